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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc

log = logging.getLogger("agentrt.tls")

ENV_TLS_CERT = "AGENTRT_TLS_CERT"
ENV_TLS_KEY = "AGENTRT_TLS_KEY"
ENV_CLIENT_CA = "AGENTRT_CLIENT_CA"


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


def is_loopback(listen: str) -> bool:
    """Whether a ``HOST:PORT`` listen address reaches this machine only."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or an address this does not parse): not known loopback
