"""A kernel-log storm against the real daemon: ingest rate, catch-up, RSS and CPU, exact counts.

Runs ``gpu-monitor daemon --simulate h100-sxm-8 --kmsg FILE`` as a subprocess and appends, at a
paced rate, ``--rate`` dmesg -T lines a second for ``--seconds`` (99% ordinary kernel lines of
up to 4 KiB, some with bytes that are not UTF-8; 1% Xid 13 lines over the 8 GPUs), plus a
``--burst-seconds`` burst of ``--burst-rate`` extra Xid lines a second in the middle (issue 18:
20,500 lines/s for 20 s and a 5 s burst of 2,000 Xids/s). It scrapes /metrics twice a second
and prints: lines/s written and ingested (``gpu_monitor_kmsg_read_total``, where the daemon has
it), the time from the flood's end until every Xid is counted, RSS and CPU before, during and
10 s after, the worst scrape, and whether each GPU's count is exactly what was written.

    python bench/bench_kmsg_storm.py [--seconds 20] [--rate 20500] [--tree DIR] [--backlog]

``--backlog`` measures what the daemon can ingest rather than what a writer can append: the
daemon is stopped (SIGSTOP) while the whole storm is written unpaced, then continued, and the
bench prints the lines it read from the continue until every Xid is counted, per second and
per CPU-second of the daemon (the writer no longer shares the machine with it).

``--tree DIR`` runs the daemon from another checkout (PYTHONPATH=DIR), to compare with older
code in one run. Targets: ingest >= 50,000 lines/s, all counted <= 5 s after the flood, RSS
growth <= 50 MiB, CPU 10 s after within 2x the idle baseline.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(__file__))
from _kmsg_storm import GPU_PCI, SLICE_S, add_storm_args, storm_slices  # noqa: E402
from _util import free_port, scrape, start_daemon  # noqa: E402

XID_RE = re.compile(r'gpu_monitor_xid_events_total\{code="13",gpu="(\d+)",uuid="[^"]*"\} '
                    r"([0-9.e+]+)")
READ_RE = re.compile(r"^gpu_monitor_kmsg_read_total ([0-9.e+]+)$", re.M)
LAST_RUN_RE = re.compile(r'^gpu_monitor_check_last_run_timestamp_seconds\{check="([^"]+)"\} '
                         r"([0-9.e+]+)$", re.M)
KMSG_CHECKS = ("xid", "nvswitch")  # they run per record, not on a cadence
GATE_PENDING = 'gpu_monitor_bootstrap_state{state="pending"} 1.0'


def wait_for_gate(sampler: Sampler, limit_s: float = 120.0) -> None:
    """Until the bootstrap gate's first suite is over: its one-shot scan of the kernel log
    would otherwise read the storm too, once, and be measured as the follower. (Sampled, so
    the polled checks' cadence before the storm is seen meanwhile.)"""
    deadline = time.monotonic() + limit_s
    while GATE_PENDING in sampler.sample(want_text=True):
        if time.monotonic() >= deadline:
            sys.exit(f"the bootstrap gate was still pending after {limit_s:.0f} s: the storm "
                     "would be measured together with its scan; not measuring")
        time.sleep(0.5)


class Sampler:
    """Scrapes /metrics and samples the daemon's RSS and CPU (``run`` in a thread every 0.5 s,
    so a slow scrape never holds up the writer)."""

    def __init__(self, port: int, pid: int):
        self.stop = threading.Event()
        self.port = port
        self.proc = psutil.Process(pid)
        self.worst_scrape = 0.0
        self.runs: dict[str, set[float]] = {}  # polled check -> the last-run times seen
        self.rows: list[tuple[float, float, float | None, dict[int, float], float, float]] = []

    def sample(self, want_text: bool = False):
        """(Xids counted, lines read or None, Xids per GPU); the scraped text instead when
        ``want_text``."""
        t0 = time.perf_counter()
        text = scrape(self.port)
        self.worst_scrape = max(self.worst_scrape, time.perf_counter() - t0)
        per_gpu = {int(g): float(v) for g, v in XID_RE.findall(text)}
        m = READ_RE.search(text)
        read = float(m.group(1)) if m else None
        for check, ts in LAST_RUN_RE.findall(text):
            if check not in KMSG_CHECKS:
                self.runs.setdefault(check, set()).add(float(ts))
        cpu = sum(self.proc.cpu_times()[:2])
        rss = self.proc.memory_info().rss / 2**20
        self.rows.append((time.monotonic(), sum(per_gpu.values()), read, per_gpu, cpu, rss))
        return text if want_text else (sum(per_gpu.values()), read, per_gpu)


    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.sample()
            except OSError as exc:
                print(f"scrape failed: {exc}", file=sys.stderr)


def cpu_pct(rows, t0: float, t1: float) -> float:
    inside = [r for r in rows if t0 <= r[0] <= t1]
    if len(inside) < 2:
        return float("nan")
    return 100 * (inside[-1][4] - inside[0][4]) / (inside[-1][0] - inside[0][0])


def launch(args):
    """The daemon following an empty kernel-log file of its own: (the file, the daemon's
    process, a Sampler of it)."""
    tmp = tempfile.mkdtemp(prefix="bench-storm-")
    path = os.path.join(tmp, "kern.log")
    open(path, "w").close()
    port = free_port()
    env = {"PYTHONPATH": os.path.abspath(args.tree)} if args.tree else None
    daemon = start_daemon(["--simulate", "h100-sxm-8", "--kmsg", path,
                           "--state", os.path.join(tmp, "state.db")], port, env=env)
    return path, daemon, Sampler(port, daemon.pid)


def worst_gaps(runs: dict[str, set[float]], t0: float, t1: float) -> dict[str, float]:
    """Per polled check, the longest time between two of its runs seen that end in
    [t0, t1] (Unix times): the cadence the scheduler kept."""
    out = {}
    for check, times in runs.items():
        ts = sorted(times)
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False) if t0 <= b <= t1]
        if gaps:
            out[check] = max(gaps)
    return out


def flood(path: str, args, rng: random.Random) -> tuple[dict[int, int], int, float]:
    """Append the storm, paced per slice; (Xids written per GPU, lines written, seconds)."""
    written = dict.fromkeys(range(len(GPU_PCI)), 0)
    lines = 0
    slices = storm_slices(rng, seconds=args.seconds, rate=args.rate,
                          burst_seconds=args.burst_seconds, burst_rate=args.burst_rate)
    start = time.monotonic()
    with open(path, "ab", buffering=1 << 20) as fh:
        for k in itertools.count():
            while (wait := start + k * SLICE_S - time.monotonic()) > 0:
                time.sleep(min(SLICE_S / 5, wait))
            chunk = next(slices, None)
            if chunk is None:
                break
            data, xids = chunk
            fh.write(data)
            fh.flush()
            lines += data.count(b"\n")
            for g, n in xids.items():
                written[g] += n
    return written, lines, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    add_storm_args(ap)
    ap.add_argument("--catch-up-limit", type=float, default=120.0)
    ap.add_argument("--tree", default=None, help="run the daemon from this checkout")
    ap.add_argument("--backlog", action="store_true",
                    help="write the storm while the daemon is stopped, then time its ingest")
    args = ap.parse_args()
    if args.backlog:
        return backlog(args)
    path, daemon, sampler = launch(args)
    rng = random.Random(18)
    try:
        wait_for_gate(sampler)
        idle_from = time.monotonic()
        sampler.sample()
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        time.sleep(5)  # the idle baseline (a span of time, not a condition)
        idle_to, idle_to_unix = time.monotonic(), time.time()
        written, lines, flood_s = flood(path, args, rng)
        flood_end = time.monotonic()
        want = sum(written.values())
        counted, read, per_gpu = 0.0, None, {}
        while time.monotonic() - flood_end < args.catch_up_limit:
            try:
                counted, read, per_gpu = sampler.sample()
            except OSError as exc:  # a scrape that timed out is a measurement too
                print(f"scrape failed: {exc}", file=sys.stderr)
            if counted >= want:
                break
            time.sleep(0.2)
        caught, caught_unix = time.monotonic(), time.time()
        settle_end = caught + 12
        time.sleep(12)  # the 10 s after (a span of time, not a condition)
        sampler.stop.set()
        thread.join(30)
        try:
            counted, read, per_gpu = sampler.sample()
        except OSError as exc:
            print(f"scrape failed: {exc}", file=sys.stderr)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    rows = sampler.rows
    rss_idle = max(r[5] for r in rows if idle_from <= r[0] <= idle_to)
    rss_peak = max(r[5] for r in rows if r[0] >= idle_from)
    ingest_s = caught - idle_to
    size = os.path.getsize(path) / 2**20
    print(f"daemon tree: {args.tree or 'this checkout'}; load average {os.getloadavg()}")
    print(f"written: {lines} lines ({size:.0f} MiB) in {flood_s:.1f} s = "
          f"{lines / flood_s:.0f} lines/s; {want} Xids")
    if read is not None:
        print(f"ingested: {read:.0f} lines read by the daemon; {read / ingest_s:.0f} lines/s "
              f"from the flood's start to all counted")
    else:
        print("ingested: the daemon has no gpu_monitor_kmsg_read_total (older code)")
    done = counted >= want
    print(f"catch-up: {'all counted' if done else 'NOT all counted'} "
          f"{caught - flood_end:.1f} s after the flood's end ({counted:.0f}/{want})")
    print(f"RSS MiB: idle {rss_idle:.0f}, peak {rss_peak:.0f} (+{rss_peak - rss_idle:.0f}), "
          f"after {rows[-1][5]:.0f}")
    print(f"CPU %: idle {cpu_pct(rows, idle_from, idle_to):.1f}, during "
          f"{cpu_pct(rows, idle_to, flood_end):.1f}, catch-up "
          f"{cpu_pct(rows, flood_end, caught):.1f}, 10 s after "
          f"{cpu_pct(rows, caught + 2, settle_end):.1f}")
    print(f"worst /metrics scrape: {sampler.worst_scrape * 1e3:.0f} ms")
    before = worst_gaps(sampler.runs, 0.0, idle_to_unix)
    storm = worst_gaps(sampler.runs, idle_to_unix, caught_unix)
    print("polled checks, longest time between runs before / during the storm (s): "
          + ", ".join(f"{c} {before.get(c, float('nan')):.0f}/{g:.0f}"
                      for c, g in sorted(storm.items())))
    exact = all(per_gpu.get(g, 0) == n for g, n in written.items())
    print(f"exactly once per GPU: {'yes' if exact else ('NO' if any(per_gpu.get(g, 0) > n for g, n in written.items()) else 'not yet (none twice)')} "
          f"(written {written}, counted {per_gpu})")
    return 0 if done and exact else 1


def backlog(args) -> int:
    """The daemon's own ingest rate: the storm written whole while it is stopped."""
    path, daemon, sampler = launch(args)
    try:
        wait_for_gate(sampler)
        base_read = sampler.sample()[1] or 0.0
        daemon.send_signal(signal.SIGSTOP)
        written = dict.fromkeys(range(len(GPU_PCI)), 0)
        lines = 0
        with open(path, "ab", buffering=1 << 20) as fh:
            for data, xids in storm_slices(random.Random(18), seconds=args.seconds,
                                           rate=args.rate, burst_seconds=args.burst_seconds,
                                           burst_rate=args.burst_rate):
                fh.write(data)
                lines += data.count(b"\n")
                for g, n in xids.items():
                    written[g] += n
        want = sum(written.values())
        cpu0 = sum(sampler.proc.cpu_times()[:2])
        t0 = time.monotonic()
        daemon.send_signal(signal.SIGCONT)
        counted, read, per_gpu = 0.0, None, {}
        while time.monotonic() - t0 < args.catch_up_limit and counted < want:
            # A scrape renders every family: one each 0.2 s is a fifth of a busy daemon's
            # CPU, so the first 90% are awaited a second at a time (Prometheus scrapes every
            # 15 s or more).
            time.sleep(0.1 if read is not None and read - base_read >= 0.9 * lines else 1.0)
            counted, read, per_gpu = sampler.sample()
        wall = time.monotonic() - t0
        cpu = sum(sampler.proc.cpu_times()[:2]) - cpu0
        rss = max(r[5] for r in sampler.rows)
    finally:
        daemon.send_signal(signal.SIGCONT)
        daemon.terminate()
        daemon.wait(timeout=30)
    # A daemon without the read counter (an older --tree) has read the whole backlog once
    # every Xid in it is counted.
    got = (lines if counted >= want else 0.0) if read is None else read - base_read
    print(f"daemon tree: {args.tree or 'this checkout'}; load average {os.getloadavg()}")
    print(f"backlog: {lines} lines ({os.path.getsize(path) / 2**20:.0f} MiB), {want} Xids, "
          f"written while the daemon was stopped")
    print(f"ingested: {got:.0f} lines in {wall:.1f} s and {cpu:.1f} CPU-s of the daemon = "
          f"{got / wall:.0f} lines/s, {got / cpu:.0f} lines/CPU-s (the bench's scrapes "
          f"included); RSS peak {rss:.0f} MiB")
    exact = all(per_gpu.get(g, 0) == n for g, n in written.items())
    print(f"exactly once per GPU: {'yes' if exact else 'NO'} (written {written}, "
          f"counted {per_gpu})")
    return 0 if exact and counted >= want else 1


if __name__ == "__main__":
    sys.exit(main())
