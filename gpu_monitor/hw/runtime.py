"""Which torch the workers' interpreter has, read without importing torch.

The active checks run torch in worker subprocesses (gpu_monitor/workers). Whether they can run
at all is a property of *that* interpreter: the passive image has no torch; a CPU-only wheel on
a GPU node has torch but no CUDA. The requirement gate (host.py) asks here before a check starts
eight workers that would each fail the same way, and the bootstrap gate asks before it records
a pass.

Facts relied on (torch's ``tools/generate_torch_version.py`` writes ``torch/version.py`` at
build time; recorded copies in tests/fixtures/torch_version/):

- torch >= 2.0 writes annotated lines: ``__version__ = '2.7.1+cu126'`` and
  ``cuda: Optional[str] = '12.6'`` (``None`` for a CPU-only or ROCm build);
- torch 1.x writes the same without the annotation: ``cuda = '11.6'`` / ``cuda = None``;
- the file is plain assignments of string literals or ``None``; it never needs importing.

``parse_torch_version`` is a pure function over the file's text and raises only
``TorchVersionError``. ``probe_torch`` finds the file: in this process when the workers run
this interpreter, else by asking the workers' interpreter (``WorkerSettings.python``) to locate
it (the same ``find_spec``, no torch import) and print it as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

_ASSIGN_RE = re.compile(
    r"""^(?P<name>__version__|cuda)\s*(?::\s*[A-Za-z_][\w\[\]., ]*)?=\s*"""
    r"""(?:(?P<none>None)|'(?P<sq>[^'\\\n]*)'|"(?P<dq>[^"\\\n]*)")\s*(?:\#.*)?$""",
    re.M,
)

# Run by the workers' interpreter: locate torch/version.py exactly as an import would, without
# importing torch, and print what was found. Only the standard library (the passive image's
# interpreter may have nothing else).
_PROBE = r"""
import importlib.util, json, os
out = {"found": False, "path": None, "text": None, "error": None}
try:
    spec = importlib.util.find_spec("torch")
except Exception as exc:
    spec = None
    out["error"] = "find_spec: %s: %s" % (type(exc).__name__, exc)
if spec is not None:
    out["found"] = True
    for root in list(spec.submodule_search_locations or []):
        path = os.path.join(root, "version.py")
        if os.path.exists(path):
            out["path"] = path
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    out["text"] = fh.read(65536)
            except OSError as exc:
                out["error"] = "%s: %s" % (path, exc)
            break
print(json.dumps(out))
"""


class TorchVersionError(ValueError):
    """The text is not a torch ``version.py`` (no ``__version__`` assignment)."""


@dataclass(frozen=True)
class TorchBuild:
    """What a ``torch/version.py`` says: the version, and the CUDA it was built for (None: a
    CPU-only or ROCm build)."""

    version: str
    cuda: str | None


@dataclass(frozen=True)
class TorchRuntime:
    """What the workers' interpreter has.

    ``installed``: torch can be found by an import. ``build``: its version file, when it could
    be read and parsed (None otherwise; ``problem`` then says why). ``interpreter``: which
    interpreter was asked, for messages.
    """

    installed: bool
    build: TorchBuild | None = None
    problem: str = ""
    interpreter: str = ""

    @property
    def cpu_only(self) -> bool:
        """True only when the version file was read and names no CUDA version."""
        return self.build is not None and self.build.cuda is None


def parse_torch_version(text: str) -> TorchBuild:
    """The ``__version__`` and ``cuda`` of a torch ``version.py``'s text.

    Both lines must be there: a file without a ``cuda`` line says nothing about CUDA, and
    guessing "CPU-only" would block a torch that may work (the workers then tell).
    """
    if not isinstance(text, str):
        raise TorchVersionError(f"expected text, got {type(text).__name__}")
    found: dict[str, str | None] = {}
    for m in _ASSIGN_RE.finditer(text):
        value = None if m.group("none") else (m.group("sq") if m.group("sq") is not None
                                               else m.group("dq"))
        found.setdefault(m.group("name"), value)
    version = found.get("__version__")
    if not version:
        raise TorchVersionError("no __version__ = '...' line")
    if "cuda" not in found:
        raise TorchVersionError("no cuda = ... line")
    return TorchBuild(version=version, cuda=found["cuda"] or None)


def _runtime_from(found: bool, path: str | None, text: str | None, error: str | None,
                  interpreter: str) -> TorchRuntime:
    if not found:
        return TorchRuntime(False, problem=error or "", interpreter=interpreter)
    if text is None:
        why = error or "torch has no version.py"
        return TorchRuntime(True, problem=f"cannot read torch's version file: {why}",
                            interpreter=interpreter)
    try:
        build = parse_torch_version(text)
    except TorchVersionError as exc:
        return TorchRuntime(True, problem=f"{path or 'torch/version.py'}: {exc}",
                            interpreter=interpreter)
    return TorchRuntime(True, build, interpreter=interpreter)


def _probe_here() -> TorchRuntime:
    where = "this interpreter"
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        return TorchRuntime(False, problem=f"find_spec: {exc}", interpreter=where)
    if spec is None:
        return TorchRuntime(False, interpreter=where)
    for root in list(spec.submodule_search_locations or []):
        path = os.path.join(root, "version.py")
        if not os.path.exists(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return _runtime_from(True, path, fh.read(65536), None, where)
        except OSError as exc:
            return _runtime_from(True, path, None, f"{path}: {exc}", where)
    return _runtime_from(True, None, None, None, where)


def probe_torch(python: str | None = None, env: Mapping[str, str] | None = None,
                timeout_s: float = 30.0) -> TorchRuntime:
    """What torch the interpreter ``python`` (None: this one) has, with ``env`` added to its
    environment. Never raises: an interpreter that cannot be run has no usable torch, and
    ``problem`` says why."""
    # The workers' PYTHONPATH comes before site-packages: with one, only asking tells.
    here = (python is None or os.path.realpath(python) == os.path.realpath(sys.executable)) \
        and not (env and env.get("PYTHONPATH"))
    if here:
        return _probe_here()
    from gpu_monitor.hw.command import CommandRunner

    python = python or sys.executable

    out = CommandRunner(env=env).run([python, "-c", _PROBE], timeout=timeout_s)
    if out.returncode != 0:
        why = out.error or (f"timed out after {timeout_s:g} s" if out.timed_out else
                            f"exited {out.returncode}: {out.stderr.strip()[-300:]}")
        return TorchRuntime(False, problem=f"the worker interpreter {python} did not run: {why}",
                            interpreter=python)
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except (ValueError, IndexError) as exc:
        return TorchRuntime(False, problem=f"the worker interpreter {python} printed no probe "
                                           f"result ({exc}): {out.stdout[-200:]!r}",
                            interpreter=python)
    text = data.get("text")
    return _runtime_from(bool(data.get("found")), data.get("path"),
                         text if isinstance(text, str) else None,
                         data.get("error") if isinstance(data.get("error"), str) else None,
                         python)
