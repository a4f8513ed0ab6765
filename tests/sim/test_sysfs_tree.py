"""The simulated sysfs/procfs tree reads back, through the real readers, as the spec says."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpu_monitor.hw.procfs import DeviceHolder, ProcfsReader
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.hw.sysfs_values import parse_aer
from gpu_monitor.sim.spec import GpuSpec, IbPortSpec, NodeSpec, NvSwitchSpec
from gpu_monitor.sim.sysfs_tree import (
    render_aer,
    render_ib_phys_state,
    render_ib_port_state,
    render_link_speed,
    update_tree,
    write_tree,
)

# Bus numbers of an HGX H100 board (lspci -vvv of a real node): GPU, its ConnectX-7 beside it.
GPU_BUSES = (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)


def hgx_spec() -> NodeSpec:
    gpus = [
        GpuSpec(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", name="NVIDIA H100",
                pci_bus_id=f"0000:{bus:02x}:00.0", numa_node=0 if i < 4 else 1)
        for i, bus in enumerate(GPU_BUSES)
    ]
    switches = [NvSwitchSpec(index=i, pci_bus_id=f"0000:{0x83 + i:02x}:00.0") for i in range(4)]
    ports = [
        IbPortSpec(device=f"mlx5_{i}", port=1, pci_bus_id=f"0000:{bus + 1:02x}:00.0",
                   numa_node=0 if i < 4 else 1)
        for i, bus in enumerate(GPU_BUSES)
    ]
    return NodeSpec(profile="h100-sxm", gpus=gpus, nvswitches=switches, ib_ports=ports)


def _assert_reads_back(reader: SysfsReader, spec: NodeSpec) -> None:
    """Every value the spec renders into sysfs comes back through the real reader."""
    gpus = reader.nvidia_gpus()
    present = [g for g in spec.gpus if not g.off_bus]
    assert [d.address for d in gpus] == sorted(g.pci_bus_id for g in present)
    by_addr = {d.address: d for d in gpus}
    for g in present:
        d = by_addr[g.pci_bus_id]
        assert d.vendor == 0x10DE
        assert d.device == g.pci_device_id >> 16
        assert d.class_code == 0x030200
        assert d.numa_node == g.numa_node
        assert (d.current_link_gen, d.max_link_gen) == (g.pcie_gen_current, g.pcie_gen_max)
        assert (d.current_link_width, d.max_link_width) == (g.pcie_width_current,
                                                            g.pcie_width_max)
        assert (d.aer_correctable.total, d.aer_nonfatal.total, d.aer_fatal.total) == (
            g.aer_correctable, g.aer_nonfatal, g.aer_fatal)
        assert d.driver == "nvidia"
        assert d.errors == ()
    switches = reader.nvidia_switches()
    assert [s.address for s in switches] == [s.pci_bus_id for s in spec.nvswitches]
    assert all(s.driver == "nvidia-nvswitch" and s.class_code == 0x068000 for s in switches)
    ports = reader.infiniband_ports()
    assert [(p.device, p.port) for p in ports] == [(p.device, p.port) for p in spec.ib_ports]
    for got, want in zip(ports, spec.ib_ports, strict=True):
        assert (got.state, got.phys_state) == (want.state, want.phys_state)
        assert (got.rate_gbit, got.rate_text) == (want.rate_gbit, want.rate_text)
        assert got.link_layer == want.link_layer
        assert got.counter("link_downed") == want.link_downed
        assert got.counter("symbol_error") == want.symbol_error
        assert got.counter("link_error_recovery") == want.link_error_recovery
        assert (got.pci_address, got.numa_node) == (want.pci_bus_id, want.numa_node)
        assert got.errors == ()


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every regular file below root -> (inode, size): os.replace gives a rewritten file a new
    inode, so comparing snapshots shows exactly which files were written."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.relpath(os.path.join(dirpath, f), root)] = (st.st_ino, st.st_size)
    return out


# --- round trip ------------------------------------------------------------------------------


def test_hgx_spec_reads_back_exactly(tmp_path):
    spec = hgx_spec()
    assert (len(spec.gpus), len(spec.nvswitches), len(spec.ib_ports)) == (8, 4, 8)
    _assert_reads_back(SysfsReader(write_tree(str(tmp_path / "node"), spec)), spec)


def test_non_default_values_read_back(tmp_path):
    spec = hgx_spec()
    g = spec.gpu(3)
    g.pcie_gen_current, g.pcie_width_current = 4, 8
    g.aer_correctable, g.aer_nonfatal, g.aer_fatal = 12, 2, 1
    p = spec.ib_port("mlx5_5", 1)
    p.state, p.phys_state = "DOWN", "Polling"
    p.rate_gbit, p.rate_text = 40, "40 Gb/sec (4X QDR)"
    p.link_downed, p.symbol_error, p.link_error_recovery = 3, 17, 2
    _assert_reads_back(SysfsReader(write_tree(str(tmp_path / "node"), spec)), spec)


def test_write_tree_returns_paths_rooted_there(tmp_path):
    paths = write_tree(str(tmp_path), hgx_spec())
    assert paths.sysfs == str(tmp_path / "sys")
    assert paths.procfs == str(tmp_path / "proc")
    assert paths.dev == str(tmp_path / "dev")
    assert os.path.exists(paths.device("nvidia7"))


def test_off_bus_gpu_is_absent_from_the_tree(tmp_path):
    spec = hgx_spec()
    spec.gpu(5).off_bus = True
    reader = SysfsReader(write_tree(str(tmp_path), spec))
    assert len(reader.nvidia_gpus()) == 7
    assert reader.pci_device(spec.gpu(5).pci_bus_id) is None


# --- file formats ----------------------------------------------------------------------------


def test_files_use_the_kernel_formats(tmp_path, fixtures_dir):
    spec = hgx_spec()
    write_tree(str(tmp_path), spec)
    gpu = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:19:00.0"
    assert (gpu / "vendor").read_text() == "0x10de\n"
    assert (gpu / "device").read_text() == "0x2330\n"
    assert (gpu / "class").read_text() == "0x030200\n"
    assert (gpu / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    assert (gpu / "max_link_width").read_text() == "16\n"
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    # AER files list the same counters, in the same order, as a real 6.x kernel's.
    real_dir = (fixtures_dir / "sysfs" / "node_exporter" / "sys" / "devices" / "pci0000:40"
                / "0000:40:01.3" / "0000:45:00.0")
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        ours = [line.split()[0] for line in (gpu / name).read_text().splitlines()]
        real = [line.split()[0] for line in (real_dir / name).read_text().splitlines()]
        assert ours == real, name


def test_tree_uses_real_symlinks(tmp_path):
    write_tree(str(tmp_path), hgx_spec())
    link = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:19:00.0"
    assert link.is_symlink()
    assert os.readlink(link) == "../../../devices/pci0000:19/0000:19:00.0"
    ib = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0"
    assert ib.is_symlink()
    assert os.path.basename(os.readlink(ib / "device")) == "0000:1a:00.0"
    assert (ib / "device" / "vendor").read_text() == "0x15b3\n"
    assert (ib / "device" / "class").read_text() == "0x020700\n"


@pytest.mark.parametrize("gen,text", [(1, "2.5 GT/s PCIe\n"), (4, "16.0 GT/s PCIe\n"),
                                      (5, "32.0 GT/s PCIe\n"), (6, "64.0 GT/s PCIe\n"),
                                      (0, "Unknown\n")])
def test_render_link_speed(gen, text):
    assert render_link_speed(gen) == text


def test_render_states_and_rejects_unknown_names():
    assert render_ib_port_state("DOWN") == "1: DOWN\n"
    assert render_ib_phys_state("Disabled") == "3: Disabled\n"
    with pytest.raises(ValueError):
        render_ib_port_state("UP")
    with pytest.raises(ValueError):
        render_ib_phys_state("Up")
    with pytest.raises(ValueError):
        render_link_speed(9)


def test_render_aer_books_the_total_and_parses():
    aer = parse_aer(render_aer("nonfatal", 3))
    assert aer.total == 3
    assert aer.counters["CmpltTO"] == 3
    assert sum(aer.counters.values()) == 3


# --- updates ---------------------------------------------------------------------------------


def test_update_rewrites_only_the_changed_files(tmp_path):
    spec = hgx_spec()
    write_tree(str(tmp_path), spec)
    before = _files(tmp_path)
    port = spec.ib_port("mlx5_2", 1)
    port.state, port.phys_state, port.link_downed = "DOWN", "Disabled", 1
    spec.gpu(6).aer_correctable = 4
    update_tree(str(tmp_path), spec)
    after = _files(tmp_path)
    changed = {f for f in after if after[f] != before.get(f)}
    gpu6 = "sys/devices/pci0000:cb/0000:cb:00.0/aer_dev_correctable"
    mlx = "sys/devices/pci0000:4d/0000:4d:00.0/infiniband/mlx5_2/ports/1"
    assert changed == {gpu6, f"{mlx}/state", f"{mlx}/phys_state", f"{mlx}/counters/link_downed"}
    assert set(after) == set(before)  # no temp files left behind


@pytest.mark.parametrize("shape,content,kind", [
    ("text", "-16", "junk"), ("empty", "", "junk"), ("binary", "", "junk"), ("dir", "", "io"),
    ("missing", "", "missing"),
])
def test_a_sysfs_override_is_what_the_reader_sees_and_survives_updates(tmp_path, shape, content,
                                                                       kind):
    from gpu_monitor.sim.spec import SysfsOverride

    spec = hgx_spec()
    addr = spec.gpu(2).pci_bus_id
    spec.sysfs_overrides[(f"pci:{addr}", "max_link_width")] = SysfsOverride(shape, content)
    spec.sysfs_overrides[("ib:mlx5_0:1", "rate")] = SysfsOverride(shape, content)
    reader = SysfsReader(write_tree(str(tmp_path), spec))
    for _ in range(2):  # as written, and after an update that rewrites the same directories
        gpu = reader.pci_device(addr)
        assert gpu.max_link_width is None
        assert [(os.path.basename(e.path), e.kind) for e in gpu.errors] == [("max_link_width",
                                                                             kind)]
        port = reader.infiniband_port("mlx5_0", 1)
        assert [(os.path.basename(e.path), e.kind) for e in port.errors] == [("rate", kind)]
        assert reader.pci_device(spec.gpu(3).pci_bus_id).errors == ()
        spec.gpu(2).pcie_width_current, spec.ib_port("mlx5_0", 1).link_downed = 8, 1
        update_tree(str(tmp_path), spec)
    spec.sysfs_overrides.clear()  # lifted: the next update renders the healthy file again
    update_tree(str(tmp_path), spec)
    assert reader.pci_device(addr).errors == () and reader.pci_device(addr).max_link_width == 16
    assert reader.infiniband_port("mlx5_0", 1).rate_gbit == 400.0


def test_update_reads_back_the_new_values(tmp_path):
    spec = hgx_spec()
    reader = SysfsReader(write_tree(str(tmp_path), spec))
    spec.gpu(1).pcie_gen_current, spec.gpu(1).pcie_width_current = 3, 4
    spec.gpu(1).aer_fatal = 1
    p = spec.ib_port("mlx5_7", 1)
    p.state, p.phys_state, p.symbol_error = "INIT", "LinkUp", 9
    update_tree(str(tmp_path), spec)
    _assert_reads_back(reader, spec)


def test_gpu_falls_off_the_bus_and_comes_back(tmp_path):
    spec = hgx_spec()
    reader = SysfsReader(write_tree(str(tmp_path), spec))
    spec.gpu(2).off_bus = True
    update_tree(str(tmp_path), spec)
    assert [g.address for g in reader.nvidia_gpus()] == [
        g.pci_bus_id for g in spec.gpus if g.index != 2]
    spec.gpu(2).off_bus = False
    update_tree(str(tmp_path), spec)
    assert len(reader.nvidia_gpus()) == 8
    _assert_reads_back(reader, spec)


def test_readers_never_see_a_torn_file_while_updating(tmp_path):
    spec = hgx_spec()
    reader = SysfsReader(write_tree(str(tmp_path), spec))
    port = spec.ib_port("mlx5_0", 1)
    stop = threading.Event()
    seen: list[tuple[str | None, tuple]] = []

    def poll() -> None:
        while not stop.is_set():
            p = reader.infiniband_port("mlx5_0", 1)
            seen.append((p.state if p else None, p.errors if p else ("gone",)))

    t = threading.Thread(target=poll)
    t.start()
    try:
        for i in range(300):
            port.state = "DOWN" if i % 2 else "ACTIVE"
            port.link_downed = i
            update_tree(str(tmp_path), spec)
    finally:
        stop.set()
        t.join()
    assert seen
    assert {s for s, _ in seen} <= {"ACTIVE", "DOWN"}
    assert all(errors == () for _, errors in seen)


# --- procfs and dev --------------------------------------------------------------------------


def test_proc_identity_reads_back(tmp_path):
    spec = hgx_spec()
    spec.hostname, spec.uptime_s = "sim-node-3", 1234.5
    proc = ProcfsReader(write_tree(str(tmp_path), spec))
    assert (proc.boot_id(), proc.uptime_s(), proc.hostname()) == (
        spec.boot_id, 1234.5, "sim-node-3")
    spec.boot_id = "00000000-1111-2222-3333-444444444444"  # a simulated reboot
    update_tree(str(tmp_path), spec)
    assert proc.boot_id() == spec.boot_id


def test_gpu_processes_hold_device_nodes_open(tmp_path):
    spec = hgx_spec()
    spec.gpu(0).processes = [(4242, 10 * 1024**3, "python")]
    spec.gpu(1).processes = [(4242, 10 * 1024**3, "python"), (5150, 1024**2, "nvidia-smi")]
    paths = write_tree(str(tmp_path), spec)
    proc = ProcfsReader(paths)
    assert proc.processes_with_open("nvidia") == [
        DeviceHolder(4242, "python"), DeviceHolder(5150, "nvidia-smi")]
    assert proc.processes_with_open(paths.device("nvidia1")) == [
        DeviceHolder(4242, "python"), DeviceHolder(5150, "nvidia-smi")]
    assert proc.cmdline(5150) == ["nvidia-smi"]
    spec.gpu(1).processes = []
    update_tree(str(tmp_path), spec)
    assert proc.processes_with_open("nvidia") == [DeviceHolder(4242, "python")]
    assert proc.processes_with_open(paths.device("nvidia1")) == []
