"""Kernel-log text files and FIFOs: the one-shot read of a saved log and the followed file.

Why it exists apart from the parsing: opening without blocking (a FIFO with no writer must
not hang: package contract 7), bounded line lengths, rotation and truncation, and the
position a follower saves so a restart resumes where it stopped are I/O concerns; the lines
themselves go through :class:`~gpu_monitor.hw.kmsg.text.LineAssembler`.
"""

from __future__ import annotations

import errno
import io
import os
import select
import stat
from collections.abc import Iterable, Iterator

from gpu_monitor.hw.kmsg.record import (
    MAX_LINE_BYTES,
    KmsgGap,
    KmsgRecord,
)
from gpu_monitor.hw.kmsg.runs import PlainRuns
from gpu_monitor.hw.kmsg.text import (
    LineAssembler,
)

# Bytes per read() when following a text file or FIFO.
FILE_READ_CHUNK = 64 * 1024
# A bounded read (``max_records`` given) reads at most about this much per call, so a backlog
# is taken in slices however few of its lines are candidates.
READ_BUDGET_BYTES = 4 * 1024 * 1024
# Continuation lines kept for a skipped record head, in case a later one holds a literal.
HELD_HEAD_BYTES = MAX_LINE_BYTES
# A one-shot read of a FIFO ends when nothing (no writer, no data) arrives for this long.
FIFO_IDLE_S = 1.0


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
    asm = LineAssembler()
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
# The followed file or FIFO
# ---------------------------------------------------------------------------------------------


def _holds(buf: bytearray, start: int, end: int, words: tuple[bytes, ...]) -> bool:
    for w in words:  # noqa: SIM110 - a plain loop: this runs once per line of a storm
        if buf.find(w, start, end) >= 0:
            return True
    return False


class KmsgFileSource:
    """A kernel-log text file or FIFO, followed like ``tail -F``.

    Complete lines only: an unterminated last line waits for its newline. When the path gets
    a new inode (rotation) the old file is read to its end, then the new one from its start;
    when the file shrinks below our offset (truncation, copytruncate) we restart at 0. In both
    cases an unterminated last line is delivered as a line. A FIFO is opened read-write so it
    never reports end-of-file or hang-up while no writer is attached (Linux semantics).
    ``fileno()`` can change after a rotation; ask again after each ``read_available``.
    A regular file always polls readable, so callers poll it on a timer.

    Pre-search (:meth:`select`): with literals selected, a line none of them occurs in is
    counted in ``lines_skipped`` and never decoded or parsed -- the batch scan's cut
    (``kmsg_scan``), applied as lines arrive. A record is still whole: a skipped head is kept
    (with up to :data:`HELD_HEAD_BYTES` of its continuation lines) until the next head, and a
    continuation holding a literal brings it back, parsed. Lines that are not UTF-8 or hold a
    NUL are parsed anyway, so each is still one ``"malformed"`` record (contract 2). While a
    skipped head is held, the run of plain lines after it is skipped at once
    (:class:`~gpu_monitor.hw.kmsg.runs.PlainRuns`: a few searches over the buffer, not Python per
    line), with exactly the outcome of skipping them one by one (``skip_runs = False``).
    """

    def __init__(self, path: str, from_start: bool = True):
        self.path = path
        self._asm = LineAssembler()
        self._fd = -1
        self._ident: tuple[int, int] | None = None
        self._is_fifo = False
        self._offset = 0
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line, dropping bytes up to its newline
        self._wanted: tuple[bytes, ...] | None = None
        self._head: list[tuple[bytes, int, int]] | None = None  # skipped head (+ its lines)
        self._head_bytes = 0
        self.lines_skipped = 0
        self.skip_runs = True  # False: every line through _skip (the reference the tests use)
        self._open(seek_end=not from_start)

    def select(self, literals: Iterable[str]) -> None:
        """Parse only the lines (records) that contain one of ``literals``; none: every line."""
        words = tuple(sorted({w.encode() for w in literals if w}))
        self._wanted = words or None

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
        self._asm.origin = None if self._is_fifo else self._ident

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]:
        """Every complete record readable now (at most about ``max_records``)."""
        out: list[KmsgRecord | KmsgGap] = []
        restarts = 0  # one rotation/truncation per call: a file cut again and again can't spin us
        budget = READ_BUDGET_BYTES if max_records is not None else None
        while True:
            if not self._drain(out, max_records):
                return out  # limit reached; the rest stays buffered
            if budget is not None and budget <= 0:
                return out  # read enough for one call; the held record may still grow
            chunk = self._read_chunk()
            if chunk:
                self._buf += chunk
                if budget is not None:
                    budget -= len(chunk)
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
        asm = self._asm
        base = self._offset - len(buf)  # the file offset of buf[0]
        pos = 0
        done = True
        runs = None if self._wanted is None or not self.skip_runs else PlainRuns(
            buf, self._wanted)
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
                asm.line_offset = base + pos
                self._emit(out, asm.feed_overlong(bytes(buf[pos : pos + MAX_LINE_BYTES])))
            else:
                asm.line_offset = base + pos
                wanted = self._wanted
                # bytearray.find per literal (a memchr-driven search) is several times faster
                # than one alternation regex, which cannot skip ahead on a literal prefix.
                matched = wanted is None or _holds(buf, pos, nl, wanted)
                if matched or not self._skip(out, buf, pos, nl, base):
                    if self._head is not None:
                        if matched and buf[pos] in b" \t":
                            self._unskip(out)  # a continuation with a literal: its head too
                        self._head = None
                    self._emit(out, asm.feed(bytes(buf[pos:nl])))
            pos = nl + 1
            # A skipped head held (and nothing in the assembler: an over-long line leaves
            # one there) and room for a record: what follows may be skipped a run at a time.
            if runs is not None and self._head is not None and not asm.holding and (
                    max_records is None or len(out) < max_records):
                pos = self._skip_run(runs, buf, pos, base)
        if pos:
            del buf[:pos]
        if self._skipping:
            buf.clear()
        elif len(buf) > MAX_LINE_BYTES:
            asm.line_offset = base + pos
            self._emit(out, asm.feed_overlong(bytes(buf[:MAX_LINE_BYTES])))
            buf.clear()
            self._skipping = True
        return done

    def _skip(self, out: list[KmsgRecord | KmsgGap], buf: bytearray, pos: int, nl: int,
              base: int) -> bool:
        """Consume a line without a literal unparsed; False when it must be parsed after all
        (it joins a held record, or it is malformed)."""
        asm = self._asm
        line = bytes(buf[pos:nl])
        if not line or line.isspace():
            asm.line_no += 1  # blank: no record, and it does not end the held one
            return True
        cont = line[0] in b" \t"
        if cont and asm.accepting:
            return False
        if not line.isascii():
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return False
        if b"\x00" in line:
            return False
        asm.line_no += 1
        self.lines_skipped += 1
        if cont and self._head is not None:
            if self._head_bytes + len(line) <= HELD_HEAD_BYTES:
                self._head.append((line, asm.line_no, base + pos))
                self._head_bytes += len(line)
            return True
        self._emit(out, asm.take())  # a new head ends the record held before it
        self._head = [(line, asm.line_no, base + pos)]
        self._head_bytes = len(line)
        return True

    def _skip_run(self, runs: PlainRuns, buf: bytearray, pos: int, base: int) -> int:
        """Skip the run of plain lines from ``pos`` at once (``runs.end``): exactly what
        :meth:`_skip` does to each in turn -- while a skipped head is held nothing else is, so
        each only counts its line and becomes the held head -- for a few searches per run
        instead of Python per line. Returns the offset where the per-line path goes on."""
        end = runs.end(pos)
        if end <= pos:
            return pos
        lines = buf.count(b"\n", pos, end)
        last = buf.rfind(b"\n", pos, end - 1) + 1 or pos  # the run's last line
        self._asm.line_no += lines
        self.lines_skipped += lines
        line = bytes(buf[last : end - 1])
        self._head = [(line, self._asm.line_no, base + last)]
        self._head_bytes = len(line)
        return end

    def _unskip(self, out: list[KmsgRecord | KmsgGap]) -> None:
        """Parse the skipped head and its kept lines (a later continuation holds a literal)."""
        asm = self._asm
        here, offset = asm.line_no, asm.line_offset
        for line, line_no, at in self._head or ():
            asm.line_no, asm.line_offset = line_no - 1, at
            self._emit(out, asm.feed(line))
            self.lines_skipped -= 1
        asm.line_no, asm.line_offset = here, offset
        self._head = None

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

    def _finish_partial(self, out: list[KmsgRecord | KmsgGap],
                        where: tuple[tuple[int, int] | None, int]) -> None:
        """Hand out an unterminated last line; ``where``: its file's identity and offset
        (taken before a rotation reopened the path)."""
        self._head = None
        if self._buf and not self._skipping:
            self._asm.origin, self._asm.line_offset = where
            self._emit(out, self._asm.feed(bytes(self._buf)))
            self._asm.origin = None if self._is_fifo else self._ident
        self._buf.clear()
        self._skipping = False

    def _check_rotation(self, out: list[KmsgRecord | KmsgGap]) -> bool:
        """At end of file: True when the path was rotated or truncated and reading restarts."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # rotated away, successor not there yet: keep the old file
        where = (None if self._is_fifo else self._ident, self._offset - len(self._buf))
        if (st.st_dev, st.st_ino) != self._ident:
            old = self._fd
            try:
                self._open(seek_end=False)
            except OSError:
                return False
            os.close(old)
            self._finish_partial(out, where)
            return True
        if os.fstat(self._fd).st_size < self._offset:
            self._finish_partial(out, where)
            self._offset = os.lseek(self._fd, 0, os.SEEK_SET)
            return True
        return False

    def position(self) -> tuple[int, int, int] | None:
        """``(device, inode, offset)`` just past the last record handed out, for resuming
        after a restart (None for a FIFO, which cannot be re-read). A record still held for
        its continuation lines, or a skipped head a later line may bring back, is not past:
        the offset is its first line's, so a restart reads it again."""
        if self._is_fifo or self._ident is None:
            return None
        offset = self._offset - len(self._buf)
        if self._head:
            offset = min(offset, self._head[0][2])
        held = self._asm.held_offset
        if held is not None:
            offset = min(offset, held)
        return (self._ident[0], self._ident[1], offset)

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
        self._head = None
        self._asm = LineAssembler()
        self._asm.origin = self._ident
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

