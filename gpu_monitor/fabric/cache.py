"""A LIST then a WATCH of one kind of object, kept in memory (client-go's reflector, reduced).

Why: the scheduler looks at every GPU node and every running pod in the cluster each round
(30 s by default). Listing them each round costs the API server the whole cluster every round:
at 10,000 nodes and 100,000 pods, hundreds of paged requests every 30 s, most of it unchanged.
One list and then a watch costs the changes only. ``transform`` keeps only the fields the
caller reads (client-go's SetTransform): a full pod is kilobytes, and a cache holds all of them.

Rules (the reflector's): list, remember the list's resourceVersion, watch from it; every event
moves the cache and the resourceVersion; a watch that ends (the server's timeout) resumes from
the last resourceVersion; 410 Gone (history compacted) means list again; any other error waits
(backoff) and resumes. A full list every ``relist_every_s`` anyway, as a net for anything missed.

``items()`` answers None — and the caller lists for itself — until the first list, and whenever
the watch has been out of contact longer than ``stale_after_s`` (an API outage): a stale cache
must not decide which nodes are idle. A half-open connection counts as contact until the
watch's read timeout (``timeout_s`` + 30 s) breaks it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

Lister = Callable[[], tuple[list[dict], str]]
Watcher = Callable[..., Iterator[tuple[str, dict]]]


def _key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ListWatchCache:
    """One kind of object, listed once and then watched; ``items()`` for the current set."""

    def __init__(self, name: str, lister: Lister, watcher: Watcher, *,
                 transform: Callable[[dict], dict] | None = None, timeout_s: int = 300, relist_every_s: float = 1800.0,
                 stale_after_s: float | None = None, backoff_s: tuple[float, float] = (1.0, 30.0),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._list = lister
        self._watch = watcher
        self._transform = transform or (lambda o: o)
        self.timeout_s = int(timeout_s)
        self.relist_every_s = float(relist_every_s)
        # A healthy watch hears from the server at least once per timeout (the stream ends).
        self.stale_after_s = float(stale_after_s if stale_after_s is not None
                                   else timeout_s + 60)
        self.backoff_s = backoff_s
        self.clock = clock
        self._lock = threading.Lock()
        self._store: dict[str, dict] = {}
        self._rv: str | None = None
        self._listed_at: float | None = None
        self._contact: float | None = None
        self._streaming = False
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # what it cost, for tests and metrics
        self.lists = 0
        self.events = 0
        self.errors = 0

    # --- reading ------------------------------------------------------------------------------

    def items(self) -> list[dict] | None:
        """The objects now (shared dicts: do not modify), or None when not to be trusted."""
        with self._lock:
            if self._contact is None:
                return None
            if not self._streaming and self.clock() - self._contact > self.stale_after_s:
                return None
            return list(self._store.values())

    @property
    def synced(self) -> bool:
        return self.items() is not None

    # --- running ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"cache-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        handle = self._handle
        if handle is not None:
            handle.stop()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=5)
        with self._lock:
            self._contact = None  # a stopped cache answers nothing
            self._streaming = False

    def run(self) -> None:
        """List, then watch, until ``stop()`` (the thread's body; tests may call ``step``)."""
        delay = self.backoff_s[0]
        while not self._stop.is_set():
            try:
                self.step()
                delay = self.backoff_s[0]
            except Exception as exc:  # noqa: BLE001 - the cache thread must survive anything
                if self._stop.is_set():
                    return
                self.errors += 1
                if getattr(exc, "status", None) == 410:
                    log.info("%s watch: history compacted (410 Gone); listing again", self.name)
                    with self._lock:
                        self._rv = None
                    continue
                log.warning("%s list/watch failed: %s; retrying in %.0f s", self.name, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])

    def step(self) -> None:
        """One list (when due) and one watch stream until it ends."""
        now = self.clock()
        if (self._rv is None or self._listed_at is None
                or now - self._listed_at >= self.relist_every_s):
            self._relist()
        rv = self._rv
        assert rv is not None
        try:
            with self._lock:
                self._streaming = True
            for typ, obj in self._watch(resource_version=rv, timeout_s=self.timeout_s,
                                        stop=self._stop, started=self._started):
                self._apply(typ, obj)
                if self.clock() - (self._listed_at or 0) >= self.relist_every_s:
                    break
            with self._lock:
                self._contact = self.clock()  # the stream ended cleanly: the server was there
        finally:
            with self._lock:
                self._streaming = False
            self._handle = None

    def _started(self, handle: Any) -> None:
        self._handle = handle
        if self._stop.is_set():
            handle.stop()

    def _relist(self) -> None:
        items, rv = self._list()
        store = {_key(o): self._transform(o) for o in items}
        with self._lock:
            self._store = store
            self._rv = rv or None
            self._listed_at = self._contact = self.clock()
        self.lists += 1
        if not rv:
            raise RuntimeError(f"{self.name}: the list carried no resourceVersion")

    def _apply(self, typ: str, obj: dict) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if typ in ("ADDED", "MODIFIED"):
                self._store[_key(obj)] = self._transform(obj)
            elif typ == "DELETED":
                self._store.pop(_key(obj), None)
            elif typ != "BOOKMARK":
                log.debug("%s watch: ignoring a %s event", self.name, typ)
            if rv:
                self._rv = rv
            self._contact = self.clock()
            self.events += 1
