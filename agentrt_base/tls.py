"""TLS for the server and its clients, with gRPC's own TLS (no hand-written crypto).

The server: a certificate and key (``--tls-cert``/``--tls-key``) and, for mTLS, the CA its
clients' certificates must chain to (``--client-ca``; a client without one is refused in the
handshake). The files are read again whenever one of them changes, on the next handshake, so
a renewed certificate takes effect without a restart (connections already open keep the one
they agreed on).

The clients (every ``agentrt`` command that talks to a server): ``--tls-ca`` (the CA that
signed the server's certificate; turns TLS on) and, for mTLS, ``--tls-cert``/``--tls-key``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc

log = logging.getLogger("agentrt.tls")

ENV_TLS_CERT = "AGENTRT_TLS_CERT"
ENV_TLS_KEY = "AGENTRT_TLS_KEY"
ENV_CLIENT_CA = "AGENTRT_CLIENT_CA"
ENV_TLS_CA = "AGENTRT_TLS_CA"
ENV_TLS_CLIENT_CERT = "AGENTRT_TLS_CLIENT_CERT"
ENV_TLS_CLIENT_KEY = "AGENTRT_TLS_CLIENT_KEY"
ENV_TOKEN = "AGENTRT_TOKEN"


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    #: The CA client certificates must chain to (mTLS); None: clients need none.
    client_ca_file: str | None = None

    @classmethod
    def resolve(
        cls,
        cert: str | None,
        key: str | None,
        client_ca: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> ServerTls | None:
        """From flags (which win) and the environment; None without a certificate. Raises
        ValueError (one line) for an incomplete configuration."""
        env = os.environ if environ is None else environ
        cert = cert or env.get(ENV_TLS_CERT) or None
        key = key or env.get(ENV_TLS_KEY) or None
        client_ca = client_ca or env.get(ENV_CLIENT_CA) or None
        if cert is None and key is None:
            if client_ca is not None:
                raise ValueError("--client-ca needs --tls-cert and --tls-key (mTLS is TLS)")
            return None
        if cert is None or key is None:
            raise ValueError("--tls-cert and --tls-key go together")
        return cls(cert, key, client_ca)


class _CertificateFiles:
    """gRPC's certificate-configuration fetcher: the files' contents, read again when one of
    them changed since the last read (None keeps the configuration in use)."""

    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls
        self._seen: tuple[float, ...] = ()

    def _paths(self) -> list[str]:
        tls = self._tls
        return [tls.cert_file, tls.key_file, *([tls.client_ca_file] if tls.client_ca_file else [])]

    def load(self) -> grpc.ServerCertificateConfiguration:
        """The configuration as the files are now (raises OSError if one cannot be read)."""
        paths = self._paths()
        stamps = tuple(os.stat(p).st_mtime_ns for p in paths)
        tls = self._tls
        pair = (Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())
        ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
        self._seen = stamps
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamps = tuple(os.stat(p).st_mtime_ns for p in self._paths())
            if stamps == self._seen:
                return None
            configuration = self.load()
        except OSError as exc:
            # (A renewal half written, say: the next handshake tries again.)
            log.warning("cannot read the TLS files again (%s); keeping the ones in use", exc)
            return None
        log.info("TLS certificate files changed: new handshakes use the new ones")
        return configuration


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials for ``add_secure_port``, reloading the files when they change."""
    files = _CertificateFiles(tls)
    # gRPC calls the fetcher at each handshake; None means "unchanged" (its docs), which its
    # type stubs do not spell out.
    fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], files)
    return grpc.dynamic_ssl_server_credentials(
        files.load(), fetcher, require_client_authentication=tls.client_ca_file is not None
    )


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


def is_loopback(listen: str) -> bool:
    """Whether a ``HOST:PORT`` listen address reaches this machine only."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or an address this does not parse): not known loopback
