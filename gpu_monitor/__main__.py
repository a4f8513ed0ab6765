import sys

from gpu_monitor.cli import main

sys.exit(main())
