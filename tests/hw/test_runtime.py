"""Which torch the workers' interpreter has: torch/version.py read without importing torch."""

from __future__ import annotations

import os
import stat
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw.runtime import (
    TorchBuild,
    TorchVersionError,
    parse_torch_version,
    probe_torch,
)

# Recorded version files (tests/fixtures/torch_version, provenance in PROVENANCE.md).
RECORDED = [
    ("torch-2.13.0+cpu_version.txt", TorchBuild("2.13.0+cpu", None)),
    ("torch-2.7.1-700_cuda12.9_version.txt", TorchBuild("2.7.1-700", "12.9")),
    ("torch-2.10.0a0_cuda13.0_version.txt", TorchBuild("2.10.0a0+gite67e3d9", "13.0")),
    ("torch-1.13.1_cuda11.6_version.txt", TorchBuild("1.13.1", "11.6")),
    ("torch-1.8.0+cpu_version.txt", TorchBuild("1.8.0+cpu", None)),
]


@pytest.mark.parametrize("name, want", RECORDED, ids=[n for n, _ in RECORDED])
def test_recorded_version_files_give_version_and_cuda(fixtures_dir, name, want):
    text = (fixtures_dir / "torch_version" / name).read_text()
    assert parse_torch_version(text) == want


@pytest.mark.parametrize("text, needle", [
    ("", "__version__"),
    ("debug = False\ncuda = '12.1'\n", "__version__"),
    ("__version__ = '2.4.0'\ndebug = False\n", "cuda"),          # says nothing about CUDA
    ("__version__ = version_from_git()\ncuda = None\n", "__version__"),
    ("<html>404 Not Found</html>", "__version__"),
], ids=["empty", "no-version", "no-cuda-line", "computed-version", "not-python"])
def test_text_that_is_not_a_version_file_is_the_documented_error(text, needle):
    with pytest.raises(TorchVersionError, match=needle):
        parse_torch_version(text)


def test_double_quotes_and_a_trailing_comment_are_read():
    build = parse_torch_version('__version__ = "2.4.1"  # release\ncuda = "12.4"\n')
    assert build == TorchBuild("2.4.1", "12.4")


@settings(deadline=None, derandomize=True, max_examples=300)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_only_the_documented_error_escapes_the_parser(text):
    try:
        build = parse_torch_version(text)
    except TorchVersionError:
        return
    assert isinstance(build, TorchBuild) and build.version


# --- probing an interpreter ---------------------------------------------------------------------


def _script(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_this_interpreter_is_probed_in_process():
    rt = probe_torch()
    assert rt.interpreter == "this interpreter"
    assert rt.installed  # the test environment has torch (CPU build)
    assert rt.build is not None and rt.build.version.startswith("2.")


def test_an_interpreter_without_site_packages_has_no_torch(tmp_path):
    python = _script(tmp_path / "python-no-site", f'exec "{sys.executable}" -S "$@"\n')
    rt = probe_torch(python)
    assert not rt.installed and rt.interpreter == python
    assert rt.problem == ""


def test_another_interpreter_with_torch_reports_its_build(tmp_path):
    python = _script(tmp_path / "python-same", f'exec "{sys.executable}" "$@"\n')
    rt = probe_torch(python)
    assert rt.installed and rt.build == probe_torch().build


def test_an_interpreter_that_cannot_start_is_no_torch_and_says_why(tmp_path):
    missing = str(tmp_path / "nope" / "python3")
    rt = probe_torch(missing)
    assert not rt.installed and missing in rt.problem
    broken = _script(tmp_path / "python-broken", "echo 'no such module' >&2; exit 1\n")
    rt = probe_torch(broken)
    assert not rt.installed and "exited 1" in rt.problem and "no such module" in rt.problem


def test_a_probe_that_prints_garbage_is_no_torch(tmp_path):
    liar = _script(tmp_path / "python-liar", "echo 'Python 3.11.7'\n")
    rt = probe_torch(liar)
    assert not rt.installed and "no probe result" in rt.problem


def test_an_unreadable_version_file_leaves_the_build_unknown(tmp_path):
    # A torch package whose version.py says nothing about CUDA: installed, build unknown,
    # never called CPU-only.
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text("__version__ = '9.9.9'\n")
    python = _script(tmp_path / "python-fake-torch", f'exec "{sys.executable}" -S "$@"\n')
    rt = probe_torch(python, env={"PYTHONPATH": str(tmp_path / "site")})
    assert rt.installed and rt.build is None and not rt.cpu_only
    assert "version.py" in rt.problem and "cuda" in rt.problem
    assert os.path.exists(pkg / "version.py")
