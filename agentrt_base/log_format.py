"""The server's log formats: text (the default) and JSON, one object a line.

A JSON line has ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger`` and
``message``; ``exception`` when one is logged; and, in a call, ``method``, ``principal``, the
ids the request names (``thread_id``, ``run_id``, ``attempt_id``, ``step_id``:
``agentrt_base.call_context``) and, when the server traces (``agentrt_base.tracing``), the
call's ``trace_id`` and ``span_id``, so a log line leads to its trace. The server logs no
user content (prompts, tool arguments, outputs) at any level; ids and reasons only.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, Final, TextIO

from opentelemetry import trace

from agentrt_base.auth import CALLER
from agentrt_base.call_context import CALL
from agentrt_base.settings import LOG_FORMATS

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        call = CALL.get()
        if call is not None:
            line["method"] = call.method
            line.update(call.ids)
        principal = CALLER.get()
        if principal is not None:
            line["principal"] = principal.name
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = format(span.trace_id, "032x")
            line["span_id"] = format(span.span_id, "016x")
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str, stream: TextIO) -> None:
    """Send the root logger's INFO and above to ``stream`` in ``log_format``."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # Alembic narrates every step at INFO; the server's own ready line is what operators need.
    logging.getLogger("alembic").setLevel(logging.WARNING)
