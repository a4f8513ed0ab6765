"""Kernel-log shapes for the tables of tests/hw, tests/checks and tests/badinput.

Stamps: each text format the reader knows is rendered from plain fields (date, time, offset), so
one table can put any value, possible or not, into every format: the real layouts are those of
util-linux ``dmesg -T`` / ``--time-format=iso`` / ``--decode``, ``journalctl -o short-iso``
(and ``short-iso-precise``), BSD syslog and pstore dumps, as in tests/fixtures/xid_kmsg.

Paths: every way a ``--kmsg`` path can give nothing to read (``make_log_path``), with the
words the resulting error must contain.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
HOST = "gpu-node-7"


@dataclass(frozen=True)
class Stamp:
    """A wall-clock stamp's printed fields; ``offset`` as ``+HH:MM``. ``offset_only``: the
    stamp is wrong only through its offset (dmesg -T prints none, so it cannot carry it)."""

    id: str
    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: int
    offset: str = "+00:00"
    offset_only: bool = False

    @property
    def date(self) -> str:
        return f"{self.year:04d}-{self.month:02d}-{self.day:02d}"

    @property
    def time(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}:{self.second:02d}"


def _ctime(s: Stamp, msg: str) -> str | None:
    if s.offset_only or not 1 <= s.month <= 12:
        return None  # no zone in a dmesg -T stamp; a month it cannot name
    # The weekday is printed but not read; Mon for every date keeps impossible ones printable.
    return (f"[Mon {MONTHS[s.month - 1]} {s.day:2d} {s.hour:02d}:{s.minute:02d}:"
            f"{s.second:02d} {s.year:04d}] {msg}")


def _dmesg_iso(s: Stamp, msg: str) -> str:
    return f"{s.date}T{s.time},470068{s.offset} {msg}"


def _decode_iso(s: Stamp, msg: str) -> str:
    return f"kern  :warn  : {_dmesg_iso(s, msg)}"


def _journal(s: Stamp, msg: str, fraction: str = "") -> str:
    """``journalctl -o short-iso``: the offset without its colon, the host, ``kernel:``."""
    return f"{s.date}T{s.time}{fraction}{s.offset.replace(':', '')} {HOST} kernel: {msg}"


def _journal_precise(s: Stamp, msg: str) -> str:
    """``journalctl -o short-iso-precise``: short-iso with microseconds."""
    return _journal(s, msg, ".123456")


# name -> (render(stamp, message) -> line or None when the format cannot print the stamp,
#          the source_format the reader must give the line)
WALLCLOCK_FORMATS: dict[str, tuple[Callable[[Stamp, str], str | None], str]] = {
    "dmesg-ctime": (_ctime, "dmesg-ctime"),
    "dmesg-iso": (_dmesg_iso, "dmesg-iso"),
    "dmesg-decode-iso": (_decode_iso, "dmesg-decode-iso"),
    "journal-short-iso": (_journal, "journal-short-iso"),
    "journal-short-iso-precise": (_journal_precise, "journal-short-iso"),
}

# A good stamp, for the lines around the garbled one.
GOOD = Stamp("good", 2025, 1, 2, 15, 20, 12, "+08:00")

# Stamps no real kernel log carries: each must parse to "no time", never raise.
EDGES: tuple[Stamp, ...] = (
    # The line: year 1 east of UTC is before datetime.min once converted.
    Stamp("calendar-start-east", 1, 1, 1, 0, 0, 0, "+05:00"),
    Stamp("calendar-end-west", 9999, 12, 31, 23, 59, 59, "-05:00"),
    Stamp("year-zero", 0, 1, 1, 0, 0, 0),
    Stamp("before-the-epoch", 1969, 12, 31, 23, 59, 59),
    Stamp("past-the-horizon", 9500, 6, 1, 12, 0, 0),
    Stamp("month-13", 2025, 13, 2, 15, 20, 12, "+08:00"),
    Stamp("month-0", 2025, 0, 2, 15, 20, 12, "+08:00"),
    Stamp("day-0", 2025, 1, 0, 15, 20, 12, "+08:00"),
    Stamp("day-32", 2025, 1, 32, 15, 20, 12, "+08:00"),
    Stamp("feb-29-not-a-leap-year", 2023, 2, 29, 15, 20, 12, "+08:00"),
    Stamp("hour-24", 2025, 1, 2, 24, 20, 12, "+08:00"),
    Stamp("minute-60", 2025, 1, 2, 15, 60, 12, "+08:00"),
    Stamp("second-61", 2025, 1, 2, 15, 20, 61, "+08:00"),
    Stamp("offset-24h", 2025, 1, 2, 15, 20, 12, "+24:00", offset_only=True),
    Stamp("offset-99h", 2025, 1, 2, 15, 20, 12, "-99:99", offset_only=True),
    Stamp("offset-minute-60", 2025, 1, 2, 15, 20, 12, "+05:60", offset_only=True),
)

# In range at both ends: these keep their time.
IN_RANGE: tuple[Stamp, ...] = (
    Stamp("the-epoch", 1970, 1, 1, 0, 0, 0),
    Stamp("leap-day", 2024, 2, 29, 23, 59, 59, "-05:00"),
    Stamp("far-future", 8999, 12, 31, 23, 59, 59),
)

# Monotonic stamps too big for a float (float() gives inf): "no time", shape kept.
HUGE_SECONDS = "9" * 400
MONOTONIC_FORMATS: dict[str, tuple[Callable[[str, str], str], str]] = {
    "dmesg": (lambda v, msg: f"[{v}] {msg}", "dmesg"),
    "dmesg-decode": (lambda v, msg: f"kern  :warn  : [{v}] {msg}", "dmesg"),
    "pstore": (lambda v, msg: f"<4>[{v}] {msg}", "pstore"),
    "syslog": (lambda v, msg: f"Jan 21 04:41:44 {HOST} kernel: [{v}] {msg}", "syslog"),
    "journal-short-iso": (lambda v, msg: _journal(GOOD, f"[{v}] {msg}"), "journal-short-iso"),
}


def wallclock_lines(stamps=EDGES, msg: str = "x"):
    """(id, line, expected source_format, stamp) for every format that can print each stamp."""
    for stamp in stamps:
        for name, (render, fmt) in WALLCLOCK_FORMATS.items():
            line = render(stamp, msg)
            if line is not None:
                yield f"{name}-{stamp.id}", line, fmt, stamp


# --- paths that give nothing to read -----------------------------------------------------------

# shape -> words the scan's error names (besides the path)
PATH_SHAPES: dict[str, str] = {
    "missing": "No such file or directory",
    "directory": "Is a directory",
    "dangling-symlink": "No such file or directory",
    "unreadable": "Permission denied",
    "device": "not a regular file or FIFO",
    "fifo-without-writer": "nothing was written to the FIFO",
    "empty-file": "the file is empty",
    "blank-lines-only": "only blank lines",
}
LOG_NAME = "kern.log"


def make_log_path(tmp: Path, shape: str) -> Path:
    """``tmp/kern.log`` in the given shape. "unreadable" is mode 000, which root reads anyway:
    pair it with ``deny_open`` (the tests do when running as root)."""
    path = tmp / LOG_NAME
    if shape == "missing":
        pass
    elif shape == "directory":
        path.mkdir()
    elif shape == "dangling-symlink":
        os.symlink(tmp / "rotated-away.log", path)
    elif shape == "unreadable":
        path.write_text("[1.0] NVRM: Xid (PCI:0000:86:00): 48, pid=1, name=x, DBE\n")
        path.chmod(0)
    elif shape == "device":
        os.symlink(os.devnull, path)
    elif shape == "fifo-without-writer":
        os.mkfifo(path)
    elif shape == "empty-file":
        path.write_bytes(b"")
    elif shape == "blank-lines-only":
        path.write_bytes(b"\n  \n\t\n")
    else:
        raise ValueError(shape)
    return path


def deny_open(monkeypatch, path: Path) -> None:
    """open(2) of ``path`` fails with EACCES, as it does for a reader without permission; every
    other open goes through. Root reads a mode-000 file anyway, so the refusal is made here."""
    real_open = os.open
    denied = os.fspath(path)

    def fake_open(file, flags, *args, **kwargs):
        if os.fspath(file) == denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), denied)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


def unreadable_needs_faking() -> bool:
    return os.geteuid() == 0
