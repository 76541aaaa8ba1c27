"""Credentials never reach a log line, and a caller cannot flood the log (issue 25, item 4).

grpcio logs, at ERROR with a traceback, every metadata value it cannot decode as UTF-8
(``grpc._cython.cygrpc``: ``Invalid encoding on b'Bearer agentrt_…\\xff'``) before any agentrt
code sees the call: any caller, authenticated or not, could write a raw token into the
server's log, as often as it liked. We cannot change what grpcio logs, so every record of
grpc's loggers passes :class:`RedactingFilter` before any handler sees it:

- the text (message, arguments and the formatted traceback) has credentials withheld: the
  value grpcio could not decode (it is a caller's bytes, whatever header it came in), a
  bearer value, an ``agentrt_`` API token, a JWT;
- identical lines (after redaction, per logger) are let through at most
  :data:`BURST` times per :data:`WINDOW_SECONDS`; the next one let through says how many were
  suppressed in between.

A filter on a logger applies only to records logged on that very logger (not to its
children's, which propagate to the handlers directly), so :func:`install` puts it on each of
grpc's loggers, once they exist (grpc creates them on import).
"""

from __future__ import annotations

import logging
import re
import threading
import time

#: Identical grpc lines let through per window, per logger.
BURST = 5
WINDOW_SECONDS = 60.0
#: The loggers covered: grpc's own, whatever their module (``grpc._cython.cygrpc``,
#: ``grpc._server``, ``grpc.aio._server``…).
_GRPC_PREFIX = "grpc"

_WITHHELD = "[withheld]"
_PATTERNS = (
    # What grpcio could not decode: a caller's raw bytes, whatever header they came in.
    (
        re.compile(r"Invalid encoding on b(['\"]).*?(?<!\\)\1", re.S),
        "Invalid encoding on a metadata value " + _WITHHELD,
    ),
    (re.compile(r"(?i)\b(bearer)\s+[^\s'\"]+"), r"\1 " + _WITHHELD),
    (re.compile(r"agentrt_[A-Za-z0-9_\-]+"), "agentrt_" + _WITHHELD),
    (re.compile(r"eyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]*"), "JWT " + _WITHHELD),
)


def redact(text: str) -> str:
    """``text`` with every credential it may hold withheld."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Withholds credentials from a record's text and rate-limits identical lines."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        #: (logger, redacted message) -> (window start, lines let through, lines suppressed)
        self._seen: dict[tuple[str, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = redact(record.getMessage())
        if record.exc_info:
            # Formatted here, once, so no handler formats the original (the exception's
            # text may quote the caller's bytes too).
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = redact(formatted)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        record.msg, record.args = message, None
        suppressed = self._admit((record.name, message))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{message} ({suppressed} similar lines suppressed)"
        return True

    def _admit(self, key: tuple[str, str]) -> int | None:
        """None to drop the line; else how many identical lines were dropped before it."""
        now = time.monotonic()
        with self._lock:
            start, shown, dropped = self._seen.get(key, (now, 0, 0))
            if now - start >= WINDOW_SECONDS:
                start, shown = now, 0
            if shown >= BURST:
                self._seen[key] = (start, shown, dropped + 1)
                return None
            self._seen[key] = (start, shown + 1, 0)
            if len(self._seen) > 4096:  # bounded: distinct lines are few; forget old ones
                self._seen.pop(next(iter(self._seen)))
            return dropped


_FILTER = RedactingFilter()


def install() -> None:
    """Put the filter on every grpc logger that exists now (idempotent; call after grpc is
    imported, e.g. when a server is made)."""
    manager = logging.Logger.manager
    names = [n for n in list(manager.loggerDict) if n.split(".")[0] == _GRPC_PREFIX]
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
