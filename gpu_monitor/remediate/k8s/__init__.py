"""Remediation's node delivery on Kubernetes (remediate/delivery.py says what it must do).

- ``delivery``: ``KubeDelivery``, the ``NodeDelivery`` the daemon injects, and ``RBAC_RULES``;
- ``node``: our Node's writes (conditions, taint, cordon, ownership records) and its Events;
- ``drain``: the Eviction-API drain, with kubectl's semantics;
- ``breaker``: the fleet breaker's slots in one ConfigMap, changed by compare-and-swap.

Every request goes through the shared client (gpu_monitor.kube); nothing here imports
``kubernetes`` at module level.
"""
