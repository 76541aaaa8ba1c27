"""One fuzz session: a real server on one database, a witness, the three kinds of request, and
the report of what the server did with them.

Assertions the report checks (:meth:`Report.problems`): no call answered UNKNOWN or INTERNAL,
no traceback logged by the server, no ordinary call hanging until the client's deadline, the
step writer process alive (the one started with the server), health SERVING, and no partial
write: after every refused call the row count of every table and the witness run's
VerifyRun are what they were before it. A call that succeeds may change state (a fuzzed
CancelRun with the witness's id is a valid request), so the snapshot is taken anew after it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from runtime_service.runtime_settings import RuntimeSettings
from runtime_service.server import SERVICE_NAMES
from tests.fuzz import corpus, malformed, strategies, witness
from tests.fuzz.pool import Pool, encode_token, token_fingerprint
from tests.fuzz.rpcs import Answer, Rpc, all_rpcs, invoke
from tests.runtime_support import Stubs
from tests.support import ServerThread

BUGS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
#: Outcomes that are not the server's answer (the client gave up): state may have changed.
UNDECIDED = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
#: RPCs that may legitimately wait (long polls and watches): a deadline is their normal end.
WAITING = {"AcquireRun", "WatchRun", "WatchThread"}
EXAMPLES_PER_KIND = 3


def recorded_refusal(answer: Answer) -> bool:
    """A refusal the API documents as recorded before it is answered (docs/api.md): a
    BeginStep refused for its tool or arguments is kept as a step (its id in ErrorInfo), and
    a step over budget ends the run (BUDGET_EXCEEDED). Its writes are the point, not a
    partial write."""
    return "step_id" in answer.metadata or answer.reason == "BUDGET_EXCEEDED"


@dataclass
class Example:
    rpc: str
    code: str
    kind: str
    request: str
    details: str

    def __str__(self) -> str:
        return f"    [{self.kind}] {self.request}\n      -> {self.code}: {self.details[:200]}"


@dataclass
class Report:
    engine: str
    requests: int = 0
    seconds: float = 0.0
    codes: Counter[str] = field(default_factory=Counter)
    by_rpc: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], list[Example]] = field(
        default_factory=lambda: defaultdict(list)
    )
    hung: list[Example] = field(default_factory=list)
    #: Refusals that came without ErrorInfo (every refusal of ours carries one): how many,
    #: and the first few.
    undetailed: int = 0
    undetailed_examples: list[Example] = field(default_factory=list)
    partial_writes: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    writer: str = "not checked"
    health: str = "not checked"
    tokens_forged: list[str] = field(default_factory=list)
    tokens_missing: list[str] = field(default_factory=list)

    def bug_count(self) -> int:
        return sum(n for (_, code), n in self.by_rpc.items() if code in ("UNKNOWN", "INTERNAL"))

    def problems(self) -> list[str]:
        found = []
        if self.bug_count():
            found.append(f"{self.bug_count()} calls answered UNKNOWN or INTERNAL")
        if self.hung:
            found.append(f"{len(self.hung)} calls hung until the client's deadline")
        if self.undetailed:
            found.append(
                f"{self.undetailed} refusals without ErrorInfo, e.g. "
                + "; ".join(str(e) for e in self.undetailed_examples)
            )
        if self.partial_writes:
            found.append(f"{len(self.partial_writes)} refused calls changed the database")
        if self.tracebacks:
            found.append(f"{len(self.tracebacks)} tracebacks in the server log")
        if not self.writer.startswith("alive"):
            found.append(f"step writer process: {self.writer}")
        if self.health != "SERVING":
            found.append(f"health: {self.health}")
        return found

    def render(self, verbose: bool = True) -> str:
        lines = [
            f"== {self.engine}: {self.requests} requests in {self.seconds:.1f} s",
            "codes: " + ", ".join(f"{c} {n}" for c, n in self.codes.most_common()),
            f"UNKNOWN {self.codes['UNKNOWN']}, INTERNAL {self.codes['INTERNAL']},"
            f" tracebacks {len(self.tracebacks)}, partial writes {len(self.partial_writes)},"
            f" hung {len(self.hung)}, refusals without ErrorInfo {self.undetailed}",
            f"step writer: {self.writer}; health: {self.health}",
            f"forged page tokens on: {', '.join(self.tokens_forged) or 'none'}"
            + (
                f" (no token handed out by {', '.join(self.tokens_missing)})"
                if self.tokens_missing
                else ""
            ),
        ]
        if not verbose:
            return "\n".join(lines)
        bugs = sorted(
            (
                (rpc, code, n)
                for (rpc, code), n in self.by_rpc.items()
                if code in ("UNKNOWN", "INTERNAL")
            ),
            key=lambda item: -item[2],
        )
        if bugs:
            lines.append("UNKNOWN/INTERNAL by RPC, with example requests:")
        for rpc, code, n in bugs:
            lines.append(f"  {rpc} {code} x{n}")
            lines.extend(str(example) for example in self.examples[(rpc, code)])
        if self.hung:
            lines.append("hung calls:")
            lines.extend(str(example) for example in self.hung[:10])
        if self.partial_writes:
            lines.append("partial writes:")
            lines.extend(f"  {p}" for p in self.partial_writes[:20])
        if self.tracebacks:
            lines.append("tracebacks (first lines of the first 5):")
            for text in self.tracebacks[:5]:
                lines.append("  " + " | ".join(text.strip().splitlines()[-3:])[:400])
        return "\n".join(lines)


class _TracebackCatcher(logging.Handler):
    """Keeps every log record of the server process that carries a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info or record.exc_text or "Traceback (most recent call last)" in text:
            self.found.append(f"{record.name}: {text}\n{self.format(record)}")


def _describe(rpc: Rpc, payloads: list[bytes]) -> str:
    """A request as the report shows it: text format when it parses, hex otherwise."""
    parts = []
    for payload in payloads:
        try:
            message = rpc.request_class().FromString(payload)
            text = text_format.MessageToString(message, as_one_line=True)
            if len(text) > 300:
                text = text[:300] + f"... ({len(payload)} bytes)"
            parts.append("{" + text + "}")
        except Exception:  # undecodable on purpose: show the bytes
            shown = payload[:48].hex() + ("..." if len(payload) > 48 else "")
            parts.append(f"bytes {shown} ({len(payload)} bytes)")
    return f"{rpc.label} " + ", ".join(parts)


class FuzzSession:
    """Start a server on ``database_url``, build the witness; send requests; then
    :meth:`finish` for the report. Use as a context manager."""

    def __init__(
        self,
        engine: str,
        database_url: str,
        *,
        timeout: float = 10.0,
        wait_timeout: float = 0.5,
    ) -> None:
        self.engine = engine
        self.database_url = database_url
        self.timeout = timeout
        self.wait_timeout = wait_timeout
        self.rpcs = all_rpcs()
        self.pool = Pool()
        self.report = Report(engine)
        self._catcher = _TracebackCatcher()
        self._started = 0.0

    # -- setup and teardown ---------------------------------------------------------------

    def __enter__(self) -> FuzzSession:
        logging.getLogger().addHandler(self._catcher)
        # No reaper passes during the fuzz (only the one at start): an expiry it wrote
        # between two calls would look like a partial write of the second.
        self.server = ServerThread(self.database_url, RuntimeSettings(reaper_interval=1e9))
        self.address = self.server.start()
        self.stubs = Stubs.open(self.address)
        self.witness = witness.build(self.stubs)
        for response in self.witness.responses:
            self.pool.harvest(response)
        step_process = self.server.server.step_process
        self._writer_pid = step_process.pid if step_process is not None else None
        self.snapshots = witness.Snapshots(
            self.database_url, lambda run_id: witness.verify_run(self.stubs, run_id)
        )
        self._state = self.snapshots.take(self.witness.run_id)
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "server", None) is None:
            return
        self.snapshots.close()
        self.stubs.close()
        self.server.stop()
        self.server = None  # type: ignore[assignment]
        logging.getLogger().removeHandler(self._catcher)

    def finish(self) -> Report:
        """Check the server is still whole; return the report (the session stays open)."""
        report = self.report
        report.seconds = time.monotonic() - self._started
        health: Any = health_pb2_grpc.HealthStub(self.stubs.channel)
        statuses = set()
        for name in ("", *SERVICE_NAMES):
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                statuses.add(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
            except grpc.RpcError as exc:
                statuses.add(f"Check({name!r}) failed {exc.code().name}")
        report.health = "SERVING" if statuses == {"SERVING"} else ", ".join(sorted(statuses))
        process = self.server.server.step_process
        if process is None:
            report.writer = "not running (the server runs no step writer process here)"
        elif not process.alive:
            report.writer = f"stopped (pid {self._writer_pid})"
        elif process.pid != self._writer_pid:
            report.writer = f"alive, restarted (pid {self._writer_pid} -> {process.pid})"
        else:
            report.writer = f"alive (pid {process.pid})"
        report.tracebacks = list(self._catcher.found)
        return report

    # -- sending --------------------------------------------------------------------------

    def send(self, rpc: Rpc, payloads: list[bytes], kind: str) -> Answer:
        waits = rpc.name in WAITING
        answer = invoke(
            self.stubs.channel, rpc, payloads, self.wait_timeout if waits else self.timeout
        )
        report = self.report
        report.requests += 1
        code = answer.code.name
        report.codes[code] += 1
        report.by_rpc[(rpc.label, code)] += 1
        if answer.code in BUGS:
            examples = report.examples[(rpc.label, code)]
            if len(examples) < EXAMPLES_PER_KIND:
                examples.append(
                    Example(rpc.label, code, kind, _describe(rpc, payloads), answer.details)
                )
        if answer.code in UNDECIDED and not waits:
            report.hung.append(
                Example(rpc.label, code, kind, _describe(rpc, payloads), answer.details)
            )
        elif (
            answer.code not in UNDECIDED and answer.code != grpc.StatusCode.OK and not answer.reason
        ):
            report.undetailed += 1
            if len(report.undetailed_examples) < EXAMPLES_PER_KIND:
                report.undetailed_examples.append(
                    Example(rpc.label, code, kind, _describe(rpc, payloads), answer.details)
                )
        if (
            answer.code == grpc.StatusCode.OK
            or answer.code in UNDECIDED
            or recorded_refusal(answer)
        ):
            self._harvest(rpc, answer)
            self._state = (
                self._settled()
                if answer.code in UNDECIDED
                else self.snapshots.take(self.witness.run_id)
            )
            return answer
        after = self.snapshots.take(self.witness.run_id)
        if after != self._state:
            changed = {
                k: f"{self._state.get(k)} -> {v}"
                for k, v in after.items()
                if self._state.get(k) != v
            }
            report.partial_writes.append(f"{_describe(rpc, payloads)} -> {code}: changed {changed}")
            self._state = after
        return answer

    def _settled(self, quiet: float = 0.3, longest: float = 10.0) -> dict[str, Any]:
        """The database once a call whose outcome the client never learnt has finished: the
        server may still complete it (a long poll that hands out a run as its deadline
        passes, on a loaded machine), and its writes are that call's, not the next one's."""
        state = self.snapshots.take(self.witness.run_id)
        deadline = time.monotonic() + longest
        while time.monotonic() < deadline:
            time.sleep(quiet)
            again = self.snapshots.take(self.witness.run_id)
            if again == state:
                break
            state = again
        return state

    def _harvest(self, rpc: Rpc, answer: Answer) -> None:
        cls = rpc.response_class()
        for payload in answer.responses:
            try:
                self.pool.harvest(cls.FromString(payload))
            except Exception:  # a response we cannot read is not ours to judge here
                continue

    # -- the three kinds of request --------------------------------------------------------

    def generated(self, count: int, seed: int = 14) -> None:
        """About ``count`` requests generated from the descriptors, the same share for every
        RPC (so each is covered however small ``count`` is)."""
        share = max(1, count // len(self.rpcs))
        for index, rpc in enumerate(self.rpcs):
            self._drive(rpc, share, seed + index)

    def _drive(self, rpc: Rpc, count: int, seed: int) -> None:
        pool = self.pool

        @settings(
            max_examples=count,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis_seed(seed)
        @given(st.data())
        def drive(data: st.DataObject) -> None:
            payloads = data.draw(strategies.requests(rpc, pool), label="request")
            self.send(rpc, payloads, "generated")

        drive()

    def corpus(self) -> None:
        """The hostile requests issue 14 found, aimed at the witness."""
        corpus.send_all(self)

    def malformed(self) -> None:
        """Every malformed-bytes case on every RPC."""
        for rpc in self.rpcs:
            for what, payloads in malformed.streams(rpc):
                self.send(rpc, payloads, what)

    def page_tokens(self) -> None:
        """For every RPC that pages: get a real token, then send it back tampered with (its
        real fingerprint with keys of every odd shape), and tokens of odd shapes."""
        for rpc in self.rpcs:
            names = {f.name: f for f in rpc.input.fields}
            if "page_token" not in names or "page_size" not in names:
                continue
            token, request = self._probe_token(rpc)
            if not token:
                self.report.tokens_missing.append(rpc.name)
                continue
            self.report.tokens_forged.append(rpc.name)
            fingerprint = token_fingerprint(token)
            tampered = [encode_token({"f": fingerprint, "k": k}) for k in strategies.ODD_KEYS]
            tampered += [token[:-2], token + "A", token.upper(), encode_token({"f": fingerprint})]
            for forged in tampered + strategies.ODD_TOKENS:
                request.page_token = forged
                self.send(rpc, [request.SerializeToString()], "tampered page token")

    def _probe_token(self, rpc: Rpc) -> tuple[str, Any]:
        cls = rpc.request_class()
        variants: list[dict[str, str]] = [{}]
        for string in rpc.input.fields:
            if string.type != string.TYPE_STRING or string.is_repeated:
                continue
            if string.name == "page_token":
                continue
            for value in self.pool.candidates(string.name)[:2]:
                variants.append({string.name: value})
        for fields in variants:
            request = cls(page_size=1, **fields)
            answer = self.send(rpc, [request.SerializeToString()], "page-token probe")
            for payload in answer.responses:
                token = getattr(rpc.response_class().FromString(payload), "next_page_token", "")
                if token:
                    return str(token), request
        return "", None
