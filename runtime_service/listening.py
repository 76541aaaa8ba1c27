"""Where and how the server listens: its gRPC transport options, the rule of which addresses
it may listen on unauthenticated, the check that an address can be bound, and the error a
refused start raises."""

from __future__ import annotations

import logging
import resource
import socket

from agentrt_base.settings import MAX_CONNECTIONS_CEILING, ServerSettings, default_max_connections
from agentrt_base.tls import is_loopback

_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: A connection must finish its TLS and HTTP/2 handshake within this (gRPC's own default is
#: 120 s): a socket opened and left silent holds one of the bounded connections only briefly.
_HANDSHAKE_TIMEOUT_MS = 20_000
#: A connection with no call for this long is closed (GOAWAY; a client reconnects on its next
#: call without error), so idle connections do not hold the server's connection slots.
_MAX_CONNECTION_IDLE_MS = 5 * 60 * 1000


def _open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS_CEILING * 2 if soft == resource.RLIM_INFINITY else soft


def transport_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """gRPC's own caps on connections and streams (``docs/security.md``, "Limits"): what the
    per-principal limits cannot see, since they count calls, not sockets."""
    options = [
        # gRPC enables SO_REUSEPORT by default: a second server would then share the
        # port silently instead of failing. Refuse, so "port in use" is an error.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.server_handshake_timeout_ms", _HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", _MAX_CONNECTION_IDLE_MS),
    ]
    if settings.max_streams_per_connection:
        # Past it a client's further calls on that connection wait (HTTP/2 flow control),
        # they are not failed.
        options.append(("grpc.max_concurrent_streams", settings.max_streams_per_connection))
    connections = settings.max_connections
    if connections is None:
        connections = default_max_connections(_open_file_limit())
    if connections:
        # Counted from accept, before any handshake; past it a new connection is closed at
        # once (measured on grpcio 1.85: raw sockets count too).
        options.append(("grpc.max_allowed_incoming_connections", connections))
    return options


class StartupError(Exception):
    """The server cannot start; the message is one line for the operator."""


def listen_exposure(settings: ServerSettings, tokens: bool) -> tuple[int, str]:
    """The safe default: without a way to authenticate its callers (an auth config, or mTLS),
    the server listens on loopback only, unless told ``--insecure``. Raises StartupError for
    an address it refuses; else returns the log level and line that say which it is (logged
    once bound, so a start refused for another reason stays one line)."""
    listen, tls = settings.listen, settings.tls
    mtls = tls is not None and tls.client_ca_file is not None
    transport = "mTLS" if mtls else "TLS" if tls is not None else "plaintext"
    if mtls or (tokens and (tls is not None or is_loopback(listen))):
        return logging.INFO, f"listening on {listen} ({transport}; callers are authenticated)"
    if tokens:
        # Bearer tokens over plaintext beyond loopback can be read (and replayed) by anyone on
        # the path: authenticated, but not safely. Refused like an unauthenticated address.
        if settings.insecure:
            return (
                logging.WARNING,
                f"listening on {listen} (plaintext) with --insecure: bearer tokens cross the"
                " network in clear, readable by anyone on the path",
            )
        raise StartupError(
            f"refusing to listen on {listen} in plaintext: bearer tokens would cross the network"
            " in clear (configure TLS with --tls-cert and --tls-key, listen on 127.0.0.1, or"
            " accept the risk with --insecure)"
        )
    if is_loopback(listen):
        return (
            logging.INFO,
            f"listening on {listen} ({transport}, loopback only: callers are not authenticated)",
        )
    if settings.insecure:
        return (
            logging.WARNING,
            f"listening on {listen} ({transport}) with --insecure: anyone who can reach it can"
            " call it",
        )
    raise StartupError(
        f"refusing to listen on {listen}: callers are not authenticated, so only a"
        " loopback address is allowed (use 127.0.0.1, configure mTLS with --tls-cert,"
        " --tls-key and --client-ca, or accept the risk with --insecure)"
    )


def check_bindable(listen: str) -> None:
    """Try the address with a plain socket first, so "port in use" is reported in our own one
    line (gRPC would also log its own multi-part error line to stderr before failing)."""
    host_text, _, port_text = listen.rpartition(":")
    host = host_text.strip("[]") or None
    try:
        port = int(port_text)
    except ValueError as exc:
        raise StartupError(f"cannot listen on {listen}: expected HOST:PORT") from exc
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {listen}: {exc.strerror}") from exc
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise StartupError(f"cannot listen on {listen}: {exc.strerror}") from exc
