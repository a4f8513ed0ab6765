"""The kernel log, as records: ``/dev/kmsg`` and saved or followed dmesg/journal/syslog text.

Why it exists: XIDs, SXids, mlx5 and PCIe events reach us only through the kernel log, and the
log reaches us in many shapes (the live record device, ``dmesg`` with four timestamp styles,
``journalctl -k``, syslog, pstore dumps, lines pasted into reports). This package turns every
shape into one value, :class:`KmsgRecord`, and leaves meaning (which line is an Xid) to the
rules that consume records.

Rooms (import each name from the module that defines it; this file defines nothing):

- ``record.py``: :class:`KmsgRecord`, :class:`KmsgGap`, the format names, and the
  ``/dev/kmsg`` record parser :func:`parse_kmsg_record`.
- ``text.py``: :func:`parse_text_line` and the continuation-line assembler.
- ``device.py``: :class:`KmsgDeviceSource` over a :class:`KmsgReader` (the device or a fake).
- ``files.py``: the one-shot read (:func:`iter_file`, :func:`open_log_file`) and the followed
  file or FIFO (:class:`KmsgFileSource`).
- ``follow.py``: the :class:`KmsgSource` interface the daemon follows and :func:`open_kmsg`.

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
