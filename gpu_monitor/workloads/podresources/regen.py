"""Regenerate the checked-in pod-resources stubs from api.proto (``python -m
gpu_monitor.workloads.podresources.regen``). Needs grpcio-tools (a developer tool, not a runtime
dependency); the version used is written into README.md next to the stubs."""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "gpu_monitor.workloads.podresources"


def main() -> int:
    from grpc_tools import protoc  # a developer tool, not a runtime dependency

    proto_include = Path(protoc.__file__).resolve().parent / "_proto"
    rc = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"-I{proto_include}",
                      f"--python_out={HERE}", f"--grpc_python_out={HERE}", str(HERE / "api.proto")])
    if rc != 0:
        print(f"protoc failed with {rc}", file=sys.stderr)
        return rc
    grpc_stub = HERE / "api_pb2_grpc.py"
    # protoc writes a top-level "import api_pb2"; the stubs live in a package.
    grpc_stub.write_text(re.sub(r"^import api_pb2 as", f"from {PACKAGE} import api_pb2 as",
                                grpc_stub.read_text(), flags=re.M))
    readme = HERE / "README.md"
    text = readme.read_text()
    text = re.sub(r"grpcio-tools [0-9][^ ]*", f"grpcio-tools {version('grpcio-tools')}", text)
    readme.write_text(text)
    print(f"regenerated api_pb2.py, api_pb2_grpc.py with grpcio-tools {version('grpcio-tools')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
