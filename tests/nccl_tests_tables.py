"""Reading nccl-tests' printed result tables (tests/fixtures/nccl_tests): the numbers the NCCL
arithmetic (tests/test_nccl.py) and the fabric probe's judgement
(tests/fabric/test_probe_result.py) are held to."""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^(?:\d+: |\[\d+,\d+\]<stdout>:)")


def nccl_tests_rows(path):
    """(size, out-of-place time us, algbw, busbw) from an nccl-tests table."""
    rows = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = _PREFIX.sub("", raw).strip()
        if not line or line.startswith("#") or "NCCL" in line or line.startswith("..."):
            continue
        cols = line.split()
        if not cols[0].isdigit() or int(cols[0]) == 0:
            continue
        t = len(cols) - 8  # 13 columns (redop, root), 12 (redop), 11 (neither)
        rows.append((int(cols[0]), float(cols[t]), float(cols[t + 1]), float(cols[t + 2])))
    return rows
