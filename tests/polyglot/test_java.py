"""Java generation is checked (issue 19): buf.gen.java.yaml generates Java from protos/ with
local plugins, ``javac`` compiles it with tests/polyglot/java/ErrorDetails.java (the error
decoding docs/api.md shows), and that program decodes a real refusal's
``grpc-status-details-bin`` bytes from the server into ErrorInfo and BadRequest.

The toolchain is Debian's (``.ci/run`` installs it): protoc and the gRPC Java plugin with the
protobuf and gRPC jars they match. Maven Central cannot be reached from this project's machines,
and Debian packages no Netty for grpc-java, so Java compiles the stubs but does not call the
server itself: the bytes it decodes come from a Python call. Go is not on these machines at all
(docs/api.md, "Go"), so no test generates Go.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_status import rpc_status

from agentrt.registry.v1 import registry_service_pb2 as rpb
from tests import registry_data
from tests.e2e.cli_support import ROOT

CLASSES = ROOT / "build" / "java-classes"
TOOLS = ["/usr/bin/protoc", "/usr/bin/grpc_java_plugin", "/usr/share/java/grpc-protobuf.jar"]


@pytest.fixture(scope="module")
def java_build() -> Path:
    missing = [tool for tool in TOOLS if not Path(tool).exists()] + [
        tool for tool in ("javac", "java") if shutil.which(tool) is None
    ]
    if missing:
        # CI installs the toolchain: there, its absence is a failure, not a skip.
        assert not os.environ.get("CI"), f"Java toolchain missing in CI: {missing}"
        pytest.skip(f"no Java toolchain ({', '.join(missing)}): .ci/run installs it")
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "java-check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return CLASSES


def test_java_decodes_a_refusals_details(java_build: Path, stub: Any, tmp_path: Path) -> None:
    bad = registry_data.tool("Read File!", "1")
    with pytest.raises(grpc.RpcError) as caught:
        stub.PublishComponent(rpb.PublishComponentRequest(component=bad), timeout=10)
    status = rpc_status.from_call(cast(grpc.Call, caught.value))
    assert status is not None
    trailer = tmp_path / "status.bin"
    trailer.write_bytes(status.SerializeToString())
    result = subprocess.run(
        ["java", "-cp", f"{java_build}:/usr/share/java/protobuf.jar", "ErrorDetails", str(trailer)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"code {grpc.StatusCode.INVALID_ARGUMENT.value[0]}"
    assert lines[1].startswith("ErrorInfo agentrt ")
    assert lines[2:] == ["BadRequest component.name"]
