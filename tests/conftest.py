"""Fixtures: one suite, two engines.

Every test that takes ``database_url`` runs twice, on a fresh SQLite file and on PostgreSQL.
PostgreSQL is found through ``AGENTRT_TEST_POSTGRES_URL`` (then it is *required*: a failure to
connect fails the suite, as CI wants) or, when that is unset, on 127.0.0.1:5432 if something
answers there; otherwise the PostgreSQL variants are skipped with the reason shown.
A fresh database is created for the test session and dropped at its end.

Tests reach the in-process server through ``stubs`` (registry, runtime and worker) or ``stub``
(the registry alone): the module's shared server (one per module and engine), or a server of
the test's own when it is marked ``fresh_server`` (docs/testing.md). A module whose tests
need ``plain_agent:prod`` (coding_agent without a completion policy) published before they
start says so once, with ``pytestmark = pytest.mark.plain_agent``.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from agentrt.registry.v1 import registry_service_pb2_grpc
from agentrt.runtime.v1 import enum_pb2, runtime_service_pb2, runtime_service_pb2_grpc
from agentrt_base.db_engines import normalise_url
from tests.runtime_support import Stubs
from tests.support import ServerThread

# A helper module's asserts are rewritten only when pytest is told to; these were rewritten
# while they lived in files named test_*, and their failures should stay as readable.
pytest.register_assert_rewrite(
    "tests.service.steps_support", "tests.service.audit_history", "tests.e2e.cli_support"
)

ENV_POSTGRES = "AGENTRT_TEST_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _postgres_admin_url() -> tuple[str | None, str]:
    url = os.environ.get(ENV_POSTGRES)
    if url:
        return url, ""
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return DEFAULT_POSTGRES, ""
    except OSError:
        return None, f"PostgreSQL not reachable on 127.0.0.1:5432 and {ENV_POSTGRES} is unset"


def create_postgres_database(admin_url: str, name: str) -> str:
    """Create database ``name`` beside the admin URL's; return its URL."""
    admin = sa.create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return normalise_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(admin_url: str, name: str) -> None:
    admin = sa.create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    url, reason = _postgres_admin_url()
    if url is None:
        pytest.skip(reason)
    return url


@pytest.fixture(scope="session")
def postgres_session_url(postgres_admin_url: str) -> Iterator[str]:
    name = f"agentrt_test_{uuid.uuid4().hex[:12]}"
    url = create_postgres_database(postgres_admin_url, name)
    yield url
    drop_postgres_database(postgres_admin_url, name)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def engine(request: pytest.FixtureRequest) -> str:
    """The engine a test runs on; every test that uses a database runs on both. Module-scoped
    so that a module's tests on one engine share one server (``shared_server``)."""
    return str(request.param)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A new SQLite file, for a test (or a database_url) that is SQLite's alone."""
    return f"sqlite:///{tmp_path / 'agentrt.db'}"


def _fresh_server(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("fresh_server") is not None


def _uses_shared_server(request: pytest.FixtureRequest) -> bool:
    """Whether the test's server is its module's shared one (see ``server_thread``)."""
    return "server_thread" in request.fixturenames and not _fresh_server(request)


@pytest.fixture
def database_url(engine: str, request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[str]:
    """The database of the test's server when it has one (``server_address``, ``stubs``,
    ``stub``, ``env``): the module's shared database, which earlier tests of the module have
    written to. Otherwise a database for this test alone: a new SQLite file, or the session's
    PostgreSQL database, emptied after the test (truncating is ~100x cheaper than a database
    per test)."""
    if _uses_shared_server(request):
        yield str(request.getfixturevalue("shared_database_url"))
        return
    if engine == "sqlite":
        yield sqlite_url
        return
    url = str(request.getfixturevalue("postgres_session_url"))
    yield url
    _truncate(url)


@pytest.fixture(scope="module")
def shared_database_url(
    engine: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One database for a module's shared server, on the module's engine; dropped after it."""
    yield from _new_database(engine, request, tmp_path_factory.mktemp("shared"), "shared")


def _new_database(
    engine: str, request: pytest.FixtureRequest, directory: Path, kind: str
) -> Iterator[str]:
    """A database nothing has touched: a new SQLite file in ``directory``, or a new
    PostgreSQL database (``agentrt_KIND_…``) dropped afterwards."""
    if engine == "sqlite":
        yield f"sqlite:///{directory / f'{kind}.db'}"
        return
    admin: str = request.getfixturevalue("postgres_admin_url")
    name = f"agentrt_{kind}_{uuid.uuid4().hex[:12]}"
    url = create_postgres_database(admin, name)
    yield url
    drop_postgres_database(admin, name)


@pytest.fixture(scope="module")
def shared_server(shared_database_url: str) -> Iterator[ServerThread]:
    """The module's server (with its step writer process) for every test that does not ask
    for a fresh one: a server per test cost a migration and a process (and on PostgreSQL a
    TRUNCATE), and most tests only need a client. Tests isolate their state by the ids they
    create, not by an empty database (docs/testing.md)."""
    server = ServerThread(shared_database_url)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _truncate(url: str) -> None:
    from runtime_service.schema import metadata

    engine = sa.create_engine(normalise_url(url))
    try:
        with engine.begin() as conn:
            existing = set(sa.inspect(conn).get_table_names())
            names = [
                f'"{t.name}"'
                for t in metadata.sorted_tables
                if t.name in existing and t.name != "installation"
            ]
            if names:
                conn.exec_driver_sql(f"TRUNCATE {', '.join(names)} CASCADE")
    finally:
        engine.dispose()


@pytest.fixture
def empty_database_url(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """A database guaranteed empty (for migration tests)."""
    yield from _new_database(engine, request, tmp_path, "empty")


@pytest.fixture
def server_thread(database_url: str, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """A real agentrt server in this process on an ephemeral port: the module's shared server,
    or one for this test alone on a fresh database when the test is marked ``fresh_server``
    (it counts or lists everything the database holds, say)."""
    if not _fresh_server(request):
        shared: ServerThread = request.getfixturevalue("shared_server")
        yield shared
        _cancel_unfinished_runs(shared.address)
        return
    server = ServerThread(database_url)
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: The statuses of a run that has not ended: one of these may still be handed to a worker.
_UNFINISHED = (
    enum_pb2.RUN_STATUS_QUEUED,
    enum_pb2.RUN_STATUS_RUNNING,
    enum_pb2.RUN_STATUS_WAITING_APPROVAL,
    enum_pb2.RUN_STATUS_PAUSED,
)


def _cancel_unfinished_runs(address: str) -> None:
    """Cancel every run a test left unfinished on the shared server. A run left queued, or
    acquired and left to its lease (which queues it again when it expires), would be the
    next test's AcquireRun: each test starts with nothing to hand out, as on a new database.
    A cancelled RUNNING run ends when its lease does, CANCELLED, never queued again."""
    with grpc.insecure_channel(address) as channel:
        runtime = runtime_service_pb2_grpc.RuntimeServiceStub(channel)
        token = ""
        while True:
            page = runtime.ListRuns(
                runtime_service_pb2.ListRunsRequest(
                    statuses=_UNFINISHED, page_size=1000, page_token=token
                ),
                timeout=30,
            )
            for run in page.runs:
                if run.cancel_requested:
                    continue
                try:
                    runtime.CancelRun(
                        runtime_service_pb2.CancelRunRequest(run_id=run.id, reason="test ended"),
                        timeout=30,
                    )
                except grpc.RpcError as exc:  # it ended meanwhile (its lease expired, say)
                    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                        raise
            token = page.next_page_token
            if not token:
                return


@pytest.fixture
def server_address(server_thread: ServerThread) -> str:
    """Address of the test's server (``server_thread``)."""
    return server_thread.address


@pytest.fixture
def stubs(server_address: str, request: pytest.FixtureRequest) -> Iterator[Stubs]:
    """Registry, runtime and worker stubs on one channel to the test's server."""
    with Stubs.open(server_address) as opened:
        if request.node.get_closest_marker("plain_agent") is not None:
            opened.publish_plain_agent()
        yield opened


@pytest.fixture
def stub(server_address: str) -> Iterator[registry_service_pb2_grpc.RegistryServiceStub]:
    """The registry stub alone, for the registry suites."""
    with grpc.insecure_channel(server_address) as channel:
        yield registry_service_pb2_grpc.RegistryServiceStub(channel)
