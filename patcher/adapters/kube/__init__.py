"""The node agent's Kubernetes adapters: API client, Node annotations and events, mirror-pod watch.

This package file deliberately imports nothing: the pure helpers (``status``) may be used by the
offline CLI, which must not pay for (or depend on) importing the kubernetes client.
"""
