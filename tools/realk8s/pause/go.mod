// The pod sandbox's process for the real node's containerd (tests/harness/real/kubelet_node.py): no registry is reachable, so the
// runtime cannot pull registry.k8s.io/pause; this is imported as a local image instead.
module scheduler-patcher/realk8s/pause

go 1.26.0
