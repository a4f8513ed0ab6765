"""Remediation's node delivery on a Slurm cluster (remediate/delivery.py says what it must do).

- ``tools``: runs ``scontrol`` / ``squeue`` with a timeout and parses their output strictly;
- ``reason``: the drain Reason gpu-monitor writes and reads back (which drains are ours);
- ``delivery``: ``SlurmDelivery``, the ``NodeDelivery`` the daemon injects with
  ``daemon.backend: slurm``;
- ``breaker``: the fleet breaker counted over the gpu-monitor drains of the partitions.

Nothing here imports ``kubernetes``, ``gpu_monitor.kube`` or ``remediate/k8s`` (the
``slurm-no-kubernetes`` contract in pyproject.toml).
"""
