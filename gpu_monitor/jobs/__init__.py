"""The training side of the fail-fast notice (docs/workloads.md#the-fail-fast-notice).

A training script calls ``watch_notice()`` once at start; when gpu-monitor writes the notice
for this pod (or process), the helper aborts the script's process group at once and exits with
``FAILFAST_EXIT_CODE``, so the job restarts from its last checkpoint now instead of hanging in
a collective until NCCL's watchdog fires (600 s by default)::

    from gpu_monitor.jobs import watch_notice
    watch_notice()  # $GPU_MONITOR_NOTICE, else /run/gpu-monitor/notices/<pod>.json

Standard library only: no kubernetes, no torch (an import-linter contract holds it).
"""

from gpu_monitor.jobs.notice import (
    DEFAULT_NOTICE_DIR,
    FAILFAST_EXIT_CODE,
    NOTICE_ENV,
    NoticeWatcher,
    notice_candidates,
    read_notice,
    watch_notice,
)

__all__ = ["DEFAULT_NOTICE_DIR", "FAILFAST_EXIT_CODE", "NOTICE_ENV", "NoticeWatcher",
           "notice_candidates", "read_notice", "watch_notice"]
