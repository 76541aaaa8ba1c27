"""Every ``google.rpc.ErrorInfo.reason`` agentrt sends, in one place.

A reason is part of the contract: a client switches on it. So each one is a constant here
with its one-line meaning and where a caller reads about it, and every raise site names the
constant, never a string literal (``tests/unit/test_reasons.py`` scans the source for
literals and checks each reason is documented: in the proto comment of every RPC listed
here, or, for a reason any RPC may answer, in the "Errors" table of ``docs/api.md``).

Adding a reason: add it here (its meaning and its RPCs), use the constant, and document it
where the entry says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    name: str
    #: What it means, in one line.
    meaning: str
    #: The RPCs (``Service.Method``) whose proto comments document it; empty: any RPC may
    #: answer it, and docs/api.md's "Errors" table documents it.
    rpcs: tuple[str, ...] = ()


#: Every reason by name.
REASONS: dict[str, Reason] = {}


def _reason(name: str, meaning: str, *rpcs: str) -> str:
    REASONS[name] = Reason(name, meaning, rpcs)
    return name


_W = "agentrt.runtime.v1.WorkerService."
_R = "agentrt.runtime.v1.RuntimeService."
_G = "agentrt.registry.v1.RegistryService."

# -- the status code's own name: the default of each error class (docs/api.md) ---------------
ERROR = _reason("ERROR", "an error without a more specific reason (the base class's default)")
INVALID_ARGUMENT = _reason("INVALID_ARGUMENT", "the request is malformed; BadRequest says where")
OUT_OF_RANGE = _reason("OUT_OF_RANGE", "a position past the end of what exists now")
NOT_FOUND = _reason("NOT_FOUND", "a named resource does not exist; ResourceInfo names it")
ALREADY_EXISTS = _reason("ALREADY_EXISTS", "a create whose identity another resource holds")
FAILED_PRECONDITION = _reason("FAILED_PRECONDITION", "the state does not allow the call")
ABORTED = _reason("ABORTED", "a concurrency conflict: a lost compare-and-swap")
RESOURCE_EXHAUSTED = _reason("RESOURCE_EXHAUSTED", "a budget or size limit would be exceeded")
PERMISSION_DENIED = _reason("PERMISSION_DENIED", "the caller or its agent may not do this")
UNAUTHENTICATED = _reason("UNAUTHENTICATED", "the caller did not prove who it is")
UNAVAILABLE = _reason("UNAVAILABLE", "the server cannot serve the call now; retry")
UNIMPLEMENTED = _reason("UNIMPLEMENTED", "an RPC of the contract this server does not provide")
INTERNAL = _reason("INTERNAL", "a bug of ours; metadata error_id is in the server log")

# -- any RPC: the request's bytes, the caller's limits and rights (docs/api.md) --------------
MALFORMED_REQUEST = _reason("MALFORMED_REQUEST", "the bytes are not the request message")
INVALID_FIELD_VALUE = _reason("INVALID_FIELD_VALUE", "a value no field of its type may hold")
RATE_LIMITED = _reason("RATE_LIMITED", "the caller is over its rate of calls")
TOO_MANY_WATCHES = _reason("TOO_MANY_WATCHES", "the caller holds its limit of open watches")
TOO_MANY_LONG_POLLS = _reason("TOO_MANY_LONG_POLLS", "the caller holds its limit of long polls")
NO_RULE = _reason("NO_RULE", "the permission table has no rule for the method")
ROLE_MISSING = _reason("ROLE_MISSING", "the caller's roles do not grant the permission")
OUTSIDE_SCOPE = _reason("OUTSIDE_SCOPE", "not for the namespace or agent the call touches")
JWKS_UNAVAILABLE = _reason("JWKS_UNAVAILABLE", "the JWT issuer's keys could not be fetched")
INPUT_TOO_LARGE = _reason(
    "INPUT_TOO_LARGE",
    "a message or input is larger than the server limit (put it in a blob)",
    _R + "AppendMessage",
    _R + "SendInput",
)
ILLEGAL_TRANSITION = _reason(
    "ILLEGAL_TRANSITION", "the run's status does not allow the move asked for"
)

# -- any RPC: the database (docs/api.md) -----------------------------------------------------
COMMIT_OUTCOME_UNKNOWN = _reason(
    "COMMIT_OUTCOME_UNKNOWN", "the connection broke after the COMMIT was sent"
)
TRANSACTION_CONFLICT = _reason("TRANSACTION_CONFLICT", "a deadlock or serialization failure")
DATABASE_BUSY = _reason("DATABASE_BUSY", "SQLite stayed locked past its busy timeout")
DATABASE_IO_ERROR = _reason("DATABASE_IO_ERROR", "SQLite could not read or write its file")
DATABASE_TIMEOUT = _reason("DATABASE_TIMEOUT", "a server-side database deadline passed")
DATABASE_FULL = _reason("DATABASE_FULL", "the database has no room for the write")
DATABASE_READ_ONLY = _reason("DATABASE_READ_ONLY", "the database accepts no writes now")
DATABASE_UNAVAILABLE = _reason("DATABASE_UNAVAILABLE", "the database connection was lost")

# -- the registry ----------------------------------------------------------------------------
VERSION_CONFLICT = _reason(
    "VERSION_CONFLICT",
    "different content under a taken label",
    _G + "PublishComponent",
    _G + "PublishAgentVersion",
)
KIND_MISMATCH = _reason(
    "KIND_MISMATCH", "the name is already published as another kind", _G + "PublishComponent"
)
VERSION_SCHEME_MISMATCH = _reason(
    "VERSION_SCHEME_MISMATCH",
    "the name is already published with the other version scheme",
    _G + "PublishComponent",
)
TAG_EXPECTATION_FAILED = _reason(
    "TAG_EXPECTATION_FAILED",
    "the tag does not point where the compare-and-swap expected",
    _G + "SetTag",
    _G + "DeleteTag",
)
TAG_POLICY = _reason(
    "TAG_POLICY",
    "a tag policy refuses the version (provenance not verified, an attestation missing)",
    _G + "SetTag",
)
ATTESTATION_UNTRUSTED = _reason(
    "ATTESTATION_UNTRUSTED",
    "no key trusted for the caller signed the envelope, or the server may not sign for it",
    _G + "AttachAttestation",
)

# -- runs ------------------------------------------------------------------------------------
RUN_ENDED = _reason("RUN_ENDED", "the call needs a run that has not ended")
THREAD_BUSY = _reason(
    "THREAD_BUSY", "the thread has an active run and its policy is REJECT", _R + "CreateRun"
)
REVISION_MISMATCH = _reason(
    "REVISION_MISMATCH", "expected_input_revision is not the run's", _R + "AmendRun"
)
APPROVAL_RESOLVED = _reason(
    "APPROVAL_RESOLVED", "the approval was resolved with another decision", _R + "ResolveApproval"
)

# -- blobs -----------------------------------------------------------------------------------
BLOB_MISSING = _reason(
    "BLOB_MISSING",
    "a named blob was not uploaded (to the run's namespace)",
    _W + "BeginStep",
    _W + "EndStep",
    _W + "WriteCheckpoint",
    _W + "CreateArtifact",
)
BLOB_TOO_LARGE = _reason("BLOB_TOO_LARGE", "the blob exceeds the size limit", _R + "PutBlob")
BLOB_QUOTA_EXCEEDED = _reason(
    "BLOB_QUOTA_EXCEEDED", "all stored blobs would exceed the quota", _R + "PutBlob"
)
NAMESPACE_BLOB_QUOTA_EXCEEDED = _reason(
    "NAMESPACE_BLOB_QUOTA_EXCEEDED", "the namespace's blobs would exceed its quota", _R + "PutBlob"
)

# -- workers ---------------------------------------------------------------------------------
LEASE_LOST = _reason("LEASE_LOST", "the fence is stale, or its attempt ended; stop working")
TURN_OPEN = _reason("TURN_OPEN", "another turn of the attempt is still open", _W + "BeginTurn")
TURN_NOT_OPEN = _reason(
    "TURN_NOT_OPEN",
    "the turn is not the open turn of this attempt",
    _W + "BeginStep",
    _W + "EndTurn",
)
STEPS_OPEN = _reason(
    "STEPS_OPEN", "steps are still STARTED: end them first", _W + "EndTurn", _W + "FinishAttempt"
)
STEP_ENDED = _reason("STEP_ENDED", "the step already ended with another outcome", _W + "EndStep")
STEP_OF_OTHER_ATTEMPT = _reason(
    "STEP_OF_OTHER_ATTEMPT", "the step belongs to another attempt", _W + "EndStep"
)
NOT_IN_DEFINITION = _reason(
    "NOT_IN_DEFINITION", "a skill or tool outside the bound definition", _W + "BeginStep"
)
TOOL_DENIED = _reason(
    "TOOL_DENIED", "the permission policy or the run's ceiling denies the tool", _W + "BeginStep"
)
NO_MODEL_CANDIDATE = _reason(
    "NO_MODEL_CANDIDATE", "no candidate of the model policy is left", _W + "BeginStep"
)
BUDGET_EXCEEDED = _reason(
    "BUDGET_EXCEEDED", "the step would exceed the run's budget; the run ends", _W + "BeginStep"
)
BUDGET_CHANGED = _reason(
    "BUDGET_CHANGED", "the run's budget changed while the step was begun: retry", _W + "BeginStep"
)
FAILED_STEP_LIMIT = _reason(
    "FAILED_STEP_LIMIT",
    "the attempt's steps failed too many times in a row; the runtime ended the attempt",
    _W + "BeginStep",
)
STEP_WRITER_STOPPED = _reason(
    "STEP_WRITER_STOPPED",
    "the step writer process stopped during the call",
    _W + "BeginStep",
    _W + "EndStep",
)
NO_STOP_REQUESTED = _reason(
    "NO_STOP_REQUESTED", "CANCELLED or PAUSED without such a request", _W + "FinishAttempt"
)
NO_APPROVAL_PENDING = _reason(
    "NO_APPROVAL_PENDING", "WAITING_APPROVAL without an approval step", _W + "FinishAttempt"
)
INPUTS_PENDING = _reason(
    "INPUTS_PENDING", "inputs were sent and not yet delivered", _W + "FinishAttempt"
)
COMPLETION_CHECKS_MISSING = _reason(
    "COMPLETION_CHECKS_MISSING",
    "a check of the completion policy has no SUCCEEDED step",
    _W + "FinishAttempt",
)
