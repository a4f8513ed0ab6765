"""Kernel-log text, one line at a time: shape detection, timestamps, continuation lines.

Why it exists: saved and followed logs arrive as dmesg (four timestamp styles), journal,
syslog, pstore or pasted text. :func:`parse_text_line` (pure, never raises) tells the shapes
apart from the line alone (package contract 5 and 6); :class:`LineAssembler` joins indented
continuation lines to the record before them (contract 3) for every reader of text: the
one-shot read, the followed file and the fast scan (``hw/kmsg_scan.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from gpu_monitor.hw.kmsg.record import (
    FIELD_KEY_RE,
    FORMAT_DMESG,
    FORMAT_DMESG_CTIME,
    FORMAT_DMESG_DECODE_ISO,
    FORMAT_DMESG_ISO,
    FORMAT_JOURNAL_SHORT_ISO,
    FORMAT_KMSG,
    FORMAT_MALFORMED,
    FORMAT_PLAIN,
    FORMAT_PSTORE,
    FORMAT_SYSLOG,
    KMSG_HEADER_RE,
    MAX_LINE_BYTES,
    KmsgRecord,
    kmsg_from_match,
    malformed_record,
    unescape_kmsg,
)

# Starts like a record but the full header did not match: a truncated or damaged record.
_KMSG_LIKE_RE = re.compile(r"\d{1,4},\d+,")
# dmesg: "[171167.620236] msg", "[    2.608284] msg"; "[123] msg" seen in pasted reports.
_MONO_RE = re.compile(r"\[\s*(\d+(?:\.\d+)?)\] ?")
# dmesg -T / --ctime: "[Sun Feb 23 16:24:18 2025] msg", "[Sun Dec  1 14:54:40 2024] msg".
_CTIME_RE = re.compile(
    r"\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d{1,2}):(\d\d):(\d\d) (\d{4})\] ?"
)
# dmesg --time-format=iso "2024-11-15T12:02:03,470068+00:00 msg"; journal short-iso
# "2025-01-02T15:20:12+0800 host kernel: msg"; short-iso-precise uses ".123456".
_ISO_RE = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)? "
)
_HOST_KERNEL_RE = re.compile(r"(\S+) kernel: ")
_HOST_RE = re.compile(r"([^\s:\[]+) (?=\S+: )")
# dmesg --decode: "kern  :warn  : ", "authpriv:info  : " (names padded to 6).
_DECODE_RE = re.compile(r"([a-z]+[0-7]?) *:([a-z]+) *: ")
# pstore/ERST dumps keep the syslog prefix: "<6>[    2.608284] msg", "<30>[ 12.97] msg".
_PSTORE_RE = re.compile(r"<(\d{1,3})>(?:\[\s*(\d+(?:\.\d+)?)\] ?)?")
# syslog / journalctl -o short, or grep output of either: "kernel: msg", "host kernel: msg",
# "Jan 21 04:41:44 host kernel: [123.4] msg".
_SYSLOG_RE = re.compile(r"(?:[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? )?(?:(\S+) )?kernel: ")

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
# util-linux dmesg --decode names; 12-15 are reserved and have none.
_FACILITIES = {
    "kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7,
    "uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11,
    **{f"local{i}": 16 + i for i in range(8)},
}  # fmt: skip
_LEVELS = {
    "emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7,
}  # fmt: skip
_UTC = timezone.utc
# Wall times a kernel log can honestly carry. A Linux clock starts at the Unix epoch, and event
# windows (days) are added to and subtracted from these times downstream: a stamp at the edge
# of the calendar (0001-01-01 with a positive offset, 9999-12-31) must not overflow there.
WALLCLOCK_MIN = datetime(1970, 1, 1, tzinfo=_UTC)
WALLCLOCK_MAX = datetime(9000, 1, 1, tzinfo=_UTC)


@lru_cache(maxsize=64)
def _tz(token: str | None) -> timezone | None:
    """``Z``, ``+00:00``, ``+0800``, ``-05:00`` as a timezone; none printed is taken as UTC.

    None for an offset no zone has (24 h or more, minutes past 59): such a stamp has no time.
    """
    if token is None or token == "Z":
        return _UTC
    hours, minutes = int(token[1:3]), int(token[-2:])
    if hours > 23 or minutes > 59:
        return None
    sign = -1 if token[0] == "-" else 1
    offset = sign * timedelta(hours=hours, minutes=minutes)
    return _UTC if not offset else timezone(offset)


def _wall(y: int, mo: int, d: int, h: int, mi: int, sec: int, micro: int,
          tz: timezone | None) -> datetime | None:
    """The UTC wall time, or None when it is not a real time in [WALLCLOCK_MIN, WALLCLOCK_MAX).

    Never raises: ``datetime`` refuses impossible fields (ValueError) and ``astimezone``
    overflows at the ends of the calendar (OverflowError); both mean "no timestamp".
    """
    if tz is None:
        return None
    try:
        dt = datetime(y, mo, d, h, mi, sec, micro, tzinfo=tz)
        if tz is not _UTC:
            dt = dt.astimezone(_UTC)
    except (ValueError, OverflowError):
        return None
    return dt if WALLCLOCK_MIN <= dt < WALLCLOCK_MAX else None


def _iso_datetime(m: re.Match[str]) -> datetime | None:
    """UTC datetime from an _ISO_RE match; None when the stamp is not a usable time."""
    y, mo, d, h, mi, sec, frac, zone = m.groups()
    micro = int(frac[:6].ljust(6, "0")) if frac else 0
    return _wall(int(y), int(mo), int(d), int(h), int(mi), int(sec), micro, _tz(zone))


def _ctime_datetime(m: re.Match[str], month: int) -> datetime | None:
    return _wall(int(m.group(6)), month, int(m.group(2)), int(m.group(3)), int(m.group(4)),
                 int(m.group(5)), 0, _UTC)


def _seconds(text: str) -> float | None:
    """A ``[mono]`` stamp as seconds; None when too big to be one (``float`` gives inf)."""
    value = float(text)
    return value if math.isfinite(value) else None


def _from_line(line: str, line_no: int, source_format: str, message: str,
               **parts: Any) -> KmsgRecord:
    """The record of one text line: ``raw`` is the line as read, ``line_no`` its number."""
    return KmsgRecord(message=message, source_format=source_format, raw=line, line_no=line_no,
                      **parts)


def _with_mono(rest: str) -> tuple[float | None, str]:
    """Strip a ``[ 123.456]`` stamp that syslog/journal lines sometimes keep."""
    if rest.startswith("["):
        m = _MONO_RE.match(rest)
        if m is not None:
            return _seconds(m.group(1)), rest[m.end() :]
    return None, rest


def _parse_bracket(
    line: str, line_no: int, priority: int | None, facility: int | None
) -> KmsgRecord | None:
    """``[mono] msg`` or ``[ctime] msg``; None when neither."""
    m = _MONO_RE.match(line)
    if m is not None:
        return _from_line(line, line_no, FORMAT_DMESG, line[m.end() :], priority=priority,
                          facility=facility, monotonic_s=_seconds(m.group(1)))
    m = _CTIME_RE.match(line)
    if m is not None:
        month = _MONTHS.get(m.group(1))
        if month is None:  # "[Xxx Yyy ...]" with no month name is not a dmesg -T stamp
            return None
        wall = _ctime_datetime(m, month)
        # Some collectors print journal lines under a dmesg -T stamp:
        # "[Sun Dec  1 14:54:40 2024] hostname kernel: mlx5_core ..." -- keep the host apart.
        at, host = m.end(), None
        j = _HOST_KERNEL_RE.match(line, at)
        if j is not None:
            at, host = j.end(), j.group(1)
        return _from_line(line, line_no, FORMAT_DMESG_CTIME, line[at:], priority=priority,
                          facility=facility, wallclock=wall, host=host)
    return None


def _parse_iso(
    line: str, start: int, line_no: int, priority: int | None, facility: int | None
) -> KmsgRecord | None:
    m = _ISO_RE.match(line, start)
    if m is None:
        return None
    wall = _iso_datetime(m)
    rest_at = m.end()
    if start:  # after a --decode prefix: always dmesg
        fmt, host = FORMAT_DMESG_DECODE_ISO, None
    else:
        j = _HOST_KERNEL_RE.match(line, rest_at)
        if j is not None:
            fmt, host, rest_at = FORMAT_JOURNAL_SHORT_ISO, j.group(1), j.end()
        elif m.group(7) is not None and line[m.start(7) - 1] == ",":
            # dmesg always prints ",micro"; the journal never uses a comma.
            fmt, host = FORMAT_DMESG_ISO, None
        else:
            # A journal line from another identifier ("host systemd[1]: ...") or a bare
            # kernel line: the host comes off, the identifier stays in the message.
            h = _HOST_RE.match(line, rest_at)
            fmt, host = FORMAT_JOURNAL_SHORT_ISO, None
            if h is not None:
                host, rest_at = h.group(1), h.end()
    mono: float | None = None
    message = line[rest_at:]
    if fmt == FORMAT_JOURNAL_SHORT_ISO:
        mono, message = _with_mono(message)
    return _from_line(line, line_no, fmt, message, priority=priority, facility=facility,
                      monotonic_s=mono, wallclock=wall, host=host)


def _parse_decode(line: str, line_no: int) -> KmsgRecord | None:
    m = _DECODE_RE.match(line)
    if m is None:
        return None
    facility = _FACILITIES.get(m.group(1))
    priority = _LEVELS.get(m.group(2))
    if facility is None or priority is None:
        return None
    at = m.end()
    rec = _parse_iso(line, at, line_no, priority, facility)
    if rec is not None:
        return rec
    rest = line[at:]
    if rest.startswith("["):
        rec = _parse_bracket(rest, line_no, priority, facility)
        if rec is not None:
            return replace(rec, raw=line)
    # dmesg --decode --notime
    return _from_line(line, line_no, FORMAT_DMESG, rest, priority=priority, facility=facility)


def _parse_pstore(line: str, line_no: int) -> KmsgRecord | None:
    m = _PSTORE_RE.match(line)
    if m is None:
        return None
    pri = int(m.group(1))
    if pri > 191:  # facility 23 (local7), level 7
        return None
    mono = m.group(2)
    return _from_line(line, line_no, FORMAT_PSTORE, line[m.end() :], priority=pri & 7,
                      facility=pri >> 3, monotonic_s=_seconds(mono) if mono is not None else None)


def _parse_syslog(line: str, line_no: int) -> KmsgRecord | None:
    m = _SYSLOG_RE.match(line)
    if m is None:
        return None
    mono, message = _with_mono(line[m.end() :])
    return _from_line(line, line_no, FORMAT_SYSLOG, message, monotonic_s=mono, host=m.group(1))


def _plain(line: str, line_no: int) -> KmsgRecord:
    return _from_line(line, line_no, FORMAT_PLAIN, line)


def parse_text_line(line: str, *, line_no: int = 0) -> KmsgRecord | None:
    """Parse one line of kernel-log text, detecting its shape from the line alone.

    Returns None for a blank line. Recognises raw kmsg records, dmesg (monotonic, ``-T``,
    ``--time-format=iso``, ``--decode``), ``journalctl -k -o short-iso``, syslog/journal lines
    with or without a timestamp, and pstore ``<pri>[mono]`` lines; anything else is
    ``"plain"``. A NUL byte, more than :data:`MAX_LINE_BYTES` characters or a truncated kmsg
    header gives a ``"malformed"`` record. Never raises.
    """
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    if not line or line.isspace():
        return None
    if len(line) > MAX_LINE_BYTES:
        return malformed_record(line[:MAX_LINE_BYTES], "line longer than 64 KiB", line_no)
    if "\x00" in line:
        return malformed_record(line, "NUL byte in line", line_no)
    c = line[0]
    rec: KmsgRecord | None = None
    if c == "[":
        rec = _parse_bracket(line, line_no, None, None)
    elif c == "<":
        rec = _parse_pstore(line, line_no)
    elif "0" <= c <= "9":
        m = KMSG_HEADER_RE.match(line)
        if m is not None:
            return kmsg_from_match(m, line[m.end() :], line, line_no)
        if _KMSG_LIKE_RE.match(line):
            return malformed_record(line, "truncated kmsg record", line_no)
        rec = _parse_iso(line, 0, line_no, None, None)
    elif "a" <= c <= "z":
        rec = _parse_decode(line, line_no)
    if rec is None and c not in " \t" and "kernel: " in line:
        rec = _parse_syslog(line, line_no)
    return rec if rec is not None else _plain(line, line_no)


# ---------------------------------------------------------------------------------------------
# Line assembly (shared by the file source and iter_file)
# ---------------------------------------------------------------------------------------------
class LineAssembler:
    """Turns raw lines into records, attaching indented continuation lines to the record before.

    ``feed`` returns the *previous* record once a new one starts (a record is complete only
    when the next line is not a continuation); ``take`` hands out the one still held.
    """

    __slots__ = ("parse_errors", "line_no", "origin", "line_offset", "_pending", "_open",
                 "_cont", "_fields", "_raws")

    def __init__(self) -> None:
        self.parse_errors = 0
        self.line_no = 0
        # A followed regular file's (device, inode); its reader sets ``line_offset`` to the byte
        # offset of each line before feeding it, and records starting there get ``position``.
        self.origin: tuple[int, int] | None = None
        self.line_offset = 0
        self._pending: KmsgRecord | None = None
        self._open = False  # pending record accepts continuation lines
        self._cont: list[str] = []
        self._fields: dict[str, str] = {}
        self._raws: list[str] = []

    @property
    def holding(self) -> bool:
        return self._pending is not None

    @property
    def held_offset(self) -> int | None:
        """The byte offset of the held record's first line (a followed file's reader sets
        ``origin``), else None: a resume must start there, not past it."""
        rec = self._pending
        return rec.position[2] if rec is not None and rec.position is not None else None

    @property
    def accepting(self) -> bool:
        """A record is held that an indented line would join as a continuation."""
        return self._open

    def feed(self, data: bytes) -> KmsgRecord | None:
        self.line_no += 1
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._start(
                malformed_record(data.decode("utf-8", "replace"), "invalid UTF-8", self.line_no)
            )
        if line.endswith("\r"):
            line = line[:-1]
        if not line or line.isspace():
            return None
        if self._open and (line[0] == " " or line[0] == "\t") and "\x00" not in line:
            self._attach(line)
            return None
        rec = parse_text_line(line, line_no=self.line_no)
        return self._start(rec) if rec is not None else None

    def feed_overlong(self, head: bytes) -> KmsgRecord | None:
        """A line past MAX_LINE_BYTES: ``head`` is its start; the caller drops the rest."""
        self.line_no += 1
        text = head.decode("utf-8", "replace")
        return self._start(malformed_record(text, "line longer than 64 KiB", self.line_no))

    def take(self) -> KmsgRecord | None:
        rec = self._pending
        if rec is None:
            return None
        if self._raws:
            rec = replace(
                rec,
                raw="\n".join((rec.raw, *self._raws)),
                continuation=rec.continuation + tuple(self._cont),
                fields=MappingProxyType({**rec.fields, **self._fields})
                if self._fields
                else rec.fields,
            )
            self._cont.clear()
            self._fields.clear()
            self._raws.clear()
        self._pending = None
        self._open = False
        return rec

    def _start(self, rec: KmsgRecord) -> KmsgRecord | None:
        prev = self.take()
        if self.origin is not None:
            rec = replace(rec, position=(*self.origin, self.line_offset))
        if rec.source_format == FORMAT_MALFORMED:
            self.parse_errors += 1
        self._pending = rec
        self._open = rec.source_format != FORMAT_MALFORMED
        return prev

    def _attach(self, line: str) -> None:
        self._raws.append(line)
        if self._pending is not None and self._pending.source_format == FORMAT_KMSG:
            key, sep, value = line[1:].partition("=")
            if line[0] == " " and sep and FIELD_KEY_RE.fullmatch(key):
                self._fields[key] = unescape_kmsg(value)
                return
        self._cont.append(line.lstrip())

