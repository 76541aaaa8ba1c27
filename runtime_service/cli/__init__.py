"""The ``agentrt`` command.

gRPC core reads ``GRPC_VERBOSITY`` once, when ``grpc`` is first imported, which the command's
modules do: so its default is set here, before any of them. Left unset, gRPC 1.85 leaves its
logging at INFO and prints, among other INFO lines, one per failed TLS handshake ("Handshake
failed with error SSL_ERROR_SSL: ... WRONG_VERSION_NUMBER" for each plaintext client of a TLS
server, issue 27), which reads like a fault of the server. ``ERROR`` (what gRPC documented as
its default; it takes DEBUG, INFO, ERROR or NONE, no WARNING) keeps its errors; the client is
the one told about the handshake (``agentrt_core.connect.PLAINTEXT_TO_TLS_HINT``). An operator
who wants gRPC's INFO lines sets ``GRPC_VERBOSITY=INFO`` (``docs/security.md``, "TLS and
mTLS")."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
