"""The kernel log, as records: ``/dev/kmsg`` and saved or followed dmesg/journal/syslog text.

Why it exists: XIDs, SXids, mlx5 and PCIe events reach us only through the kernel log, and the
log reaches us in many shapes (the live record device, ``dmesg`` with four timestamp styles,
``journalctl -k``, syslog, pstore dumps, lines pasted into reports). This module turns every
shape into one value, :class:`KmsgRecord`, and leaves meaning (which line is an Xid) to the
rules that consume records.

Contract (what callers may rely on):

1. Parsing is pure. :func:`parse_text_line` never raises; unknown shapes become ``"plain"``
   records whose ``message`` is the whole line. :func:`parse_kmsg_record` raises
   :class:`KmsgParseError` (a ``ValueError``) on anything that is not a record.
2. Readers (:class:`KmsgDeviceSource`, :class:`KmsgFileSource`, :func:`iter_file`) never raise
   on bad *input*. Each bad line or record -- not UTF-8, containing a NUL byte, longer than
   :data:`MAX_LINE_BYTES`, or a truncated ``pri,seq,usec,flags;`` header -- becomes exactly one
   record with ``source_format == "malformed"`` (best-effort text in ``message``, the reason in
   ``fields["error"]``) and adds one to the source's ``parse_errors``. Blank lines are skipped
   and are not errors. I/O errors (a missing file, no permission on ``/dev/kmsg``) do raise.
3. Continuation: a text line that begins with whitespace belongs to the record before it (the
   way dmesg prints multi-line NVRM output). Its text, left-stripped, goes to
   ``continuation``; in raw kmsg text a `` KEY=value`` line goes to ``fields`` instead. A
   whitespace line with no record before it is a ``"plain"`` record of its own. A followed
   source hands out the last record when no more data is available, so a continuation line
   written later than its record arrives as its own ``"plain"`` record.
4. ``/dev/kmsg``: one ``read()`` is one record; the read buffer (:data:`KMSG_READ_BUFFER`) is
   larger than the kernel's longest record, so ``EINVAL`` cannot happen; ``EAGAIN`` means
   "nothing more now"; ``EPIPE`` (records overwritten before we read them) yields a
   :class:`KmsgGap` and reading resumes at the oldest record still present. A jump in sequence
   numbers between two reads is reported as a gap too.
5. Shapes, told apart by the line's start: ``pri,seq,usec,flags;`` raw kmsg (``\\xNN``
   escapes undone; an escaped newline splits into ``continuation``); ``[mono]`` dmesg;
   ``[Www Mmm dd HH:MM:SS YYYY]`` dmesg -T (a ``host kernel:`` after it goes to ``host``);
   ISO stamps with a ``,micro`` fraction are dmesg, other ISO stamps are the journal;
   ``kern  :warn  :`` dmesg --decode (its facility and level kept); ``<pri>[mono]`` pstore;
   ``[Mmm dd HH:MM:SS] [host] kernel:`` syslog. Everything else is ``"plain"``.
6. Times: ``monotonic_s`` is seconds since boot. ``wallclock`` is UTC-aware. ``dmesg -T``
   prints the reading host's *local* time without a zone; we take it as UTC (DaemonSet
   containers run in UTC). Syslog ``Mon DD HH:MM:SS`` stamps carry no year, so they give no
   ``wallclock``. Journal offsets like ``+0800`` are converted to UTC. A stamp whose value is
   impossible (month 13, Feb 30, hour 24, an offset of 24 h or more, a monotonic stamp too big
   for a float) or whose wall time falls outside [:data:`WALLCLOCK_MIN`,
   :data:`WALLCLOCK_MAX`) gives *no* time (None) but keeps the line's shape and message, so
   the event on the line is still found.
7. One-shot reads (:func:`iter_file`, :func:`open_log_file`) open without blocking: a FIFO
   with no writer neither hangs the open nor the read; it is read until its writers close it
   or nothing arrives for :data:`FIFO_IDLE_S`. Only regular files and FIFOs are logs here; a
   directory or a device raises ``OSError`` naming the path.

Sources are single-consumer objects (no locking); nothing here spells a host path -- the
default comes from :attr:`HostPaths.kmsg_path`.
"""

from __future__ import annotations

import errno
import io
import math
import os
import re
import select
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from types import MappingProxyType
from typing import Protocol

from gpu_monitor.hw.paths import HostPaths

# Longest line/record we accept. Real kernel records stop at 8 KiB (CONSOLE_EXT_LOG_MAX);
# anything past 64 KiB is not a log line and must not make a follower buffer without bound.
MAX_LINE_BYTES = 64 * 1024
# /dev/kmsg answers EINVAL when the buffer is smaller than the next record (<= 8 KiB).
KMSG_READ_BUFFER = 16 * 1024
# Bytes per read() when following a text file or FIFO.
FILE_READ_CHUNK = 64 * 1024
# A one-shot read of a FIFO ends when nothing (no writer, no data) arrives for this long.
FIFO_IDLE_S = 1.0

FORMAT_KMSG = "kmsg"
FORMAT_DMESG = "dmesg"
FORMAT_DMESG_CTIME = "dmesg-ctime"
FORMAT_DMESG_ISO = "dmesg-iso"
FORMAT_DMESG_DECODE_ISO = "dmesg-decode-iso"
FORMAT_JOURNAL_SHORT_ISO = "journal-short-iso"
FORMAT_SYSLOG = "syslog"
FORMAT_PSTORE = "pstore"
FORMAT_PLAIN = "plain"
FORMAT_MALFORMED = "malformed"
SOURCE_FORMATS = (
    FORMAT_KMSG,
    FORMAT_DMESG,
    FORMAT_DMESG_CTIME,
    FORMAT_DMESG_ISO,
    FORMAT_DMESG_DECODE_ISO,
    FORMAT_JOURNAL_SHORT_ISO,
    FORMAT_SYSLOG,
    FORMAT_PSTORE,
    FORMAT_PLAIN,
    FORMAT_MALFORMED,
)

_NO_FIELDS: Mapping[str, str] = MappingProxyType({})


def _no_fields() -> Mapping[str, str]:
    return _NO_FIELDS


@dataclass(frozen=True, slots=True, kw_only=True)
class KmsgRecord:
    """One kernel-log message, whatever shape it arrived in.

    ``message`` is the text after any prefix (timestamp, level, host); ``raw`` is the input
    exactly (record or line(s), without the final newline). ``line_no`` is the 1-based line of
    the record's first line in a text source, the 1-based count of records read from a device,
    or what the caller passed to the parse functions (default 0).
    """

    message: str
    source_format: str
    raw: str
    line_no: int = 0
    seq: int | None = None
    priority: int | None = None  # syslog level 0 (emerg) .. 7 (debug)
    facility: int | None = None  # 0 = kern, 1 = user, 3 = daemon, ...
    monotonic_s: float | None = None
    wallclock: datetime | None = None
    host: str | None = None
    fields: Mapping[str, str] = field(default_factory=_no_fields, hash=False)
    continuation: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The message with its continuation lines, newline-joined."""
        if not self.continuation:
            return self.message
        return "\n".join((self.message, *self.continuation))

    @property
    def malformed(self) -> bool:
        return self.source_format == FORMAT_MALFORMED


@dataclass(frozen=True, slots=True)
class KmsgGap:
    """Records were lost between two reads (ring-buffer overrun); ``missed`` when countable."""

    missed: int | None
    reason: str


class KmsgParseError(ValueError):
    """The bytes are not a ``/dev/kmsg`` record."""


# ---------------------------------------------------------------------------------------------
# Pure parsing
# ---------------------------------------------------------------------------------------------

# /dev/kmsg: "6,3964,206764307,-;msg"; newer kernels add fields after the flags
# ("4,1227,437812449,c,1,-;msg", ",caller=T42").
_KMSG_RE = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),([^,;]*)[^;]*;")
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
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
_FIELD_KEY_RE = re.compile(r"[A-Za-z0-9_+.-]+")

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


def _unescape_kmsg(text: str) -> str:
    """Undo /dev/kmsg's ``\\xNN`` escaping of control bytes, newlines and backslashes."""
    if "\\x" not in text:
        return text
    return _KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def _malformed(text: str, reason: str, line_no: int) -> KmsgRecord:
    return KmsgRecord(
        message=text,
        source_format=FORMAT_MALFORMED,
        raw=text,
        line_no=line_no,
        fields=MappingProxyType({"error": reason}),
    )


def _split_message(message: str) -> tuple[str, tuple[str, ...]]:
    """An unescaped kmsg message may hold newlines; dmesg shows those as continuation lines."""
    if "\n" not in message:
        return message, ()
    first, *rest = message.split("\n")
    return first, tuple(r.lstrip() for r in rest if r.strip())


def _kmsg_from_match(m: re.Match[str], message: str, raw: str, line_no: int) -> KmsgRecord:
    pri = int(m.group(1))
    message, continuation = _split_message(_unescape_kmsg(message))
    return KmsgRecord(
        message=message,
        source_format=FORMAT_KMSG,
        raw=raw,
        line_no=line_no,
        seq=int(m.group(2)),
        priority=pri & 7,
        facility=pri >> 3,
        monotonic_s=int(m.group(3)) / 1e6,
        continuation=continuation,
    )


def parse_kmsg_record(data: bytes | str, *, line_no: int = 0) -> KmsgRecord:
    """Parse one ``/dev/kmsg`` record: ``pri,seq,usec,flags[,...];message`` then optional
    `` KEY=value`` dictionary lines (``SUBSYSTEM=pci``, ``DEVICE=+pci:0000:3b:00.0``).

    ``pri`` is facility*8 + level. Raises :class:`KmsgParseError` on anything else.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise KmsgParseError(f"record is not UTF-8: {e}") from None
    else:
        text = data
    text = text.rstrip("\n")
    if not text:
        raise KmsgParseError("empty record")
    if "\x00" in text:
        raise KmsgParseError("record contains a NUL byte")
    head, _, rest = text.partition("\n")
    m = _KMSG_RE.match(head)
    if m is None:
        raise KmsgParseError(f"not a kmsg record header: {head[:80]!r}")
    rec = _kmsg_from_match(m, head[m.end() :], text, line_no)
    if not rest:
        return rec
    fields: dict[str, str] = {}
    extra: list[str] = []
    for line in rest.split("\n"):
        if not line.strip():
            continue
        key, sep, value = line[1:].partition("=")
        if line[0] == " " and sep and _FIELD_KEY_RE.fullmatch(key):
            fields[key] = _unescape_kmsg(value)
        else:
            extra.append(line.strip())
    return replace(
        rec,
        fields=MappingProxyType(fields) if fields else _NO_FIELDS,
        continuation=rec.continuation + tuple(extra),
    )


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
        return KmsgRecord(
            message=line[m.end() :],
            source_format=FORMAT_DMESG,
            raw=line,
            line_no=line_no,
            priority=priority,
            facility=facility,
            monotonic_s=_seconds(m.group(1)),
        )
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
        return KmsgRecord(
            message=line[at:],
            source_format=FORMAT_DMESG_CTIME,
            raw=line,
            line_no=line_no,
            priority=priority,
            facility=facility,
            wallclock=wall,
            host=host,
        )
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
    return KmsgRecord(
        message=message,
        source_format=fmt,
        raw=line,
        line_no=line_no,
        priority=priority,
        facility=facility,
        monotonic_s=mono,
        wallclock=wall,
        host=host,
    )


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
    return KmsgRecord(
        message=rest,
        source_format=FORMAT_DMESG,
        raw=line,
        line_no=line_no,
        priority=priority,
        facility=facility,
    )


def _parse_pstore(line: str, line_no: int) -> KmsgRecord | None:
    m = _PSTORE_RE.match(line)
    if m is None:
        return None
    pri = int(m.group(1))
    if pri > 191:  # facility 23 (local7), level 7
        return None
    mono = m.group(2)
    return KmsgRecord(
        message=line[m.end() :],
        source_format=FORMAT_PSTORE,
        raw=line,
        line_no=line_no,
        priority=pri & 7,
        facility=pri >> 3,
        monotonic_s=_seconds(mono) if mono is not None else None,
    )


def _parse_syslog(line: str, line_no: int) -> KmsgRecord | None:
    m = _SYSLOG_RE.match(line)
    if m is None:
        return None
    mono, message = _with_mono(line[m.end() :])
    return KmsgRecord(
        message=message,
        source_format=FORMAT_SYSLOG,
        raw=line,
        line_no=line_no,
        monotonic_s=mono,
        host=m.group(1),
    )


def _plain(line: str, line_no: int) -> KmsgRecord:
    return KmsgRecord(message=line, source_format=FORMAT_PLAIN, raw=line, line_no=line_no)


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
        return _malformed(line[:MAX_LINE_BYTES], "line longer than 64 KiB", line_no)
    if "\x00" in line:
        return _malformed(line, "NUL byte in line", line_no)
    c = line[0]
    rec: KmsgRecord | None = None
    if c == "[":
        rec = _parse_bracket(line, line_no, None, None)
    elif c == "<":
        rec = _parse_pstore(line, line_no)
    elif "0" <= c <= "9":
        m = _KMSG_RE.match(line)
        if m is not None:
            return _kmsg_from_match(m, line[m.end() :], line, line_no)
        if _KMSG_LIKE_RE.match(line):
            return _malformed(line, "truncated kmsg record", line_no)
        rec = _parse_iso(line, 0, line_no, None, None)
    elif "a" <= c <= "z":
        rec = _parse_decode(line, line_no)
    if rec is None and c not in " \t" and "kernel: " in line:
        rec = _parse_syslog(line, line_no)
    return rec if rec is not None else _plain(line, line_no)


# ---------------------------------------------------------------------------------------------
# Line assembly (shared by the file source and iter_file)
# ---------------------------------------------------------------------------------------------


class _Assembler:
    """Turns raw lines into records, attaching indented continuation lines to the record before.

    ``feed`` returns the *previous* record once a new one starts (a record is complete only
    when the next line is not a continuation); ``take`` hands out the one still held.
    """

    __slots__ = ("parse_errors", "line_no", "_pending", "_open", "_cont", "_fields", "_raws")

    def __init__(self) -> None:
        self.parse_errors = 0
        self.line_no = 0
        self._pending: KmsgRecord | None = None
        self._open = False  # pending record accepts continuation lines
        self._cont: list[str] = []
        self._fields: dict[str, str] = {}
        self._raws: list[str] = []

    @property
    def holding(self) -> bool:
        return self._pending is not None

    def feed(self, data: bytes) -> KmsgRecord | None:
        self.line_no += 1
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._start(
                _malformed(data.decode("utf-8", "replace"), "invalid UTF-8", self.line_no)
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
        return self._start(_malformed(text, "line longer than 64 KiB", self.line_no))

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
        if rec.source_format == FORMAT_MALFORMED:
            self.parse_errors += 1
        self._pending = rec
        self._open = rec.source_format != FORMAT_MALFORMED
        return prev

    def _attach(self, line: str) -> None:
        self._raws.append(line)
        if self._pending is not None and self._pending.source_format == FORMAT_KMSG:
            key, sep, value = line[1:].partition("=")
            if line[0] == " " and sep and _FIELD_KEY_RE.fullmatch(key):
                self._fields[key] = _unescape_kmsg(value)
                return
        self._cont.append(line.lstrip())


def open_log_file(path: str | os.PathLike[str]) -> tuple[int, bool]:
    """Open a saved log or a FIFO for a one-shot read: ``(fd, is_fifo)``.

    ``O_NONBLOCK``, so a FIFO with no writer opens at once instead of waiting for one. Raises
    ``OSError`` naming the path for what cannot be read (missing, dangling symlink, no
    permission) and for what is not a log: a directory, a device, a socket.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise OSError(errno.EINVAL, "not a regular file or FIFO (read the record device "
                          "through --path.dev, not --kmsg)", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, stat.S_ISFIFO(mode)


class _FifoRaw(io.RawIOBase):
    """A FIFO opened ``O_NONBLOCK`` read as a finite stream.

    End of stream when every writer has closed it, or when nothing arrives for ``idle_s``
    (no writer ever came, or one stays open and silent). Linux reports end-of-file at once
    while no writer is attached, so before data or a writer was seen we wait in ``poll``,
    which only wakes for data or for a writer that came and went.
    """

    def __init__(self, fd: int, idle_s: float):
        super().__init__()
        self._fd = fd
        self._idle_ms = max(0, int(idle_s * 1000))
        self._writer_seen = False
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while True:
            try:
                n = os.readv(self._fd, [buffer])
            except BlockingIOError:
                n = -1  # a writer is attached, nothing written yet
            if n > 0:
                self._writer_seen = True
                return n
            if n == 0 and self._writer_seen:
                return 0
            self._writer_seen = self._writer_seen or n < 0
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            if not poller.poll(self._idle_ms):
                self.timed_out = True
                return 0
            self._writer_seen = True

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def log_stream(fd: int, is_fifo: bool, fifo_idle_s: float = FIFO_IDLE_S) -> io.BufferedReader:
    """A buffered reader over a descriptor from :func:`open_log_file` (it owns the fd); for a
    FIFO its ``raw.timed_out`` tells afterwards whether the read ended by idling."""
    if is_fifo:
        return io.BufferedReader(_FifoRaw(fd, fifo_idle_s), FILE_READ_CHUNK)
    return open(fd, "rb")


def read_records(stream: io.BufferedIOBase) -> Iterator[KmsgRecord]:
    """Every record of a binary line stream, start to end (what :func:`iter_file` yields)."""
    asm = _Assembler()
    limit = MAX_LINE_BYTES + 1
    readline = stream.readline
    while True:
        data = readline(limit)
        if not data:
            break
        if data[-1] == 0x0A:
            rec = asm.feed(data[:-1])
        elif len(data) == limit:
            rec = asm.feed_overlong(data[:MAX_LINE_BYTES])
            while True:  # drop the rest of the over-long line
                more = readline(limit)
                if not more or more[-1] == 0x0A:
                    break
        else:
            rec = asm.feed(data)
        if rec is not None:
            yield rec
    last = asm.take()
    if last is not None:
        yield last


def iter_file(path: str | os.PathLike[str], *,
              fifo_idle_s: float = FIFO_IDLE_S) -> Iterator[KmsgRecord]:
    """Every record of a saved log, start to end (formats auto-detected per line).

    Malformed lines come out as ``"malformed"`` records; a last line without a newline counts.
    A FIFO is read until its writers close it or it stays idle for ``fifo_idle_s``.
    """
    with log_stream(*open_log_file(path), fifo_idle_s) as stream:
        yield from read_records(stream)


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


class KmsgReader(Protocol):
    """What :class:`KmsgDeviceSource` reads from: one record per ``read``.

    ``read`` raises ``BlockingIOError`` when nothing is available and ``OSError(EPIPE)`` when
    records were overwritten, exactly as ``os.read`` on ``/dev/kmsg`` does.
    """

    def read(self, size: int) -> bytes: ...

    def seek_end(self) -> None: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class FdRecordReader:
    """A :class:`KmsgReader` over an open file descriptor (``/dev/kmsg``, or in tests a
    ``SOCK_SEQPACKET`` socket, which keeps the same one-record-per-read boundaries)."""

    def __init__(self, fd: int, *, owns_fd: bool = True):
        self._fd = fd
        self._owns = owns_fd

    @classmethod
    def open(cls, path: str) -> FdRecordReader:
        return cls(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))

    def read(self, size: int) -> bytes:
        return os.read(self._fd, size)

    def seek_end(self) -> None:
        os.lseek(self._fd, 0, os.SEEK_END)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0 and self._owns:
            os.close(self._fd)
        self._fd = -1


class KmsgSource(Protocol):
    path: str

    @property
    def parse_errors(self) -> int: ...

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


_EPIPE_REASON = "kernel ring buffer overrun (EPIPE): records were overwritten before read"
_SEQ_REASON = "kmsg sequence number jumped"
# A device that keeps answering EPIPE is broken; stop the round instead of spinning.
_MAX_EPIPE_IN_A_ROW = 16


class KmsgDeviceSource:
    """``/dev/kmsg``, read record by record without blocking.

    ``replay=True`` starts at the oldest record in the ring (the position a fresh open has,
    which also covers records hidden by ``dmesg -C``); ``replay=False`` seeks to the end and
    delivers only new records. ``reader`` replaces the device (tests, the simulated node);
    without it the path is opened ``O_RDONLY|O_NONBLOCK`` and open errors raise.
    """

    def __init__(self, path: str, replay: bool = True, *, reader: KmsgReader | None = None):
        self.path = path
        self.parse_errors = 0
        self.gaps = 0
        self._reader: KmsgReader = reader if reader is not None else FdRecordReader.open(path)
        self._count = 0
        self._last_seq: int | None = None
        self._gap_pending = False
        self._deferred: OSError | None = None
        if not replay:
            self._reader.seek_end()

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]:
        """Everything readable now (at most ``max_records`` records), gaps in place.

        An I/O error other than those above raises; when records were read before it in the
        same call they are returned first and the error is raised by the next call.
        """
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc
        out: list[KmsgRecord | KmsgGap] = []
        drained = False
        epipes = 0
        n = 0
        while max_records is None or n < max_records:
            try:
                data = self._reader.read(KMSG_READ_BUFFER)
            except BlockingIOError:
                drained = True
                break
            except OSError as e:
                if e.errno == errno.EPIPE:
                    self._gap_pending = True
                    epipes += 1
                    if epipes > _MAX_EPIPE_IN_A_ROW:
                        drained = True
                        break
                    continue
                if e.errno == errno.EAGAIN:
                    drained = True
                    break
                if e.errno == errno.EINVAL:  # a record bigger than our buffer: cannot happen
                    self.parse_errors += 1
                    self._gap(out, None, "record larger than the read buffer (EINVAL)")
                    break
                if out:  # keep what was read; the error comes with the next call
                    self._deferred = e
                    break
                raise
            epipes = 0
            if not data:
                drained = True
                break
            self._count += 1
            n += 1
            try:
                rec = parse_kmsg_record(data, line_no=self._count)
            except KmsgParseError as e:
                self.parse_errors += 1
                out.append(_malformed(bytes(data).decode("utf-8", "replace"), str(e), self._count))
                continue
            self._note_seq(out, rec.seq)
            out.append(rec)
        if drained and self._gap_pending:
            self._gap(out, None, _EPIPE_REASON)
            self._last_seq = (
                None  # the next record's jump belongs to this gap: don't count it twice
            )
        return out

    def _note_seq(self, out: list[KmsgRecord | KmsgGap], seq: int | None) -> None:
        last = self._last_seq
        missed = seq - last - 1 if last is not None and seq is not None and seq > last else None
        if self._gap_pending:
            self._gap(out, missed, _EPIPE_REASON)
        elif missed:
            self._gap(out, missed, _SEQ_REASON)
        self._last_seq = seq

    def _gap(self, out: list[KmsgRecord | KmsgGap], missed: int | None, reason: str) -> None:
        self._gap_pending = False
        self.gaps += 1
        out.append(KmsgGap(missed, reason))

    def fileno(self) -> int:
        return self._reader.fileno()

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> KmsgDeviceSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KmsgFileSource:
    """A kernel-log text file or FIFO, followed like ``tail -F``.

    Complete lines only: an unterminated last line waits for its newline. When the path gets
    a new inode (rotation) the old file is read to its end, then the new one from its start;
    when the file shrinks below our offset (truncation, copytruncate) we restart at 0. In both
    cases an unterminated last line is delivered as a line. A FIFO is opened read-write so it
    never reports end-of-file or hang-up while no writer is attached (Linux semantics).
    ``fileno()`` can change after a rotation; ask again after each ``read_available``.
    A regular file always polls readable, so callers poll it on a timer.
    """

    def __init__(self, path: str, from_start: bool = True):
        self.path = path
        self._asm = _Assembler()
        self._fd = -1
        self._ident: tuple[int, int] | None = None
        self._is_fifo = False
        self._offset = 0
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line, dropping bytes up to its newline
        self._open(seek_end=not from_start)

    @property
    def parse_errors(self) -> int:
        return self._asm.parse_errors

    def _open(self, seek_end: bool) -> None:
        is_fifo = stat.S_ISFIFO(os.stat(self.path).st_mode)
        fd = -1
        if is_fifo:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except PermissionError:
                fd = -1
        if fd < 0:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        st = os.fstat(fd)
        self._fd = fd
        self._is_fifo = stat.S_ISFIFO(st.st_mode)
        self._ident = (st.st_dev, st.st_ino)
        self._offset = os.lseek(fd, 0, os.SEEK_END) if seek_end and not self._is_fifo else 0

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]:
        """Every complete record readable now (at most about ``max_records``)."""
        out: list[KmsgRecord | KmsgGap] = []
        restarts = 0  # one rotation/truncation per call: a file cut again and again can't spin us
        while True:
            if not self._drain(out, max_records):
                return out  # limit reached; the rest stays buffered
            chunk = self._read_chunk()
            if chunk:
                self._buf += chunk
                continue
            if self._is_fifo or restarts or not self._check_rotation(out):
                break
            restarts += 1
        # Nothing more now: hand out the held record unless its continuation is mid-write.
        if self._asm.holding and not (self._buf and self._buf[:1] in (b" ", b"\t")):
            rec = self._asm.take()
            if rec is not None:
                out.append(rec)
        return out

    def _drain(self, out: list[KmsgRecord | KmsgGap], max_records: int | None) -> bool:
        """Parse the complete lines in the buffer; False when ``max_records`` stopped it."""
        buf = self._buf
        pos = 0
        done = True
        while True:
            if max_records is not None and len(out) >= max_records:
                done = False
                break
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            if self._skipping:
                self._skipping = False
            elif nl - pos > MAX_LINE_BYTES:
                self._emit(out, self._asm.feed_overlong(bytes(buf[pos : pos + MAX_LINE_BYTES])))
            else:
                self._emit(out, self._asm.feed(bytes(buf[pos:nl])))
            pos = nl + 1
        if pos:
            del buf[:pos]
        if self._skipping:
            buf.clear()
        elif len(buf) > MAX_LINE_BYTES:
            self._emit(out, self._asm.feed_overlong(bytes(buf[:MAX_LINE_BYTES])))
            buf.clear()
            self._skipping = True
        return done

    @staticmethod
    def _emit(out: list[KmsgRecord | KmsgGap], rec: KmsgRecord | None) -> None:
        if rec is not None:
            out.append(rec)

    def _read_chunk(self) -> bytes:
        if self._fd < 0:
            return b""
        try:
            chunk = os.read(self._fd, FILE_READ_CHUNK)
        except BlockingIOError:
            return b""
        self._offset += len(chunk)
        return chunk

    def _finish_partial(self, out: list[KmsgRecord | KmsgGap]) -> None:
        if self._buf and not self._skipping:
            self._emit(out, self._asm.feed(bytes(self._buf)))
        self._buf.clear()
        self._skipping = False

    def _check_rotation(self, out: list[KmsgRecord | KmsgGap]) -> bool:
        """At end of file: True when the path was rotated or truncated and reading restarts."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # rotated away, successor not there yet: keep the old file
        if (st.st_dev, st.st_ino) != self._ident:
            old = self._fd
            try:
                self._open(seek_end=False)
            except OSError:
                return False
            os.close(old)
            self._finish_partial(out)
            return True
        if os.fstat(self._fd).st_size < self._offset:
            self._finish_partial(out)
            self._offset = os.lseek(self._fd, 0, os.SEEK_SET)
            return True
        return False

    def position(self) -> tuple[int, int, int] | None:
        """``(device, inode, offset)`` just past the last complete line handed out, for
        resuming after a restart (None for a FIFO, which cannot be re-read)."""
        if self._is_fifo or self._ident is None:
            return None
        return (self._ident[0], self._ident[1], self._offset - len(self._buf))

    def resume(self, position: tuple[int, int, int]) -> bool:
        """Continue from a ``position()`` saved earlier, when it is still the same file and not
        truncated below it; False (and nothing changed) otherwise."""
        if self._is_fifo or self._ident is None:
            return False
        dev, ino, offset = position
        if (dev, ino) != self._ident or os.fstat(self._fd).st_size < offset:
            return False
        self._buf.clear()
        self._skipping = False
        self._asm = _Assembler()
        self._offset = os.lseek(self._fd, offset, os.SEEK_SET)
        return True

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> KmsgFileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_kmsg(
    paths: HostPaths,
    replay: bool = True,
    *,
    device_reader: Callable[[str], KmsgReader] | None = None,
) -> KmsgDeviceSource | KmsgFileSource:
    """The kernel-log source ``paths`` names: the record device, or a file/FIFO given by
    ``--kmsg``. ``replay`` means "from the oldest record" (device) / "from the start" (file).
    """
    path = paths.kmsg_path
    if paths.kmsg_is_device:
        reader = device_reader(path) if device_reader is not None else None
        return KmsgDeviceSource(path, replay=replay, reader=reader)
    return KmsgFileSource(path, from_start=replay)
