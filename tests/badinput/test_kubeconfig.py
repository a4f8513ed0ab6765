"""Bad ``--kubeconfig`` files: the daemon refuses to start (exit 2) naming the flag and the file.

A daemon outside a cluster reaches its API server through ``--kubeconfig`` (docs/cli.md). The
file is checked at start, so a broken one is a usage error there, not a traceback in the first
remediation tick minutes later. The table is generated: every file-level shape (missing, a
directory, empty, not YAML, a YAML scalar or list, binary), and every way to break each part
of an otherwise good kubeconfig (each top-level key dropped, nulled or of the wrong type; the
current context, its cluster and its user pointing nowhere; the server missing or not a URL;
certificate files that do not exist; a ``--context`` that is not in the file).

Every case runs ``daemon --once``: a kubeconfig wrongly accepted ends the run with a report
(exit 0/1) and fails the case instead of starting a daemon that never returns.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.badinput.harness import Case, config_case, ids, run_case

FILE = "kubeconfig.yaml"

GOOD: dict = {
    "apiVersion": "v1",
    "kind": "Config",
    "current-context": "ops",
    "clusters": [{"name": "prod", "cluster": {"server": "https://10.0.0.1:6443"}}],
    "contexts": [{"name": "ops", "context": {"cluster": "prod", "user": "admin"}}],
    "users": [{"name": "admin", "user": {"token": "abc"}}],
}


def _write(text: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / FILE
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    return setup


def _doc(mutate: Callable[[dict], None]) -> Callable[[Path], None]:
    doc = copy.deepcopy(GOOD)
    mutate(doc)
    return _write(yaml.safe_dump(doc))


def _file_shapes() -> Iterator[tuple[str, Callable[[Path], None]]]:
    yield "missing", lambda tmp: None
    yield "a-directory", lambda tmp: (tmp / FILE).mkdir()
    yield "empty", _write("")
    yield "not-yaml", _write("clusters: [unclosed\n")
    yield "yaml-scalar", _write("just a string\n")
    yield "yaml-list", _write("- a\n- b\n")
    yield "binary", _write(bytes(range(256)))


def _part_shapes() -> Iterator[tuple[str, Callable[[dict], None]]]:
    for key in ("current-context", "clusters", "contexts", "users"):
        yield f"{key}-dropped", lambda d, k=key: d.pop(k)
        yield f"{key}-null", lambda d, k=key: d.__setitem__(k, None)
    for key in ("clusters", "contexts", "users"):
        yield f"{key}-a-string", lambda d, k=key: d.__setitem__(k, "oops")
        yield f"{key}-empty-list", lambda d, k=key: d.__setitem__(k, [])
    yield "current-context-unknown", lambda d: d.__setitem__("current-context", "nope")
    yield "context-cluster-unknown", lambda d: d["contexts"][0]["context"].__setitem__(
        "cluster", "nope")
    yield "context-user-unknown", lambda d: d["contexts"][0]["context"].__setitem__(
        "user", "nope")
    yield "server-missing", lambda d: d["clusters"][0]["cluster"].pop("server")
    yield "server-not-a-url", lambda d: d["clusters"][0]["cluster"].__setitem__(
        "server", "prod-apiserver")
    yield "server-ftp", lambda d: d["clusters"][0]["cluster"].__setitem__(
        "server", "ftp://10.0.0.1")
    yield "ca-file-missing", lambda d: d["clusters"][0]["cluster"].__setitem__(
        "certificate-authority", "/nonexistent/ca.crt")
    yield "client-cert-missing", lambda d: d["users"][0].__setitem__(
        "user", {"client-certificate": "/nonexistent/c.crt",
                 "client-key": "/nonexistent/c.key"})


def cases() -> list[Case]:
    argv = ("daemon", "--once", "--simulate", "h100-sxm-8", "--kubeconfig", "{tmp}/" + FILE)
    out = [config_case(f"file-{name}", argv, ("--kubeconfig", FILE), setup)
           for name, setup in _file_shapes()]
    out += [config_case(f"part-{name}", argv, ("--kubeconfig", FILE), _doc(mutate))
            for name, mutate in _part_shapes()]
    out.append(config_case("context-not-in-file", (*argv, "--context", "staging"),
                           ("--kubeconfig", FILE, "staging"), _doc(lambda d: None)))
    return out


CASES = cases()


def test_the_table_is_big_enough():
    assert len(CASES) >= 30 and len(set(ids(CASES))) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_bad_kubeconfig_stops_the_daemon_at_start(case, tmp_path, capsys, caplog):
    run_case(case, tmp_path, capsys, caplog)


def test_a_good_kubeconfig_passes_the_start_check(tmp_path):
    from gpu_monitor.kube.config import kubeconfig_factory

    _doc(lambda d: None)(tmp_path)
    api = kubeconfig_factory(str(tmp_path / FILE))()
    assert api.configuration.host == "https://10.0.0.1:6443"
