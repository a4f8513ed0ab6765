"""Fake ``dcgmi`` and ``ib_write_bw`` executables for the simulated node.

``install_tools(bin_dir, state_file)`` writes two small Python programs (``#!<this python>``)
into ``bin_dir``, which the simulated host's ``CommandRunner`` puts first on PATH. Each run
reads the simulation state file (``SimulatedNode._write_state``) and prints what the real tool
prints, with the simulated values, so the real parsers and checks run unchanged:

- ``dcgmi diag -r LEVEL [-j] [--host H]``: the DCGM 3.x JSON shape (``"DCGM GPU Diagnostic"``,
  per-GPU ``gpu_ids`` results, upper-case statuses) or the text table. A test named by a
  ``dcgm-fail`` fault is reported ``FAIL`` on that GPU with the warning text, ``error_id``,
  category and severity DCGM uses for that test (dcgm_errors.h), and the exit status is the one
  dcgmi returns for a failed run (226 = NVVS_ERROR, 205 = NVVS_ISOLATE_ERROR). A failing test
  that the level does not include is added to the run, so the fault is seen at any level.
  ``dcgm_available: false`` (or a ``--host`` other than this node) prints dcgmi's
  "unable to establish a connection" errors and exits non-zero.
- ``ib_write_bw``: server/client semantics over a real TCP socket on ``-p PORT``. Without a
  server address it is the server: it prints the "Waiting for client to connect..." banner,
  accepts one client, then prints the report. With an address it is the client: it connects
  (failing like perftest when nobody listens), reports ``loopback_gbit`` of its ``-d`` device
  in ``Gb/sec`` with ``--report_gbits`` or ``MB/sec`` (2^20 bytes) without, and exits.
  ``--use_cuda=N`` prints perftest's CUDA set-up lines and fails for a GPU that does not exist;
  a device that does not exist or a port that is not ACTIVE fails as perftest does.

Bad output on purpose: a ``dcgm-output`` fault makes ``dcgmi`` print the text table or JSON
whatever ``-j`` says, leave GPUs out of every result, print another status word for every pass,
print a recorded file instead, stop after N lines or exit with another status; an
``ib-bw-output`` fault cuts ``ib_write_bw``'s report short (before or after its header, inside
the row, before the closing rule) or changes its exit status. ``ib-bw`` values are printed as
given, NaN, negative or 10^30 included.

The programs use only the standard library and never touch anything but the state file and the
one TCP port they are given.
"""

from __future__ import annotations

import os
import stat
import sys

_COMMON = r'''
import json
import os
import sys

STATE_FILE = __STATE_FILE__


def load_state():
    path = os.environ.get("GPU_MONITOR_SIM_STATE") or STATE_FILE
    with open(path) as fh:
        return json.load(fh)


def gpus(state):
    return [g for g in state.get("gpus", []) if not g.get("missing") and not g.get("lost")]
'''

_DCGMI = r'''
LEVELS = {"1": 1, "quick": 1, "short": 1, "2": 2, "medium": 2, "3": 3, "long": 3,
          "4": 4, "xlong": 4}
DEPLOYMENT = ["Denylist", "NVML Library", "CUDA Main Library",
              "Permissions and OS-related Blocks", "Persistence Mode",
              "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes",
              "Inforom", "Fabric Manager"]
# (category, plugin test) by the level that adds it, in DCGM's order.
PLUGINS = [(2, "Integration", "pcie"), (2, "Hardware", "memory"),
           (3, "Hardware", "diagnostic"), (3, "Stress", "targeted_stress"),
           (3, "Stress", "targeted_power"), (3, "Stress", "memory_bandwidth"),
           (4, "Hardware", "memtest"), (4, "Hardware", "pulse_test")]
TEXT_NAMES = {"pcie": "PCIe", "memory": "GPU Memory", "diagnostic": "Diagnostic",
              "targeted_stress": "Targeted Stress", "targeted_power": "Targeted Power",
              "memory_bandwidth": "Memory Bandwidth", "memtest": "Memtest",
              "pulse_test": "Pulse Test", "Environmental Variables": "Environment Variables",
              "Permissions and OS-related Blocks": "Permissions and OS Blocks"}
# error_id, error_category, error_severity, message (dcgm_errors.h ids and message formats).
FAILURES = {
    "memory": (52, 10, 2, "Found 1 faulty memory elements on GPU {g}"),
    "memtest": (58, 10, 2, "A memory mismatch was detected on GPU {g}, but no error was "
                           "reported by CUDA or NVML."),
    "diagnostic": (52, 10, 2, "Found 16 faulty memory elements on GPU {g}"),
    "pcie": (30, 13, 4, "Bandwidth of GPU {g} in direction host to device of 6.21 did not "
                        "exceed minimum required bandwidth of 20.00."),
    "targeted_stress": (50, 1, 4, "Max stress level of 11835.2 did not reach desired stress "
                                  "level of 29250.0 for GPU {g}"),
    "targeted_power": (63, 14, 4, "Max power of 412.3 did not reach desired power minimum "
                                  "target_power_min_ratio of 525.0 for GPU {g}"),
    "memory_bandwidth": (62, 1, 4, "GPU {g} only achieved a memory bandwidth of 1203.55 GB/s, "
                                   "failing to meet 1905.00 GB/s for test 0"),
    "persistence mode": (29, 8, 5, "Persistence Mode: Persistence mode for GPU {g} is disabled. "
                                   "Enable persistence mode by running \"nvidia-smi -i <gpuId> "
                                   "-pm 1 \" as root."),
    "page retirement/row remap": (85, 10, 6, "GPU {g} had memory errors and row remappings "
                                             "are pending"),
    "inforom": (9, 15, 4, "A corrupt InfoROM has been detected in GPU {g}."),
}
GENERIC = (44, 16, 3, "There was an internal error during the test: '{t} failed on GPU {g}'")
CONNECT_ERRORS = ("Error: unable to establish a connection to the specified host: {h}\n"
                  "Error: Unable to connect to host engine. Host engine connection "
                  "invalid/disconnected.\n")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "unix:///tmp/nv-hostengine")


def usage(out):
    out.write("Usage: dcgmi <subsystem>\n"
              "  diag -r <level> [-j] [--host <ip:port>] [-p <parameters>]\n")


def option(args, *names):
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def plan(level, failing):
    """[(category, test)] the run includes, plus failing tests outside the level."""
    tests = [("Deployment", t) for t in DEPLOYMENT]
    tests += [(c, t) for lvl, c, t in PLUGINS if lvl <= level]
    known = {t.lower() for _, t in tests}
    for name in failing:
        if name.lower() not in known:
            cat = next((c for _, c, t in PLUGINS if t.lower() == name.lower()), None)
            if cat is None:
                cat = "Deployment" if name.lower() in {t.lower() for t in DEPLOYMENT} \
                    else "Hardware"
            tests.append((cat, name))
            known.add(name.lower())
    return tests


def failure(test, gpu):
    eid, cat, sev, msg = FAILURES.get(test.lower(), GENERIC)
    return {"warning": msg.format(g=gpu, t=test), "error_id": eid, "error_category": cat,
            "error_severity": sev}


def info(test, gpu):
    if test == "pcie":
        return [f"GPU {gpu} GPU to Host bandwidth:\t\t53.08 GB/s",
                f"GPU {gpu} Host to GPU bandwidth:\t\t52.13 GB/s",
                f"GPU {gpu} bidirectional bandwidth:\t100.42 GB/s"]
    if test == "memory":
        return ["Allocated 83353206374 bytes (97.2%)"]
    return []


def outcomes(state, level, drop=()):
    """{(category, test): {gpu: failure dict or None}} for every test of the run; GPUs in
    ``drop`` are left out of every result (a run that did not cover them)."""
    devices = [g for g in gpus(state) if g["index"] not in drop]
    failing = {}
    for g in devices:
        for t in g.get("dcgm_failures", []):
            failing.setdefault(t.lower(), set()).add(g["index"])
    names = []
    for g in devices:
        names += [t for t in g.get("dcgm_failures", []) if t not in names]
    out = {}
    for cat, test in plan(level, names):
        bad = failing.get(test.lower(), set())
        out[(cat, test)] = {g["index"]: (failure(test, g["index"]) if g["index"] in bad
                                         else None) for g in devices}
    return out


def as_json(results, pass_word="PASS"):
    categories = []
    for (cat, test), per_gpu in results.items():
        entry = next((c for c in categories if c["category"] == cat), None)
        if entry is None:
            entry = {"category": cat, "tests": []}
            categories.append(entry)
        rows = []
        passed = [g for g, f in per_gpu.items() if f is None]
        if cat == "Deployment" and passed:
            rows.append({"gpu_ids": ",".join(str(g) for g in passed), "status": pass_word})
            per_gpu = {g: f for g, f in per_gpu.items() if f is not None}
        for gpu, fail in per_gpu.items():
            row = {"gpu_ids": str(gpu)}
            lines = info(test, gpu)
            if lines:
                row["info"] = lines
            row["status"] = pass_word if fail is None else "FAIL"
            if fail is not None:
                row["warnings"] = [fail]
            rows.append(row)
        entry["tests"].append({"name": test, "results": rows})
    doc = {"DCGM GPU Diagnostic": {"test_categories": categories, "version": "3.3.9"}}
    return json.dumps(doc, indent="\t", separators=(",", " : ")) + "\n"


def cell_rows(name, text, width=46):
    chunks = [text[i:i + width] for i in range(0, len(text), width)] or [""]
    return [(name if i == 0 else "", c) for i, c in enumerate(chunks)]


def as_text(results, state, pass_word="Pass", drop=()):
    left, right = 27, 48
    border = "+" + "-" * left + "+" + "-" * right + "+"

    def section(name, first):
        label = f"-----  {name}  ".ljust(left, "-")
        edge = "|" if first else "+"
        return edge + label + "+" + "-" * right + edge

    def row(name, value):
        return f"| {name:<{left - 2}} | {value:<{right - 2}} |"

    devices = [g for g in gpus(state) if g["index"] not in drop]
    lines = ["Successfully ran diagnostic for group.", border,
             row("Diagnostic", "Result"), "+" + "=" * left + "+" + "=" * right + "+",
             section("Metadata", True), row("DCGM Version", "3.3.9"),
             row("Driver Version Detected", state.get("driver_version", "")),
             row("GPU Device IDs Detected", ",".join("2330" for _ in devices))]
    current = None
    for (cat, test), per_gpu in results.items():
        if cat != current:
            lines.append(section(cat, cat == "Deployment"))
            current = cat
        name = TEXT_NAMES.get(test, test)
        passed = [g for g, f in per_gpu.items() if f is None]
        failed = {g: f for g, f in per_gpu.items() if f is not None}
        if not failed:
            lines.append(row(name, pass_word if cat == "Deployment" else f"{pass_word} - All"))
            continue
        first = name
        if passed:
            lines.append(row(first, f"{pass_word} - GPUs: " + ", ".join(str(g) for g in passed)))
            first = ""
        for gpu, fail in failed.items():
            lines.append(row(first, f"Fail - GPU: {gpu}"))
            first = ""
            for n, chunk in cell_rows("Warning", f"GPU {gpu} " + fail["warning"]):
                lines.append(row(n, chunk))
    lines.append(border)
    return "\n".join(lines) + "\n"


def cut_at(lines, section):
    """Where output cut before ``section`` ends: the line that opens that category (text
    ``-----  Name  --``, JSON ``"category" : "Name"``), or for ``end`` the closing line."""
    if section == "end":
        return max(0, len(lines) - 1)
    for i, line in enumerate(lines):
        if f"  {section}  ".encode() in line or f'"{section}"'.encode() in line:
            return i
    return len(lines)


def diag(args, state):
    level_arg = option(args, "-r", "--run") or "1"
    level = LEVELS.get(level_arg.lower())
    if level is None:
        sys.stderr.write(f"Error: invalid run level '{level_arg}'\n")
        return 255
    # A dcgm-output fault: what this dcgmi prints and returns instead of a faithful report.
    bad = state.get("dcgm_output") or {}
    drop = {int(g) for g in bad.get("drop", [])}
    results = outcomes(state, level, drop)
    fails = [f for per in results.values() for f in per.values() if f is not None]
    json_out = bad.get("format", "json" if "-j" in args or "--json" in args else "text")
    if bad.get("file"):
        with open(bad["file"], "rb") as fh:
            data = fh.read()
    elif json_out == "json":
        data = as_json(results, bad.get("status", "PASS")).encode()
    else:
        data = as_text(results, state, bad.get("status", "Pass"), drop).encode()
    lines = data.splitlines(keepends=True)
    if bad.get("cut"):
        lines = lines[:cut_at(lines, bad["cut"])]
    if bad.get("lines") is not None:
        lines = lines[:int(bad["lines"])]
    data = b"".join(lines)
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    if bad.get("exit") is not None:
        return int(bad["exit"])
    if not fails:
        return 0
    return 205 if any(f["error_severity"] == 2 for f in fails) else 226


def main(argv):
    args = argv[1:]
    if not args or args[0] in ("-h", "--help"):
        usage(sys.stdout if args else sys.stderr)
        return 0 if args else 255
    state = load_state()
    host = option(args, "--host") or "localhost"
    name = host.split(":")[0] if not host.startswith("unix") else host
    if not state.get("dcgm_available", True) or name not in (*LOCAL_HOSTS, state.get("hostname")):
        sys.stdout.write(CONNECT_ERRORS.format(h=name))
        return 236
    if args[0] == "diag":
        return diag(args[1:], state)
    sys.stderr.write(f"dcgmi: subsystem '{args[0]}' is not simulated\n")
    usage(sys.stderr)
    return 255


sys.exit(main(sys.argv))
'''

_IB_WRITE_BW = r'''
import socket
import time

RULE = "-" * 87
MIB = 1 << 20
HELP = """Usage:
  ib_write_bw            start a server and wait for connection
  ib_write_bw <host>     connect to server at <host>

Options:
  -d, --ib-dev=<dev>  Use IB device <dev> (default first device found)
  -i, --ib-port=<port>  Use port <port> of IB device (default 1)
  -p, --port=<port>  Listen on/connect to port <port> (default 18515)
  -s, --size=<size>  Size of message to exchange (default 65536)
  -n, --iters=<iters>  Number of exchanges (at least 5, default 5000)
  -x, --gid-index=<index>  Test uses GID with GID index
  -F, --CPU-freq  Do not show a warning even if cpufreq_ondemand module is loaded
      --report_gbits  Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)
      --use_cuda=<cuda device id>  Use CUDA specific device for GPUDirect RDMA testing
      --use_cuda_bus_id=<cuda full BUS id>  Use CUDA specific device, based on its full PCIe address, for GPUDirect RDMA testing
"""


def parse(args):
    opts = {"dev": None, "ib_port": 1, "port": 18515, "size": 65536, "iters": 5000,
            "gbits": False, "cuda": None, "server": None, "help": False}
    keys = {"-d": "dev", "--ib-dev": "dev", "-i": "ib_port", "--ib-port": "ib_port",
            "-p": "port", "--port": "port", "-s": "size", "--size": "size", "-n": "iters",
            "--iters": "iters", "-x": "gid", "--gid-index": "gid", "--use_cuda": "cuda",
            "--use_cuda_bus_id": "cuda_bus",
            "-D": "duration", "--duration": "duration", "-q": "qps", "--qp": "qps"}
    ints = {"ib_port", "port", "size", "iters", "cuda"}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help"):
            opts["help"] = True
        elif a in ("-F", "--CPU-freq", "--report_gbits", "-a", "--all", "-b", "--bidirectional",
                   "--perform_warm_up", "-R", "--rdma_cm"):
            opts["gbits"] = opts["gbits"] or a == "--report_gbits"
        elif "=" in a and a.split("=", 1)[0] in keys:
            k, v = a.split("=", 1)
            opts[keys[k]] = int(v) if keys[k] in ints else v
        elif a in keys:
            if i + 1 >= len(args):
                raise SystemExit(f" option {a} requires an argument")
            i += 1
            opts[keys[a]] = int(args[i]) if keys[a] in ints else args[i]
        elif a.startswith("-"):
            raise SystemExit(f"ib_write_bw: unrecognized option '{a}'")
        else:
            opts["server"] = a
        i += 1
    return opts


def find_port(state, opts):
    ports = state.get("ib_ports", [])
    if opts["dev"] is None:
        return ports[0] if ports else None
    for p in ports:
        if p["device"] == opts["dev"] and int(p["port"]) == int(opts["ib_port"]):
            return p
    return None


def cuda_setup(state, index, size):
    devices = gpus(state)
    print("initializing CUDA")
    print("Listing all CUDA devices in system:")
    for n, g in enumerate(devices):
        bus = g["pci_bus_id"].split(":", 1)[1].rsplit(".", 1)[0]
        print(f"CUDA device {n}: PCIe address is {bus}")
    if not 0 <= index < len(devices):
        print(f"No CUDA device {index} in the system ({len(devices)} devices)")
        return False
    print(f"\nPicking device No. {index}")
    print(f"[pid = {os.getpid()}, dev = {index}] device name = [{devices[index]['name']}]")
    print("creating CUDA Ctx")
    print("making it the current CUDA Ctx")
    print(f"cuMemAlloc() of a {2 * size} bytes GPU buffer")
    print("allocated GPU buffer address at 00007f3a2c000000 pointer=0x7f3a2c000000")
    return True


def header(opts, port, lid, qpn, peer_qpn):
    print(RULE)
    print("                    RDMA_Write BW Test")
    print(f" Dual-port       : OFF\t\tDevice         : {port['device']}")
    print(" Number of qps   : 1\t\tTransport type : IB")
    print(" Connection type : RC\t\tUsing SRQ      : OFF")
    print(" PCIe relax order: ON")
    print(" ibv_wr* API     : ON")
    print(" TX depth        : 128")
    print(" CQ Moderation   : 100")
    print(" Mtu             : 4096[B]")
    link = "IB" if port.get("link_layer", "InfiniBand") == "InfiniBand" else "Ethernet"
    print(f" Link type       : {link}")
    print(" Max inline data : 0[B]")
    print(" rdma_cm QPs\t : OFF")
    print(" Data ex. method : Ethernet")
    print(RULE)
    print(f" local address: LID {lid:#06x} QPN {qpn:#06x} PSN 0x3c9e82 RKey 0x080359 "
          "VAddr 0x007f9fc479c000")
    print(f" remote address: LID {lid:#06x} QPN {peer_qpn:#06x} PSN 0xbd024b RKey 0x080258 "
          "VAddr 0x007fe62504b000")
    print(RULE)


def report(opts, numbers, cut=None):
    """The bandwidth report; an ib-bw-output fault's ``cut`` ends it early: before the header,
    after it, inside the row's average column, or before the closing rule."""
    unit = "Gb/sec" if opts["gbits"] else "MB/sec"
    if cut == "before-report":
        return
    print(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    if cut == "after-header":
        return
    peak, avg, rate = numbers
    head = f" {opts['size']:<10d} {opts['iters']:<16d} {peak:<19.2f} "
    if cut == "mid-row":
        print(head + f"{avg:.2f}"[:2])
        return
    print(head + f"{avg:<16.2f}\t   {rate:.6f}")
    if cut != "before-rule":
        print(RULE)


def measure(opts, port):
    gbit = float(port.get("loopback_gbit", 0.0))
    bytes_per_s = gbit * 1e9 / 8
    avg = gbit if opts["gbits"] else bytes_per_s / MIB
    rate = bytes_per_s / opts["size"] / 1e6
    return [round(avg * 1.0004, 2), round(avg, 2), rate]


def lines(sock):
    buf = b""
    while True:
        data = sock.recv(4096)
        if not data:
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


def server(opts, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", opts["port"]))
        sock.listen(1)
    except OSError:
        sys.stderr.write(f"Couldn't listen to port {opts['port']}\n"
                         "Unable to open file descriptor for socket connection")
        return 1
    print("\n************************************")
    print("* Waiting for client to connect... *")
    print("************************************", flush=True)
    conn, _ = sock.accept()
    with conn:
        messages = lines(conn)
        hello = next(messages)
        conn.sendall((json.dumps({"qpn": 0x095E}) + "\n").encode())
        done = next(messages, None)
    if done is None:
        sys.stderr.write(" Failed to exchange data between server and clients\n")
        return 1
    header(opts, port, hello["lid"], 0x095E, hello["qpn"])
    bad = port.get("output") or {}
    report(opts, done["numbers"], bad.get("cut"))
    return int(bad.get("exit", 0))


def client(opts, port):
    try:
        conn = socket.create_connection((opts["server"], opts["port"]), timeout=10)
    except OSError:
        sys.stderr.write(f"Couldn't connect to {opts['server']}:{opts['port']}\n"
                         "Unable to open file descriptor for socket connection Unable to init "
                         "the socket connection\n")
        return 1
    conn.settimeout(None)
    with conn:
        conn.sendall((json.dumps({"lid": 0xD06, "qpn": 0x095F}) + "\n").encode())
        peer = next(lines(conn), None)
        if peer is None:
            sys.stderr.write(" Failed to exchange data between server and clients\n")
            return 1
        numbers = measure(opts, port)
        time.sleep(0.02)
        header(opts, port, 0xD06, 0x095F, peer["qpn"])
        bad = port.get("output") or {}
        report(opts, numbers, bad.get("cut"))
        sys.stdout.flush()
        conn.sendall((json.dumps({"numbers": numbers}) + "\n").encode())
    return int(bad.get("exit", 0))


def main(argv):
    opts = parse(argv[1:])
    if opts["help"]:
        print(HELP)
        return 0
    state = load_state()
    port = find_port(state, opts)
    if port is None:
        sys.stderr.write(f" IB device {opts['dev']} not found\n"
                         " Unable to find the Infiniband/RoCE device\n")
        return 1
    if port.get("state", "ACTIVE") != "ACTIVE":
        sys.stderr.write(f" Port number {opts['ib_port']} state is {port['state'].title()}\n"
                         " Couldn't set the link layer\n Couldn't get context for the device\n")
        return 1
    if opts.get("cuda_bus") is not None:
        want = opts["cuda_bus"].lower().split(":", 1)[-1] if opts["cuda_bus"].count(":") > 1 \
            else opts["cuda_bus"].lower()
        opts["cuda"] = next((n for n, g in enumerate(gpus(state))
                             if g["pci_bus_id"].lower().endswith(want)), len(gpus(state)))
    if opts["cuda"] is not None and not cuda_setup(state, opts["cuda"], opts["size"]):
        sys.stderr.write(" Couldn't create IB resources\n")
        return 1
    return client(opts, port) if opts["server"] else server(opts, port)


sys.exit(main(sys.argv))
'''

TOOLS = {"dcgmi": _DCGMI, "ib_write_bw": _IB_WRITE_BW}


def render(tool: str, state_file: str, python: str | None = None) -> str:
    """The source of one fake tool bound to ``state_file``."""
    body = _COMMON.replace("__STATE_FILE__", repr(os.path.abspath(state_file)))
    return (f"#!{python or sys.executable}\n"
            f'"""Simulated {tool} (gpu-monitor sim/tools.py): prints the real tool\'s formats '
            f'with the simulated node\'s values."""\n' + body + TOOLS[tool])


def install_tools(bin_dir: str, state_file: str, only: tuple[str, ...] | None = None) -> list[str]:
    """Write the fake tools into ``bin_dir`` (executable); returns their paths. ``only`` limits
    which are installed (a simulated node without DCGM or perftest has no such binary)."""
    os.makedirs(bin_dir, exist_ok=True)
    paths = []
    for tool in TOOLS:
        if only is not None and tool not in only:
            continue
        path = os.path.join(bin_dir, tool)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(render(tool, state_file))
        mode = os.stat(tmp).st_mode
        os.chmod(tmp, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, path)
        paths.append(path)
    return paths
