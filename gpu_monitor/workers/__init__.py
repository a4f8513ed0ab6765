"""Per-device torch workers for the active checks (burn_in, nccl_allreduce, nvlink_peer, pcie,
sdc_probe).

The parent side -- ``pool`` (``WorkerPool``, ``Task``, ``DeviceRef``, ``Outcome``) and the
processes it drives (``procs``) -- is stdlib only: the daemon and the CLI never import torch.
The worker side -- ``python -m gpu_monitor.workers`` (``__main__``, ``child``) and the
device-agnostic torch layer (``device``) -- runs only in worker processes. ``board`` is the
status board between the two; ``faults`` is test-only misbehaviour. docs/active-checks.md
describes how they run.
"""
