"""The kernel-log record as a value, and the parser for the record device's own format.

Why it exists: every reader and every rule meets the kernel log as one frozen value,
:class:`KmsgRecord` (or :class:`KmsgGap` where records were lost). The ``pri,seq,usec,flags;``
header of ``/dev/kmsg`` is parsed here (:func:`parse_kmsg_record`, which raises
:class:`KmsgParseError`), because both the device source and the text parser (raw records
pasted into a file) read it; see the package docstring for the contract.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

# Longest line/record we accept. Real kernel records stop at 8 KiB (CONSOLE_EXT_LOG_MAX);
# anything past 64 KiB is not a log line and must not make a follower buffer without bound.
MAX_LINE_BYTES = 64 * 1024

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

NO_FIELDS: Mapping[str, str] = MappingProxyType({})


def _no_fields() -> Mapping[str, str]:
    return NO_FIELDS


@dataclass(frozen=True, slots=True, kw_only=True)
class KmsgRecord:
    """One kernel-log message, whatever shape it arrived in.

    ``message`` is the text after any prefix (timestamp, level, host); ``raw`` is the input
    exactly (record or line(s), without the final newline). ``line_no`` is the 1-based line of
    the record's first line in a text source, the 1-based count of records read from a device,
    or what the caller passed to the parse functions (default 0). ``position`` is
    ``(device, inode, byte offset)`` of the record's first line in a followed regular file
    (None elsewhere): unlike ``line_no`` it means the same line after a restart resumes
    mid-file, so it keys events found in text lines (:func:`text_event_key`).
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
    position: tuple[int, int, int] | None = field(default=None, compare=False)

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


def text_event_key(position: tuple[int, int, int], raw: str) -> int:
    """A de-duplication key (0 .. 2**63-1, an SQLite integer) for a text line with no kernel
    sequence number: the file's identity, the line's byte offset and its text.

    The same line read again (a replay from the start, a resume at a saved offset) gives the
    same key; a different line at the same offset after a copytruncate does not. Collisions
    between two lines of one boot are a 2**-63 chance per pair.
    """
    digest = hashlib.blake2b(f"{position[0]}:{position[1]}:{position[2]}:".encode()
                             + raw.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class KmsgParseError(ValueError):
    """The bytes are not a ``/dev/kmsg`` record."""


# /dev/kmsg: "6,3964,206764307,-;msg"; newer kernels add fields after the flags
# ("4,1227,437812449,c,1,-;msg", ",caller=T42").
KMSG_HEADER_RE = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),([^,;]*)[^;]*;")
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
FIELD_KEY_RE = re.compile(r"[A-Za-z0-9_+.-]+")


def unescape_kmsg(text: str) -> str:
    """Undo /dev/kmsg's ``\\xNN`` escaping of control bytes, newlines and backslashes."""
    if "\\x" not in text:
        return text
    return _KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def malformed_record(text: str, reason: str, line_no: int) -> KmsgRecord:
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


def kmsg_from_match(m: re.Match[str], message: str, raw: str, line_no: int) -> KmsgRecord:
    pri = int(m.group(1))
    message, continuation = _split_message(unescape_kmsg(message))
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
    m = KMSG_HEADER_RE.match(head)
    if m is None:
        raise KmsgParseError(f"not a kmsg record header: {head[:80]!r}")
    rec = kmsg_from_match(m, head[m.end() :], text, line_no)
    if not rest:
        return rec
    fields: dict[str, str] = {}
    extra: list[str] = []
    for line in rest.split("\n"):
        if not line.strip():
            continue
        key, sep, value = line[1:].partition("=")
        if line[0] == " " and sep and FIELD_KEY_RE.fullmatch(key):
            fields[key] = unescape_kmsg(value)
        else:
            extra.append(line.strip())
    return replace(
        rec,
        fields=MappingProxyType(fields) if fields else NO_FIELDS,
        continuation=rec.continuation + tuple(extra),
    )

