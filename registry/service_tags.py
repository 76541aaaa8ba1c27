"""The registry's tag use cases: move a tag, delete one, list tags and their history.

A tag is the only thing in the registry that changes: each move locks its agent's row,
checks the caller's expectation and the tag policies, and appends to the agent's history,
in one transaction. A concurrent move answers ABORTED (re-read, then decide again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from agentrt_base.auth import TagPolicy, caller_name
from agentrt_base.db import Database, utcnow
from agentrt_core import content_limits, reasons, refs
from agentrt_core.errors import FailedPrecondition, InvalidArgument, NotFound, ViolationCollector
from agentrt_core.model import Provenance, Tag, TagEvent
from agentrt_core.paging import cut_page, page_request
from agentrt_core.tag_names import tag_spelling
from registry import log_store, store
from registry.attestations import attested
from registry.service_common import Page, check_provenance, digest_field, write_retrying
from registry.tag_policy import check_tag_policies
from registry.transparency import tag_event_leaf


class TagsService:
    """Tags over one database."""

    def __init__(
        self,
        database: Database,
        tag_policies: Callable[[], Sequence[TagPolicy]] = lambda: (),
    ) -> None:
        self._db = database
        #: The tag policies in force (read again on every SetTag: a SIGHUP changes them).
        self._tag_policies = tag_policies

    async def set_tag(
        self,
        agent_id: str,
        tag_name: str,
        digest: str,
        *,
        expected_digest: str | None,
        expect_absent: bool,
        actor: str,
        reason: str,
        provenance: Provenance,
    ) -> tuple[Tag, TagEvent | None, log_store.Proof | None]:
        """Point ``agent_id:tag_name`` at ``digest`` if the expectation holds; record the move
        (in the tag's history and in the registry log)."""
        problems = ViolationCollector()
        _check_tag_request(agent_id, tag_name, actor, reason, provenance, problems)
        if refs.is_valid_tag(tag_name) and not refs.is_settable_tag(tag_name):
            problems.add(
                "tag",
                f"{tag_name!r}: tags are set in lower case ({tag_spelling(tag_name)!r}), so no"
                " two tags differ only in case and a tag policy covers every spelling",
            )
        digest_field(digest, "digest", problems)
        if expected_digest is not None:
            digest_field(expected_digest, "expected_digest", problems)
        problems.raise_if_any()
        principal = caller_name()
        policies = tuple(self._tag_policies())

        def write(session: Session) -> tuple[Tag, TagEvent | None, log_store.Proof | None]:
            agent = _locked_agent(session, agent_id)
            version = store.agent_version_by_digest(session, digest)
            if version is None or version.agent_id != agent_id:
                raise NotFound("agent version", f"{agent_id}@{digest}")
            current = store.tag(session, agent_id, tag_name, for_update=True)
            if current is not None and current.digest == digest:
                return store.tag_of(current), None, None
            check_tag_policies(
                policies,
                agent_id,
                tag_name,
                digest,
                store.verified(version.verified_provenance_json),
                lambda: attested(session, digest),
            )
            _check_expectation(current, expected_digest, expect_absent)
            event = store.append_tag_event(
                session,
                agent,
                tag_name,
                "SET",
                current.digest if current else "",
                digest,
                principal=principal,
                actor=actor,
                reason=reason,
                provenance=provenance,
                now=utcnow(),
            )
            tag = store.point_tag(
                session, current, agent_id, tag_name, event, actor=actor, principal=principal
            )
            (proof,) = log_store.append(session, tag_event_leaf(event))
            return tag, event, proof

        return await write_retrying(self._db, write, conflict_is_abort=True)

    async def delete_tag(
        self,
        agent_id: str,
        tag_name: str,
        *,
        expected_digest: str,
        actor: str,
        reason: str,
        provenance: Provenance,
    ) -> tuple[TagEvent, log_store.Proof]:
        problems = ViolationCollector()
        _check_tag_request(agent_id, tag_name, actor, reason, provenance, problems)
        if expected_digest:
            digest_field(expected_digest, "expected_digest", problems)
        problems.raise_if_any()
        principal = caller_name()

        def write(session: Session) -> tuple[TagEvent, log_store.Proof]:
            agent = _locked_agent(session, agent_id)
            current = store.tag(session, agent_id, tag_name, for_update=True)
            if current is None:
                raise NotFound("tag", f"{agent_id}:{tag_name}")
            if expected_digest:
                _check_expectation(current, expected_digest, False)
            event = store.append_tag_event(
                session,
                agent,
                tag_name,
                "DELETE",
                current.digest,
                "",
                principal=principal,
                actor=actor,
                reason=reason,
                provenance=provenance,
                now=utcnow(),
            )
            store.delete_tag(session, current)
            (proof,) = log_store.append(session, tag_event_leaf(event))
            return event, proof

        return await write_retrying(self._db, write, conflict_is_abort=True)

    async def list_tags(self, agent_id: str, page_size: int, page_token: str) -> Page[Tag]:
        filters = {"agent_id": agent_id}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(str, str),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )
        after = (page.after[0], page.after[1]) if page.after is not None else None

        def read(session: Session) -> Page[Tag]:
            rows, token = cut_page(
                store.tags_page(session, agent_id, after, page.size + 1),
                page.size,
                filters,
                lambda r: [r.agent_id, r.name],
            )
            return Page([store.tag_of(r) for r in rows], token)

        return await self._db.read(read)

    async def list_tag_history(
        self, agent_id: str, tag_name: str, page_size: int, page_token: str
    ) -> Page[TagEvent]:
        if not agent_id:
            raise InvalidArgument.for_field("agent_id", "required")
        filters = {"agent_id": agent_id, "tag": tag_name}
        page = page_request(
            page_size,
            page_token,
            filters,
            key=(int,),
            default=content_limits.DEFAULT_PAGE_SIZE,
            maximum=content_limits.MAX_PAGE_SIZE,
        )
        before = page.after[0] if page.after is not None else None

        def read(session: Session) -> Page[TagEvent]:
            if not store.agent_exists(session, agent_id):
                raise NotFound("agent", agent_id)
            rows, token = cut_page(
                store.tag_events_page(session, agent_id, tag_name, before, page.size + 1),
                page.size,
                filters,
                lambda r: [r.sequence],
            )
            return Page([store.tag_event_of(r) for r in rows], token)

        return await self._db.read(read)


def _check_tag_request(
    agent_id: str,
    tag_name: str,
    actor: str,
    reason: str,
    provenance: Provenance,
    problems: ViolationCollector,
) -> None:
    if not refs.is_valid_name(agent_id):
        problems.add(
            "agent_id", f"{agent_id!r} is not a valid agent id" if agent_id else "required"
        )
    if not refs.is_valid_tag(tag_name):
        problems.add(
            "tag",
            # Says what can be set (lower case: refs.is_settable_tag); a tag with capitals is
            # valid (DeleteTag takes one an older server stored) and never gets here.
            f"{tag_name!r} is not a valid tag: 1-128 of a-z 0-9 . _ -, not starting with"
            " '.' or '-', not 64 hex digits"
            if tag_name
            else "required",
        )
    if len(actor) > content_limits.MAX_ACTOR_CHARS:
        problems.add("actor", f"at most {content_limits.MAX_ACTOR_CHARS} characters")
    if len(reason) > content_limits.MAX_REASON_CHARS:
        problems.add("reason", f"at most {content_limits.MAX_REASON_CHARS} characters")
    check_provenance(provenance, problems)


def _locked_agent(session: Session, agent_id: str) -> store.AgentRow:
    agent = store.lock_agent(session, agent_id)
    if agent is None:
        raise NotFound("agent", agent_id)
    return agent


def _check_expectation(
    current: store.TagRow | None, expected_digest: str | None, expect_absent: bool
) -> None:
    current_digest = current.digest if current else ""
    if expect_absent and current is not None:
        raise FailedPrecondition(
            f"tag exists (points at {current_digest}) but was expected to be absent",
            reason=reasons.TAG_EXPECTATION_FAILED,
            metadata={"current_digest": current_digest},
        )
    if expected_digest is not None and current_digest != expected_digest:
        raise FailedPrecondition(
            f"tag points at {current_digest or 'nothing'}, expected {expected_digest}",
            reason=reasons.TAG_EXPECTATION_FAILED,
            metadata={"current_digest": current_digest},
        )
