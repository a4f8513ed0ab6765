"""The SDC tests' shared setting: fingerprints in their eager form unless a test asks otherwise.

Why: the multi-rank tests spawn up to 6 processes; each would compile the fused fingerprint
kernels (gpu_monitor/sdc/fingerprint_fused.py) on its first large tensor, seconds of CPU each on
a 2-core machine. The environment variable is inherited by every spawned rank. The fused form has
its own tests (test_fingerprint_fused.py), which set the mode per test.
"""

from __future__ import annotations

import pytest

from gpu_monitor.sdc.fingerprint_fused import MODE_ENV


@pytest.fixture(scope="package", autouse=True)
def _eager_fingerprints():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODE_ENV, "eager")
        yield
