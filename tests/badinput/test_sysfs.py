"""Bad input, sysfs values: every sysfs file a check judges, in every shape a value can go bad.

The table is generated: ``JUDGED`` lists each file, the check that judges it and the target
whose result must then be ``unknown`` (never ``ok``, and never ``failed`` either: garbage is no
evidence of a fault), naming the file; ``SHAPES`` lists what can be wrong with a value. Each
case runs ``gpu-monitor check`` in-process through the harness:

- RDMA port files on a copy of gpud's recorded H100 ``/sys/class/infiniband`` tree, and AER /
  identity files of a GPU function rendered by the simulated node's tree writer, in real-host
  mode (``--path.sysfs``/``--path.procfs`` over the tree the case built; rdma_ports and pcie_aer
  need no NVML);
- PCIe link and NUMA files through the simulated node (``--simulate h100-sxm-8`` with the
  ``sysfs`` fault), since the pcie check needs NVML beside sysfs.

"unreadable" cannot be made with file modes when the tests run as root, so it is injected at the
reader's one I/O boundary (``gpu_monitor.hw.sysfs._read_bytes``), as the reader documents.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_monitor.hw import sysfs as sysfs_mod
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.node import build_spec
from gpu_monitor.sim.sysfs_tree import NOT_UTF8, render_aer, write_tree
from tests.badinput.harness import Case, ids, run_case
from tests.conftest import FIXTURES

GPU_ADDR = "0000:53:00.0"  # gpu:0 of the simulated HGX H100 board
IB_TREE = FIXTURES / "sysfs" / "gpud_h100" / "sys-class-infiniband-h100.0"
HUGE = "1" + "0" * 30  # 10^30


@dataclass(frozen=True)
class Judged:
    """A file a check judges; ``healthy`` holds ``key + number`` once, and shapes swap it."""

    mode: str  # "ib-tree" | "pci-tree" | "sim"
    owner: str  # the inject target (sim) / what the path is relative to
    file: str
    check: str
    target: str
    healthy: str
    number: str
    negative: str  # a negative number that is not a legal value here ("-1" may be one)
    key: str = ""  # what precedes the number (an AER file's TOTAL_ERR_* line)
    legit_absent: bool = False  # the kernel may leave the file out: "missing" is no case

    def with_number(self, new: str) -> str:
        return self.healthy.replace(self.key + self.number, self.key + new) + "\n"

    @property
    def huge(self) -> str:
        return "0x1" + "0" * 30 if self.number.startswith("0x") else HUGE

    @property
    def where(self) -> str:
        """The path suffix that names the file (also what the result must mention)."""
        if self.owner.startswith("ib:"):
            _, dev, port = self.owner.split(":")
            return f"{dev}/ports/{port}/{self.file}"
        return f"{GPU_ADDR}/{self.file}"


JUDGED = [
    # rdma_ports: state, phys_state, rate, counters/link_downed of each port
    Judged("ib-tree", "ib:mlx5_0:1", "state", "rdma_ports", "ib:mlx5_0:1", "4: ACTIVE", "4",
           "-4"),
    Judged("ib-tree", "ib:mlx5_0:1", "phys_state", "rdma_ports", "ib:mlx5_0:1", "5: LinkUp",
           "5", "-5"),
    Judged("ib-tree", "ib:mlx5_0:1", "rate", "rdma_ports", "ib:mlx5_0:1",
           "400 Gb/sec (4X NDR)", "400", "-400"),
    Judged("ib-tree", "ib:mlx5_0:1", "counters/link_downed", "rdma_ports", "ib:mlx5_0:1", "0",
           "0", "-1"),
    # pcie_aer: the AER counter files, and the identity that decides whether it watches one
    *(Judged("pci-tree", "gpu:0", f"aer_dev_{kind}", "pcie_aer", f"pcie:{GPU_ADDR}",
             render_aer(kind, 0).rstrip("\n"), "0", "-1", key=f"TOTAL_ERR_{total} ")
      for kind, total in (("fatal", "FATAL"), ("nonfatal", "NONFATAL"),
                          ("correctable", "COR"))),
    Judged("pci-tree", "gpu:0", "vendor", "pcie_aer", f"pcie:{GPU_ADDR}", "0x10de", "0x10de",
           "-0x10de"),
    Judged("pci-tree", "gpu:0", "class", "pcie_aer", f"pcie:{GPU_ADDR}", "0x030200",
           "0x030200", "-0x030200"),
    # pcie: the GPU function's link speed/width (judged beside NVML's) and NUMA node
    Judged("sim", "gpu:0", "current_link_speed", "pcie", "gpu:0", "32.0 GT/s PCIe", "32.0",
           "-32.0"),
    Judged("sim", "gpu:0", "max_link_speed", "pcie", "gpu:0", "32.0 GT/s PCIe", "32.0",
           "-32.0"),
    Judged("sim", "gpu:0", "current_link_width", "pcie", "gpu:0", "16", "16", "-16"),
    Judged("sim", "gpu:0", "max_link_width", "pcie", "gpu:0", "16", "16", "-16"),
    # numa_node exists only on CONFIG_NUMA kernels: absent is "not exported", not a fault
    Judged("sim", "gpu:0", "numa_node", "pcie", "gpu:0", "0", "0", "-7", legit_absent=True),
]

DIR, ABSENT = "<directory>", "<absent>"
# shape -> what the file holds instead (text or bytes; DIR, ABSENT; None: unreadable)
SHAPES: dict[str, Callable[[Judged], str | bytes | None]] = {
    "garbage": lambda j: "banana\n",
    "empty": lambda j: "",
    "negative": lambda j: j.with_number(j.negative),
    "huge": lambda j: j.with_number(j.huge),
    "nan": lambda j: j.with_number("nan"),
    "inf": lambda j: j.with_number("inf"),
    "not-utf8": lambda j: NOT_UTF8,
    "directory": lambda j: DIR,
    "missing": lambda j: ABSENT,
    "unreadable": lambda j: None,
}

_INJECT_SHAPE = {"": "empty", DIR: "dir", ABSENT: "missing"}


def _write(path: Path, content: str | bytes) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if content == DIR:
        path.mkdir()
    elif content != ABSENT:
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _proc(root: Path) -> None:
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "uptime").write_text("86400.00 1382400.00\n")
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text(
        "6f0c2b1e-8a5d-4c1f-9e7a-2d3b4c5d6e7f\n")


def _ib_tree_setup(j: Judged, content: str | bytes | None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        root = tmp / "host"
        dev = root / "sys" / "class" / "infiniband" / "mlx5_0"
        shutil.copytree(IB_TREE / "mlx5_0", dev)
        _proc(root)
        if content is not None:
            _write(dev / "ports" / "1" / j.file, content)
    return setup


def _pci_tree_setup(j: Judged, content: str | bytes | None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        spec = build_spec(load_profile("h100-sxm-8"))
        spec.gpus, spec.nvswitches, spec.ib_ports = spec.gpus[:1], [], []
        paths = write_tree(str(tmp / "host"), spec)
        if content is not None:
            _write(Path(paths.sys("bus", "pci", "devices", GPU_ADDR)) / j.file, content)
    return setup


def _case(j: Judged, shape: str) -> tuple[Case, str | None]:
    content = SHAPES[shape](j)
    mentions = (j.where, "permission" if content is None else "")
    common = dict(id=f"{j.check}:{j.file}:{shape}", check=j.check,
                  target=j.target, mentions=tuple(m for m in mentions if m),
                  statuses=frozenset({"unknown"}), exits=frozenset({3}))
    if j.mode == "sim":
        argv = ["check", j.check, "--simulate", "h100-sxm-8"]
        if content is not None:
            if isinstance(content, bytes):
                spec = "shape=binary"
            elif content in _INJECT_SHAPE:
                spec = f"shape={_INJECT_SHAPE[content]}"
            else:
                spec = f"value={content.rstrip(chr(10))}"
            argv += ["--inject", f"sysfs@{j.owner},file={j.file},{spec}"]
        case = Case(argv=tuple(argv), **common)
    else:
        setup = (_ib_tree_setup if j.mode == "ib-tree" else _pci_tree_setup)(j, content)
        argv = ("check", j.check, "--profile", "cpu-only", "--path.sysfs", "{tmp}/host/sys",
                "--path.procfs", "{tmp}/host/proc", "--state", "{tmp}/state.db")
        case = Case(argv=argv, setup=setup, **common)
    return case, (j.where if content is None else None)


TABLE = [_case(j, shape) for j in JUDGED for shape in SHAPES
         if not (shape == "missing" and j.legit_absent)]
CASES = [c for c, _ in TABLE]
DENIED = {c.id: where for c, where in TABLE if where is not None}


def _deny(where: str):
    real = sysfs_mod._read_bytes

    def read(path: str) -> bytes:
        if path.endswith(where):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path)
    return read


def test_the_table_covers_every_judged_file_in_every_shape():
    assert len(CASES) >= 60 and len(set(ids(CASES))) == len(CASES)
    for j in JUDGED:
        shapes = {c.id.rsplit(":", 1)[1] for c in CASES if c.id.startswith(f"{j.check}:{j.file}:")}
        assert shapes == set(SHAPES) - ({"missing"} if j.legit_absent else set()), j


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_sysfs_value_that_does_not_parse_is_unknown_naming_the_file(case, tmp_path, capsys,
                                                                      caplog, monkeypatch):
    if case.id in DENIED:
        monkeypatch.setattr(sysfs_mod, "_read_bytes", _deny(DENIED[case.id]))
    report = run_case(case, tmp_path, capsys, caplog)
    mine = [r for r in report["results"] if r["target"] == case.target]
    assert all(r["reason"] == "SysfsReadError" for r in mine), mine


def test_the_healthy_trees_are_ok(tmp_path, capsys, caplog):
    """The same runs without a garbled file pass: the cases fail because of the garbling."""
    from gpu_monitor.cli import main

    for j in (JUDGED[0], JUDGED[4]):
        root = tmp_path / j.mode
        (_ib_tree_setup if j.mode == "ib-tree" else _pci_tree_setup)(j, None)(root)
        rc = main(["check", j.check, "--profile", "cpu-only", "-o", "json",
                   "--path.sysfs", f"{root}/host/sys", "--path.procfs", f"{root}/host/proc",
                   "--state", f"{root}/state.db"])
        out = capsys.readouterr().out
        assert rc == 0, out[-2000:]
        assert f'"target": "{j.target}"' in out and '"status": "ok"' in out
    assert main(["check", "pcie", "--simulate", "h100-sxm-8", "-o", "json"]) == 0
    assert os.path.isdir(tmp_path)
