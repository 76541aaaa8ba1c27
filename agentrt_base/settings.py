"""Server settings: command-line flag, then environment variable, then default.

Read once by the CLI and passed down explicitly; nothing reads the environment at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentrt_base.limits import Limits
from agentrt_base.tls import ServerTls
from agentrt_core.connect import DEFAULT_PORT

DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_DATABASE_URL = "sqlite:///./agentrt.db"

ENV_LISTEN = "AGENTRT_LISTEN"
ENV_METRICS_LISTEN = "AGENTRT_METRICS_LISTEN"
ENV_CONSOLE_LISTEN = "AGENTRT_CONSOLE_LISTEN"
ENV_LOG_FORMAT = "AGENTRT_LOG_FORMAT"
#: The server's log formats (``agentrt_base.log_format``).
LOG_FORMATS = ("text", "json")
ENV_INSECURE = "AGENTRT_INSECURE"
ENV_AUTH_CONFIG = "AGENTRT_AUTH_CONFIG"
ENV_DATABASE_URL = "AGENTRT_DATABASE_URL"
#: A file whose content is the database password (it replaces the URL's), so the password
#: need not appear in the process's arguments or environment.
ENV_DATABASE_PASSWORD_FILE = "AGENTRT_DATABASE_PASSWORD_FILE"
ENV_STEP_PROCESS = "AGENTRT_STEP_PROCESS"
ENV_DB_CONNECT_TIMEOUT = "AGENTRT_DB_CONNECT_TIMEOUT"
ENV_DB_STATEMENT_TIMEOUT = "AGENTRT_DB_STATEMENT_TIMEOUT"
ENV_DB_LOCK_TIMEOUT = "AGENTRT_DB_LOCK_TIMEOUT"
ENV_DB_POOL_TIMEOUT = "AGENTRT_DB_POOL_TIMEOUT"
ENV_SQLITE_MAX_BYTES = "AGENTRT_SQLITE_MAX_BYTES"
ENV_MAX_BLOB_BYTES = "AGENTRT_MAX_BLOB_BYTES"
ENV_BLOB_QUOTA_BYTES = "AGENTRT_BLOB_QUOTA_BYTES"
ENV_NAMESPACE_BLOB_QUOTA_BYTES = "AGENTRT_NAMESPACE_BLOB_QUOTA_BYTES"
ENV_BLOB_UPLOAD_RATE = "AGENTRT_BLOB_UPLOAD_BYTES_PER_SECOND"
# Per-principal limits (agentrt_base.limits) and the transport's caps (docs/security.md).
ENV_RATE_LIMIT = "AGENTRT_RATE_LIMIT"
ENV_RATE_BURST = "AGENTRT_RATE_BURST"
ENV_MAX_WATCHES = "AGENTRT_MAX_WATCHES"
ENV_MAX_LONG_POLLS = "AGENTRT_MAX_LONG_POLLS"
ENV_MAX_STREAMS_PER_CONNECTION = "AGENTRT_MAX_STREAMS_PER_CONNECTION"
ENV_MAX_CONNECTIONS = "AGENTRT_MAX_CONNECTIONS"
ENV_SHUTDOWN_DEADLINE = "AGENTRT_SHUTDOWN_DEADLINE"
#: The signing key files, comma-separated, the signing one first (agentrt_base.signing_keys).
ENV_SIGNING_KEYS = "AGENTRT_SIGNING_KEYS"
ENV_LOG_ORIGIN = "AGENTRT_LOG_ORIGIN"

#: HTTP/2 streams one connection may have open at once (``grpc.max_concurrent_streams``):
#: above one principal's watches plus long polls, so a client that keeps them all on one
#: channel still can (past it, a client's new calls queue until a stream ends).
DEFAULT_MAX_STREAMS_PER_CONNECTION = 2_000
#: The most connections the server holds, whatever their state; and the share of the
#: process's open-file limit taken when none is set.
MAX_CONNECTIONS_CEILING = 10_000


def default_max_connections(open_file_limit: int) -> int:
    """Half the open-file limit (at most :data:`MAX_CONNECTIONS_CEILING`), so connections can
    never take the descriptors the database and the blob files need."""
    return max(16, min(open_file_limit // 2, MAX_CONNECTIONS_CEILING))


@dataclass(frozen=True)
class DatabaseSettings:
    """The server's own deadlines on the database, so a frozen database answers UNAVAILABLE
    (``DATABASE_TIMEOUT``) instead of holding calls until the client's deadline, and the
    SQLite size cap. Seconds unless said otherwise; ``docs/architecture.md`` ("Deadlines")."""

    #: Opening a PostgreSQL connection (libpq ``connect_timeout``).
    connect_timeout: float = 5.0
    #: One PostgreSQL statement (``statement_timeout``); on SQLite, how long a write call waits
    #: for the group-commit writer to commit it.
    statement_timeout: float = 30.0
    #: Waiting for a lock: PostgreSQL ``lock_timeout``, SQLite ``busy_timeout``.
    lock_timeout: float = 10.0
    #: Waiting for a free connection of the pool (PostgreSQL).
    pool_timeout: float = 5.0
    #: SQLite: the largest the database file may grow (``PRAGMA max_page_count``); a write
    #: past it answers RESOURCE_EXHAUSTED ``DATABASE_FULL``. None: as large as the disk allows.
    sqlite_max_bytes: int | None = None
    #: How often the health watcher probes the database (``runtime_service.health``).
    probe_interval: float = 1.0

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> DatabaseSettings:
        default = cls()
        return cls(
            connect_timeout=_seconds(env, ENV_DB_CONNECT_TIMEOUT, default.connect_timeout),
            statement_timeout=_seconds(env, ENV_DB_STATEMENT_TIMEOUT, default.statement_timeout),
            lock_timeout=_seconds(env, ENV_DB_LOCK_TIMEOUT, default.lock_timeout),
            pool_timeout=_seconds(env, ENV_DB_POOL_TIMEOUT, default.pool_timeout),
            sqlite_max_bytes=_bytes(None, env, ENV_SQLITE_MAX_BYTES),
        )


@dataclass(frozen=True)
class ServerSettings:
    """What ``agentrt serve`` needs to start."""

    listen: str = DEFAULT_LISTEN
    #: Where ``/metrics`` is served (``agentrt_base.metrics_http``); None: no metrics (and no
    #: metrics interceptor: off costs nothing).
    metrics_listen: str | None = None
    #: Where the web console is served (``runtime_service.console``); None: no console.
    console_listen: str | None = None
    #: How the server's log lines are written: "text" or "json" (``agentrt_base.log_format``).
    log_format: str = "text"
    database_url: str = DEFAULT_DATABASE_URL
    #: Seconds in-flight calls get to finish after SIGTERM before they are cancelled.
    shutdown_grace_seconds: float = 3.0
    #: Seconds the whole shutdown may take (drain, background tasks, the step writer, the
    #: database); past it the process exits 1 with a line naming the stage it abandoned, so a
    #: stuck stop never leaves a server that no longer serves but still holds its port.
    shutdown_deadline_seconds: float = 30.0
    #: On a SQLite file or PostgreSQL (on Linux), write the step path's common case in a
    #: second process (``runtime_service.step_process``); ``AGENTRT_STEP_PROCESS=0`` keeps it
    #: in-process.
    step_process: bool = True
    #: Deadlines on every database call, and the SQLite size cap.
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    #: PutBlob's per-blob limit and total quota in bytes; None keeps the runtime's defaults
    #: (``RuntimeSettings``).
    max_blob_bytes: int | None = None
    blob_quota_bytes: int | None = None
    #: The blob bytes one namespace may hold (each blob it uploaded, counted once).
    namespace_blob_quota_bytes: int | None = None
    #: Bytes per second all uploads together may take (0: no limit); None: the default.
    blob_upload_rate: int | None = None
    #: TLS (and mTLS with a client CA); None: plaintext.
    tls: ServerTls | None = None
    #: Accept a listen address other machines can reach without authenticating them
    #: (``--insecure``); without it, such an address is refused at start.
    insecure: bool = False
    #: The principals' file (``agentrt_base.auth``); None: callers are not authenticated.
    auth_config: str | None = None
    #: Every principal's limits, unless its entry in the auth file sets its own.
    limits: Limits = field(default_factory=Limits)
    #: HTTP/2 streams per connection (0: gRPC's own, unlimited).
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    #: Connections the server accepts at once (0: unlimited); None: from the open-file limit
    #: (:func:`default_max_connections`).
    max_connections: int | None = None
    #: Key files the server signs with, the signing one first (``agentrt_base.signing_keys``);
    #: empty: a SQLite file's generated key.
    signing_keys: tuple[str, ...] = ()
    #: The registry log's origin, the first line of its checkpoints; None: the one it has,
    #: or ``agentrt/<installation id>`` for a new log.
    log_origin: str | None = None

    @classmethod
    def resolve(
        cls,
        *,
        listen: str | None,
        database_url: str | None,
        environ: Mapping[str, str] | None = None,
        max_blob_bytes: int | None = None,
        blob_quota_bytes: int | None = None,
        namespace_blob_quota_bytes: int | None = None,
        blob_upload_rate: int | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        client_ca: str | None = None,
        insecure: bool = False,
        auth_config: str | None = None,
        rate_limit: float | None = None,
        rate_burst: int | None = None,
        max_watches: int | None = None,
        max_long_polls: int | None = None,
        max_streams_per_connection: int | None = None,
        max_connections: int | None = None,
        metrics_listen: str | None = None,
        log_format: str | None = None,
        console_listen: str | None = None,
        signing_keys: Sequence[str] | None = None,
        log_origin: str | None = None,
    ) -> ServerSettings:
        """Combine flags (which win) with the environment and the defaults; raises
        ValueError (one line) for a malformed value."""
        env = os.environ if environ is None else environ
        return cls(
            max_blob_bytes=_bytes(max_blob_bytes, env, ENV_MAX_BLOB_BYTES),
            blob_quota_bytes=_bytes(blob_quota_bytes, env, ENV_BLOB_QUOTA_BYTES),
            namespace_blob_quota_bytes=_bytes(
                namespace_blob_quota_bytes, env, ENV_NAMESPACE_BLOB_QUOTA_BYTES
            ),
            blob_upload_rate=_bytes(blob_upload_rate, env, ENV_BLOB_UPLOAD_RATE),
            listen=listen or env.get(ENV_LISTEN) or DEFAULT_LISTEN,
            metrics_listen=metrics_listen or env.get(ENV_METRICS_LISTEN) or None,
            console_listen=console_listen or env.get(ENV_CONSOLE_LISTEN) or None,
            log_format=resolve_log_format(log_format, env),
            database_url=database_url or env.get(ENV_DATABASE_URL) or DEFAULT_DATABASE_URL,
            step_process=env.get(ENV_STEP_PROCESS, "1").strip().lower()
            not in ("0", "false", "no", "off"),
            database=DatabaseSettings.from_environ(env),
            tls=ServerTls.resolve(tls_cert, tls_key, client_ca, env),
            insecure=insecure
            or env.get(ENV_INSECURE, "").strip().lower() in ("1", "true", "yes", "on"),
            auth_config=auth_config or env.get(ENV_AUTH_CONFIG) or None,
            limits=_limits(
                env,
                rate_limit=rate_limit,
                rate_burst=rate_burst,
                max_watches=max_watches,
                max_long_polls=max_long_polls,
            ),
            max_streams_per_connection=_or(
                _count(max_streams_per_connection, env, ENV_MAX_STREAMS_PER_CONNECTION),
                DEFAULT_MAX_STREAMS_PER_CONNECTION,
            ),
            max_connections=_count(max_connections, env, ENV_MAX_CONNECTIONS),
            shutdown_deadline_seconds=_seconds(env, ENV_SHUTDOWN_DEADLINE, 30.0),
            signing_keys=signing_key_paths(signing_keys, env),
            log_origin=log_origin or env.get(ENV_LOG_ORIGIN) or None,
        )


def signing_key_paths(flags: Sequence[str] | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """``--signing-key`` values, else ``AGENTRT_SIGNING_KEYS`` split at commas."""
    if flags:
        return tuple(flags)
    return tuple(p.strip() for p in env.get(ENV_SIGNING_KEYS, "").split(",") if p.strip())


def resolve_log_format(flag: str | None, env: Mapping[str, str]) -> str:
    """The log format from ``--log-format`` (which wins), ``AGENTRT_LOG_FORMAT`` or the
    default; ValueError (one line) for one that is not in :data:`LOG_FORMATS`. Asked first by
    ``serve``, which logs while it reads the rest of its settings."""
    value = flag or env.get(ENV_LOG_FORMAT) or "text"
    if value not in LOG_FORMATS:
        raise ValueError(f"{ENV_LOG_FORMAT}={value!r}: expected one of {', '.join(LOG_FORMATS)}")
    return value


def _bytes(flag: int | None, env: Mapping[str, str], name: str) -> int | None:
    """A size in bytes from its flag or environment variable (None when neither is set)."""
    value: int | None = flag
    if value is None and env.get(name, "").strip():
        try:
            value = int(env[name].strip())
        except ValueError:
            raise ValueError(f"{name}={env[name]!r} is not a whole number of bytes") from None
    if value is not None and value < 0:
        raise ValueError(f"{name}: a size in bytes may not be negative ({value})")
    return value


def _count(flag: int | None, env: Mapping[str, str], name: str) -> int | None:
    """A whole number, 0 or more, from its flag or environment variable (None when neither
    is set)."""
    value: int | None = flag
    if value is None and env.get(name, "").strip():
        try:
            value = int(env[name].strip())
        except ValueError:
            raise ValueError(f"{name}={env[name]!r} is not a whole number") from None
    if value is not None and value < 0:
        raise ValueError(f"{name}: may not be negative ({value}); 0 means unlimited")
    return value


def _rate(flag: float | None, env: Mapping[str, str], name: str) -> float | None:
    value: float | None = flag
    if value is None and env.get(name, "").strip():
        try:
            value = float(env[name].strip())
        except ValueError:
            raise ValueError(f"{name}={env[name]!r} is not a number of calls a second") from None
    if value is not None and not 0 <= value < float("inf"):
        raise ValueError(f"{name}: must be a finite number, 0 or more ({value}); 0: unlimited")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A number of seconds (above 0, below a day) from the environment, or ``default``."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if not 0 < value < 86_400:
        raise ValueError(f"{name}: must be more than 0 and less than a day ({text})")
    return value


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _limits(
    env: Mapping[str, str],
    *,
    rate_limit: float | None,
    rate_burst: int | None,
    max_watches: int | None,
    max_long_polls: int | None,
) -> Limits:
    """Every principal's limits: flags, then the environment, then :class:`Limits`'s
    defaults."""
    default = Limits()
    rate = _rate(rate_limit, env, ENV_RATE_LIMIT)
    burst = _count(rate_burst, env, ENV_RATE_BURST)
    if burst == 0:
        raise ValueError(f"{ENV_RATE_BURST}: must be 1 or more (a bucket must hold one call)")
    return Limits(
        requests_per_second=default.requests_per_second if rate is None else rate,
        burst=_or(burst, default.burst),
        watches=_or(_count(max_watches, env, ENV_MAX_WATCHES), default.watches),
        long_polls=_or(_count(max_long_polls, env, ENV_MAX_LONG_POLLS), default.long_polls),
    )
