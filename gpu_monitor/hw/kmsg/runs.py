"""Where a followed text log's run of skippable lines ends, found over the whole buffer.

Why it exists: a pre-searching follower (``KmsgFileSource.select``) skips the lines no check
wants. Deciding that line by line in Python (find the newline, search each literal, test the
bytes) cost more than everything the checks did with the candidates in a storm (issue 18).
This module answers the same question for a whole run of lines at once with a few C-speed
searches over the buffer -- the batch scan's cut (``hw/kmsg_scan.py``), kept exact.

Contract: :meth:`PlainRuns.end` returns the start of the first line at or after ``pos`` that
is not *plain*, or the end of the buffer's last complete line. A plain line is one that
``KmsgFileSource._skip`` skips as a new head with nothing else to do: it holds none of the
literals, is not blank and does not begin with whitespace (no continuation, no blank-line
rule), has no byte that is NUL or outside ASCII (so it decodes and is not malformed), and is
at most ``MAX_LINE_BYTES`` long. Anything else ends the run and is left to the per-line path,
so a line a check would use is never inside a run. The answer may stop early (a literal that
spans two lines ends the run before them), never late.
"""

from __future__ import annotations

import codecs
import functools
import re

from gpu_monitor.hw.kmsg.record import MAX_LINE_BYTES

# A line that begins with whitespace (blank, or a continuation): ``re`` finds the newline
# prefix at memchr speed. The bytes ``bytes.isspace`` counts as whitespace.
_WS_LINE = re.compile(rb"\n[ \t\n\r\x0b\x0c]")
_WS = b" \t\n\r\x0b\x0c"
_NONE = -1


@functools.lru_cache(maxsize=16)
def _patterns(words: tuple[bytes, ...]) -> tuple[re.Pattern[bytes], ...]:
    """One compiled pattern per literal: ``re`` finds a literal about 1.7x faster than
    ``bytearray.find`` here (and an alternation of them ten times slower than either)."""
    return tuple(re.compile(re.escape(w)) for w in words)


class PlainRuns:
    """The runs of plain lines in one buffer (module contract), for one pass over it.

    The buffer must not change while this is used; positions only move forward, so each
    search is cached until ``pos`` passes its answer and the whole pass costs a few scans
    of the buffer, not one per line.
    """

    __slots__ = ("_buf", "_words", "_hits", "_nul", "_high", "_ws", "_complete")

    def __init__(self, buf: bytearray, words: tuple[bytes, ...]):
        self._buf = buf
        self._words = _patterns(words)
        self._hits = [_NONE] * len(words)  # next occurrence of each literal (cached)
        self._nul = _NONE  # next NUL byte (cached), and next byte outside ASCII
        self._high = _NONE
        self._ws = _NONE
        self._complete = buf.rfind(b"\n") + 1  # just past the last complete line

    def end(self, pos: int) -> int:
        """The start of the first line at or after ``pos`` (a line start) that is not plain,
        or the end of the last complete line; ``pos`` itself when that line is not plain."""
        buf = self._buf
        limit = self._complete
        if pos >= limit or buf[pos] in _WS:
            return pos
        for i, pattern in enumerate(self._words):
            hit = self._hits[i]
            if hit < pos:
                m = pattern.search(buf, pos, self._complete)
                self._hits[i] = hit = self._complete if m is None else m.start()
            limit = min(limit, self._line_start(pos, hit))
        if self._nul < pos:
            hit = buf.find(b"\x00", pos, self._complete)
            self._nul = self._complete if hit < 0 else hit
        if self._high < pos:
            self._high = self._next_high(pos)
        limit = min(limit, self._line_start(pos, min(self._nul, self._high)))
        if self._ws < pos:
            m = _WS_LINE.search(buf, pos, self._complete)
            self._ws = self._complete if m is None else m.start() + 1
        limit = min(limit, self._ws)
        return self._short_until(pos, limit)

    def _next_high(self, pos: int) -> int:
        """The offset of the first byte outside ASCII at or after ``pos`` (the end of the
        last complete line if none): the ASCII codec stops at it, faster than a translate or
        a character-class search, and each byte is decoded at most once per pass."""
        with memoryview(self._buf) as view:  # released at once: the buffer is resized later
            try:
                codecs.ascii_decode(view[pos : self._complete])
            except UnicodeDecodeError as exc:
                return pos + exc.start
        return self._complete

    def _line_start(self, pos: int, at: int) -> int:
        """The start of the line holding offset ``at`` (at least ``pos``, a line start)."""
        if at >= self._complete:
            return self._complete
        return self._buf.rfind(b"\n", pos, at) + 1 or pos

    def _short_until(self, pos: int, limit: int) -> int:
        """``limit``, or the start of the first line in [pos, limit) longer than
        ``MAX_LINE_BYTES`` (its newline is further than that from its start)."""
        buf = self._buf
        while pos < limit:
            nl = buf.rfind(b"\n", pos, min(limit, pos + MAX_LINE_BYTES + 1))
            if nl < 0:
                return pos
            pos = nl + 1
        return limit
