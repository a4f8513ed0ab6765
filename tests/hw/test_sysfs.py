"""SysfsReader on real captured sysfs trees, on parser tables, and on broken attributes."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest

from gpu_monitor.hw import sysfs as sysfs_mod
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.hw.sysfs_values import (
    AerCounters,
    parse_aer,
    parse_ib_rate,
    parse_ib_state,
    parse_link_speed,
    pcie_gen,
)

# --- fixtures --------------------------------------------------------------------------------


def _materialise_node_exporter(src: Path, dst: Path) -> Path:
    """Copy node_exporter's sysfs extract and turn SYMLINKS.tsv entries into real symlinks.

    The shared copy stores each ``bus/pci/devices/<addr>`` link as a plain file holding its
    target; the reader must follow real relative links exactly as on a host.
    """
    shutil.copytree(src / "sys", dst / "sys", symlinks=True)
    for dirpath, _dirs, _files in os.walk(dst):
        os.chmod(dirpath, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    for line in (src / "SYMLINKS.tsv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        rel, target = line.split("\t")
        link = dst / rel
        if link.is_symlink() or link.exists():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    return dst / "sys"


@pytest.fixture
def node_exporter(fixtures_dir: Path, tmp_path: Path) -> SysfsReader:
    sys_root = _materialise_node_exporter(fixtures_dir / "sysfs" / "node_exporter",
                                          tmp_path / "node_exporter")
    return SysfsReader(HostPaths(sysfs=str(sys_root)))


@pytest.fixture
def gpud_h100(fixtures_dir: Path, tmp_path: Path) -> SysfsReader:
    """gpud's H100 ``/sys/class/infiniband`` capture mounted where sysfs keeps it."""
    src = fixtures_dir / "sysfs" / "gpud_h100" / "sys-class-infiniband-h100.0"
    (tmp_path / "sys" / "class").mkdir(parents=True)
    os.symlink(src, tmp_path / "sys" / "class" / "infiniband")
    return SysfsReader(HostPaths(sysfs=str(tmp_path / "sys")))


def _pci_tree(root: Path, address: str = "0000:18:00.0", **overrides: str | bytes) -> Path:
    """A minimal healthy H100 function; ``overrides`` replace (or, with None, drop) files."""
    files: dict[str, str | bytes | None] = {
        "vendor": "0x10de\n",
        "device": "0x2330\n",
        "class": "0x030200\n",
        "numa_node": "0\n",
        "current_link_speed": "32.0 GT/s PCIe\n",
        "max_link_speed": "32.0 GT/s PCIe\n",
        "current_link_width": "16\n",
        "max_link_width": "16\n",
        "aer_dev_correctable": "RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n",
        "aer_dev_nonfatal": "DLP 0\nCmpltTO 0\nTOTAL_ERR_NONFATAL 0\n",
        "aer_dev_fatal": "DLP 0\nTOTAL_ERR_FATAL 0\n",
    }
    files.update(overrides)
    d = root / "sys" / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if content is None:
            continue
        data = content.encode() if isinstance(content, str) else content
        (d / name).write_bytes(data)
    return d


def _ib_tree(root: Path, device: str = "mlx5_0", port: int = 1, **overrides: str) -> Path:
    files = {
        "state": "4: ACTIVE\n",
        "phys_state": "5: LinkUp\n",
        "rate": "400 Gb/sec (4X NDR)\n",
        "link_layer": "InfiniBand\n",
        "counters/link_downed": "0\n",
        "counters/symbol_error": "0\n",
    }
    files.update(overrides)
    d = root / "sys" / "class" / "infiniband" / device / "ports" / str(port)
    for rel, content in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(content)
    return d


def _reader(root: Path) -> SysfsReader:
    return SysfsReader(HostPaths(sysfs=str(root / "sys")))


# --- node_exporter's captured tree -----------------------------------------------------------


def test_node_exporter_lists_every_pci_function_in_address_order(node_exporter):
    assert [d.address for d in node_exporter.pci_devices()] == [
        "0000:00:02.1", "0000:01:00.0", "0000:45:00.0",
    ]


def test_node_exporter_nvme_reads_a_downgraded_link_speed(node_exporter):
    nvme = node_exporter.pci_device("0000:01:00.0")
    assert nvme is not None
    assert (nvme.vendor, nvme.device, nvme.class_code) == (0xC0A9, 0x540A, 0x010802)
    assert nvme.numa_node is None  # the file says -1
    assert (nvme.current_link_speed_gts, nvme.max_link_speed_gts) == (8.0, 16.0)
    assert (nvme.current_link_gen, nvme.max_link_gen) == (3, 4)
    assert (nvme.current_link_width, nvme.max_link_width) == (4, 4)
    assert nvme.speed_downgraded is True
    assert nvme.width_downgraded is False
    assert nvme.driver == "nvme"
    assert nvme.errors == ()


def test_node_exporter_nvme_aer_files_parse_with_every_counter(node_exporter):
    nvme = node_exporter.pci_device("0000:01:00.0")
    assert nvme.aer_correctable == AerCounters(
        counters={n: 0 for n in ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout",
                                 "NonFatalErr", "CorrIntErr", "HeaderOF")},
        total=0,
    )
    assert len(nvme.aer_nonfatal.counters) == 18
    assert nvme.aer_nonfatal.counters["CmpltTO"] == 0
    assert nvme.aer_nonfatal.total == 0
    assert "PoisonTLPBlocked" in nvme.aer_fatal.counters
    assert nvme.aer_fatal.total == 0


def test_node_exporter_bridge_without_aer_files_has_none_and_no_errors(node_exporter):
    bridge = node_exporter.pci_device("0000:00:02.1")
    assert (bridge.vendor, bridge.device, bridge.class_code) == (0x1022, 0x1634, 0x060400)
    assert (bridge.current_link_width, bridge.max_link_width) == (4, 8)
    assert bridge.width_downgraded is True
    assert bridge.speed_downgraded is False
    assert bridge.driver == "pcieport"
    assert (bridge.aer_correctable, bridge.aer_nonfatal, bridge.aer_fatal) == (None, None, None)
    assert bridge.errors == ()


def test_node_exporter_igb_nic_on_numa_node_0(node_exporter):
    nic = node_exporter.pci_device("0000:45:00.0")
    assert (nic.vendor, nic.device, nic.class_code) == (0x8086, 0x1521, 0x020000)
    assert nic.numa_node == 0
    assert (nic.current_link_gen, nic.current_link_width) == (2, 4)
    assert nic.driver == "igb"


def test_vendor_filter_returns_only_that_vendor(node_exporter):
    assert [d.address for d in node_exporter.pci_devices(vendor=0x8086)] == ["0000:45:00.0"]
    assert [d.address for d in node_exporter.pci_devices(vendor=0x1022)] == ["0000:00:02.1"]
    assert node_exporter.nvidia_gpus() == []
    assert node_exporter.nvidia_switches() == []


def test_pci_device_accepts_nvml_address_spelling(node_exporter):
    assert node_exporter.pci_device("00000000:01:00.0").address == "0000:01:00.0"
    assert node_exporter.pci_device("0000:99:00.0") is None


def test_node_exporter_infiniband_ports(node_exporter):
    ports = node_exporter.infiniband_ports()
    assert [(p.device, p.port) for p in ports] == [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)]
    mlx = ports[1]
    assert (mlx.state, mlx.state_code, mlx.phys_state, mlx.phys_state_code) == (
        "ACTIVE", 4, "LinkUp", 5)
    assert (mlx.rate_gbit, mlx.rate_text) == (40.0, "40 Gb/sec (4X QDR)")
    assert mlx.link_layer == "InfiniBand"
    assert mlx.counter("port_rcv_packets") == 6825908347
    assert mlx.counter("port_xmit_wait") == 4294967295
    assert mlx.counter("port_xmit_discards") == 5
    assert mlx.counter("multicast_rcv_packets") == 93
    assert mlx.counter("link_downed") == 0
    assert len(mlx.counters) == 16
    assert mlx.hw_counters is None
    assert mlx.pci_address is None  # the extract has no device symlink
    assert mlx.active and mlx.link_up
    assert mlx.errors == ()
    assert len(ports[2].counters) == 8


def test_iwarp_counters_without_pma_are_unavailable_not_errors(node_exporter):
    iw = node_exporter.infiniband_ports()[0]
    assert (iw.device, iw.rate_gbit, iw.rate_text) == ("i40iw0", 10.0, "10 Gb/sec (4X)")
    assert iw.counters == {}
    assert "link_downed" in iw.counters_unavailable
    assert len(iw.counters_unavailable) == 17
    assert iw.counter("link_downed") is None
    assert iw.errors == ()


# --- gpud's H100 InfiniBand capture ----------------------------------------------------------

H100_PORTS = [
    # device, state, phys_state, rate_gbit, rate_text, link_layer, link_downed
    ("mlx5_0", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_1", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 255),
    ("mlx5_4", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_5", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_6", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_7", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_8", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_9", "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0),
    ("mlx5_bond_0", "ACTIVE", "LinkUp", 200.0, "200 Gb/sec (2X NDR)", "Ethernet", 0),
]


def test_gpud_h100_every_port_state_rate_and_link_downed(gpud_h100):
    ports = gpud_h100.infiniband_ports()
    got = [(p.device, p.state, p.phys_state, p.rate_gbit, p.rate_text, p.link_layer,
            p.counter("link_downed")) for p in ports]
    assert got == H100_PORTS
    assert all(p.port == 1 and p.errors == () for p in ports)


def test_gpud_h100_reads_every_counter_and_hw_counter(gpud_h100):
    port = gpud_h100.infiniband_port("mlx5_1", 1)
    assert port.counter("port_rcv_data") == 205128687774249
    assert len(port.counters) == 21
    assert port.hw_counters is not None and len(port.hw_counters) == 26
    assert port.hw_counters["out_of_sequence"] == 0
    assert gpud_h100.infiniband_port("mlx5_2", 1) is None


def test_infiniband_device_link_gives_pci_address_and_numa(tmp_path):
    _pci_tree(tmp_path, "0000:1a:00.0", vendor="0x15b3\n", numa_node="1\n")
    ib = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0"
    _ib_tree(tmp_path)
    os.symlink("../../../bus/pci/devices/0000:1a:00.0", ib / "device")
    port = _reader(tmp_path).infiniband_ports()[0]
    assert (port.pci_address, port.numa_node) == ("0000:1a:00.0", 1)


# --- parser tables ---------------------------------------------------------------------------

LINK_SPEEDS = [
    ("2.5 GT/s PCIe\n", 2.5, 1),
    ("5.0 GT/s PCIe\n", 5.0, 2),
    ("8.0 GT/s PCIe\n", 8.0, 3),
    ("16.0 GT/s PCIe\n", 16.0, 4),
    ("32.0 GT/s PCIe\n", 32.0, 5),
    ("64.0 GT/s PCIe\n", 64.0, 6),
    ("2.5 GT/s\n", 2.5, 1),  # kernels before 5.x
    ("5 GT/s\n", 5.0, 2),
    ("8 GT/s\n", 8.0, 3),
    ("16 GT/s\n", 16.0, 4),
    ("Unknown\n", None, None),  # link down / not PCIe Express
    ("Unknown speed\n", None, None),
]


@pytest.mark.parametrize("text,gts,gen", LINK_SPEEDS, ids=[s[0].strip() for s in LINK_SPEEDS])
def test_link_speed_strings(text, gts, gen):
    assert parse_link_speed(text) == gts
    assert pcie_gen(parse_link_speed(text)) == gen


@pytest.mark.parametrize("junk", ["fast", "", "32 Gb/s", "GT/s PCIe"])
def test_link_speed_junk_raises(junk):
    with pytest.raises(ValueError):
        parse_link_speed(junk)


def test_aer_parses_real_file_and_counts(fixtures_dir):
    real = (fixtures_dir / "sysfs" / "node_exporter" / "sys" / "devices" / "pci0000:40"
            / "0000:40:01.3" / "0000:45:00.0" / "aer_dev_nonfatal").read_text()
    aer = parse_aer(real)
    assert list(aer.counters)[:3] == ["Undefined", "DLP", "SDES"]
    assert aer.total == 0
    busy = parse_aer("RxErr 3\nBadTLP 1\nBadDLLP 0\nTOTAL_ERR_COR 4\n")
    assert busy.counters == {"RxErr": 3, "BadTLP": 1, "BadDLLP": 0}
    assert busy.total == 4


def test_aer_without_total_line_sums_the_counters():
    assert parse_aer("RxErr 2\nBadTLP 5\n").total == 7


@pytest.mark.parametrize("junk", ["", "RxErr x\n", "garbage\n", "RxErr -1\n"])
def test_aer_junk_raises(junk):
    with pytest.raises(ValueError):
        parse_aer(junk)


IB_STATES = [
    ("4: ACTIVE\n", ("ACTIVE", 4)),
    ("1: DOWN\n", ("DOWN", 1)),
    ("2: INIT\n", ("INIT", 2)),
    ("3: ARMED\n", ("ARMED", 3)),
    ("5: LinkUp\n", ("LinkUp", 5)),
    ("2: Polling\n", ("Polling", 2)),
    ("3: Disabled\n", ("Disabled", 3)),
    ("7: Phy Test\n", ("Phy Test", 7)),
]


@pytest.mark.parametrize("text,expected", IB_STATES, ids=[s[0].strip() for s in IB_STATES])
def test_ib_state_strings(text, expected):
    assert parse_ib_state(text) == expected


@pytest.mark.parametrize("junk", ["ACTIVE", "", "four: ACTIVE", "4:"])
def test_ib_state_junk_raises(junk):
    with pytest.raises(ValueError):
        parse_ib_state(junk)


@pytest.mark.parametrize("text,gbit", [
    ("400 Gb/sec (4X NDR)", 400.0), ("200 Gb/sec (2X NDR)", 200.0), ("40 Gb/sec (4X QDR)", 40.0),
    ("10 Gb/sec (4X)", 10.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("56 Gb/sec (4X FDR)", 56.0),
])
def test_ib_rate_strings(text, gbit):
    assert parse_ib_rate(text) == gbit


def test_ib_rate_junk_raises():
    with pytest.raises(ValueError):
        parse_ib_rate("fast")


# --- broken, missing and unreadable attributes -----------------------------------------------


def test_missing_root_is_empty_and_says_unavailable(tmp_path):
    reader = _reader(tmp_path)
    assert reader.pci_devices() == []
    assert reader.infiniband_ports() == []
    assert reader.pci_available() is False
    assert "bus/pci/devices" in reader.pci_unavailable_reason()
    assert reader.infiniband_available() is False


def test_empty_root_is_available_with_no_devices(tmp_path):
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    reader = _reader(tmp_path)
    assert reader.pci_available() and reader.infiniband_available()
    assert reader.pci_unavailable_reason() == ""
    assert reader.pci_devices() == [] and reader.infiniband_ports() == []


def test_missing_attributes_are_none_without_errors(tmp_path):
    # No NUMA (CONFIG_NUMA off), no AER capability, not PCI Express: whole groups absent.
    _pci_tree(tmp_path, numa_node=None, aer_dev_fatal=None, aer_dev_nonfatal=None,
              aer_dev_correctable=None, max_link_speed=None, current_link_speed=None,
              max_link_width=None, current_link_width=None)
    gpu = _reader(tmp_path).nvidia_gpus()[0]
    assert (gpu.numa_node, gpu.aer_fatal, gpu.max_link_speed_gts) == (None, None, None)
    assert gpu.speed_downgraded is None
    assert gpu.driver is None
    assert gpu.errors == ()


@pytest.mark.parametrize("name", ["aer_dev_fatal", "max_link_speed", "current_link_width",
                                  "vendor", "device", "class"])
def test_one_attribute_missing_from_a_group_the_kernel_exports_whole_is_an_error(tmp_path, name):
    _pci_tree(tmp_path, **{name: None})
    dev = _reader(tmp_path).pci_devices()[0]
    assert [(os.path.basename(e.path), e.kind) for e in dev.errors] == [(name, "missing")]


@pytest.mark.parametrize("name,content", [
    ("vendor", "zzz\n"),
    ("class", b"\xff\xfe\x00"),
    ("current_link_width", "sixteen\n"),
    ("current_link_speed", "very fast\n"),
    ("aer_dev_fatal", "DLP lots\n"),
    ("numa_node", "\n"),
])
def test_junk_attribute_is_none_with_a_junk_error(tmp_path, name, content):
    _pci_tree(tmp_path, **{name: content})
    dev = _reader(tmp_path).pci_devices()[0]
    field = {"vendor": "vendor", "class": "class_code", "current_link_width": "current_link_width",
             "current_link_speed": "current_link_speed_gts", "aer_dev_fatal": "aer_fatal",
             "numa_node": "numa_node"}[name]
    assert getattr(dev, field) is None
    assert [(os.path.basename(e.path), e.kind) for e in dev.errors] == [(name, "junk")]
    assert dev.device == 0x2330  # the rest is still read


def _failing_open(monkeypatch, basename: str, exc: OSError) -> None:
    real_open = open

    def fake_open(path, *args, **kwargs):
        if os.path.basename(str(path)) == basename:
            raise exc
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sysfs_mod, "open", fake_open, raising=False)


def test_unreadable_attribute_is_a_permission_error(tmp_path, monkeypatch):
    _pci_tree(tmp_path)
    _failing_open(monkeypatch, "aer_dev_fatal",
                  PermissionError(errno.EACCES, "Permission denied"))
    gpu = _reader(tmp_path).nvidia_gpus()[0]
    assert gpu.aer_fatal is None
    assert gpu.aer_nonfatal is not None
    assert [(os.path.basename(e.path), e.kind) for e in gpu.errors] == [
        ("aer_dev_fatal", "permission")]


def test_io_error_from_a_dead_device_is_an_io_error(tmp_path, monkeypatch):
    _pci_tree(tmp_path)
    _failing_open(monkeypatch, "current_link_speed", OSError(errno.EIO, "Input/output error"))
    gpu = _reader(tmp_path).nvidia_gpus()[0]
    assert gpu.current_link_speed_gts is None
    assert gpu.errors[0].kind == "io"
    assert "Input/output error" in str(gpu.errors[0])


def test_unreadable_vendor_keeps_the_device_when_filtering(tmp_path, monkeypatch):
    _pci_tree(tmp_path)
    _failing_open(monkeypatch, "vendor", PermissionError(errno.EACCES, "Permission denied"))
    devs = _reader(tmp_path).pci_devices(vendor=0x10DE)
    assert [d.address for d in devs] == ["0000:18:00.0"]
    assert devs[0].errors[0].kind == "permission"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads mode-000 files anyway; the monkeypatched case covers it")
def test_mode_000_attribute_is_a_permission_error(tmp_path):
    d = _pci_tree(tmp_path)
    os.chmod(d / "aer_dev_correctable", 0)
    gpu = _reader(tmp_path).nvidia_gpus()[0]
    assert gpu.aer_correctable is None
    assert gpu.errors[0].kind == "permission"


def test_ib_junk_state_and_counter_are_errors_on_the_port(tmp_path):
    _ib_tree(tmp_path, state="ACTIVE\n", **{"counters/symbol_error": "many\n"})
    port = _reader(tmp_path).infiniband_ports()[0]
    assert port.state is None and port.state_code is None
    assert port.phys_state == "LinkUp"
    assert "symbol_error" not in port.counters
    assert port.counter("link_downed") == 0
    assert sorted((os.path.basename(e.path), e.kind) for e in port.errors) == [
        ("state", "junk"), ("symbol_error", "junk")]


def test_dot_files_in_counters_are_ignored(tmp_path):
    _ib_tree(tmp_path, **{"counters/.link_downed.tmp1.0": "7\n"})
    port = _reader(tmp_path).infiniband_ports()[0]
    assert set(port.counters) == {"link_downed", "symbol_error"}


def test_gpu_and_nvswitch_classification(tmp_path):
    _pci_tree(tmp_path, "0000:18:00.0")
    _pci_tree(tmp_path, "0000:19:00.0", **{"class": "0x030000\n"})  # VGA
    _pci_tree(tmp_path, "0000:83:00.0", device="0x22a3\n", **{"class": "0x068000\n"})
    _pci_tree(tmp_path, "0000:1a:00.0", vendor="0x15b3\n", **{"class": "0x020700\n"})
    reader = _reader(tmp_path)
    assert [g.address for g in reader.nvidia_gpus()] == ["0000:18:00.0", "0000:19:00.0"]
    assert [s.address for s in reader.nvidia_switches()] == ["0000:83:00.0"]


def test_real_host_sysfs_reads_without_raising():
    reader = SysfsReader(HostPaths())
    devices = reader.pci_devices()
    if reader.pci_available():
        assert all(d.address.count(":") == 2 for d in devices)
    else:
        assert devices == []


def test_parse_aer_accepts_old_kernel_multi_word_names():
    from gpu_monitor.hw.sysfs_values import parse_aer

    aer = parse_aer("Receiver Error 2\nBad TLP 0\nBad DLLP 1\nTOTAL_ERR_COR 3\n")
    assert aer.counters == {"Receiver_Error": 2, "Bad_TLP": 0, "Bad_DLLP": 1}
    assert aer.total == 3
