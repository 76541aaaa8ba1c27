"""Tag policies: which agent versions a tag may point at (pure; the rule SetTag applies).

A policy (``[[tag_policies]]`` in the auth config, ``agentrt_base.auth.TagPolicy``) covers
tags by name pattern, optionally only of some agents, and requires the version the tag is set
to have been published with verified provenance (an OIDC token) whose claims match the
policy's claim patterns, e.g. ``prod`` only for versions published from ``refs/heads/main`` of
``acme/agents``. Self-declared provenance (``--publisher``, ``--commit``) never satisfies one.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrt_base.auth import TagPolicy, claims_match
from agentrt_core import reasons
from agentrt_core.errors import FailedPrecondition
from agentrt_core.model import VerifiedProvenance


def check_tag_policies(
    policies: Sequence[TagPolicy],
    agent_id: str,
    tag: str,
    digest: str,
    verified: VerifiedProvenance | None,
) -> None:
    """Raise FAILED_PRECONDITION (reason ``TAG_POLICY``, naming the policy, with one
    PreconditionFailure violation per unmet requirement) if a policy covering
    ``agent_id:tag`` refuses the version ``digest``; the first such policy is named."""
    subject = f"{agent_id}@{digest}"
    for policy in policies:
        if not policy.covers(agent_id, tag):
            continue
        if verified is None:
            violations = [
                (
                    "VERIFIED_PROVENANCE",
                    subject,
                    "published without verified provenance (not with an OIDC token)",
                )
            ]
        else:
            claims = verified.claim_map()
            violations = [
                (
                    "CLAIM",
                    subject,
                    f"claim {name!r} is {claims.get(name, '(absent)')!r}, "
                    f"the policy requires {pattern!r}",
                )
                for name, pattern in policy.claims
                if not claims_match([(name, pattern)], claims)
            ]
        if violations:
            raise FailedPrecondition(
                f"tag policy {policy.name!r} refuses {agent_id}:{tag} -> {digest}: "
                + "; ".join(v[2] for v in violations),
                reason=reasons.TAG_POLICY,
                metadata={"policy": policy.name, "tag": tag},
                violations=violations,
            )
