"""Parse perftest bandwidth reports (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``).

A report is a header line naming the units and one row per message size::

     #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
     8388608    20000            24056.74            24056.72              0.003007

Facts the parser relies on (perftest ``src/perftest_resources.c``, ``print_report_bw``):

- Without ``--report_gbits`` the unit is 2^20 bytes per second, printed ``MB/sec`` by older
  releases and ``MiB/sec`` by newer ones; with it, ``Gb/sec`` is 10^9 bits per second
  (bytes / 125,000,000). ``gbit_per_s`` converts either to Gbit/s.
- A loopback log holds the server's and the client's lines interleaved (both print the header
  and the row; the numbers are the same), and ``-a`` prints one row per size from 2 B to 8 MiB.
- Other lines may sit between the header and the rows (``Conflicting CPU frequency values
  detected ...``, CUDA buffer messages with ``--use_cuda``); only rows of numbers count.
- With ``-D`` (duration mode) the peak column is ``0.00``: use the average.

``parse_report`` raises ``PerftestParseError`` on output without a header or without a row, so a
crashed or garbled run is never read as a bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20

_HEADER_RE = re.compile(
    r"#bytes\s+#iterations\s+BW\s+peak\[(?P<unit>[A-Za-z]+/sec)\]\s+"
    r"BW\s+average\[(?P<unit2>[A-Za-z]+/sec)\]"
)
_ROW_RE = re.compile(
    r"^\s*(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>\d+(?:\.\d+)?)\s+"
    r"(?P<avg>\d+(?:\.\d+)?)(?:\s+(?P<rate>\d+(?:\.\d+)?))?\s*$"
)
# Unit label -> Gbit/s per unit.
_TO_GBIT = {
    "Gb/sec": 1.0,
    "MB/sec": MIB * 8 / 1e9,
    "MiB/sec": MIB * 8 / 1e9,
}


class PerftestParseError(ValueError):
    """The output holds no perftest bandwidth report."""


@dataclass(frozen=True)
class BwRow:
    """One message size of a bandwidth report, in the report's own unit."""

    bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float | None
    unit: str  # "Gb/sec", "MB/sec" or "MiB/sec"

    @property
    def gbit_per_s(self) -> float:
        """Average bandwidth in Gbit/s (10^9 bits per second)."""
        return self.bw_average * _TO_GBIT[self.unit]

    @property
    def peak_gbit_per_s(self) -> float:
        return self.bw_peak * _TO_GBIT[self.unit]


@dataclass(frozen=True)
class BwReport:
    rows: tuple[BwRow, ...]

    @property
    def unit(self) -> str:
        return self.rows[-1].unit

    def sizes(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(r.bytes for r in self.rows))

    def row_for(self, size: int) -> BwRow | None:
        """The last row for ``size`` (the client's, in an interleaved loopback log)."""
        found = [r for r in self.rows if r.bytes == size]
        return found[-1] if found else None

    @property
    def largest(self) -> BwRow:
        return max(self.rows, key=lambda r: (r.bytes, self.rows.index(r)))


def parse_report(text: str) -> BwReport:
    """Every bandwidth row of a perftest log, each tagged with the unit of the header above it."""
    unit: str | None = None
    rows: list[BwRow] = []
    headers = 0
    for line in text.splitlines():
        header = _HEADER_RE.search(line)
        if header:
            label = header.group("unit")
            if label not in _TO_GBIT or header.group("unit2") != label:
                raise PerftestParseError(f"unknown perftest bandwidth unit in {line.strip()!r}")
            unit = label
            headers += 1
            continue
        if unit is None:
            continue
        m = _ROW_RE.match(line)
        if not m:
            continue
        size, iters = int(m.group("bytes")), int(m.group("iters"))
        if size <= 0:
            continue
        rate = m.group("rate")
        rows.append(BwRow(size, iters, float(m.group("peak")), float(m.group("avg")),
                          float(rate) if rate is not None else None, unit))
    if not headers:
        raise PerftestParseError("no perftest bandwidth header (#bytes #iterations BW ...) "
                                 "in the output")
    if not rows:
        raise PerftestParseError("perftest printed its header but no result row "
                                 "(the run ended early)")
    return BwReport(tuple(rows))
