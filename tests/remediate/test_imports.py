"""Remediation's layering: only the client package (gpu_monitor/kube/) imports `kubernetes`, and
only when it is called; remediation never reads the host itself (it asks its actuator)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import gpu_monitor
import gpu_monitor.remediate as pkg

ROOT = Path(gpu_monitor.__file__).resolve().parent.parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."))
CLIENT = Path(gpu_monitor.__file__).resolve().parent / "kube"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _sources() -> list[Path]:
    return sorted(p for top in ("gpu_monitor", "checks") for p in (ROOT / top).rglob("*.py"))


def test_importing_remediation_loads_no_kubernetes():
    assert "gpu_monitor.remediate.k8s.delivery" in MODULES and len(MODULES) > 10
    code = ("import sys\n" + "".join(f"import {m}\n" for m in ["gpu_monitor.remediate", *MODULES])
            + "import gpu_monitor.kube.client, gpu_monitor.host_actuator\n"
            + "print('kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_only_the_client_package_imports_kubernetes():
    """Across the whole tree (remediation, the fabric scheduler, the SDC library, the CLI)."""
    sources = _sources()
    assert any(p.parts[-2:] == ("sdc", "report.py") for p in sources)
    for path in sources:
        if any(n == "kubernetes" or n.startswith("kubernetes.") for n in _imported(path)):
            assert CLIENT in path.parents, f"{path.relative_to(ROOT)} imports kubernetes"


def test_remediation_imports_nothing_from_hw():
    """GPU reset, holder scan, NVSwitch detection, boot id and the reboot sentinel are the
    injected actuator's (gpu_monitor/host_actuator.py)."""
    for path in Path(pkg.__file__).parent.rglob("*.py"):
        bad = {n for n in _imported(path) if n == "gpu_monitor.hw" or n.startswith("gpu_monitor.hw.")}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_policy_is_pure():
    """policy.py reads no clock, store, file or network: only the vocabulary."""
    tree = ast.parse(Path(pkg.__file__).with_name("policy.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "json", "collections.abc", "dataclasses", "datetime",
                        "enum", "types", "typing", "gpu_monitor.model"}
