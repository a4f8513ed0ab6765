"""The fail-fast notice: when the fabric has already killed a job (one RDMA outage longer than
NCCL tolerates, or, configurably, a fatal GPU Xid), tell the workloads holding the affected
GPUs at once, instead of leaving them idle until PyTorch's NCCL watchdog fires (600 s by
default). docs/workloads.md#the-fail-fast-notice.

``trigger`` turns results into triggers, ``affected`` finds the workloads, ``records`` keeps
one notice per outage in the store, ``local`` and ``pods`` act (notice files and signals on
this host; Events, pod conditions and deletions through gpu_monitor.kube), ``notifier`` runs
it off the poll threads, ``metrics`` exports the counts.
"""
