"""gpu-monitor: a per-node GPU health daemon.

Importing this package loads none of torch, pynvml or kubernetes: they are imported lazily by
the modules that wrap them (hw/nvml_reader.py, the active checks' workers, gpu_monitor/kube/).
"""

__version__ = "0.1.0"
