"""The ``/metrics`` endpoint: the Prometheus text format over HTTP, by ``prometheus_client``.

It listens on its own address (``--metrics-listen``, ``AGENTRT_METRICS_LISTEN``; off unless
given) and follows the gRPC port's exposure rule: loopback only, unless whoever scrapes is
authenticated — the server has mTLS configured, and the endpoint then requires a client
certificate signed by the same CA — or the operator accepts the risk with ``--insecure``.
Metrics hold no secrets, but their labels name namespaces and agents.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from agentrt_base.metrics import Metrics
from agentrt_base.tls import ServerTls, is_loopback

log = logging.getLogger("agentrt.metrics")


class MetricsExposureError(ValueError):
    """The endpoint may not listen where it was asked to; the message is one line."""


def metrics_exposure(listen: str, tls: ServerTls | None, insecure: bool) -> str:
    """How the endpoint at ``listen`` is reached (a phrase for the log line), or
    :class:`MetricsExposureError` if it may not listen there."""
    if tls is not None and tls.client_ca_file is not None:
        return "HTTPS, scrapers present a client certificate"
    if is_loopback(listen):
        return "HTTP, loopback only"
    if insecure:
        return "HTTP with --insecure: anyone who can reach it can read it"
    raise MetricsExposureError(
        f"refusing to serve metrics on {listen}: scrapers are not authenticated, so only a"
        " loopback address is allowed (use 127.0.0.1, configure mTLS with --tls-cert,"
        " --tls-key and --client-ca, or accept the risk with --insecure)"
    )


@dataclass
class MetricsEndpoint:
    listen: str
    metrics: Metrics
    tls: ServerTls | None = None
    insecure: bool = False
    port: int = 0
    _server: WSGIServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> int:
        """Bind and serve (on a thread of its own); return the bound port. Raises
        MetricsExposureError, or OSError when the address cannot be bound."""
        how = metrics_exposure(self.listen, self.tls, self.insecure)
        host, _, port_text = self.listen.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            raise MetricsExposureError(
                f"--metrics-listen {self.listen}: expected HOST:PORT"
            ) from None
        mtls = self.tls is not None and self.tls.client_ca_file is not None
        self._server, self._thread = start_http_server(
            port,
            host.strip("[]") or "0.0.0.0",
            registry=self.metrics.registry,
            certfile=self.tls.cert_file if mtls and self.tls else None,
            keyfile=self.tls.key_file if mtls and self.tls else None,
            client_cafile=self.tls.client_ca_file if mtls and self.tls else None,
            client_auth_required=mtls,
        )
        self.port = self._server.server_port
        log.info("serving metrics on %s:%d/metrics (%s)", host, self.port, how)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
