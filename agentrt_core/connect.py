"""How a client reaches a server: the address it talks to and the channel it opens.

Shared by the SDK and every ``agentrt`` command that calls a server, so both read ``--target``
and ``AGENTRT_TARGET`` the same way, speak TLS the same way (``--tls-ca``, and for mTLS
``--tls-cert``/``--tls-key``; gRPC's own TLS, no hand-written crypto) and send the same token.
The server's half of TLS (its certificate, reloading it) is ``agentrt_base.tls``.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

#: The port agentrt serves on, and the one a client's ``--target HOST`` means when it names
#: none (gRPC's own default for a bare host is 443, which no agentrt server listens on).
DEFAULT_PORT = 50051
DEFAULT_TARGET = f"127.0.0.1:{DEFAULT_PORT}"
#: gRPC name-resolver schemes (grpc/grpc doc/naming.md): a target that starts with one is
#: passed to gRPC as it is.
_TARGET_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")

ENV_TARGET = "AGENTRT_TARGET"
ENV_TLS_CA = "AGENTRT_TLS_CA"
ENV_TLS_CLIENT_CERT = "AGENTRT_TLS_CLIENT_CERT"
ENV_TLS_CLIENT_KEY = "AGENTRT_TLS_CLIENT_KEY"
ENV_TOKEN = "AGENTRT_TOKEN"


class TargetError(ValueError):
    """A server address that is not one (a URL): the message is the one line to show."""


def resolve_target(target: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The server address a client command talks to: ``--target``, ``AGENTRT_TARGET``, default;
    a host named without a port gets :data:`DEFAULT_PORT` (:func:`with_default_port`).

    Raises:
        TargetError: it is a URL (``http://127.0.0.1:50051``). gRPC would read it as a host
            named ``http`` and answer "Misformatted domain name"; whether to use TLS is
            ``--tls-ca``'s to say, not a scheme's, so a URL is refused rather than guessed at.
    """
    env = os.environ if environ is None else environ
    given = target or env.get(ENV_TARGET) or DEFAULT_TARGET
    if "://" in given and not given.startswith(_TARGET_SCHEMES):
        where = "--target" if target else ENV_TARGET
        address = with_default_port(urlsplit(given).netloc or DEFAULT_TARGET)
        tls = " with --tls-ca" if given.startswith("https://") else ""
        raise TargetError(f"{where} takes HOST:PORT, not a URL ({given}): use {address}{tls}")
    return with_default_port(given)


def with_default_port(target: str) -> str:
    """``target`` with :data:`DEFAULT_PORT` added when it names a host and no port.

    ``HOST``, ``[V6]`` and a bare IPv6 address get the port; ``HOST:PORT``, ``[V6]:PORT`` and
    a target with a gRPC scheme (``dns:``, ``unix:``, ...) are returned unchanged.
    """
    if target.startswith(_TARGET_SCHEMES):
        return target
    if target.startswith("["):
        return target if "]:" in target else f"{target}:{DEFAULT_PORT}"
    colons = target.count(":")
    if colons == 0:
        return f"{target}:{DEFAULT_PORT}"
    if colons > 1:  # an IPv6 address without brackets cannot carry a port
        return f"[{target}]:{DEFAULT_PORT}"
    return target


@dataclass(frozen=True)
class ClientTls:
    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def resolve(
        cls,
        ca: str | None,
        cert: str | None,
        key: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientTls | None:
        """From flags (which win) and the environment; None without a CA (plaintext)."""
        env = os.environ if environ is None else environ
        ca = ca or env.get(ENV_TLS_CA) or None
        cert = cert or env.get(ENV_TLS_CLIENT_CERT) or None
        key = key or env.get(ENV_TLS_CLIENT_KEY) or None
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs its key (--tls-cert and --tls-key)")
        if ca is None:
            if cert is not None:
                raise ValueError("--tls-cert needs --tls-ca (the server's CA)")
            return None
        return cls(ca, cert, key)


def client_channel(args: Any, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """The channel a client command opens to ``target``: TLS as its flags (``--tls-ca``,
    ``--tls-cert``, ``--tls-key``) and the environment say, and its API token (``--token``,
    env ``AGENTRT_TOKEN``) on every call. Raises ValueError (one line)."""
    tls = ClientTls.resolve(
        getattr(args, "tls_ca", None),
        getattr(args, "tls_cert", None),
        getattr(args, "tls_key", None),
    )
    channel = open_channel(target, tls, options)
    token = getattr(args, "token", None) or os.environ.get(ENV_TOKEN) or None
    if token is None:
        return channel
    return grpc.intercept_channel(channel, _Bearer(token))


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def open_channel(
    target: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel to ``target``: TLS (and a client certificate) when configured."""
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, channel_credentials(tls), options=list(options))


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    """The credentials of a TLS client channel: the server's CA, and a client certificate
    when one is configured (for the blocking channels here and the SDK's asyncio ones)."""
    return grpc.ssl_channel_credentials(
        root_certificates=Path(tls.ca_file).read_bytes(),
        private_key=Path(tls.key_file).read_bytes() if tls.key_file else None,
        certificate_chain=Path(tls.cert_file).read_bytes() if tls.cert_file else None,
    )


#: Added to a plaintext client's UNAVAILABLE when the server turns out to speak TLS: gRPC's own
#: words for it are "Socket closed", which sent people looking at the network (issue 27).
PLAINTEXT_TO_TLS_HINT = (
    f"the server speaks TLS and this client does not: pass --tls-ca PATH (env {ENV_TLS_CA};"
    " the SDK's tls=ClientTls(ca_file=PATH)) with the CA of the server's certificate"
)


def speaks_tls(target: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``target`` (``HOST:PORT``) completes a TLS handshake offering
    HTTP/2. Its certificate is not checked: this only tells a TLS server from a plaintext one,
    to explain a plaintext call that failed, and nothing is sent after the handshake."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:  # dns:///, unix:…: not probed
        return False
    host = host.removeprefix("[").removesuffix("]")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host or None),
        ):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False


def plaintext_failure_hint(target: str) -> str:
    """:data:`PLAINTEXT_TO_TLS_HINT` if ``target`` speaks TLS, else empty: for a plaintext
    client whose call failed UNAVAILABLE (asked only then, so a working call costs nothing)."""
    return PLAINTEXT_TO_TLS_HINT if speaks_tls(target) else ""


def cannot_reach(args: Any, target: str, details: str) -> str:
    """A client command's words for UNAVAILABLE: ``cannot reach TARGET: DETAILS``, and the
    hint when the command talked plaintext (no ``--tls-ca``, no ``AGENTRT_TLS_CA``) to a server
    that speaks TLS."""
    text = f"cannot reach {target}: {details}"
    if getattr(args, "tls_ca", None) or os.environ.get(ENV_TLS_CA):
        return text
    hint = plaintext_failure_hint(target)
    return f"{text}; {hint}" if hint else text
