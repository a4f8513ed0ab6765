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

``parse_report`` raises ``PerftestParseError`` (the one error it raises, whatever the input) on
output without a header or without a row, so a crashed or garbled run is never read as a
bandwidth. Rows have a domain too: a line that starts like a row (message size, iterations)
must carry finite, non-negative numbers, and no bandwidth above ``MAX_RDMA_RATE_GBIT`` (faster
than any RDMA link: 1e30 Gb/s is a garbled number, not a fast NIC). perftest ends a report with
a rule line (``RESULT_LINE`` at full verbosity, write_bw.c); ``BwReport.complete`` says whether
one followed the last row, so output cut inside a row (``392.16  39``) is not read as 39 Gb/s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpu_monitor.hw.sysfs_values import MAX_RDMA_RATE_GBIT

MIB = 1 << 20

_HEADER_RE = re.compile(
    r"#bytes\s+#iterations\s+BW\s+peak\[(?P<unit>[A-Za-z]+/sec)\]\s+"
    r"BW\s+average\[(?P<unit2>[A-Za-z]+/sec)\]"
)
# A line that starts like a row: message size and iterations, then two or three more fields.
_ROW_LIKE_RE = re.compile(r"^\s*(?P<bytes>[0-9]{1,12})\s+(?P<iters>[0-9]{1,12})"
                          r"(?P<rest>(?:\s+\S+){2,3})\s*$")
_NUMBER_RE = re.compile(r"^[0-9]{1,40}(?:\.[0-9]{1,9})?$")
_RULE_RE = re.compile(r"^\s*-{20,}\s*$")
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
    complete: bool = True  # perftest's closing rule line followed the last row

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


def _row(line: str, m: re.Match[str], unit: str) -> BwRow:
    fields = m.group("rest").split()
    if not all(_NUMBER_RE.match(f) for f in fields):
        raise PerftestParseError(f"perftest row with a value that is not a finite, non-negative "
                                 f"number: {line.strip()[:120]!r}")
    peak, avg = float(fields[0]), float(fields[1])
    row = BwRow(int(m.group("bytes")), int(m.group("iters")), peak, avg,
                float(fields[2]) if len(fields) > 2 else None, unit)
    for what, gbit in (("peak", row.peak_gbit_per_s), ("average", row.gbit_per_s)):
        if not math.isfinite(gbit) or gbit > MAX_RDMA_RATE_GBIT:
            raise PerftestParseError(
                f"perftest row reports a {what} of {gbit:.6g} Gb/s, faster than any RDMA link "
                f"({MAX_RDMA_RATE_GBIT:g}): a garbled number, not a measurement: "
                f"{line.strip()[:120]!r}")
    return row


def parse_report(text: str) -> BwReport:
    """Every bandwidth row of a perftest log, each tagged with the unit of the header above it."""
    unit: str | None = None
    rows: list[BwRow] = []
    headers = 0
    closed = False
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
        if _RULE_RE.match(line):
            closed = closed or bool(rows)
            continue
        m = _ROW_LIKE_RE.match(line)
        if not m:
            continue
        if int(m.group("bytes")) <= 0:
            continue
        rows.append(_row(line, m, unit))
        closed = False
    if not headers:
        raise PerftestParseError("no perftest bandwidth header (#bytes #iterations BW ...) "
                                 "in the output")
    if not rows:
        raise PerftestParseError("perftest printed its header but no result row "
                                 "(the run ended early)")
    return BwReport(tuple(rows), complete=closed)
