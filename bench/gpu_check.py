"""One command for a machine with CUDA: every ``gpu``-marked test and the GPU forms of the benches.

Why: no CUDA path of this project had run on a GPU; a lent GPU machine comes for minutes, so the
whole check is prepared here and runs as one command, within a time budget (4 minutes on one
GPU by default), printing one table of figures and failures. Each step runs in its own process
with its own time limit, so a hang or crash in one still leaves the others' rows. Without CUDA
every row says ``skipped`` and the command exits 0 (nothing failed; nothing was measured).

Steps: the ``gpu``-marked tests (pytest); burn-in vs a bare matmul loop at 8192 bf16
(bench_burn_in.py); fingerprints vs ``sum`` (bench_fingerprints.py); pinned host-to-device and
device-to-host copies; NCCL all-reduce (bench_nccl.py) where two GPUs exist.

    bench/gpu_check.sh [--budget-s 240] [--only STEP ...] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Row:
    step: str
    status: str  # ok, FAILED, skipped, timeout
    figure: str = ""
    target: str = ""
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


def pytest_summary(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line ('3 passed, 1 failed, 2 skipped in 4.5s')."""
    counts: dict[str, int] = {}
    for line in reversed(text.strip().splitlines()):
        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
                           line)
        if found:
            for n, what in found:
                counts["error" if what.startswith("error") else what] = int(n)
            return counts
    return counts


def last_float(pattern: str, text: str) -> float | None:
    m = re.findall(pattern, text)
    return float(m[-1]) if m else None


def cuda_devices() -> int:
    """How many CUDA devices torch sees (0 without torch or CUDA); asked in a child process."""
    try:
        out = subprocess.run([sys.executable, "-c",
                              "import torch; print(torch.cuda.device_count() "
                              "if torch.cuda.is_available() else 0)"],
                             capture_output=True, text=True, timeout=120, check=False)
        return int(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def run(cmd: list[str], limit_s: float) -> tuple[int | None, str, float]:
    """(rc or None on timeout, stdout+stderr, seconds)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=max(1.0, limit_s), check=False)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, time.monotonic() - t0


def gpu_test_files() -> list[str]:
    """The test files that hold a ``gpu`` mark: collecting only them keeps modules that need
    what the GPU machine lacks (kubernetes, kubectl) out of the run."""
    found = []
    for base, _dirs, files in os.walk(os.path.join(REPO, "tests")):
        for f in files:
            path = os.path.join(base, f)
            if f.startswith("test_") and f.endswith(".py"):
                with open(path, encoding="utf-8") as fh:
                    if "mark.gpu" in fh.read():
                        found.append(os.path.relpath(path, REPO))
    return sorted(found)


def step_tests(limit_s: float, gpus: int) -> Row:
    rc, out, s = run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                      "-o", "addopts=", "-rfEs", *gpu_test_files()], limit_s)
    c = pytest_summary(out)
    fig = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped") if c.get(k))
    status = "timeout" if rc is None else ("ok" if rc == 0 else "FAILED")
    fails = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return Row("gpu-marked tests", status, fig or "no summary", "0 failed", s, fails[:20])


def step_burn_in(limit_s: float, gpus: int) -> Row:
    rc, out, s = run([sys.executable, "bench/bench_burn_in.py", "--device", "cuda", "--sizes",
                      "8192", "--dtypes", "bf16", "--seconds", "1", "--rounds", "5"], limit_s)
    ratio = last_float(r"worst ratio ([0-9.]+)", out)
    ok = rc == 0 and ratio is not None and ratio >= 0.95
    return Row("burn-in vs bare matmul 8192 bf16", "timeout" if rc is None else
               ("ok" if ok else "FAILED"), f"{ratio:.3f}x" if ratio is not None else "-",
               ">= 0.95x", s, [] if ok else out.strip().splitlines()[-5:])


def step_fingerprints(limit_s: float, gpus: int) -> Row:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fp.json")
        rc, out, s = run([sys.executable, "bench/bench_fingerprints.py", "--device", "cuda",
                          "--json", path], limit_s)
        fig = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                fig = json.load(fh)
    if not fig:
        return Row("fingerprints vs sum (256 MiB fp32)", "timeout" if rc is None else "FAILED",
                   "-", ">= 0.5x", s, out.strip().splitlines()[-5:])
    first = fig.get("first_call_s", {})
    text = (f"{fig['compiled_vs_sum']:.3f}x (eager {fig['eager_vs_sum']:.3f}x; first call "
            f"{first.get('cold_cache', float('nan')):.1f} s cold, "
            f"{first.get('warm_cache', float('nan')):.1f} s warm)")
    ok = rc == 0 and fig["compiled_vs_sum"] >= 0.5
    return Row("fingerprints vs sum (256 MiB fp32)", "ok" if ok else "FAILED", text, ">= 0.5x",
               s)


COPY = r"""
import torch, time
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True); d = torch.empty(n, dtype=torch.uint8,
device="cuda")
def best(f):
    b = 1e9
    for _ in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
        b = min(b, time.perf_counter() - t0)
    return n / b / 1e9
print(f"h2d {best(lambda: d.copy_(h, non_blocking=True)):.1f}")
print(f"d2h {best(lambda: h.copy_(d, non_blocking=True)):.1f}")
"""


def step_copies(limit_s: float, gpus: int) -> Row:
    rc, out, s = run([sys.executable, "-c", COPY], limit_s)
    h2d, d2h = last_float(r"h2d ([0-9.]+)", out), last_float(r"d2h ([0-9.]+)", out)
    ok = rc == 0 and h2d is not None and d2h is not None
    return Row("pinned copies, 1 GiB", "timeout" if rc is None else ("ok" if ok else "FAILED"),
               f"H2D {h2d} GB/s, D2H {d2h} GB/s" if ok else "-", "figures only", s,
               [] if ok else out.strip().splitlines()[-5:])


def step_nccl(limit_s: float, gpus: int) -> Row:
    if gpus < 2:
        return Row("NCCL all-reduce", "skipped", "needs 2 GPUs", ">= 0.9x of bare")
    rc, out, s = run([sys.executable, "bench/bench_nccl.py", "--device", "cuda", "--world",
                      str(gpus), "--bytes", str(1 << 30), "--rounds", "5"], limit_s)
    ratio = last_float(r"ratio[^0-9]*([0-9.]+)", out)
    ok = rc == 0 and ratio is not None and ratio >= 0.9
    return Row("NCCL all-reduce", "timeout" if rc is None else ("ok" if ok else "FAILED"),
               f"{ratio}" if ratio is not None else "-", ">= 0.9x of bare", s,
               out.strip().splitlines()[-3:])


# name -> (function, share of the budget)
STEPS = {"tests": (step_tests, 0.40), "burn_in": (step_burn_in, 0.15),
         "fingerprints": (step_fingerprints, 0.25), "copies": (step_copies, 0.05),
         "nccl": (step_nccl, 0.15)}


def table(rows: list[Row], gpus: int, wall_s: float) -> str:
    w = max(len(r.step) for r in rows)
    lines = [f"gpu_check: {gpus} CUDA device(s), {wall_s:.0f} s",
             f"{'step':<{w}}  {'status':<8} {'seconds':>7}  figure  (target)"]
    for r in rows:
        lines.append(f"{r.step:<{w}}  {r.status:<8} {r.seconds:7.1f}  {r.figure}"
                     + (f"  ({r.target})" if r.target else ""))
        lines += [f"{'':<{w}}    | {d}" for d in r.detail]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--only", nargs="+", choices=sorted(STEPS))
    ap.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = ap.parse_args(argv)
    names = args.only or list(STEPS)
    t0 = time.monotonic()
    gpus = 0 if args.dry_run else cuda_devices()
    rows: list[Row] = []
    for name in names:
        fn, share = STEPS[name]
        if args.dry_run or gpus == 0:
            why = "dry run" if args.dry_run else "no CUDA device"
            rows.append(Row(name, "skipped", why))
            continue
        left = args.budget_s - (time.monotonic() - t0)
        rows.append(fn(min(left, args.budget_s * share * 1.5), gpus) if left > 5 else
                    Row(name, "timeout", "budget spent before this step"))
    print(table(rows, gpus, time.monotonic() - t0))
    return 1 if any(r.status in ("FAILED", "timeout") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
