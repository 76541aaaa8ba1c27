"""Which signals the standard ``OTEL_*`` variables ask to be exported, and how: the one rule
the server (``agentrt_base.tracing``) and the demo's processes (``agentrt_sdk.demo``) follow.

A signal ("traces" or "metrics") is exported when an OTLP endpoint is named for it or for
all signals (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``…) or
its exporter is ``otlp`` (``OTEL_TRACES_EXPORTER``); never with ``none`` or with
``OTEL_SDK_DISABLED=true``. agentrt exports OTLP over gRPC only: another exporter or
protocol is refused (:class:`OtelConfigError`), not silently ignored. The variables are the
OpenTelemetry SDK's
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/ and
https://opentelemetry.io/docs/specs/otel/protocol/exporter/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"


class OtelConfigError(ValueError):
    """The ``OTEL_*`` variables ask for something agentrt cannot do; one line."""


def _exporters(environ: Mapping[str, str], signal: str) -> list[str]:
    value = environ.get(f"OTEL_{signal.upper()}_EXPORTER", "")
    return [part.strip().lower() for part in value.split(",") if part.strip()]


def exports(environ: Mapping[str, str], signal: str) -> bool:
    """Whether ``signal`` ("traces" or "metrics") is to be exported over OTLP.

    Raises:
        OtelConfigError: an exporter other than ``otlp``/``none``, or a protocol other than
            ``grpc``, is asked for.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters(environ, signal)
    if "none" in exporters:
        return False
    unsupported = [name for name in exporters if name != "otlp"]
    if unsupported:
        raise OtelConfigError(
            f"OTEL_{signal.upper()}_EXPORTER={','.join(exporters)}: agentrt exports over"
            " OTLP only (otlp or none)"
        )
    # The signal's own protocol variable wins over the general one.
    for variable in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL", _PROTOCOL):
        protocol = environ.get(variable, "").strip().lower()
        if protocol and protocol != "grpc":
            raise OtelConfigError(
                f"{variable}={protocol}: agentrt exports OTLP over gRPC only (grpc)"
            )
        if protocol:
            break
    return bool(
        "otlp" in exporters
        or environ.get(_ENDPOINT)
        or environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    )
