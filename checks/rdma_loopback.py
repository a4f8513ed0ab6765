"""rdma_loopback: can each RDMA port move data at line rate? (``ib_write_bw`` loopback)

A NIC that trained at a lower rate, sits in a degraded PCIe slot, or whose GPUDirect path is
broken still shows ``ACTIVE`` in sysfs; only moving data shows it. For each active port this
check starts a perftest ``ib_write_bw`` server and a client on the same host and device (the
loopback Azure's HPC health checks use), 8 MiB messages (``rdma.message_bytes``),
``--report_gbits``, one TCP port per device (``tcp_port_base`` + n; a port another process
already holds — a stale perftest, another check — makes the server say "Couldn't listen to
port", and the check moves that device up by the number of devices, at most
``PORT_TRIES`` times, recording ``tcp_ports_tried``), and holds the measured
average against ``rdma.loopback_floor_gbit_per_s``: below → failed ``RdmaBandwidthLow``, within
the warning band above it → degraded ``RdmaBandwidthNearFloor``.

GPUDirect: with ``use_cuda`` (default true) and a perftest built with CUDA (its ``--help``
lists ``--use_cuda``), the buffers live in the GPU nearest the NIC (``pcie.gpu_nic`` when the
profile sets it, else the GPU on the same NUMA node with the nearest PCI bus number), named by
PCI address (``--use_cuda_bus_id``) where perftest supports it.

Nothing about perftest failing is a hardware verdict: a server or client that hangs past the
timeout is killed and the port is ``unknown`` (``PerftestHang``) naming the device; a non-zero
exit (``PerftestFailed``) or output without a usable report (``PerftestBadOutput``: no header or
row, a row whose numbers are NaN, negative or faster than any RDMA link, a report cut short
before its closing line, an average above the port's own rate) is ``unknown`` too;
a port that is not ACTIVE is ``skipped`` (``PortNotActive``, the rdma_ports check judges link
state); no perftest → ``skipped`` by the requirement gate.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from checks._builtin import BuiltinCheck
from checks._tool_output import output_tail
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.command import kill_group
from gpu_monitor.hw.perftest import BwReport, PerftestParseError, parse_report
from gpu_monitor.hw.sysfs_values import IbPort
from gpu_monitor.model import Action, Kind, Result, Status, canonical_pci, ib_target
from gpu_monitor.profiles.schema import COUNT, FRACTION, POSITIVE_INT, SECONDS, Bool, Int, Nullable

BANNER = "Waiting for client to connect"
# perftest's Gb/sec is payload; no loopback moves more than the port's data rate. The slack
# covers rounding in the rate file ("2.5 Gb/sec") and timer jitter, not a faster link.
RATE_SLACK = 0.05
# Ports tried per device when the server cannot listen (base + n, then + k x device count).
PORT_TRIES = 3
BUSY = "Couldn't listen to port"


class _Drain:
    """Reads a server's stdout/stderr in threads (a full pipe would stall it) and notes when
    its "waiting for client" banner appears."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self.banner = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(s, buf), daemon=True)
                         for s, buf in ((proc.stdout, self.out), (proc.stderr, self.err)) if s]
        for t in self._threads:
            t.start()

    def _read(self, stream: Any, buf: list[str]) -> None:
        for line in iter(stream.readline, ""):
            buf.append(line)
            if BANNER in line:
                self.banner.set()

    def wait_ready(self, timeout_s: float) -> None:
        """Until the banner shows, the server exits, or ``timeout_s`` passes (perftest may
        buffer its banner when stdout is a pipe, so the client is started anyway)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.banner.is_set():
            if self.proc.poll() is not None:
                return
            self.banner.wait(0.05)

    def close(self) -> None:
        for t in self._threads:
            t.join(timeout=2)

    @property
    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)


class RdmaLoopback(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP})
    summary = "ib_write_bw loopback per active RDMA port (GPUDirect when available) vs floor"
    requires = frozenset({"perftest", "infiniband"})
    invasive = True
    timeout = 1200.0
    reasons = (
        "RdmaBandwidthLow",
        "RdmaBandwidthNearFloor",
        "PortNotActive",
        "PerftestFailed",
        "PerftestHang",
        "PerftestBadOutput",
    )
    sections = ("rdma",)
    settings = {
        "use_cuda": Setting(Bool(), True, "GPU memory buffers (`--use_cuda`) when CUDA is "
                            "available", "Azure NHC (GPUDirect, `--use_cuda`) when available"),
        "iterations": Setting(POSITIVE_INT, 5000, "iterations",
                              "perftest default for bandwidth tests"),
        "tcp_port_base": Setting(Int(1024, 65535), 18510,
                                 "TCP port of the first HCA's server (one per HCA)",
                                 "Azure NHC (18510–18517, one per HCA)"),
        "gid_index": Setting(Nullable(COUNT), None, "GID index",
                             "RoCE fabrics need one (`ib_write_bw -x N`)"),
        "run_timeout_s": Setting(SECONDS, 120.0, "s; hard limit for one client run", "project"),
        "server_start_s": Setting(SECONDS, 5.0, "s to wait for the server to listen", "project"),
        "connect_retries": Setting(COUNT, 5, "client connection retries", "project"),
        "server_exit_s": Setting(SECONDS, 10.0, "s to wait for the server to exit after the "
                                 "client", "project"),
        "warning_band": Setting(
            FRACTION, 0.02, "fraction",
            "project: a healthy port reaches ~96% of line rate (fixture: 24056.72 MB/s = 201.8 "
            "Gb/s on HDR 200, perftest's MB being 2^20 bytes), i.e. ~385 on NDR, inside a 5% "
            "band above 380 (399)"),
    }
    condition = "RDMANetworkError"

    def run(self, ctx: Context) -> Sequence[Result]:
        ports = ctx.host.sysfs.infiniband_ports()
        s = self._settings(ctx)
        cuda = self._cuda_flag(ctx) if s["use_cuda"] else None
        results: list[Result] = []
        for n, port in enumerate(ports):
            target = ib_target(port.device, port.port)
            if not port.active:
                results.append(self.result(
                    ctx, Status.SKIPPED, target, "PortNotActive",
                    f"{target} is {port.state or 'in an unknown state'}, not ACTIVE: no "
                    "loopback test", {"state": port.state, "phys_state": port.phys_state}))
                continue
            gpu = _gpu_for(ctx, port) if cuda else None
            candidates = [p for p in (s["tcp_port_base"] + n + k * len(ports)
                                      for k in range(PORT_TRIES)) if p <= 65535]
            results.append(self._one(ctx, port, s, candidates, cuda, gpu))
        return results

    @staticmethod
    def _settings(ctx: Context) -> dict[str, Any]:
        name = RdmaLoopback.name
        return {
            "size": int(ctx.setting(name, "message_bytes", 8388608)),
            "iterations": int(ctx.setting(name, "iterations")),
            "tcp_port_base": int(ctx.setting(name, "tcp_port_base")),
            "floor": ctx.setting(name, "loopback_floor_gbit_per_s"),
            "band": float(ctx.setting(name, "warning_band", 0.05)),
            "use_cuda": bool(ctx.setting(name, "use_cuda")),
            "gid_index": ctx.setting(name, "gid_index"),
            "run_timeout_s": float(ctx.setting(name, "run_timeout_s")),
            "server_start_s": float(ctx.setting(name, "server_start_s")),
            "connect_retries": int(ctx.setting(name, "connect_retries")),
            "server_exit_s": float(ctx.setting(name, "server_exit_s")),
        }

    def _cuda_flag(self, ctx: Context) -> str | None:
        """``--use_cuda_bus_id`` or ``--use_cuda`` when perftest was built with CUDA."""
        if not ctx.host.nvml.available():
            return None
        out = ctx.host.commands.run(["ib_write_bw", "--help"], timeout=15.0)
        text = out.stdout + out.stderr
        if "--use_cuda_bus_id" in text:
            return "--use_cuda_bus_id"
        if "--use_cuda" in text:
            return "--use_cuda"
        return None

    # --- one port ------------------------------------------------------------------------------

    def _one(self, ctx: Context, port: IbPort, s: dict[str, Any], tcp_ports: list[int],
             cuda: str | None, gpu: tuple[int, str] | None) -> Result:
        """One device's loopback, on the first of ``tcp_ports`` its server can listen on."""
        tried: list[int] = []
        for tcp_port in tcp_ports:
            tried.append(tcp_port)
            outcome = self._attempt(ctx, port, s, tcp_port, cuda, gpu)
            if isinstance(outcome, Result):
                return outcome
            client, drain, server_done, details = outcome
            busy = client is None and BUSY in drain.text
            if not busy or tcp_port == tcp_ports[-1]:
                break
        details["tcp_ports_tried"] = tried
        return self._judge(ctx, ib_target(port.device, port.port), port, s, client, drain,
                           server_done, details)

    def _attempt(self, ctx: Context, port: IbPort, s: dict[str, Any], tcp_port: int,
                 cuda: str | None, gpu: tuple[int, str] | None
                 ) -> Result | tuple[Any, _Drain, bool, dict[str, Any]]:
        """Server and client on ``tcp_port``: what ran (for ``_judge``), or the result when
        the server could not even start."""
        target = ib_target(port.device, port.port)
        argv = ["ib_write_bw", "-d", port.device, "-i", str(port.port), "-p", str(tcp_port),
                "-s", str(s["size"]), "-n", str(s["iterations"]), "-F", "--report_gbits"]
        if s["gid_index"] is not None:
            argv += ["-x", str(s["gid_index"])]
        if cuda and gpu is not None:
            argv.append(f"{cuda}={gpu[1] if cuda == '--use_cuda_bus_id' else gpu[0]}")
        details: dict[str, Any] = {
            "command": " ".join(argv), "tcp_port": tcp_port, "message_bytes": s["size"],
            "gpudirect_gpu": gpu[0] if cuda and gpu is not None else None,
            "rate_gbit_per_s": port.rate_gbit,
        }
        runner = ctx.host.commands
        try:
            server = runner.popen(argv)
        except OSError as exc:
            return self.result(ctx, Status.UNKNOWN, target, "PerftestFailed",
                               f"cannot start the ib_write_bw server for {target}: {exc}",
                               details)
        drain = _Drain(server)
        client = None
        try:
            drain.wait_ready(s["server_start_s"])
            for attempt in range(max(1, s["connect_retries"])):
                if server.poll() is not None:
                    break
                client = runner.run([*argv, "127.0.0.1"], timeout=s["run_timeout_s"])
                if client.returncode != 0 and _refused(client.stdout + client.stderr):
                    time.sleep(0.5 * (attempt + 1))  # the server may not listen yet
                    continue
                break
            ok = client is not None and client.returncode == 0
            server_done = _wait(server, s["server_exit_s"] if ok else 1.0)
        finally:
            if server.poll() is None:
                kill_group(server)
            drain.close()
        details["server_exit_code"] = server.returncode if server_done else None
        return client, drain, server_done, details

    def _judge(self, ctx: Context, target: str, port: IbPort, s: dict[str, Any], client: Any,
               drain: _Drain, server_done: bool, details: dict[str, Any]) -> Result:
        details["server_banner_seen"] = drain.banner.is_set()
        if client is None:
            details["server_output_tail"] = output_tail(drain.text)
            return self.result(
                ctx, Status.UNKNOWN, target, "PerftestFailed",
                f"ib_write_bw server for {target} exited {drain.proc.returncode} before a "
                f"client could connect: {_last_line(''.join(drain.err) or ''.join(drain.out))}",
                details)
        details["client_exit_code"] = client.returncode
        if client.timed_out or client.returncode is None:
            details["client_output_tail"] = output_tail(client.stdout + client.stderr)
            details["server_output_tail"] = output_tail(drain.text)
            return self.result(
                ctx, Status.UNKNOWN, target, "PerftestHang",
                f"ib_write_bw loopback on {target} did not finish within "
                f"{s['run_timeout_s']:g} s; server and client killed", details)
        if client.returncode != 0:
            details["client_output_tail"] = output_tail(client.stdout + client.stderr)
            details["server_output_tail"] = output_tail(drain.text)
            if not server_done and not drain.banner.is_set():
                return self.result(
                    ctx, Status.UNKNOWN, target, "PerftestHang",
                    f"ib_write_bw server for {target} never accepted a connection "
                    f"({s['connect_retries']} tries); killed", details)
            return self.result(
                ctx, Status.UNKNOWN, target, "PerftestFailed",
                f"ib_write_bw client on {target} exited {client.returncode}: "
                f"{_last_line(client.stderr or client.stdout)}", details)
        report, problem = _usable(client.stdout)
        if report is None:  # the server prints the same report; use it if only the client's is bad
            report, _ = _usable("".join(drain.out))
        if report is None:
            details["client_output_tail"] = output_tail(client.stdout)
            code = drain.proc.returncode
            if server_done and code not in (0, None):
                # No report because the server failed (it may have died while the client was
                # still starting): the server's error is the cause worth naming.
                details["server_output_tail"] = output_tail(drain.text)
                return self.result(
                    ctx, Status.UNKNOWN, target, "PerftestFailed",
                    f"ib_write_bw server for {target} exited {code}: "
                    f"{_last_line(''.join(drain.err) or ''.join(drain.out))}", details)
            return self.result(ctx, Status.UNKNOWN, target, "PerftestBadOutput",
                               f"ib_write_bw on {target}: {problem}", details)
        row = report.row_for(s["size"])
        if row is None:
            details["sizes_reported"] = list(report.sizes())
            return self.result(ctx, Status.UNKNOWN, target, "PerftestBadOutput",
                               f"ib_write_bw on {target} reported no {s['size']}-byte row",
                               details)
        rate = port.rate_gbit
        if rate is not None and row.gbit_per_s > rate * (1 + RATE_SLACK):
            details.update({"bw_gbit_per_s_reported": round(row.gbit_per_s, 3),
                            "client_output_tail": output_tail(client.stdout)})
            return self.result(
                ctx, Status.UNKNOWN, target, "PerftestBadOutput",
                f"ib_write_bw on {target} reported {row.gbit_per_s:.6g} Gb/s, above the port's "
                f"rate of {rate:g} Gb/s: a measurement error, not a pass", details)
        gbit = round(row.gbit_per_s, 3)
        floor = s["floor"]
        details.update({"bw_gbit_per_s": gbit, "bw_peak_gbit_per_s": round(row.peak_gbit_per_s, 3),
                        "iterations": row.iterations, "unit_reported": row.unit,
                        "floor_gbit_per_s": floor, "warning_band": s["band"],
                        "server_finished": server_done})
        if floor is None:
            return self.ok(ctx, target, f"{gbit:g} Gb/s loopback (no floor in the profile)",
                           details)
        floor = float(floor)
        if gbit < floor:
            return self.result(ctx, Status.FAILED, target, "RdmaBandwidthLow",
                               f"{target} loopback {gbit:g} Gb/s is below the floor "
                               f"{floor:g} Gb/s", details, Action.NONE)
        if gbit < floor * (1 + s["band"]):
            return self.result(ctx, Status.DEGRADED, target, "RdmaBandwidthNearFloor",
                               f"{target} loopback {gbit:g} Gb/s is within "
                               f"{s['band']:.0%} of the floor {floor:g} Gb/s", details,
                               Action.WATCH)
        return self.ok(ctx, target, f"{gbit:g} Gb/s loopback (floor {floor:g})", details)


def _usable(text: str) -> tuple[BwReport | None, str]:
    """The report in ``text`` if it parses and is complete, else (None, what is wrong)."""
    try:
        report = parse_report(text)
    except PerftestParseError as exc:
        return None, str(exc)
    if not report.complete:
        return None, ("the report ends before perftest's closing line after its last row "
                      "(output cut short)")
    return report, ""


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _refused(text: str) -> bool:
    """perftest's words when its TCP exchange found no server listening."""
    return "Couldn't connect to" in text or "Unable to open file descriptor" in text


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _gpu_for(ctx: Context, port: IbPort) -> tuple[int, str] | None:
    """(index, PCI address) of the GPU that should hold the buffers for ``port``'s device."""
    try:
        gpus = [g for g in ctx.host.nvml.gpus() if g.identified]
    except Exception:  # noqa: BLE001 - no GPU means host memory, not a failure
        return None
    if not gpus:
        return None
    pairing = ctx.profile.get("pcie.gpu_nic") or ()
    for index, nic in enumerate(pairing):
        if nic == port.device:
            found = next((g for g in gpus if g.index == index), None)
            if found is not None:
                return found.index, str(found.pci_bus_id)
    if not port.pci_address:
        return gpus[0].index, str(gpus[0].pci_bus_id)
    nic = canonical_pci(port.pci_address)

    def distance(g: Any) -> tuple[int, int, int]:
        addr = canonical_pci(g.pci_bus_id)
        try:
            numa = ctx.host.nvml.numa_node(g.index)
        except Exception:  # noqa: BLE001
            numa = None
        other_numa = int(port.numa_node is not None and numa is not None
                         and numa != port.numa_node)
        other_domain = int(addr[:4] != nic[:4])
        return other_numa + other_domain, abs(int(addr[5:7], 16) - int(nic[5:7], 16)), g.index

    best = min(gpus, key=distance)
    return best.index, str(best.pci_bus_id)
