"""Recovery from a damaged state file: move it aside, start an empty store, remember it.

Why: a damaged state file can be read by nothing, and a daemon that exits on it crash-loops its
DaemonSet pod while the node goes unmonitored. ``recover`` moves the file and its companions
aside under a name that keeps them inspectable with ``sqlite3``, creates a fresh store at the
path and records the recovery in that fresh store. The metrics collector
(``gpu_monitor_state_recoveries_total``) and the remediator (one ``StateRecovered`` Event) read
the record from there. ``gpu-monitor state recover`` (cli.py) and the daemon's start
(``daemon.recover_corrupt_state``) are the two callers.

Guarantees:

1. **Nothing is deleted.** The damaged file moves together with its ``-wal``, ``-shm`` and
   ``-journal`` (``move_aside``). ``Store.open`` judges an existing file through a
   read-only connection, so a WAL is never checkpointed into a damaged file before it moves.
2. **Only damage is recovered.** A sound file is opened as it is. Two kinds of file are
   refused with their own error and left where they are: a file from a newer release
   (``StoreVersionError``; moving it aside would be a downgrade), and a file gpu-monitor may
   not read or write (``cause == "access"``; it may be intact).
3. **The record is committed before** ``recover`` **returns**, in the fresh store. The Event
   and the counter survive a crash right after the move.
4. **A disk that keeps damaging files is not papered over.** With ``max_copies`` (the daemon's
   start), recovery gives up when that many damaged copies already lie beside the file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import iso, parse_iso
from gpu_monitor.state import Store
from gpu_monitor.state.errors import RECOVER_COMMAND, StoreCorruptError, StoreError

__all__ = [
    "AUTO_RECOVER_MAX_COPIES",
    "KV_KEY",
    "KV_NAMESPACE",
    "Recovery",
    "corrupt_copies",
    "mark_announced",
    "move_aside",
    "record",
    "recover",
    "recoveries",
    "recoveries_total",
]

log = logging.getLogger("gpu_monitor.state")

KV_NAMESPACE = "state"
KV_KEY = "recoveries"

# The daemon's start stops moving files aside once this many damaged copies are kept beside the
# state file (guarantee 4); `gpu-monitor state recover` has no such limit.
AUTO_RECOVER_MAX_COPIES = 5

_COMPANIONS = ("-wal", "-shm", "-journal")


@dataclass(frozen=True)
class Recovery:
    """One damaged state file moved aside and replaced by an empty store.

    ``copies``: the damaged copies kept beside the file right after this move, this one
    included (the counter's value: the history that counted earlier recoveries is what was
    damaged, and the copies are what survives of them). ``by``: ``daemon`` or ``cli``.
    """

    path: str
    moved_to: str
    detail: str
    cause: str
    at: datetime
    by: str
    copies: int
    moved: tuple[str, ...] = ()  # every path that moved: the file, then its companions
    announced: bool = False  # the remediator has sent its Event

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["at"] = iso(self.at)
        data["moved"] = list(self.moved)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recovery:
        return cls(path=str(data["path"]), moved_to=str(data["moved_to"]),
                   detail=str(data.get("detail", "")), cause=str(data.get("cause", "damaged")),
                   at=parse_iso(str(data["at"])), by=str(data.get("by", "")),
                   copies=int(data.get("copies", 1)),
                   moved=tuple(str(m) for m in data.get("moved") or ()),
                   announced=bool(data.get("announced", False)))


def corrupt_copies(path: str | os.PathLike[str]) -> list[str]:
    """The damaged copies of ``path`` kept beside it (``<name>.corrupt-<UTC stamp>[.<n>]``),
    oldest first; companions (``-wal``, ...) are not counted apart from their file."""
    parent, base = os.path.split(os.fspath(path))
    pattern = re.compile(re.escape(base) + r"\.corrupt-\d{8}T\d{6}Z(?:\.\d+)?$")
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    # The stamp sorts by time; a same-second ".<n>" sorts after its plain name.
    return [os.path.join(parent, n) for n in sorted(names, key=_copy_order) if pattern.match(n)]


def _copy_order(name: str) -> tuple[str, int]:
    stem, _, n = name.rpartition(".")
    return (stem, int(n)) if n.isdigit() else (name, -1)


def move_aside(path: str | os.PathLike[str], clock: Clock | None = None) -> str:
    """Rename a damaged state file aside (with its -wal/-shm/-journal) and return the name.

    The next ``Store.open(path)`` starts empty. The WAL moves too, under a name SQLite
    pairs with the moved file, so the copy stays inspectable with ``sqlite3``. Nothing is
    deleted. Run it only while no daemon has the file open.
    """
    path = os.fspath(path)
    if path == ":memory:":
        raise StoreError("an in-memory store has no file to move aside")
    if not os.path.lexists(path):
        raise StoreError(f"state file {path} does not exist: nothing to move aside")
    stamp = (clock or Clock()).now().astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = f"{path}.corrupt-{stamp}"
    n = 1
    while any(os.path.lexists(target + s) for s in ("", *_COMPANIONS)):
        target = f"{path}.corrupt-{stamp}.{n}"
        n += 1
    try:
        os.rename(path, target)
        for suffix in _COMPANIONS:
            if os.path.lexists(path + suffix):
                os.rename(path + suffix, target + suffix)
    except OSError as exc:
        raise StoreError(f"cannot move {path} aside to {target}: {exc.strerror}") from exc
    log.info("state %s moved aside to %s", path, target)
    return target


# --- the record in the store ---------------------------------------------------------------------


def recoveries(store: Store) -> list[Recovery]:
    """The recoveries recorded in ``store``, oldest first (unreadable entries are skipped)."""
    raw = store.get_kv(KV_NAMESPACE, KV_KEY) or []
    out = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(Recovery.from_json(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("state: ignoring an unreadable recovery record %r: %s", item, exc)
    return out


def record(store: Store, rec: Recovery) -> None:
    store.set_kv(KV_NAMESPACE, KV_KEY, [r.to_json() for r in [*recoveries(store), rec]])


def mark_announced(store: Store, moved_to: str) -> None:
    """Remember that the Event for the recovery that moved a file to ``moved_to`` was sent."""
    updated = [replace(r, announced=True) if r.moved_to == moved_to else r
               for r in recoveries(store)]
    store.set_kv(KV_NAMESPACE, KV_KEY, [r.to_json() for r in updated])


def recoveries_total(store: Store) -> int:
    """The value of ``gpu_monitor_state_recoveries_total``: 0 until the first recovery."""
    return max((r.copies for r in recoveries(store)), default=0)


# --- recovering ----------------------------------------------------------------------------------


def recover(path: str | os.PathLike[str], clock: Clock | None = None, *, by: str,
            integrity: str = "quick", busy_timeout_s: float = 5.0,
            max_copies: int | None = None) -> tuple[Store, Recovery | None]:
    """Open the store at ``path``; when the file is damaged, move it aside and start empty.

    Returns the open store and the ``Recovery`` (None when the file was sound). Raises
    ``StoreVersionError`` for a newer release's file, ``StoreCorruptError`` for one that may
    not be read (``cause == "access"``), and ``StoreError`` when moving aside or creating the
    new store fails, or when ``max_copies`` damaged copies already lie beside the file.
    """
    path = os.fspath(path)
    clock = clock or Clock()
    try:
        return Store.open(path, clock, busy_timeout_s=busy_timeout_s, integrity=integrity), None
    except StoreCorruptError as exc:
        if exc.cause == "access":
            raise
        damage = exc
    earlier = corrupt_copies(path)
    if max_copies is not None and len(earlier) >= max_copies:
        raise StoreError(
            f"state file {path} is corrupt or unreadable: {damage.detail}. It was not moved "
            f"aside automatically: {len(earlier)} damaged copies already lie beside it (the "
            f"newest {earlier[-1]}), so the disk may be failing. Check the disk, then run "
            f"`{RECOVER_COMMAND} --state {path}` by hand (or remove old copies)."
        )
    present = [path + s for s in ("", *_COMPANIONS) if os.path.lexists(path + s)]
    moved_to = move_aside(path, clock)
    try:
        store = Store.open(path, clock, busy_timeout_s=busy_timeout_s, integrity=integrity)
    except StoreError as exc:
        raise StoreError(f"moved the damaged {path} aside to {moved_to}, but cannot create a "
                         f"new store there: {exc}") from exc
    rec = Recovery(path=path, moved_to=moved_to, detail=damage.detail, cause=damage.cause,
                   at=clock.now(), by=by, copies=len(corrupt_copies(path)),
                   moved=tuple(moved_to + p[len(path):] for p in present))
    try:
        record(store, rec)
    except BaseException:
        store.close()
        raise
    log.warning("state file %s was corrupt or unreadable (%s): moved it aside to %s and "
                "started an empty store (recovery %d on this node)", path, damage.detail,
                moved_to, rec.copies)
    return store, rec
