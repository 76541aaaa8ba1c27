"""Pieces both agentrt packages stand on: settings, ids, domain errors and their gRPC mapping,
and the storage base (declarative base, engine factory, session runners)."""

from agentrt_base.db import Base, Database, utcnow
from agentrt_base.db_failures import DatabaseUnavailable
from agentrt_base.errors import (
    Aborted,
    AgentrtError,
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unimplemented,
    ViolationCollector,
)
from agentrt_base.ids import new_id
from agentrt_base.settings import ServerSettings, resolve_target

__all__ = [
    "Aborted",
    "AgentrtError",
    "AlreadyExists",
    "Base",
    "Database",
    "DatabaseUnavailable",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
    "LeaseLost",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "ServerSettings",
    "Unauthenticated",
    "Unimplemented",
    "ViolationCollector",
    "new_id",
    "resolve_target",
    "utcnow",
]
