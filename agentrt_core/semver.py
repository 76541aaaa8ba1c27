"""Component versions and version ranges: semver 2.0.0 and node-semver, nothing registry-specific.

A component version is a semantic version 2.0.0 (``2.1.0``, ``1.0.0-rc.1+build.5``) or a
positive integer ``N``, read as ``N.0.0``. Versions are ordered by semver precedence (§11:
build metadata ignored). A range (``^2.1``, ``~1.2``, ``1.x``, ``>=1.2 <2``, ``||``) follows
node-semver, including its rule that a prerelease satisfies a range only when a comparator
names a prerelease of the same ``major.minor.patch``; :func:`max_satisfying` picks the highest
version a range admits. The registry resolves a range once, when a definition is published
(see :mod:`agentrt_core.refs`, where ``name@^2.1`` is a reference).

:class:`RefError` is defined here, the lowest layer of the grammar, because a version or a
range can be wrong on its own; :mod:`agentrt_core.refs` raises the same error for references.

This module is pure (no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "Comparator",
    "RefError",
    "Version",
    "VersionRange",
    "compare_versions",
    "is_int_version",
    "is_semver",
    "is_valid_version",
    "max_satisfying",
    "parse_range",
    "parse_version",
]

_INT_VERSION_RE: Final = re.compile(r"[1-9][0-9]*")
# The regular expression published with semver 2.0.0, with `\d` spelled `[0-9]` because
# Python's `\d` also matches non-ASCII digits.
_NUM: Final = r"(?:0|[1-9][0-9]*)"
_PRE_ID: Final = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID: Final = r"[0-9A-Za-z-]+"
_SEMVER_RE: Final = re.compile(
    rf"({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?"
    rf"(?:\+({_BUILD_ID}(?:\.{_BUILD_ID})*))?"
)
# A version is stored and shown in many places; bound it like names and labels.
_MAX_VERSION_LENGTH: Final = 128


class RefError(ValueError):
    """A reference, version or range that does not follow the grammar.

    The message says what is wrong in words a caller can act on; it is meant to be used as the
    ``description`` of a ``google.rpc.BadRequest.FieldViolation`` whose ``field`` the caller
    knows (this module does not know which request field the text came from).
    """


def is_semver(s: str) -> bool:
    """Return whether ``s`` is a semantic version 2.0.0 string such as ``1.0.0-rc.1+build.5``."""
    return len(s) <= _MAX_VERSION_LENGTH and _SEMVER_RE.fullmatch(s) is not None


def is_int_version(s: str) -> bool:
    """Return whether ``s`` is a plain positive integer version such as ``7`` (no leading 0)."""
    return len(s) <= _MAX_VERSION_LENGTH and _INT_VERSION_RE.fullmatch(s) is not None


def is_valid_version(s: str) -> bool:
    """Return whether ``s`` is a valid component version: semver 2.0.0 or a positive integer."""
    return is_semver(s) or is_int_version(s)


# --------------------------------------------------------------------------------------------
# Versions and precedence (semver 2.0.0 §11)
# --------------------------------------------------------------------------------------------

PrereleaseId = int | str
Precedence = tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]
"""A version's precedence key: compare two with ``<`` (see :attr:`Version.precedence`)."""


@dataclass(frozen=True, slots=True)
class Version:
    """A parsed version. An integer version ``N`` is ``N.0.0`` (that is how ranges see it).

    Equality compares every field, build metadata included; use :attr:`precedence` (or
    :func:`compare_versions`) to order versions, where build metadata does not count.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple[PrereleaseId, ...] = ()
    build: tuple[str, ...] = ()

    @property
    def precedence(self) -> Precedence:
        """A sort key implementing semver 2.0.0 §11 precedence (build metadata ignored).

        A release sorts after all its prereleases; numeric identifiers sort numerically and
        before alphanumeric ones, which sort in ASCII order; a shorter identifier list sorts
        first when it is a prefix of the longer one (Python's tuple order gives that).
        """
        pre = tuple((0, p) if isinstance(p, int) else (1, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(str(p) for p in self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _parse_prerelease(text: str | None) -> tuple[PrereleaseId, ...]:
    if not text:
        return ()
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def parse_version(s: str) -> Version:
    """Parse a component version (semver 2.0.0 or a positive integer ``N``, read as ``N.0.0``).

    Args:
        s: The version text.

    Returns:
        The parsed version.

    Raises:
        RefError: ``s`` is neither a semantic version nor a positive integer.
    """
    if is_int_version(s):
        return Version(int(s), 0, 0)
    m = _SEMVER_RE.fullmatch(s) if len(s) <= _MAX_VERSION_LENGTH else None
    if m is None:
        raise RefError(
            f"{s!r} is not a valid version: expected a semantic version such as '2.1.0' or "
            "'1.0.0-rc.1' (semver 2.0.0), or a positive integer such as '3'"
        )
    major, minor, patch, pre, build = m.groups()
    return Version(
        int(major),
        int(minor),
        int(patch),
        _parse_prerelease(pre),
        tuple(build.split(".")) if build else (),
    )


def compare_versions(a: str, b: str) -> int:
    """Compare two versions by semver precedence.

    Args:
        a: A valid version.
        b: A valid version.

    Returns:
        A negative number, zero or a positive number as ``a`` is lower than, equal in
        precedence to, or higher than ``b``. ``1.0.0+a`` and ``1.0.0+b`` compare equal, and so
        do ``2`` and ``2.0.0``.

    Raises:
        RefError: Either argument is not a valid version.
    """
    ka, kb = parse_version(a).precedence, parse_version(b).precedence
    return (ka > kb) - (ka < kb)


# --------------------------------------------------------------------------------------------
# Ranges (node-semver semantics)
# --------------------------------------------------------------------------------------------

Operator = Literal["<", "<=", ">", ">=", "="]


@dataclass(frozen=True, slots=True)
class Comparator:
    """One primitive comparison, such as ``>=1.2.0`` or ``<2.0.0-0``."""

    op: Operator
    version: Version

    def test(self, v: Version) -> bool:
        """Return whether ``v`` satisfies this comparison (precedence only)."""
        a, b = v.precedence, self.version.precedence
        match self.op:
            case "<":
                return a < b
            case "<=":
                return a <= b
            case ">":
                return a > b
            case ">=":
                return a >= b
            case "=":
                return a == b

    def __str__(self) -> str:
        return f"{self.op}{self.version}"


@dataclass(frozen=True, slots=True)
class VersionRange:
    """A parsed version range: alternatives (``||``), each a set of comparators (AND).

    Attributes:
        text: The range as written (kept so a reference round-trips exactly).
        alternatives: The desugared comparator sets; ``^1.2`` becomes
            ``((>=1.2.0, <2.0.0-0),)`` exactly as node-semver desugars it.
    """

    text: str
    alternatives: tuple[tuple[Comparator, ...], ...]

    def matches(self, version: str | Version) -> bool:
        """Return whether ``version`` satisfies the range.

        A prerelease version matches only if some comparator of the satisfied set names the
        same ``major.minor.patch`` with a prerelease (node-semver's rule): ``^1.2.3-beta.1``
        matches ``1.2.3-beta.2`` but not ``1.2.4-beta.1``, and ``*`` matches no prerelease.
        The point is that opting into one prerelease does not opt into every future one.

        Args:
            version: A version (integer versions are read as ``N.0.0``).

        Raises:
            RefError: ``version`` is not a valid version.
        """
        v = parse_version(version) if isinstance(version, str) else version
        return any(_test_set(cs, v) for cs in self.alternatives)

    def __str__(self) -> str:
        return self.text


def _test_set(comparators: tuple[Comparator, ...], v: Version) -> bool:
    if not all(c.test(v) for c in comparators):
        return False
    if not v.prerelease:
        return True
    return any(
        c.version.prerelease
        and (c.version.major, c.version.minor, c.version.patch) == (v.major, v.minor, v.patch)
        for c in comparators
    )


_OPERATORS: Final[dict[str, Operator]] = {
    "": "=",
    "=": "=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_X: Final = frozenset({"x", "X", "*"})
_PARTIAL_RE: Final = re.compile(
    rf"(?P<major>{_NUM}|[xX*])"
    rf"(?:\.(?P<minor>{_NUM}|[xX*])"
    rf"(?:\.(?P<patch>{_NUM}|[xX*])"
    rf"(?:-(?P<pre>{_PRE_ID}(?:\.{_PRE_ID})*))?"
    rf"(?:\+(?P<build>{_BUILD_ID}(?:\.{_BUILD_ID})*))?"
    r")?)?"
)
_COMPARATOR_RE: Final = re.compile(r"(?P<op>\^|~|<=|>=|<|>|=)?(?P<partial>.*)", re.DOTALL)
# node-semver tolerates a space between an operator and its version (">= 1.2.0").
_OP_SPACE_RE: Final = re.compile(r"(\^|~|<=|>=|<|>|=)\s+")
_ANY: Final = (Comparator(">=", Version(0, 0, 0)),)
_NOTHING: Final = (Comparator("<", Version(0, 0, 0, (0,))),)


def _lower(major: int, minor: int, patch: int, pre: tuple[PrereleaseId, ...] = ()) -> Comparator:
    return Comparator(">=", Version(major, minor, patch, pre))


def _upper(major: int, minor: int, patch: int) -> Comparator:
    # `-0` is the lowest possible prerelease, so `<2.0.0-0` excludes 2.0.0's prereleases too.
    return Comparator("<", Version(major, minor, patch, (0,)))


def _desugar(token: str, whole: str) -> tuple[Comparator, ...]:
    m = _COMPARATOR_RE.fullmatch(token)
    assert m is not None  # the pattern matches any string
    op, partial = m.group("op") or "", m.group("partial")
    pm = _PARTIAL_RE.fullmatch(partial)
    if token == "-":
        raise RefError(
            f"{whole!r} is not a valid version range: hyphen ranges are not supported; write "
            "'>=1.2.3 <=2.3.4' instead"
        )
    if pm is None:
        raise RefError(
            f"{whole!r} is not a valid version range: cannot read {token!r} (expected e.g. "
            "'^1.2', '~1.2.3', '1.x', '1.2.*', '*', '>=1.2.0 <2.0.0', '^1 || ^2')"
        )
    parts = [pm.group("major"), pm.group("minor"), pm.group("patch")]
    first_x = next((i for i, p in enumerate(parts) if p is None or p in _X), 3)
    if any(p is not None and p not in _X for p in parts[first_x:]):
        raise RefError(
            f"{whole!r} is not a valid version range: in {token!r} a number follows a wildcard"
        )
    # Count how many leading numeric parts are present; the rest are wildcards.
    nums: list[int] = []
    for p in parts:
        if p is None or p in _X:
            break
        nums.append(int(p))
    pre = _parse_prerelease(pm.group("pre"))
    if pre and len(nums) < 3:
        raise RefError(f"{whole!r} is not a valid version range: {token!r} has a wildcard")

    if op == "^":
        return _caret(nums, pre)
    if op == "~":
        return _tilde(nums, pre)
    return _primitive(op, nums, pre)


def _caret(nums: list[int], pre: tuple[PrereleaseId, ...]) -> tuple[Comparator, ...]:
    # Caret allows changes that do not modify the left-most non-zero part.
    match nums:
        case []:
            return _ANY
        case [major]:
            return (_lower(major, 0, 0), _upper(major + 1, 0, 0))
        case [major, minor]:
            if major == 0:
                return (_lower(0, minor, 0), _upper(0, minor + 1, 0))
            return (_lower(major, minor, 0), _upper(major + 1, 0, 0))
        case [major, minor, patch]:
            low = _lower(major, minor, patch, pre)
            if major != 0:
                return (low, _upper(major + 1, 0, 0))
            if minor != 0:
                return (low, _upper(0, minor + 1, 0))
            return (low, _upper(0, 0, patch + 1))
    raise AssertionError(nums)  # pragma: no cover - a partial has at most three parts


def _tilde(nums: list[int], pre: tuple[PrereleaseId, ...]) -> tuple[Comparator, ...]:
    # Tilde allows patch-level changes when a minor is given, minor-level ones otherwise.
    match nums:
        case []:
            return _ANY
        case [major]:
            return (_lower(major, 0, 0), _upper(major + 1, 0, 0))
        case [major, minor]:
            return (_lower(major, minor, 0), _upper(major, minor + 1, 0))
        case [major, minor, patch]:
            return (_lower(major, minor, patch, pre), _upper(major, minor + 1, 0))
    raise AssertionError(nums)  # pragma: no cover


def _primitive(op: str, nums: list[int], pre: tuple[PrereleaseId, ...]) -> tuple[Comparator, ...]:
    if len(nums) == 3:
        exact = Version(nums[0], nums[1], nums[2], pre)
        return (Comparator(_OPERATORS[op], exact),)
    if not nums:
        # node-semver: `>*` and `<*` can match nothing, every other form matches anything.
        return _NOTHING if op in ("<", ">") else _ANY
    major = nums[0]
    minor = nums[1] if len(nums) == 2 else 0
    # The next version above the wildcard block, e.g. 1.x -> 2.0.0, 1.2.x -> 1.3.0.
    nxt = (major + 1, 0, 0) if len(nums) == 1 else (major, minor + 1, 0)
    match op:
        case "" | "=":
            return (_lower(major, minor, 0), _upper(*nxt))
        case ">=":
            return (_lower(major, minor, 0),)
        case ">":
            return (_lower(*nxt),)
        case "<":
            return (_upper(major, minor, 0),)
        case "<=":
            return (_upper(*nxt),)
    raise AssertionError(op)  # pragma: no cover


def parse_range(s: str) -> VersionRange:
    """Parse a version range with node-semver semantics.

    Supported: exact versions (``1.2.3``, ``=1.2.3``), caret (``^1.2``, ``^0.2.3``), tilde
    (``~1.2``, ``~1.2.3``), x-ranges (``1.x``, ``1.2.*``, ``1``, ``*``), primitive comparators
    (``>=1.2.0``, ``<2``), space-separated comparator sets (AND) and ``||`` alternatives (OR).
    Hyphen ranges (``1.2 - 2.3``) and the ``v`` prefix are not supported. Integer versions
    are ``N.0.0``, so ``^3`` matches version ``3`` and ``3.1.0``.

    Args:
        s: The range text.

    Returns:
        The parsed range (it keeps ``s`` verbatim as :attr:`VersionRange.text`).

    Raises:
        RefError: ``s`` is not a valid range.
    """
    if not s or s != s.strip():
        raise RefError(f"{s!r} is not a valid version range: it is empty or has outer spaces")
    alternatives: list[tuple[Comparator, ...]] = []
    for alternative in s.split("||"):
        tokens = _OP_SPACE_RE.sub(r"\1", alternative.strip()).split()
        if not tokens:
            raise RefError(f"{s!r} is not a valid version range: an alternative is empty")
        comparators: list[Comparator] = []
        for token in tokens:
            comparators.extend(_desugar(token, s))
        alternatives.append(tuple(comparators))
    return VersionRange(s, tuple(alternatives))


def max_satisfying(range_: VersionRange | str, versions: Iterable[str]) -> str | None:
    """Return the highest version (semver precedence) in ``versions`` that ``range_`` matches.

    Versions of equal precedence (``2`` and ``2.0.0``, or ``1.0.0+a`` and ``1.0.0+b``) are
    ordered by their text so the answer does not depend on the order of ``versions``.

    Args:
        range_: A parsed range, or range text.
        versions: Candidate versions (semver or positive integers).

    Returns:
        The matching version as it was given, or ``None`` when nothing matches.

    Raises:
        RefError: The range or one of the versions is invalid.
    """
    r = parse_range(range_) if isinstance(range_, str) else range_
    best: tuple[Precedence, str] | None = None
    for text in versions:
        v = parse_version(text)
        if r.matches(v):
            key = (v.precedence, text)
            if best is None or key > best:
                best = key
    return None if best is None else best[1]
