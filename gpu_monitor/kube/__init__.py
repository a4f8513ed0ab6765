"""The Kubernetes client: the one room that imports ``kubernetes`` (lazily, inside functions).

- ``client``: ``Kube``, the one call path for every request (raw JSON, errors mapped, writes
  rate-limited, transient failures retried, lists paged, watches);
- ``errors``: ``KubeError`` and its kinds, nameable without loading ``kubernetes``;
- ``config``: in-cluster config or a kubeconfig, checked before the first request;
- ``ratelimit``: the token bucket behind the client's writes.

Its users - remediation (through its Kubernetes delivery, remediate/k8s/), the fabric
scheduler (fabric/api.py), the SDC library's report (sdc/report.py) and the operator CLIs -
never import ``kubernetes`` themselves; import-linter holds them to it (pyproject.toml's
``kubernetes`` contract) and so does tests/remediate/test_remediate_imports.py.
"""
