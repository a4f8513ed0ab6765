"""Remediation's layering: only kube.py imports `kubernetes`, and only when it is called."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gpu_monitor.remediate as pkg

MODULES = ["gpu_monitor.remediate", "gpu_monitor.remediate.policy", "gpu_monitor.remediate.kube",
           "gpu_monitor.remediate.drain", "gpu_monitor.remediate.breaker",
           "gpu_monitor.remediate.lifecycle", "gpu_monitor.remediate.reports",
           "gpu_monitor.remediate.metrics", "gpu_monitor.remediate.cli"]


def test_importing_remediation_loads_no_kubernetes():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "print('kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_only_kube_py_imports_kubernetes():
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "kubernetes" or n.startswith("kubernetes.") for n in names):
                assert path.name == "kube.py", f"{path.name} imports kubernetes"


def test_policy_is_pure():
    """policy.py reads no clock, store, file or network: only the vocabulary."""
    tree = ast.parse(Path(pkg.__file__).with_name("policy.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "json", "collections.abc", "dataclasses", "datetime",
                        "enum", "types", "typing", "gpu_monitor.model"}
