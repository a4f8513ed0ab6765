"""Loading a kubeconfig (gpu_monitor/kube/config.py): whatever a file holds, it loads or is refused
with KubeConfigError naming it. The daemon started with --kubeconfig: test_config_daemon.py."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["name", "server", "cluster", "user", "context", "token",
                         "current-context", "clusters", "contexts", "users", "x"]),
        inner, max_size=4),
    max_leaves=12))
@settings(deadline=None, derandomize=True, max_examples=150,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_kubeconfig_either_loads_or_raises_kubeconfig_error(tmp_path, doc):
    """Whatever the file holds, nothing but KubeConfigError leaves the start-up check."""
    import yaml

    from gpu_monitor.kube.config import kubeconfig_factory
    from gpu_monitor.kube.errors import KubeConfigError

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    try:
        kubeconfig_factory(str(path))
    except KubeConfigError as exc:
        assert str(path) in str(exc)
