"""fabric/transport.py: NCCL's INFO lines name the transport; the capture sets NCCL up to
write them where the probe reads them back."""

from __future__ import annotations

import pytest

from gpu_monitor.fabric.transport import (
    Transport,
    capture_nccl_debug,
    merge_transports,
    parse_nccl_debug,
)

# --- transports -------------------------------------------------------------------------------------

# Lines as NCCL prints them with NCCL_DEBUG=INFO (formats from public NCCL issue reports).
IB_LINES = [
    "node-a:120890:121560 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>",
    "node-a:120890:121560 [0] NCCL INFO Using network IB",
    "node-a:120890:121560 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "node-a:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA",
    "node-a:120890:121563 [3] NCCL INFO Channel 01 : 3[ca000] -> 2[c7000] [send] via NET/IB/2/GDRDMA",
    "node-a:120890:121563 [3] NCCL INFO Channel 02 : 3[3] -> 4[4] via SHM/direct/direct",
]
SOCKET_LINES = [
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO NET/IB : No device found.",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Failed to initialize NET plugin IB",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.56.0.6<0>",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Initialized NET plugin Socket",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Assigned NET plugin Socket to comm",
    "nccl-benchmark-csgjr:1:1 [0] NCCL INFO Using network Socket",
    "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
]
IBEXT_LINES = [
    "hostname-test:987:1260 [7] NCCL INFO Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2",
    "hostname-test:986:1254 [6] NCCL INFO Channel 00/0 : 6[6] -> 38[6] [receive] via NET/IBext_v8/1",
]
INTRA_LINES = [
    "w-0:5663:5809 [0] NCCL INFO Channel 04/0 : 0[0] -> 7[7] via P2P/CUMEM",
    "w-0:5663:5809 [0] NCCL INFO Channel 05/0 : 0[0] -> 7[7] via P2P/CUMEM",
]


@pytest.mark.parametrize("lines, kind, network, rdma, paths", [
    (IB_LINES, "rdma", "IB", True, {"P2P": 1, "NET/IB": 2, "SHM": 1}),
    (SOCKET_LINES, "socket", "Socket", False, {"NET/Socket": 1}),
    (SOCKET_LINES[:-1], "socket", "Socket", False, {}),  # no channel line: "Using network"
    (IBEXT_LINES, "rdma", "IBext_v8", True, {"NET/IBext_v8": 2}),
    (INTRA_LINES, "intra-node", None, None, {"P2P": 2}),
    (["just a line", "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"], "unknown", None, None, {}),
])
def test_nccl_debug_lines_name_the_transport(lines, kind, network, rdma, paths):
    t = parse_nccl_debug(lines)
    assert (t.kind, t.network, t.rdma, dict(t.paths)) == (kind, network, rdma, paths)


def test_gdrdma_connections_are_counted():
    assert parse_nccl_debug(IB_LINES).gdr == 2


def test_one_rank_on_sockets_makes_the_group_a_socket_fallback():
    ib, sock = parse_nccl_debug(IB_LINES), parse_nccl_debug(SOCKET_LINES)
    merged = merge_transports([ib, ib, sock, Transport()])
    assert merged.kind == "socket" and merged.paths["NET/IB"] == 4
    assert merge_transports([ib, ib]).kind == "rdma"
    assert merge_transports([Transport(), Transport()]).kind == "unknown"


def test_capture_sets_info_init_net_and_a_private_file(tmp_path):
    env: dict[str, str] = {}
    log = capture_nccl_debug(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log") and not log.echo
    path = env["NCCL_DEBUG_FILE"].replace("%h", "anyhost").replace("%p", str(__import__("os").getpid()))
    with open(path, "w") as fh:
        fh.write("\n".join(IB_LINES) + "\n")
    assert parse_nccl_debug(log.lines()).kind == "rdma"
    # A user's own subsystems are kept, ours added; their file is read, not replaced.
    env = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "COLL"}
    log = capture_nccl_debug(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "COLL,INIT,NET"
    assert log.echo
    env = {"NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}
    assert capture_nccl_debug(env).pattern == "/var/log/nccl.%h.%p"

