"""The SQLite state store: what gpu-monitor remembers across restarts.

Checks are mostly stateless functions of the host, but several decisions need history: RDMA
port downtime in a sliding window, XID repeats after a reset, which kernel-log records were
already handled, the node's quarantine state, what remediation already did. The store keeps that
history in one SQLite file (a hostPath in the DaemonSet, so it survives pod restarts), and it is
the snapshot the metrics collector reads at scrape time.

Guarantees (tests hold the store to each):
1. Every write is committed before the method returns. A decision taken on the strength of a
   write (cordon after an XID, skip a replayed kmsg record) never outlives the write.
2. Committed data survives a crash of the process (SIGKILL included); a torn transaction is
   rolled back on the next open, never half applied.
3. Counters (``reason_counts``, ``xid_counts``, ``action_counts``, ``health_report_counts``,
   ``port_down_total_s``) only go up: they live in their own tables, are incremented in the same
   transaction as the row they count, and pruning history never touches them.
4. A file that is not a readable gpu-monitor database raises ``StoreCorruptError`` naming the
   file and the recovery command (``RECOVER_COMMAND``); a file written by a newer gpu-monitor
   raises ``StoreVersionError``. Either is left exactly as it was, WAL included: an existing
   file is judged through a read-only connection first, which never checkpoints (files.py;
   the recovery itself is recovery.py). Callers see ``StoreError`` subclasses, never
   ``sqlite3`` exceptions.
5. Safe to share between threads: one connection, every use under one re-entrant lock.

The rooms of the package: connection.py (the connection, its lock and transactions), one
module per domain of tables (results.py, kernel_log.py, ports.py, node.py, kv.py), schema.py
(the SQL of each version and the migrations), files.py (judging a file before use),
errors.py, encoding.py (times and JSON in columns), recovery.py (moving a damaged file aside)
and cli.py (``gpu-monitor state check|recover``). ``Store`` is the one object callers hold: it
is every domain's tables over one connection. docs/state.md describes tables and recovery.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpu_monitor.state.encoding import to_us
from gpu_monitor.state.kernel_log import KernelLogTables
from gpu_monitor.state.kv import KvTables
from gpu_monitor.state.node import NodeTables
from gpu_monitor.state.ports import PortTables
from gpu_monitor.state.results import ResultTables

__all__ = ["Store"]


class Store(ResultTables, KernelLogTables, PortTables, NodeTables, KvTables):
    """The state store. Create with ``Store.open(path)``; close with ``close()`` or ``with``.

    Each base owns its tables' reads and writes; ``prune`` is here because retention spans
    them all and runs as one transaction.
    """

    def prune(self, older_than: datetime | timedelta) -> dict[str, int]:
        """Drop history older than a cutoff (a time, or an age before the clock's now).

        Kept whatever their age: the latest result per check/target, open port outages, the
        counters, kernel-log high-water marks, node-state history, key/value state and health
        report uids (their de-duplication depends on them). Returns rows deleted per table.
        """
        if isinstance(older_than, timedelta):
            older_than = self._clock.now() - older_than
        cutoff = to_us(older_than)
        deleted: dict[str, int] = {}
        with self._write() as c:
            deleted["results"] = c.execute(
                "DELETE FROM results WHERE observed_us < ? AND id NOT IN"
                " (SELECT result_id FROM latest_results)", (cutoff,)).rowcount
            deleted["xid_events"] = c.execute(
                "DELETE FROM xid_events WHERE observed_us < ?", (cutoff,)).rowcount
            if deleted["xid_events"]:
                self._xid_events_pruned()
            deleted["port_down"] = c.execute(
                "DELETE FROM port_down WHERE end_us IS NOT NULL AND end_us < ?",
                (cutoff,)).rowcount
            deleted["actions"] = c.execute(
                "DELETE FROM actions WHERE at_us < ?", (cutoff,)).rowcount
            # Remember how far each boot's marks were pruned, so kmsg_seen stays true for them.
            c.execute(
                "UPDATE kmsg_boots SET pruned_through = MAX(pruned_through, (SELECT MAX(seq)"
                " FROM kmsg_seen s WHERE s.boot_id = kmsg_boots.boot_id AND s.seen_us < ?))"
                " WHERE EXISTS (SELECT 1 FROM kmsg_seen s WHERE s.boot_id = kmsg_boots.boot_id"
                " AND s.seen_us < ?)", (cutoff, cutoff))
            deleted["kmsg_seen"] = c.execute(
                "DELETE FROM kmsg_seen WHERE seen_us < ?", (cutoff,)).rowcount
        return deleted

