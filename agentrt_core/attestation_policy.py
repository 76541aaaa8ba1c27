"""What a tag policy may require of a version's attestations, and the check (pure).

A requirement names a predicate type, who must have attested (a principal name pattern) and,
optionally, a condition on the predicate: ``<field path> <op> <JSON value>``, e.g. ``passed =
true`` or ``metrics.score >= 0.9``; the path is dotted into the predicate object, the operators
are ``=``, ``!=``, ``>=``, ``>``, ``<=``, ``<``, and ordering compares numbers only (a value of
another type, or a missing field, does not satisfy the condition).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_CONDITION = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(>=|<=|!=|=|>|<)\s*(.+?)\s*$"
)


@dataclass(frozen=True)
class Condition:
    path: tuple[str, ...]
    op: str
    value: Any

    @classmethod
    def parse(cls, text: str) -> Condition:
        """ValueError (one line) for a condition outside the grammar above."""
        match = _CONDITION.match(text)
        if match is None:
            raise ValueError(
                f"condition {text!r}: write '<field> <op> <JSON value>', e.g. 'passed = true'"
            )
        path, op, literal = match.groups()
        try:
            value = json.loads(literal)
        except ValueError:
            raise ValueError(f"condition {text!r}: {literal!r} is not a JSON value") from None
        if op in (">=", "<=", ">", "<") and not _is_number(value):
            raise ValueError(f"condition {text!r}: {op} compares numbers only")
        if isinstance(value, (dict, list)):
            raise ValueError(f"condition {text!r}: compare with a string, number, boolean or null")
        return cls(tuple(path.split(".")), op, value)

    def holds(self, predicate: Any) -> bool:
        found: Any = predicate
        for key in self.path:
            if not isinstance(found, dict) or key not in found:
                return False
            found = found[key]
        if self.op in ("=", "!="):
            # Equal as JSON values: numbers by value (1 = 1.0), anything else by type too
            # (true is not 1).
            both_numbers = _is_number(found) and _is_number(self.value)
            same = bool(found == self.value) and (both_numbers or type(found) is type(self.value))
            return same if self.op == "=" else not same
        if not _is_number(found):
            return False
        number, bound = float(found), float(self.value)
        return {
            ">=": number >= bound,
            "<=": number <= bound,
            ">": number > bound,
            "<": number < bound,
        }[self.op]

    def __str__(self) -> str:
        return f"{'.'.join(self.path)} {self.op} {json.dumps(self.value)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Requirement:
    """An attestation a tag's target must have."""

    predicate_type: str
    #: Who attested: a pattern over the attesting principal's name.
    signer: str = "*"
    condition: Condition | None = None

    def describe(self) -> str:
        what = f"an attestation of type {self.predicate_type!r} by {self.signer!r}"
        return what + (f" with {self.condition}" if self.condition else "")


@dataclass(frozen=True)
class Attested:
    """One attestation of a version, as a requirement reads it."""

    predicate_type: str
    principal: str
    predicate: Mapping[str, Any]


def unmet(requirements: Iterable[Requirement], attested: Iterable[Attested]) -> list[Requirement]:
    """The requirements no attestation satisfies."""
    have = list(attested)
    return [
        r
        for r in requirements
        if not any(
            a.predicate_type == r.predicate_type
            and fnmatch.fnmatchcase(a.principal, r.signer)
            and (r.condition is None or r.condition.holds(a.predicate))
            for a in have
        )
    ]
