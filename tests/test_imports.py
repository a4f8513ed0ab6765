"""The layers where import-linter cannot hold them.

docs/architecture.md ("Layers") states the rules; pyproject.toml ``[tool.importlinter]`` holds
the ones a static import graph can see, and ``lint-imports`` runs in .ci/run (and here, so
``pytest tests/core`` catches a broken layer too). What the graph cannot see is held here:

- what importing a module *executes* (the registry loads every check): ``import gpu_monitor``,
  ``import checks`` and the daemon's, CLI's and workers' parent-side modules load none of
  torch, pynvml or kubernetes;
- ``pynvml`` is loaded by name (``importlib``) in hw/nvml_reader.py, invisible to import-linter;
- a check never imports another check, only the shared ``checks/_*.py`` rules (and its own
  ``checks/<name>_worker.py``); a contract would have to list every check;
- imports inside functions are only for heavy optional modules.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = REPO
HEAVY = ("torch", "pynvml", "kubernetes")


@pytest.mark.parametrize("module", ["gpu_monitor", "checks", "gpu_monitor.cli",
                                    "gpu_monitor.runner", "gpu_monitor.daemon",
                                    "gpu_monitor.suite", "gpu_monitor.registry",
                                    "gpu_monitor.workers.device", "gpu_monitor.workers.pool",
                                    "gpu_monitor.workers.child", "gpu_monitor.fabric.probe"])
def test_import_loads_no_heavy_dependency(module):
    code = (
        f"import sys, {module}\n"
        f"import gpu_monitor.registry as r; r.all_check_classes()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_the_import_contracts_hold():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run(["lint-imports", "--no-cache"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


# --- the source, read as a tree -------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _sources() -> dict[str, Path]:
    return {_module_name(p): p for top in ("gpu_monitor", "checks")
            for p in sorted((ROOT / top).rglob("*.py"))}


@cache
def _imports(module: str) -> tuple[tuple[str, bool, int], ...]:
    """(imported module, inside a function, line) for each import ``module`` makes; imports
    under ``if TYPE_CHECKING:`` never run and are left out."""
    path = _sources()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                continue
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, inside, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in _sources() else base, inside, child.lineno))
            visit(child, inside)

    visit(ast.parse(path.read_text(), str(path)), False)
    return tuple(found)



def test_the_scan_sees_the_whole_tree():
    """The tests below read ``_sources()``; when it finds nothing they pass without looking
    (ROOT pointed elsewhere once). Every built-in check and the entry points must be in it."""
    from checks import ALL_CHECKS

    found = _sources()
    wanted = {c.__module__ for c in ALL_CHECKS} | {
        "gpu_monitor.cli", "gpu_monitor.daemon", "gpu_monitor.hw.nvml_reader", "checks"}
    assert sorted(wanted - found.keys()) == []
    assert all(path.is_file() for path in found.values())
    assert len(_check_modules()) >= len(ALL_CHECKS)
    assert any(inside for m in found for _, inside, _ in _imports(m))

# --- pynvml is named in one place --------------------------------------------------------------------


def test_only_the_nvml_reader_loads_pynvml():
    loaders = sorted(m for m, p in _sources().items()
                     if any(t.split(".")[0] == "pynvml" for t, _, _ in _imports(m))
                     or 'import_module("pynvml")' in p.read_text())
    assert loaders == ["gpu_monitor.hw.nvml_reader"]


# --- checks never import each other -----------------------------------------------------------------


def _check_modules() -> list[str]:
    return [m for m in _sources() if m.startswith("checks.") and not m.split(".")[1].startswith("_")]


@pytest.mark.parametrize("module", _check_modules())
def test_a_check_imports_no_other_check(module):
    own_worker = f"{module}_worker"
    others = sorted({t for t, _, _ in _imports(module)
                     if t.startswith("checks.") and not t.split(".")[1].startswith("_")
                     and t not in (module, own_worker)})
    assert others == [], f"{module} imports the checks {others}"


# --- imports inside functions only for heavy optional modules -----------------------------------

# Loading any of these costs real time or memory, or needs an optional extra; a module that
# imports one at module level is heavy too (gpu_monitor.sdc.fingerprint: torch). grpc is the
# kubelet client's C extension, loaded only when the kubelet is the attribution source;
# grpc_tools is a developer tool (stub regeneration), not installed at run time.
HEAVY_OPTIONAL = ("torch", "numpy", "pynvml", "kubernetes", "urllib3", "grpc", "grpc_tools")

# The one lazy import by design, not debt: the settings schema composes the checks' declarations
# on first use (gpu_monitor/declarations.py; the COMPOSITION ignore of the import contracts).
COMPOSITION = ("gpu_monitor.profiles.settings", "gpu_monitor.declarations")

# Modules that still import light modules inside functions, left to the parts that reshape them
# (issue "The house"). The test fails both ways: a module that starts doing it, and a listed one
# that no longer does (or no longer exists) -- then delete its line here.
NOT_YET = {
    "checks.burn_in", "gpu_monitor.check", "gpu_monitor.docs_gen",
    "gpu_monitor.metrics", "gpu_monitor.registry", "gpu_monitor.host", "gpu_monitor.hw.runtime",
    "gpu_monitor.sim.node", "gpu_monitor.sdc.probe_worker",
    "gpu_monitor.sdc.report",
    # the remediator wiring in daemon.py (_remediator, _node_delivery)
    "gpu_monitor.daemon",
    "gpu_monitor.remediate.bootstrap_gate", "gpu_monitor.remediate.breaker",
    "gpu_monitor.remediate.cli",
    "gpu_monitor.remediate.reports",
    "gpu_monitor.fabric.api", "gpu_monitor.fabric.cli", "gpu_monitor.fabric.metrics",
    "gpu_monitor.fabric.plan",
}


@cache
def _is_heavy(module: str) -> bool:
    """Whether importing ``module`` loads a heavy optional module (through module-level
    imports, transitively)."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m.split(".")[0] in HEAVY_OPTIONAL:
            return True
        if m in seen or m not in _sources():
            continue
        seen.add(m)
        todo += [t for t, inside, _ in _imports(m) if not inside]
    return False


def test_imports_inside_functions_are_only_for_heavy_optional_modules():
    lazy = {m: [f"l.{line} {target}" for target, inside, line in _imports(m)
                if inside and not _is_heavy(target) and (m, target) != COMPOSITION]
            for m in _sources()}
    offenders = {m for m, found in lazy.items() if found}
    new = {m: lazy[m] for m in sorted(offenders - NOT_YET)}
    assert not new, f"import these at the top of the module instead: {new}"
    assert sorted(NOT_YET - offenders) == [], "no longer lazy (or gone): delete from NOT_YET"
