"""The Kubernetes API adapters: the client, the error hierarchy, watches, Node reports, Leases, cluster reads.

This package file deliberately imports nothing: importing one adapter must not load the others (the offline
CLI imports none of them, and must not pay for or depend on the kubernetes client).
"""
