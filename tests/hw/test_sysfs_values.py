"""The sysfs value parsers' domains, and what the reader makes of a value outside them.

Each parser accepts the kernel's own spellings (tables of real lines below) and refuses, with
``SysfsParseError`` naming the content, anything else: garbage, a sign where the kernel prints
an unsigned number, a NaN, a count beyond u64, a PCIe rate that does not exist. Property tests
feed arbitrary text and assert that nothing but that error escapes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw import sysfs as sysfs_mod
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.hw.sysfs_values import (
    SysfsParseError,
    parse_aer,
    parse_counter,
    parse_ib_phys_state,
    parse_ib_port_state,
    parse_ib_rate,
    parse_int,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_pci_class,
    parse_pci_id,
)

PARSERS = {
    "pci_id": parse_pci_id,
    "pci_class": parse_pci_class,
    "int": parse_int,
    "link_width": parse_link_width,
    "numa_node": parse_numa_node,
    "link_speed": parse_link_speed,
    "aer": parse_aer,
    "ib_port_state": parse_ib_port_state,
    "ib_phys_state": parse_ib_phys_state,
    "ib_rate": parse_ib_rate,
    "counter": parse_counter,
}

# (parser, the kernel's text, the value) — real spellings (node_exporter's and gpud's captured
# trees, drivers/pci/pci-sysfs.c, drivers/infiniband/core/sysfs.c).
ACCEPTED = [
    ("pci_id", "0x10de\n", 0x10DE),
    ("pci_id", "0x2330\n", 0x2330),
    ("pci_class", "0x030200\n", 0x030200),
    ("pci_class", "0x068000\n", 0x068000),
    ("link_width", "16\n", 16),
    ("link_width", "2\n", 2),  # NVSwitch links
    ("link_width", "0\n", 0),  # not trained
    ("link_width", "32\n", 32),
    ("numa_node", "-1\n", None),
    ("numa_node", "1\n", 1),
    ("link_speed", "32.0 GT/s PCIe\n", 32.0),
    ("link_speed", "5 GT/s\n", 5.0),
    ("link_speed", "Unknown\n", None),
    ("ib_port_state", "4: ACTIVE\n", ("ACTIVE", 4)),
    ("ib_port_state", "5: ACTIVE_DEFER\n", ("ACTIVE_DEFER", 5)),
    ("ib_port_state", "9: UNKNOWN\n", ("UNKNOWN", 9)),  # beyond the kernel's table
    ("ib_phys_state", "5: LinkUp\n", ("LinkUp", 5)),
    ("ib_phys_state", "7: Phy Test\n", ("Phy Test", 7)),
    ("ib_phys_state", "0: <unknown>\n", ("<unknown>", 0)),
    ("ib_rate", "400 Gb/sec (4X NDR)\n", 400.0),
    ("ib_rate", "2.5 Gb/sec (1X SDR)\n", 2.5),
    ("ib_rate", "10 Gb/sec (4X)\n", 10.0),
    ("counter", "205128687774249\n", 205128687774249),
    ("counter", "18446744073709551615\n", 2**64 - 1),
    ("counter", "N/A (no PMA)\n", None),
]


@pytest.mark.parametrize("kind,text,value", ACCEPTED,
                         ids=[f"{k}:{t.strip()}" for k, t, _ in ACCEPTED])
def test_the_kernels_own_spellings_parse(kind, text, value):
    assert PARSERS[kind](text) == value


REFUSED = [
    ("pci_id", "0x10de0\n"),  # 20 bits
    ("pci_id", "-0x10de\n"),
    ("pci_id", "10de\n"),
    ("pci_class", "0x1030200\n"),
    ("link_width", "-16\n"),
    ("link_width", "64\n"),
    ("link_width", "1" + "0" * 30 + "\n"),
    ("link_width", "nan\n"),
    ("link_width", "16.0\n"),
    ("link_width", "\u0661\u0666\n"),  # Arabic-Indic digits: int() would take them
    ("int", ""),
    ("int", "9" * 5000),  # int() itself refuses this many digits, with a plain ValueError
    ("numa_node", "-2\n"),
    ("numa_node", "4096\n"),
    ("link_speed", "-32.0 GT/s PCIe\n"),
    ("link_speed", "33.0 GT/s PCIe\n"),
    ("link_speed", "99999 GT/s PCIe\n"),
    ("link_speed", "nan GT/s PCIe\n"),
    ("link_speed", "inf GT/s\n"),
    ("aer", "TOTAL_ERR_FATAL -1\n"),
    ("aer", "TOTAL_ERR_FATAL 1e30\n"),
    ("aer", "TOTAL_ERR_FATAL 18446744073709551616\n"),  # 2^64
    ("aer", "RxErr nan\n"),
    ("ib_port_state", "4: DOWN\n"),  # a code with another state's name
    ("ib_port_state", "-4: ACTIVE\n"),
    ("ib_port_state", "9: ACTIVE\n"),
    ("ib_phys_state", "5: ACTIVE\n"),
    ("ib_rate", "banana\n"),
    ("ib_rate", "-400 Gb/sec (4X NDR)\n"),
    ("ib_rate", "0 Gb/sec (4X NDR)\n"),
    ("ib_rate", "1000000000000000000000000000000 Gb/sec (4X NDR)\n"),
    ("ib_rate", "nan Gb/sec (4X NDR)\n"),
    ("ib_rate", "inf Gb/sec\n"),
    ("counter", "-1\n"),
    ("counter", "18446744073709551616\n"),
    ("counter", "0x10\n"),
]


@pytest.mark.parametrize("kind,text", REFUSED, ids=[f"{k}:{t.strip()[:24]}" for k, t in REFUSED])
def test_values_outside_the_domain_are_a_parse_error_naming_the_content(kind, text):
    with pytest.raises(SysfsParseError) as err:
        PARSERS[kind](text)
    assert text.strip()[:10] in str(err.value) or not text.strip()


_TEXT = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    # near-misses of real values: a number, a unit, a state name
    st.builds(lambda n, tail: f"{n}{tail}",
              st.one_of(st.integers(-(2**70), 2**70).map(str), st.floats().map(repr)),
              st.sampled_from(["", "\n", " GT/s PCIe", " GT/s", " Gb/sec (4X NDR)", ": ACTIVE",
                               ": LinkUp", " x", "\n\n"])),
    st.lists(st.tuples(st.sampled_from(["RxErr", "TOTAL_ERR_COR", "Bad TLP", ""]),
                       st.one_of(st.integers(-5, 2**66).map(str), st.text(max_size=5))),
             max_size=5).map(lambda rows: "\n".join(f"{n} {c}" for n, c in rows)),
)


@pytest.mark.parametrize("kind", sorted(PARSERS))
@settings(deadline=None, derandomize=True, max_examples=150)
@given(text=_TEXT)
def test_nothing_but_the_parse_error_escapes_a_parser(kind, text):
    try:
        PARSERS[kind](text)
    except SysfsParseError:
        pass


# --- what the reader makes of it ---------------------------------------------------------------


def _port(root: Path, **files: str | bytes | None) -> Path:
    healthy: dict[str, str | bytes | None] = {
        "state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n", "rate": "400 Gb/sec (4X NDR)\n",
        "link_layer": "InfiniBand\n", "counters/link_downed": "0\n",
        "counters/symbol_error": "0\n",
    }
    healthy.update(files)
    d = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for rel, content in healthy.items():
        if content is None:
            continue
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(content.encode() if isinstance(content, str) else content)
    return d


def _reader(root: Path) -> SysfsReader:
    return SysfsReader(HostPaths(sysfs=str(root / "sys")))


def _errors(port) -> list[tuple[str, str]]:
    return [(os.path.basename(e.path), e.kind) for e in port.errors]


@pytest.mark.parametrize("content,kind", [
    ("banana\n", "junk"), ("", "junk"), ("-400 Gb/sec (4X NDR)\n", "junk"),
    (b"\xff\xfe\x00", "junk"), (None, "missing"),
], ids=["garbage", "empty", "negative", "non-utf8", "missing"])
def test_a_rate_that_does_not_parse_is_an_error_on_the_port(tmp_path, content, kind):
    _port(tmp_path, rate=content)
    (port,) = _reader(tmp_path).infiniband_ports()
    assert port.rate_gbit is None
    assert _errors(port) == [("rate", kind)]
    assert port.errors_for("rate") == port.errors and port.errors_for("state") == ()


def test_a_rate_that_is_a_directory_is_an_io_error(tmp_path):
    d = _port(tmp_path, rate=None)
    (d / "rate").mkdir()
    (port,) = _reader(tmp_path).infiniband_ports()
    assert _errors(port) == [("rate", "io")]
    assert "directory" in str(port.errors[0])


def test_link_downed_missing_or_a_directory_while_other_counters_exist_is_an_error(tmp_path):
    d = _port(tmp_path, **{"counters/link_downed": None})
    (port,) = _reader(tmp_path).infiniband_ports()
    assert _errors(port) == [("link_downed", "missing")]
    (d / "counters" / "link_downed").mkdir()
    (port,) = _reader(tmp_path).infiniband_ports()
    assert _errors(port) == [("link_downed", "io")]
    assert port.counter("link_downed") is None and port.counter("symbol_error") == 0


def test_a_port_without_a_counters_directory_needs_no_link_downed(tmp_path):
    _port(tmp_path, **{"counters/link_downed": None, "counters/symbol_error": None})
    (port,) = _reader(tmp_path).infiniband_ports()
    assert port.errors == () and port.counters is None


def test_poll_reads_the_four_files_again_through_the_same_parsers(tmp_path):
    d = _port(tmp_path)
    reader = _reader(tmp_path)
    (base,) = reader.infiniband_ports()
    (d / "state").write_text("1: DOWN\n")
    (d / "counters" / "link_downed").write_text("3\n")
    polled = reader.poll_ib_port(base)
    assert (polled.state, polled.phys_state, polled.counter("link_downed")) == ("DOWN",
                                                                                 "LinkUp", 3)
    assert polled.errors == ()
    (d / "rate").write_text("banana\n")
    (d / "counters" / "link_downed").unlink()
    polled = reader.poll_ib_port(base)
    assert _errors(polled) == [("rate", "junk"), ("link_downed", "missing")]
    assert polled.rate_text == "banana" and polled.rate_gbit is None


def test_poll_goes_through_the_io_boundary(tmp_path, monkeypatch):
    import errno

    _port(tmp_path)
    reader = _reader(tmp_path)
    (base,) = reader.infiniband_ports()
    real = sysfs_mod._read_bytes

    def deny(path):
        if path.endswith("phys_state"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path)

    monkeypatch.setattr(sysfs_mod, "_read_bytes", deny)
    assert _errors(reader.poll_ib_port(base)) == [("phys_state", "permission")]


@pytest.mark.parametrize("name,content", [
    ("max_link_width", "-16\n"), ("current_link_width", "99\n"),
    ("current_link_speed", "3.0 GT/s PCIe\n"), ("numa_node", "-7\n"),
    ("class", "0x" + "f" * 12 + "\n"), ("aer_dev_fatal", "TOTAL_ERR_FATAL -1\n"),
])
def test_pci_values_out_of_domain_are_junk_errors(tmp_path, name, content):
    d = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:18:00.0"
    d.mkdir(parents=True)
    healthy = {"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n",
               "current_link_speed": "32.0 GT/s PCIe\n", "max_link_speed": "32.0 GT/s PCIe\n",
               "current_link_width": "16\n", "max_link_width": "16\n",
               "aer_dev_correctable": "TOTAL_ERR_COR 0\n",
               "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL 0\n", "aer_dev_fatal": "TOTAL_ERR_FATAL 0\n",
               name: content}
    for n, c in healthy.items():
        (d / n).write_text(c)
    (dev,) = _reader(tmp_path).pci_devices()
    assert _errors(dev) == [(name, "junk")]
    if name.endswith("link_width"):
        assert dev.width_downgraded is None  # never judged on half a reading
    assert dev.unidentified is (name == "class")
