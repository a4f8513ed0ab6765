"""`import gpu_monitor` and `import checks` must stay light: no torch, pynvml or kubernetes."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "pynvml", "kubernetes")


@pytest.mark.parametrize("module", ["gpu_monitor", "checks", "gpu_monitor.cli",
                                    "gpu_monitor.runner", "gpu_monitor.daemon",
                                    "gpu_monitor.registry", "gpu_monitor.workers.device",
                                    "gpu_monitor.workers.pool", "gpu_monitor.fabric.probe"])
def test_import_loads_no_heavy_dependency(module):
    code = (
        f"import sys, {module}\n"
        f"import gpu_monitor.registry as r; r.all_check_classes()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"
