"""The store's schema: each version's SQL, and the migrations that bring a file to the latest.

Why it exists: files in the field were built by the SQL their release shipped, so the schema is
history, not a definition to edit. ``MIGRATIONS`` is the ordered list of steps; a shipped step
is never changed (a test pins each step's SQL by its digest), and ``apply_migrations`` runs
each step a file lacks in its own transaction, together with the ``user_version`` bump.
docs/state.md lists the versions and the rules for adding one.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpu_monitor.state.errors import StoreVersionError

__all__ = ["APPLICATION_ID", "LATEST_VERSION", "MIGRATIONS", "Migration", "apply_migrations"]

log = logging.getLogger("gpu_monitor.state")

# Written to ``PRAGMA application_id`` ("GPMS"): tells our files from other SQLite databases.
APPLICATION_ID = 0x47504D53


@dataclass(frozen=True)
class Migration:
    """One schema step: ``apply`` is an SQL script or a function of the connection.

    A shipped migration is never edited: files in the field were built by it. Each runs in its
    own transaction together with the ``user_version`` bump, so a crash leaves the previous
    version intact.
    """

    version: int
    summary: str
    apply: str | Callable[[sqlite3.Connection], None]


_V1 = """
CREATE TABLE results (
    id INTEGER PRIMARY KEY,
    check_name TEXT NOT NULL,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    details TEXT NOT NULL DEFAULT '{}',
    action TEXT NOT NULL DEFAULT 'none',
    observed_us INTEGER NOT NULL
);
CREATE TABLE runs (
    check_name TEXT PRIMARY KEY,
    started_us INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    success INTEGER NOT NULL
);
CREATE TABLE reason_counters (
    check_name TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (check_name, reason)
) WITHOUT ROWID;
CREATE TABLE kmsg_boots (
    boot_id TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    pruned_through INTEGER NOT NULL DEFAULT -1,
    first_seen_us INTEGER NOT NULL
);
CREATE TABLE kmsg_seen (
    boot_id TEXT NOT NULL REFERENCES kmsg_boots(boot_id),
    seq INTEGER NOT NULL,
    seen_us INTEGER NOT NULL,
    PRIMARY KEY (boot_id, seq)
) WITHOUT ROWID;
CREATE TABLE xid_events (
    id INTEGER PRIMARY KEY,
    boot_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    observed_us INTEGER NOT NULL,
    code INTEGER NOT NULL,
    pci_bus_id TEXT NOT NULL DEFAULT '',
    gpu_uuid TEXT,
    gpu_index INTEGER,
    kind TEXT NOT NULL CHECK (kind IN ('xid', 'sxid')),
    message TEXT NOT NULL DEFAULT '',
    fatal INTEGER NOT NULL DEFAULT 0,
    UNIQUE (boot_id, seq, code, pci_bus_id)
);
CREATE TABLE xid_counters (
    kind TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    code INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (kind, gpu_index, gpu_uuid, code)
) WITHOUT ROWID;
CREATE TABLE ports (
    device TEXT NOT NULL,
    port INTEGER NOT NULL,
    closed_down_us INTEGER NOT NULL DEFAULT 0,
    outages INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (device, port)
) WITHOUT ROWID;
CREATE TABLE port_down (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL,
    port INTEGER NOT NULL,
    start_us INTEGER NOT NULL,
    end_us INTEGER,
    FOREIGN KEY (device, port) REFERENCES ports(device, port)
);
CREATE UNIQUE INDEX port_down_one_open ON port_down(device, port) WHERE end_us IS NULL;
CREATE TABLE kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_us INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE TABLE node_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL,
    since_us INTEGER NOT NULL,
    reason TEXT NOT NULL,
    retest_failures INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE node_state_history (
    id INTEGER PRIMARY KEY,
    at_us INTEGER NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    at_us INTEGER NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE action_counters (
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (action, result)
) WITHOUT ROWID;
"""

# v2: the metrics collector asks for the latest result per check/target on every scrape, and
# rdma_ports alone writes one result per port per second. Scanning the history for the maximum
# grew with the history; a pointer table keeps the read proportional to the number of targets,
# and its foreign key stops pruning from deleting a latest result (the index on result_id keeps
# that check cheap while prune deletes). The backfill picks, per key, the newest observation
# (highest id on a tie). The time indexes serve ``since=`` queries and prune.
_V2 = """
CREATE INDEX results_by_key_time ON results(check_name, target, observed_us);
CREATE INDEX results_by_time ON results(observed_us);
CREATE TABLE latest_results (
    check_name TEXT NOT NULL,
    target TEXT NOT NULL,
    result_id INTEGER NOT NULL REFERENCES results(id),
    observed_us INTEGER NOT NULL,
    PRIMARY KEY (check_name, target)
) WITHOUT ROWID;
INSERT INTO latest_results (check_name, target, result_id, observed_us)
    SELECT check_name, target, id, observed_us FROM (
        SELECT id, check_name, target, observed_us, ROW_NUMBER() OVER (
            PARTITION BY check_name, target ORDER BY observed_us DESC, id DESC) AS rn
        FROM results)
    WHERE rn = 1;
CREATE INDEX latest_results_by_result ON latest_results(result_id);
CREATE INDEX xid_events_by_time ON xid_events(observed_us);
CREATE INDEX port_down_by_port_start ON port_down(device, port, start_us);
CREATE INDEX actions_by_time ON actions(at_us);
CREATE INDEX kmsg_seen_by_time ON kmsg_seen(seen_us);
"""

# v3: the runner started telling a timeout from a crash (RunOutcome.error), and reports about
# this node from other detectors (GPUHealthReport CRs, the host drop dir) must be acted on once
# only, even after a restart, so their uids are remembered.
_V3 = """
ALTER TABLE runs ADD COLUMN error TEXT NOT NULL DEFAULT '';
CREATE TABLE health_reports (
    uid TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    source TEXT NOT NULL,
    observed_us INTEGER NOT NULL,
    received_us INTEGER NOT NULL,
    payload TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX health_reports_by_time ON health_reports(observed_us);
CREATE TABLE health_report_counters (
    reason TEXT PRIMARY KEY,
    count INTEGER NOT NULL
) WITHOUT ROWID;
"""

# v4: the xid check reads a GPU's history of one code on every Xid event, and its poll the GPU's
# recent events; with only the time index each read scanned every stored event, which made a
# hardware-XID storm quadratic. The indexes follow those reads' filters: GPU, kind, then code,
# then time (the order they come back in).
_V4 = """
CREATE INDEX xid_events_by_gpu_code_time ON xid_events(gpu_uuid, kind, code, observed_us);
CREATE INDEX xid_events_by_gpu_time ON xid_events(gpu_uuid, kind, observed_us);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1),
    Migration(2, "latest-result pointers and time indexes", _V2),
    Migration(3, "run error text; health reports from other detectors", _V3),
    Migration(4, "XID event indexes by GPU, kind, code and time", _V4),
)
LATEST_VERSION = MIGRATIONS[-1].version


def _statements(script: str) -> Iterator[str]:
    """Split a script into statements (``executescript`` would commit our transaction)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:80]!r}")


def apply_migrations(conn: sqlite3.Connection, path: str,
                      migrations: Sequence[Migration]) -> None:
    supported = migrations[-1].version if migrations else 0
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(f"migrations must be numbered 1, 2, ...: found {m.version} at {i}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > supported:
        raise StoreVersionError(path, version, supported)
    for m in migrations[version:]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] >= m.version:
                conn.execute("COMMIT")
                continue
            if isinstance(m.apply, str):
                for stmt in _statements(m.apply):
                    conn.execute(stmt)
            else:
                m.apply(conn)
            conn.execute(f"PRAGMA user_version = {int(m.version)}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        # Creating a new store is routine; upgrading an existing one is worth a log line.
        log.log(logging.DEBUG if version == 0 else logging.INFO,
                "state %s: migrated to schema version %d (%s)", path, m.version, m.summary)

