"""scheduler-patcher: plug a scheduler extender into static-pod kube-schedulers, reversibly."""

__version__ = "0.1.0"
