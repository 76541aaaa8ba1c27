"""Tag policies: which agent versions a tag may point at (pure; the rule SetTag applies).

A policy (``[[tag_policies]]`` in the auth config, ``agentrt_base.auth.TagPolicy``) covers
tags by name pattern, optionally only of some agents, and requires the version the tag is set
to have been published with verified provenance (an OIDC token) whose claims match the
policy's claim patterns, e.g. ``prod`` only for versions published from ``refs/heads/main`` of
``acme/agents``. Self-declared provenance (``--publisher``, ``--commit``) never satisfies one.
A policy may also require attestations attached to the version (an evaluation that passed,
signed by the evaluator: ``agentrt_core.attestation_policy``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentrt_base.auth import TagPolicy, claims_match
from agentrt_core import reasons
from agentrt_core.attestation_policy import Attested, unmet
from agentrt_core.errors import FailedPrecondition
from agentrt_core.model import VerifiedProvenance


def check_tag_policies(
    policies: Sequence[TagPolicy],
    agent_id: str,
    tag: str,
    digest: str,
    verified: VerifiedProvenance | None,
    attested: Callable[[], Sequence[Attested]] = lambda: (),
) -> None:
    """Raise FAILED_PRECONDITION (reason ``TAG_POLICY``, naming the policy, with one
    PreconditionFailure violation per unmet requirement) if a policy covering
    ``agent_id:tag`` refuses the version ``digest``; the first such policy is named."""
    subject = f"{agent_id}@{digest}"
    for policy in policies:
        if not policy.covers(agent_id, tag):
            continue
        # A policy of attestations alone does not also ask for an OIDC publish; one of claims
        # (or of nothing else) does.
        violations: list[tuple[str, str, str]] = []
        if not policy.claims and policy.attestations:
            pass
        elif verified is None:
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
        if policy.attestations:
            violations += [
                ("ATTESTATION", subject, f"missing {r.describe()}")
                for r in unmet(policy.attestations, attested())
            ]
        if violations:
            raise FailedPrecondition(
                f"tag policy {policy.name!r} refuses {agent_id}:{tag} -> {digest}: "
                + "; ".join(v[2] for v in violations),
                reason=reasons.TAG_POLICY,
                metadata={"policy": policy.name, "tag": tag},
                violations=violations,
            )
