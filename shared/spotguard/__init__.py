"""spotguard: keep Kubernetes workloads serving on spot capacity."""

__version__ = "0.1.0"
