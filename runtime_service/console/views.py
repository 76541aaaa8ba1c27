"""What the console's pages ask the API, and the filters their templates format values with.

Pure: query strings in, request messages out; messages in, text out. The templates read the
API's messages as they are (``run.agent.agent_id``), so a field the API serves is a field the
page can show, with nothing restated in between.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import grpc
import jinja2
from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from agentrt.audit.v1 import audit_service_pb2
from agentrt.registry.v1 import enum_pb2 as registry_enums
from agentrt.registry.v1 import message_pb2 as registry_pb2
from agentrt.runtime.v1 import enum_pb2, event_pb2, message_pb2, runtime_service_pb2
from agentrt_sdk.errors import InvalidArgumentError

#: The run statuses a list can be filtered by, by their short names.
RUN_STATUSES: Final[tuple[str, ...]] = tuple(
    value.name.removeprefix("RUN_STATUS_")
    for value in enum_pb2.RunStatus.DESCRIPTOR.values
    if value.number != 0
)
_TERMINAL: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class RunFilter:
    """The runs list's filters, as its query string carries them."""

    namespace: str = ""
    agent_id: str = ""
    thread_id: str = ""
    statuses: tuple[str, ...] = ()
    #: The definition's digest, and the tag the run's reference followed.
    digest: str = ""
    tag: str = ""
    #: Created from (inclusive) and before (exclusive), as typed: ISO 8601, UTC when it
    #: names no offset (what a ``datetime-local`` field sends).
    created_from: str = ""
    created_before: str = ""
    page_token: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> RunFilter:
        getall = getattr(query, "getall", None)
        statuses = getall("status", []) if getall is not None else []
        return cls(
            namespace=query.get("namespace", "").strip(),
            agent_id=query.get("agent", "").strip(),
            thread_id=query.get("thread", "").strip(),
            # Unknown names are dropped, not sent: the list shows what the filter names.
            statuses=tuple(s for s in statuses if s in RUN_STATUSES),
            digest=query.get("digest", "").strip(),
            tag=query.get("tag", "").strip(),
            created_from=query.get("from", "").strip(),
            created_before=query.get("before", "").strip(),
            page_token=query.get("page", ""),
        )

    def query(self) -> message_pb2.RunsQuery:
        """The filters as the API takes them (ListRuns's fields; a saved view's query);
        :class:`InvalidArgumentError` for a time that is not one (everything else is the
        API's to check)."""
        query = message_pb2.RunsQuery(
            namespace=self.namespace,
            agent_id=self.agent_id,
            thread_id=self.thread_id,
            statuses=[enum_pb2.RunStatus.Value(f"RUN_STATUS_{s}") for s in self.statuses],
            agent_digest=self.digest,
            agent_tag=self.tag,
        )
        if self.created_from:
            query.create_time_start.FromDatetime(_utc_time("from", self.created_from))
        if self.created_before:
            query.create_time_end.FromDatetime(_utc_time("before", self.created_before))
        return query

    def request(self, page_size: int) -> runtime_service_pb2.ListRunsRequest:
        query = self.query()
        request = runtime_service_pb2.ListRunsRequest(
            page_size=page_size,
            page_token=self.page_token,
            namespace=query.namespace,
            agent_id=query.agent_id,
            thread_id=query.thread_id,
            statuses=query.statuses,
            agent_digest=query.agent_digest,
            agent_tag=query.agent_tag,
        )
        for field in ("create_time_start", "create_time_end"):
            if query.HasField(field):
                getattr(request, field).CopyFrom(getattr(query, field))
        return request

    @classmethod
    def of_saved(cls, query: message_pb2.RunsQuery) -> RunFilter:
        """The filters a saved view keeps, as the list's query string would carry them."""
        return cls(
            namespace=query.namespace,
            agent_id=query.agent_id,
            thread_id=query.thread_id,
            statuses=tuple(
                enum_pb2.RunStatus.Name(s).removeprefix("RUN_STATUS_") for s in query.statuses
            ),
            digest=query.agent_digest,
            tag=query.agent_tag,
            created_from=_form_time(query.create_time_start)
            if query.HasField("create_time_start")
            else "",
            created_before=_form_time(query.create_time_end)
            if query.HasField("create_time_end")
            else "",
        )

    def pairs(self) -> list[tuple[str, str]]:
        """The filters as the query string's name-value pairs (only those set)."""
        pairs = [
            ("namespace", self.namespace),
            ("agent", self.agent_id),
            ("thread", self.thread_id),
            *(("status", s) for s in self.statuses),
            ("digest", self.digest),
            ("tag", self.tag),
            ("from", self.created_from),
            ("before", self.created_before),
        ]
        return [(k, v) for k, v in pairs if v]

    def query_string(self) -> str:
        """The list's query string, first page."""
        return urlencode(self.pairs())

    def next_page(self, token: str) -> str:
        """The query string of the next page ("" when there is none)."""
        if not token:
            return ""
        return urlencode([*self.pairs(), ("page", token)])


def _form_time(value: Timestamp) -> str:
    """A time as a ``datetime-local`` field shows it (UTC, to the minute when it is whole)."""
    moment = value.ToDatetime()
    if moment.second == 0 and moment.microsecond == 0:
        return moment.strftime("%Y-%m-%dT%H:%M")
    return moment.isoformat()


def _utc_time(field: str, text: str) -> dt.datetime:
    """``text`` (ISO 8601) as an aware time, UTC when it names no offset."""
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{field}: {text!r} is not a time (YYYY-MM-DDTHH:MM, UTC)",
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def get_run(run_id: str) -> runtime_service_pb2.GetRunRequest:
    return runtime_service_pb2.GetRunRequest(run_id=run_id)


def list_attempts(run_id: str) -> runtime_service_pb2.ListAttemptsRequest:
    # A run has at most its max_attempts (bounded by the server): one page holds them.
    return runtime_service_pb2.ListAttemptsRequest(run_id=run_id, page_size=1000)


def list_steps(
    run_id: str, page_size: int, page_token: str
) -> runtime_service_pb2.ListStepsRequest:
    return runtime_service_pb2.ListStepsRequest(
        run_id=run_id, page_size=page_size, page_token=page_token
    )


def watch_run(run_id: str, after: int) -> runtime_service_pb2.WatchRunRequest:
    return runtime_service_pb2.WatchRunRequest(run_id=run_id, after_sequence=after)


def server_sent(event: event_pb2.Event) -> bytes:
    """One ledger event as a server-sent event: its sequence (the id a reconnecting browser
    resumes after) and its type; what it holds, the page reads again."""
    data = json.dumps(
        {
            "sequence": event.sequence,
            "type": enum_name(event.event_type, enum_pb2.EventType, "EVENT_TYPE_"),
        }
    )
    return f"id: {event.sequence}\nevent: ledger\ndata: {data}\n\n".encode()


#: The controls of a run page: its action, the API method and what it asks.
CONTROLS: Final[Mapping[str, tuple[str, Callable[..., Message]]]] = {
    "cancel": ("CancelRun", runtime_service_pb2.CancelRunRequest),
    "pause": ("PauseRun", runtime_service_pb2.PauseRunRequest),
    "resume": ("ResumeRun", runtime_service_pb2.ResumeRunRequest),
}


def live(run: message_pb2.Run) -> bool:
    """Whether the run can still change (its page follows it)."""
    return enum_name(run.status, enum_pb2.RunStatus, "RUN_STATUS_") not in _TERMINAL


def controls(run: message_pb2.Run) -> list[str]:
    """The controls that apply to the run as it is (whether the principal may use them is
    the permission table's to say)."""
    status = enum_name(run.status, enum_pb2.RunStatus, "RUN_STATUS_")
    if status in _TERMINAL:
        return []
    if status == "PAUSED":
        return ["resume", "cancel"]
    return ["pause", "cancel"]


def control_method(action: str) -> str:
    """The full gRPC method name of a control (what the permission table is keyed by)."""
    return "/agentrt.runtime.v1.RuntimeService/" + CONTROLS[action][0]


def control_request(action: str, run_id: str, reason: str = "") -> Message:
    return CONTROLS[action][1](run_id=run_id, reason=reason)


def control_stub(api: Any, action: str) -> Callable[..., Awaitable[Any]]:
    stub: Callable[..., Awaitable[Any]] = getattr(api.runtime, CONTROLS[action][0])
    return stub


RESOLVE_APPROVAL: Final = "/agentrt.runtime.v1.RuntimeService/ResolveApproval"
VERIFY_RUN: Final = "/agentrt.audit.v1.AuditService/VerifyRun"
SEND_INPUT: Final = "/agentrt.runtime.v1.RuntimeService/SendInput"
LIST_VIEWS: Final = "/agentrt.runtime.v1.RuntimeService/ListViews"
INPUT_KINDS: Final[Mapping[str, int]] = {
    "steer": enum_pb2.INPUT_KIND_STEER,
    "follow_up": enum_pb2.INPUT_KIND_FOLLOW_UP,
}


def send_input(
    run_id: str, kind: str, content: str, sender: str, request_id: str
) -> runtime_service_pb2.SendInputRequest:
    return runtime_service_pb2.SendInputRequest(
        run_id=run_id,
        kind=INPUT_KINDS[kind],  # type: ignore[arg-type]
        content=content,
        sender=sender,
        request_id=request_id,
    )


def verify_run(run_id: str) -> audit_service_pb2.VerifyRunRequest:
    return audit_service_pb2.VerifyRunRequest(run_id=run_id)


DECISIONS: Final[Mapping[str, int]] = {
    "approve": enum_pb2.APPROVAL_DECISION_APPROVE,
    "deny": enum_pb2.APPROVAL_DECISION_DENY,
}


def resolve_approval(
    run_id: str, step_id: str, decision: str, comment: str, approver: str, request_id: str = ""
) -> runtime_service_pb2.ResolveApprovalRequest:
    return runtime_service_pb2.ResolveApprovalRequest(
        run_id=run_id,
        step_id=step_id,
        decision=DECISIONS[decision],  # type: ignore[arg-type]
        comment=comment,
        approver=approver,
        request_id=request_id,
    )


def new_request_id() -> str:
    """A form's idempotency key (AIP-155): the same form sent twice decides once."""
    return str(uuid.uuid4())


# ---------------------------------------------------------------------- template filters


def enum_name(value: int, enum: Any, prefix: str = "") -> str:
    """An enum value's name without its type prefix; the number when it has none (a value
    a newer server sent)."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def when(value: Timestamp) -> str:
    """A timestamp as UTC, to the millisecond; "" when unset."""
    if not value.seconds and not value.nanos:
        return ""
    moment = value.ToDatetime(tzinfo=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def as_json(value: Message | Struct) -> str:
    """A message (tool arguments, parameters) as indented JSON text (escaped by the page)."""
    return json.dumps(json_format.MessageToDict(value), indent=2, sort_keys=True)


def short(digest: str, keep: int = 19) -> str:
    """``sha256:0123456789ab…``: enough to tell digests apart on a page."""
    return digest if len(digest) <= keep else digest[:keep] + "…"


def _enum_filter(prefix: str, enum: Any) -> Callable[[int], str]:
    return lambda value: enum_name(value, enum, prefix)


def register(environment: jinja2.Environment) -> None:
    environment.filters.update(
        {
            "when": when,
            "json": as_json,
            "short": short,
            "run_status": _enum_filter("RUN_STATUS_", enum_pb2.RunStatus),
            "attempt_status": _enum_filter("ATTEMPT_STATUS_", enum_pb2.AttemptStatus),
            "attempt_reason": _enum_filter("ATTEMPT_REASON_", enum_pb2.AttemptReason),
            "step_type": _enum_filter("STEP_TYPE_", enum_pb2.StepType),
            "step_status": _enum_filter("STEP_STATUS_", enum_pb2.StepStatus),
            "error_class": _enum_filter("ERROR_CLASS_", enum_pb2.ErrorClass),
            "candidate_reason": _enum_filter("CANDIDATE_REASON_", enum_pb2.CandidateReason),
            "terminal_reason": _enum_filter("TERMINAL_REASON_", enum_pb2.TerminalReason),
            "decision": _enum_filter("APPROVAL_DECISION_", enum_pb2.ApprovalDecision),
        }
    )


@dataclass(frozen=True)
class CheckShown:
    """One check of the run's completion policy, as the run page shows it."""

    name: str
    description: str
    #: Who decides it: the worker attests it, or the runtime evaluates a condition.
    how: str
    #: What the steps on the page say of it ("" when they say nothing).
    outcome: str


_CONDITIONS: Final = {
    registry_enums.COMPLETION_CONDITION_ARTIFACT_EXISTS: "an artifact of kind {artifact_kind}",
    registry_enums.COMPLETION_CONDITION_TOOL_SUCCEEDED_AFTER_SIDE_EFFECTS: (
        "{tool} succeeded after the last step with side effects"
    ),
    registry_enums.COMPLETION_CONDITION_NO_OPEN_STEPS: "no step left open",
}


def completion_checks(
    policy: registry_pb2.CompletionPolicySpec, steps: list[message_pb2.Step]
) -> list[CheckShown]:
    """The policy's checks, each with how it is decided and, for one the worker attests, the
    last COMPLETION_CHECK step of it among ``steps`` (the page's)."""
    last: dict[str, message_pb2.Step] = {}
    for step in steps:
        if step.type == enum_pb2.STEP_TYPE_COMPLETION_CHECK and step.completion_check:
            last[step.completion_check] = step
    shown = []
    for check in policy.checks:
        if check.condition:
            template = _CONDITIONS.get(check.condition, "a condition")
            how = "evaluated by the runtime: " + template.format(
                artifact_kind=check.artifact_kind, tool=check.tool
            )
            outcome = ""
        else:
            how = "attested by the worker"
            attested = last.get(check.name)
            outcome = ""
            if attested is not None:
                status = enum_pb2.StepStatus.Name(attested.status).removeprefix("STEP_STATUS_")
                outcome = f"step {attested.sequence}: {status}"
        shown.append(CheckShown(check.name, check.description, how, outcome))
    return shown


@dataclass(frozen=True)
class Bar:
    """One attempt on the run page's timeline: where its bar starts and how long it is, in
    thousandths of the span from the run's creation to the last moment drawn."""

    number: int
    x: int
    width: int
    status: str
    label: str
    #: The whole span drawn, in seconds, as its scale says it (the same for every bar).
    span: str


#: The timeline's width in its own units (the SVG's viewBox), and a bar's height with its gap.
TIMELINE_WIDTH: Final = 1000
TIMELINE_ROW: Final = 22


def attempt_bars(
    run: message_pb2.Run, attempts: list[message_pb2.Attempt], now: dt.datetime
) -> list[Bar]:
    """The attempts drawn against time, from the run's creation to its end (or ``now`` while
    it is live): the queue wait before the first, the gaps between attempts (a retry's
    backoff, an approval waited for) and each attempt's length show as they were."""
    if not attempts:
        return []
    origin = run.create_time.ToDatetime(tzinfo=dt.UTC)

    def end_of(attempt: message_pb2.Attempt) -> dt.datetime:
        if attempt.HasField("end_time"):
            return attempt.end_time.ToDatetime(tzinfo=dt.UTC)
        return now

    last = max([now if live(run) else origin, *(end_of(a) for a in attempts)])
    if run.HasField("end_time"):
        last = max(last, run.end_time.ToDatetime(tzinfo=dt.UTC))
    span = max((last - origin).total_seconds(), 1e-6)
    bars = []
    for attempt in attempts:
        start = attempt.start_time.ToDatetime(tzinfo=dt.UTC)
        x = round((start - origin).total_seconds() / span * TIMELINE_WIDTH)
        width = round((end_of(attempt) - start).total_seconds() / span * TIMELINE_WIDTH)
        status = enum_pb2.AttemptStatus.Name(attempt.status).removeprefix("ATTEMPT_STATUS_")
        reason = enum_pb2.AttemptReason.Name(attempt.reason).removeprefix("ATTEMPT_REASON_")
        seconds = (end_of(attempt) - start).total_seconds()
        bars.append(
            Bar(
                attempt.number,
                min(max(x, 0), TIMELINE_WIDTH - 2),
                max(width, 2),  # an attempt of no length still shows
                status.lower(),
                f"#{attempt.number} {reason} → {status}, lease epoch {attempt.lease_epoch},"
                f" {seconds:.1f} s",
                f"{span:.1f} s",
            )
        )
    return bars
