"""Workload attribution: which pod (or, off Kubernetes, which process) holds which device."""
