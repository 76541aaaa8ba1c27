"""Composition root: one ``grpc.aio`` server hosting every agentrt service.

``grpc.aio`` rather than a sync thread pool because, measured on this class of machine
(``shared/PERFORMANCE.md``), it is ~1.3x faster once handlers touch the database and it keeps
serving hundreds of watch streams where a pool of N threads starves all but N of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from agentrt.audit.v1 import audit_service_pb2, audit_service_pb2_grpc
from agentrt.registry.v1 import registry_service_pb2, registry_service_pb2_grpc
from agentrt.runtime.v1 import (
    runtime_service_pb2,
    runtime_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from agentrt_base import gc_policy, log_redaction, signing_keys
from agentrt_base.access import Authorizer
from agentrt_base.auth_gate import Authenticator
from agentrt_base.call_context import CallContextInterceptor
from agentrt_base.db import Database
from agentrt_base.db_engines import normalise_url, writer_lock_path
from agentrt_base.grpc_errors import ErrorMappingInterceptor
from agentrt_base.grpc_metrics import MetricsInterceptor
from agentrt_base.grpc_tracing import TracingInterceptor
from agentrt_base.handler_wrap import Stacked, WrappingInterceptor
from agentrt_base.limits import Limiter
from agentrt_base.metrics import Metrics
from agentrt_base.metrics_http import MetricsEndpoint, MetricsExposureError, metrics_exposure
from agentrt_base.settings import ENV_SHUTDOWN_DEADLINE, ServerSettings
from agentrt_base.tls import server_credentials
from agentrt_base.tracing import Tracing, TracingConfigError
from registry.servicer import RegistryServicer
from registry.transparency import RegistryLog, open_registry_log
from runtime_service import __version__, migrate
from runtime_service.console.mount import ConsoleMount
from runtime_service.console.web import ConsoleExposureError
from runtime_service.health import DatabaseHealth, HealthServicer
from runtime_service.ledger_telemetry import LedgerTelemetry
from runtime_service.listening import (
    StartupError,
    check_bindable,
    listen_exposure,
    transport_options,
)
from runtime_service.notify import Notifier
from runtime_service.observations import Observer, Observers
from runtime_service.reflection import enable_reflection
from runtime_service.run_metrics import RunMetrics, watch_writers
from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.servicers.audit import AuditServicer
from runtime_service.servicers.runtime import RuntimeServicer
from runtime_service.servicers.worker import WorkerServicer
from runtime_service.services.attestations import RunAttester
from runtime_service.services.bound import BoundAgents
from runtime_service.services.context import Runtime
from runtime_service.services.resources import ResourceLookup
from runtime_service.step_process import StepProcess, child_database_url

log = logging.getLogger("agentrt.server")

#: Fully-qualified names of the services this server hosts (health reports each one).
SERVICE_NAMES = (
    registry_service_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name,
    runtime_service_pb2.DESCRIPTOR.services_by_name["RuntimeService"].full_name,
    worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
)


def _libpq_conninfo(database: Database) -> str:
    """The database URL as libpq understands it (for the LISTEN connection)."""
    return database.url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class AgentrtServer:
    """The running server: start it, read its port, stop it.

    ``agentrt serve`` and the in-process test fixture share this class, so tests exercise the
    same composition that production runs.
    """

    settings: ServerSettings
    database: Database | None = None
    port: int = 0
    _server: grpc.aio.Server | None = field(default=None, repr=False)
    _health: HealthServicer | None = field(default=None, repr=False)
    runtime_settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Who is calling (``agentrt_base.auth``); read from ``settings.auth_config`` here, so a
    #: file that does not load stops the start with its one-line error (ValueError).
    authenticator: Authenticator = field(init=False)
    #: Every principal's rate, watches and long polls (``agentrt_base.limits``).
    limiter: Limiter = field(init=False)
    _notifier: Notifier | None = field(default=None, repr=False)
    _reaper: asyncio.Task[None] | None = field(default=None, repr=False)
    _attester: asyncio.Task[None] | None = field(default=None, repr=False)
    _stop_background: asyncio.Event | None = field(default=None, repr=False)
    _step_process: StepProcess | None = field(default=None, repr=False)
    _database_health: DatabaseHealth | None = field(default=None, repr=False)
    #: The server's metrics (``agentrt_base.metrics``), when ``settings.metrics_listen`` is
    #: set; None: nothing is counted.
    metrics: Metrics | None = field(default=None, init=False)
    _metrics_endpoint: MetricsEndpoint | None = field(default=None, repr=False)
    _console: ConsoleMount | None = field(default=None, repr=False)
    #: The server's OpenTelemetry (``agentrt_base.tracing``), when the ``OTEL_*`` variables
    #: ask for it; None: no span or OTLP metric is made.
    tracing: Tracing | None = field(default=None, init=False)
    _telemetry: LedgerTelemetry | None = field(default=None, repr=False)
    #: The stage of :meth:`stop` under way ("" before it is called).
    stopping: str = field(default="", init=False)

    def __post_init__(self) -> None:
        # Before any call: grpcio logs callers' undecodable metadata (tokens included).
        log_redaction.install()
        self.authenticator = Authenticator(self.settings.auth_config)
        self.limiter = Limiter(self.settings.limits)

    async def start(self) -> int:
        """Open and migrate the database, bind, start serving; return the bound port."""
        # Before anything is opened: a refused exposure is a configuration error, and a port
        # in use must not leave behind the SQLite file opening the database creates.
        exposure = listen_exposure(self.settings, self.authenticator.configured)
        check_bindable(self.settings.listen)
        metrics_listen = self.settings.metrics_listen
        if metrics_listen is not None:
            try:
                metrics_exposure(metrics_listen, self.settings.tls, self.settings.insecure)
            except MetricsExposureError as exc:
                raise StartupError(str(exc)) from None
            check_bindable(metrics_listen)
            self.metrics = Metrics()
        if self.settings.console_listen is not None:
            try:
                self._console = ConsoleMount(
                    self.settings.console_listen,
                    self.settings.tls,
                    self.authenticator,
                    self.settings.insecure,
                )
            except ConsoleExposureError as exc:
                raise StartupError(str(exc)) from None
            check_bindable(self.settings.console_listen)
        try:
            self.tracing = Tracing.from_environment(version=__version__)
        except TracingConfigError as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:  # the exporter process could not be started
            raise StartupError(f"cannot start the span exporter process: {exc}") from None
        try:  # a key file that cannot be used stops the start before anything is opened
            given_keys = (
                signing_keys.load(self.settings.signing_keys)
                if self.settings.signing_keys
                else None
            )
        except signing_keys.SigningKeyError as exc:
            raise StartupError(str(exc)) from None
        url = normalise_url(self.settings.database_url)
        # The step writer process needs a database both processes can open: a SQLite file
        # (not an in-memory database) or PostgreSQL.
        use_step_process = (
            self.settings.step_process
            and (writer_lock_path(url) is not None or url.get_backend_name() == "postgresql")
            and StepProcess.supported()
        )
        database = Database(
            self.settings.database_url,
            writer_lock=use_step_process,
            settings=self.settings.database,
        )
        notifier = Notifier()
        step_process = (
            StepProcess(child_database_url(url), notifier, settings=self.settings.database)
            if use_step_process
            else None
        )
        try:
            await asyncio.to_thread(database.check)
            installation_id = await asyncio.to_thread(migrate.upgrade, database)
            registry_log = await self._open_log(database, given_keys, installation_id)
            if step_process is not None:
                try:
                    await step_process.start()
                except (OSError, RuntimeError) as exc:
                    raise StartupError(f"cannot start the step writer process: {exc}") from exc
        except BaseException:
            database.dispose()
            if self.tracing is not None:
                await asyncio.to_thread(self.tracing.shutdown)
                self.tracing = None
            raise
        self.database = database
        self._step_process = step_process
        if self.metrics is not None:
            watch_writers(self.metrics, database, step_process)

        runtime = Runtime(database, notifier, self.runtime_settings)
        attester = RunAttester(runtime, registry_log.keys)
        runtime.run_ended = attester.ended
        bound = BoundAgents()
        tracing = self.tracing
        observers: list[Observer] = []
        if self.metrics is not None:
            observers.append(RunMetrics(self.metrics, runtime))
        if tracing is not None and tracing.traces:
            runtime.traces = True
            # A SQLite database's name is a file path: not a namespace worth a span name.
            tracing.name_database(
                database.dialect_name, "" if database.is_sqlite else database.url.database or ""
            )
            database.span = tracing.transaction
        if tracing is not None:
            self._telemetry = LedgerTelemetry(
                database, lambda digest: bound.definition_now(database, digest), tracing=tracing
            )
            observers.append(self._telemetry)
        if observers:
            runtime.observer = observers[0] if len(observers) == 1 else Observers(*observers)
        authenticator = self.authenticator

        async def authenticate(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            metadata = context.invocation_metadata() or ()
            await authenticator.authenticate(metadata, context.auth_context())

        gate = authenticate if authenticator.configured else None
        # Who may do what is decided only for authenticated callers: without an auth config
        # the server listens on loopback only and every local caller may do everything.
        authorizer = Authorizer(ResourceLookup(runtime)) if authenticator.configured else None
        authorize = authorizer.authorize if authorizer is not None else None
        # No maximum_concurrent_rpcs: it is one count for the whole server, so a single
        # caller could fill it and have everybody else refused; the per-principal limits
        # (self.limiter) bound what each caller holds instead.
        error_mapping = ErrorMappingInterceptor(
            gate, self.limiter, authorize, authenticator if gate is not None else None
        )
        # The metrics interceptor goes first (outermost): it counts the code the caller got.
        metering: list[WrappingInterceptor] = (
            [MetricsInterceptor(self.metrics)] if self.metrics is not None else []
        )
        # Then the server span, outside the error mapping for the same reason; the gate,
        # the limits and the handler run inside it.
        if tracing is not None and tracing.traces:
            metering.append(TracingInterceptor(tracing))
        # The call's method and ids, for JSON log lines (outside the error mapping, so its
        # log line of an INTERNAL error carries them).
        context = [CallContextInterceptor()] if self.settings.log_format == "json" else []
        server = grpc.aio.server(
            interceptors=[Stacked([*metering, *context, error_mapping])],
            options=transport_options(self.settings),
        )
        registry_service_pb2_grpc.add_RegistryServiceServicer_to_server(
            RegistryServicer(database, registry_log, self.authenticator.tag_policies),
            server,
        )
        worker = WorkerServicer(runtime, bound, step_process)
        runtime_service_pb2_grpc.add_RuntimeServiceServicer_to_server(
            RuntimeServicer(runtime, bound), server
        )
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
        audit_service_pb2_grpc.add_AuditServiceServicer_to_server(
            AuditServicer(runtime, attester, registry_log), server
        )
        health_servicer = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        enable_reflection(server, (*SERVICE_NAMES, health.SERVICE_NAME))
        try:
            tls = self.settings.tls
            port = (
                server.add_secure_port(self.settings.listen, server_credentials(tls))
                if tls is not None
                else server.add_insecure_port(self.settings.listen)
            )
        except RuntimeError as exc:  # taken since the check, or TLS files gRPC refuses
            await self._release()
            raise StartupError(f"cannot listen on {self.settings.listen}: {exc}") from exc
        if port == 0:
            await self._release()
            raise StartupError(f"cannot listen on {self.settings.listen}: address unavailable")
        if self._console is not None:
            self._console.bind(server)
        await server.start()
        log.log(*exposure)
        if self.metrics is not None and metrics_listen is not None:
            endpoint = MetricsEndpoint(
                metrics_listen, self.metrics, self.settings.tls, self.settings.insecure
            )
            try:
                await asyncio.to_thread(endpoint.start)
            except (OSError, MetricsExposureError) as exc:
                await server.stop(0)
                await self._release()
                raise StartupError(f"cannot serve metrics on {metrics_listen}: {exc}") from exc
            self._metrics_endpoint = endpoint
        if self._console is not None:
            try:
                console_url = await self._console.start(authorizer)
            except (OSError, ConsoleExposureError) as exc:
                await server.stop(0)
                await self._release()
                raise StartupError(f"cannot serve the console: {exc}") from exc
            log.info("serving the console at %s (%s)", console_url, self._console.how)
        if not database.is_sqlite:
            notifier.start_listening(_libpq_conninfo(database))
        self._notifier = notifier
        self._stop_background = asyncio.Event()
        self._reaper = asyncio.create_task(
            worker.leases.run_reaper(self._stop_background), name="agentrt-reaper"
        )
        self._attester = asyncio.create_task(
            attester.run(self._stop_background), name="agentrt-run-attester"
        )
        # Health follows the database from here on: SERVING only while it can be written.
        db_settings = self.settings.database
        self._database_health = DatabaseHealth(
            database,
            health_servicer,
            SERVICE_NAMES,
            interval=db_settings.probe_interval,
            timeout=min(db_settings.statement_timeout, max(2.0, 2 * db_settings.probe_interval)),
        )
        await self._database_health.start()
        self._server, self._health, self.port = server, health_servicer, port
        return port

    async def _open_log(
        self, database: Database, given: signing_keys.KeyFiles | None, installation_id: str
    ) -> RegistryLog:
        """The registry log and its keys: those given, else a SQLite file's generated key."""
        lock_path = writer_lock_path(database.url)
        sqlite_file = Path(database.url.database or "") if lock_path is not None else None
        try:
            keys = given or signing_keys.resolve((), sqlite_file)
            return await asyncio.to_thread(
                open_registry_log, database, keys, self.settings.log_origin, installation_id
            )
        except ValueError as exc:  # SigningKeyError, NoteError, a refused origin
            raise StartupError(str(exc)) from None

    @property
    def step_process(self) -> StepProcess | None:
        """The step writer process, when this server runs one."""
        return self._step_process

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics`` is served on, when it is."""
        return self._metrics_endpoint.port if self._metrics_endpoint is not None else None

    @property
    def console_url(self) -> str | None:
        """The console's address, when it is served."""
        return self._console.url if self._console is not None else None

    @property
    def address(self) -> str:
        host = self.settings.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, let in-flight calls finish within ``grace``, release the DB.

        :attr:`stopping` names the stage under way, so a stop that does not finish in time
        can say where it was held up (``serve``'s shutdown deadline)."""
        if self._step_process is not None:
            self._step_process.begin_stop()  # nothing is restarted once the stop has begun
        self.stopping = "reporting NOT_SERVING"
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        self.stopping = "stopping the database probe"
        if self._database_health is not None:
            await self._database_health.stop()
            self._database_health = None
        if self._stop_background is not None:
            self._stop_background.set()
        self.stopping = "closing the console"
        if self._console is not None:
            await self._console.stop()
        self.stopping = "draining in-flight calls"
        if self._server is not None:
            await self._server.stop(
                self.settings.shutdown_grace_seconds if grace is None else grace
            )
        self.stopping = "stopping the lease reaper"
        if self._reaper is not None:
            await self._reaper
            self._reaper = None
        self.stopping = "stopping the run attester"
        if self._attester is not None:
            await self._attester
            self._attester = None
        self.stopping = "stopping the PostgreSQL listener"
        if self._notifier is not None:
            await self._notifier.stop()
            self._notifier = None
        self.stopping = "stopping the metrics endpoint"
        if self._metrics_endpoint is not None:
            await asyncio.to_thread(self._metrics_endpoint.stop)
            self._metrics_endpoint = None
        await self._release()
        self._server = self._health = None
        self.stopping = "stopped"

    async def _release(self) -> None:
        """Make the telemetry of what was committed, stop the step writer process (after the
        calls it serves), close the database, then export the last spans."""
        if self._telemetry is not None:
            self.stopping = "making the last spans"
            await asyncio.to_thread(self._telemetry.stop)
            self._telemetry = None
        if self._step_process is not None:
            self.stopping = "stopping the step writer process"
            await self._step_process.stop()
            self._step_process = None
        if self.database is not None:
            self.stopping = "closing the database"
            await asyncio.to_thread(self.database.dispose)
            self.database = None
        if self.tracing is not None:
            self.stopping = "exporting the last spans"
            await asyncio.to_thread(self.tracing.shutdown)
            self.tracing = None
        if self._console is not None:
            self._console.remove()
            self._console = None


def runtime_settings(settings: ServerSettings) -> RuntimeSettings:
    """The runtime's settings, with what the operator set on the command line or environment."""
    runtime = RuntimeSettings()
    if settings.max_blob_bytes is not None:
        runtime = dataclasses.replace(runtime, max_blob_bytes=settings.max_blob_bytes)
    if settings.blob_quota_bytes is not None:
        runtime = dataclasses.replace(runtime, blob_quota_bytes=settings.blob_quota_bytes)
    if settings.namespace_blob_quota_bytes is not None:
        runtime = dataclasses.replace(
            runtime, namespace_blob_quota_bytes=settings.namespace_blob_quota_bytes
        )
    if settings.blob_upload_rate is not None:
        runtime = dataclasses.replace(runtime, blob_upload_rate=settings.blob_upload_rate)
    return runtime


class _ShutdownDeadline:
    """Ends the process if a stop that has begun has not finished within ``seconds``.

    A thread, not a task: what holds a stop up may be the event loop itself. Past the
    deadline it writes one line naming the stage :meth:`AgentrtServer.stop` was in (what it
    abandons) and exits 1 without running anything else, so a server that no longer serves
    never goes on holding its port and its database (issue 27: a stop once hung for good).
    """

    def __init__(self, server: AgentrtServer, seconds: float) -> None:
        self._server, self._seconds = server, seconds
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        """The stop has begun (a signal arrived): start counting, once."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="agentrt-shutdown-deadline", daemon=True
            )
            self._thread.start()

    def disarm(self) -> None:
        """The stop has finished."""
        self._finished.set()

    def _watch(self) -> None:
        if self._finished.wait(self._seconds):
            return
        stage = self._server.stopping or "starting up"
        with contextlib.suppress(Exception):
            log.critical(
                "shutdown did not finish within %g s (%s); exiting, abandoning: %s",
                self._seconds,
                ENV_SHUTDOWN_DEADLINE,
                stage,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            sys.stderr.flush()
        os._exit(1)


async def serve(settings: ServerSettings) -> signal.Signals:
    """Run until SIGTERM or SIGINT, then drain and return the signal that stopped it (the
    process exits 0 after SIGTERM, 130 after SIGINT, as every command interrupted does). The
    stop finishes within ``settings.shutdown_deadline_seconds`` of the signal, or the process
    exits 1 saying what it abandoned."""
    stop = asyncio.Event()
    stopped_by: list[signal.Signals] = []
    loop = asyncio.get_running_loop()
    server = AgentrtServer(settings, runtime_settings=runtime_settings(settings))
    deadline = _ShutdownDeadline(server, settings.shutdown_deadline_seconds)

    def stop_requested(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        stop.set()
        deadline.arm()

    # Handlers go in before the ready line is logged: a supervisor may signal the moment it
    # reads that line, and the default handler would kill the process mid-flight.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested, sig)
    # SIGHUP: read the auth config again (tokens added or revoked take effect at once).
    loop.add_signal_handler(signal.SIGHUP, server.authenticator.reload)
    try:
        await server.start()
        # A signal during start-up: the start finishes (a migration is not cut in half), and
        # the server stops without having said it is ready.
        if not stop.is_set():
            gc_policy.settle_long_lived()
            assert server.database is not None
            log.info(
                "agentrt ready: listening on %s, database %s%s",
                server.address,
                server.database.display_url(),
                f"; console at {server.console_url}" if server.console_url else "",
            )
            await stop.wait()
        log.info("agentrt stopping: draining in-flight calls")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        deadline.arm()  # (a start that failed stops too, within the same bound)
        try:
            await server.stop()
            # asyncio.run would wait for these after serve returns, unbounded: a database
            # call a cancelled RPC left running in a worker thread. Waited for here instead.
            server.stopping = "waiting for database calls in worker threads to return"
            await loop.shutdown_default_executor()
        finally:
            deadline.disarm()
    log.info("agentrt stopped")
    return stopped_by[0]
