"""Demo (issue 15 §2): the fail-fast notice ends a training job within a second of the 7.5 s mark.

What it runs, all real: a two-process gloo training loop (tests/failfast/gloo_rank.py, torch on
the CPU, using ``gpu_monitor.jobs.watch_notice``), both ranks in one process group; then the
daemon as an operator starts it on the simulated node, with rank 0 registered as GPU 0's holder
and mlx5_0:1 (GPU 0's NIC) going down 10 s in for 20 s:

    gpu-monitor daemon --simulate h100-sxm-8 --config CONFIG \\
        --inject gpu-process@gpu:0,pid=<rank 0> --inject port-down@ib:mlx5_0:1,after=10,for=20

CONFIG: ``workloads.source: nvml`` (off Kubernetes the holders are processes), ``failfast``
with the ``file`` action out of dry-run into a temporary notice directory. It prints when the
outage started and crossed NCCL's tolerance (from the notice), when the job was gone, and the
delay from the crossing to the job's end; exit 1 when the job did not end within 1 s of it.

    python bench/demo_failfast.py [--after 10] [--for 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _util import free_port  # noqa: E402

RANK = ROOT / "tests" / "failfast" / "gloo_rank.py"
TARGET_S = 1.0


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def start_job(tmp: Path, notices: Path) -> list[subprocess.Popen]:
    """Rank 0 leads a new process group; rank 1 joins it (the helper kills the group)."""
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []
    for rank in (0, 1):
        group = procs[0].pid if procs else 0
        procs.append(subprocess.Popen(
            [sys.executable, str(RANK), str(rank), port, str(notices), str(tmp / f"p{rank}")],
            env=env, process_group=group))
    return procs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--after", type=float, default=10.0, help="the outage starts after S s")
    ap.add_argument("--for", dest="duration", type=float, default=20.0, help="it lasts S s")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-monitor-demo-") as name:
        tmp = Path(name)
        notices = tmp / "notices"
        config = tmp / "config.yaml"
        config.write_text(
            "workloads: {source: nvml, refresh_s: 1, timeout_s: 0.5}\n"
            f"failfast: {{actions: [file], dry_run: false, notice_dir: '{notices}'}}\n")
        job = start_job(tmp, notices)
        deadline = time.monotonic() + 120
        while not (tmp / "p0").exists():  # training: five steps done
            if time.monotonic() > deadline or any(p.poll() is not None for p in job):
                print("the training job did not start", file=sys.stderr)
                return 1
            time.sleep(0.05)
        cmd = [sys.executable, "-m", "gpu_monitor", "daemon", "--simulate", "h100-sxm-8",
               "--config", str(config), "--state", str(tmp / "state.db"),
               "--listen", f"127.0.0.1:{free_port()}", "--log-level", "warning",
               "--inject", f"gpu-process@gpu:0,pid={job[0].pid}",
               "--inject", f"port-down@ib:mlx5_0:1,after={args.after:g},for={args.duration:g}"]
        print("$ gpu-monitor " + " ".join(cmd[3:]), flush=True)
        daemon = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)})
        started = time.time()
        gone: float | None = None
        try:
            while time.monotonic() < deadline + args.after:
                if all(p.poll() is not None for p in job):
                    gone = time.time()
                    break
                time.sleep(0.001)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            for p in job:
                if p.poll() is None:
                    p.kill()
                p.wait()
        path = notices / f"pid-{job[0].pid}.json"
        if gone is None or not path.exists():
            print(f"no notice reached the job (notice file {path}: {path.exists()})")
            return 1
        notice = json.loads(path.read_text())
        start, crossed = _epoch(notice["outage_start"]), _epoch(notice["crossed_at"])
        delay = gone - crossed
        print(f"daemon started        t=0.000 s\n"
              f"outage started        t={start - started:.3f} s\n"
              f"crossed the tolerance t={crossed - started:.3f} s "
              f"({crossed - start:.3f} s into the outage)\n"
              f"training job gone     t={gone - started:.3f} s "
              f"(rank 0 exit {job[0].returncode}, rank 1 {job[1].returncode})\n"
              f"crossing -> job gone  {delay * 1000:.0f} ms (target <= {TARGET_S * 1000:.0f} ms; "
              f"the NCCL watchdog: 600 s)")
        return 0 if 0 <= delay <= TARGET_S and job[0].returncode == 86 else 1


if __name__ == "__main__":
    sys.exit(main())
