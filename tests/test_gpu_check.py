"""bench/gpu_check.sh, its CPU side: it skips cleanly without CUDA, reads its steps' output, and
fails the command when a step fails. (Its GPU side has not run here: no CUDA on this machine.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import gpu_check as G
from tests.conftest import REPO


def test_without_cuda_every_row_is_skipped_and_the_command_succeeds():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    out = subprocess.run([str(REPO / "bench" / "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines()[2:] if ln.strip()]
    assert len(rows) == len(G.STEPS) and all("skipped" in r and "no CUDA" in r for r in rows)
    assert out.stdout.startswith("gpu_check: 0 CUDA device(s)")


@pytest.mark.parametrize("line, counts", [
    ("3 passed, 1 failed, 2 skipped in 4.51s", {"passed": 3, "failed": 1, "skipped": 2}),
    ("==== 12 passed, 4768 deselected, 1 error in 80.00s (0:01:20) ====",
     {"passed": 12, "deselected": 4768, "error": 1}),
    ("no tests ran in 0.01s", {}),
], ids=["plain", "decorated", "none"])
def test_the_pytest_summary_line_is_read(line, counts):
    assert G.pytest_summary("collecting ...\n" + line + "\n") == counts


def test_the_benches_figures_are_read_from_their_last_lines():
    burn = "fp32    256     1.2      1.3  0.951   TFLOP/s\nworst ratio 0.948 (target >= 0.95)\n"
    nccl = "busbw GB/s (median)  nccl_allreduce 10  bare 11\nratio (median of rounds) 0.912 (target >= 0.9)"
    assert G.last_float(r"worst ratio ([0-9.]+)", burn) == 0.948
    assert G.last_float(r"ratio[^0-9]*([0-9.]+)", nccl) == 0.912
    assert G.last_float(r"worst ratio ([0-9.]+)", "Traceback ...") is None


def test_only_files_with_a_gpu_mark_are_collected():
    files = G.gpu_test_files()
    assert "tests/sdc/test_fingerprint_fused.py" in files
    assert "tests/checks/test_burn_in.py" in files
    assert not any(f.startswith("tests/remediate/") for f in files)


def test_a_failing_step_fails_the_command_and_its_lines_are_shown(monkeypatch, capsys):
    monkeypatch.setattr(G, "cuda_devices", lambda: 1)
    monkeypatch.setattr(G, "STEPS", {
        "good": (lambda limit, gpus: G.Row("good step", "ok", "1.0x", ">= 0.5x", 1.0), 0.5),
        "bad": (lambda limit, gpus: G.Row("bad step", "FAILED", "-", "0 failed", 2.0,
                                          ["FAILED tests/x.py::test_y"]), 0.5)})
    assert G.main([]) == 1
    out = capsys.readouterr().out
    assert "good step" in out and "| FAILED tests/x.py::test_y" in out


def test_each_step_gets_at_most_its_share_and_none_starts_with_the_budget_spent(monkeypatch):
    seen = []
    monkeypatch.setattr(G, "cuda_devices", lambda: 1)
    monkeypatch.setattr(G, "STEPS", {
        "a": (lambda limit, gpus: seen.append(limit) or G.Row("a", "ok"), 0.5)})
    assert G.main(["--budget-s", "100"]) == 0
    assert 0 < seen[0] <= 75
    assert G.main(["--budget-s", "4"]) == 1  # under 5 s left: the step is not started
