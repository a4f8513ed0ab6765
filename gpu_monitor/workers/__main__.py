"""``python -m gpu_monitor.workers``: one worker process; ``--forkserver``: the fork server.

What runs is child.py's; this entry only picks which and leaves without interpreter teardown
(CUDA/NCCL destructors can hang there).
"""

import os
import sys

from gpu_monitor.workers import child

if sys.argv[1:] == ["--forkserver"]:
    os._exit(child.forkserver_main())
code = child.worker_main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
