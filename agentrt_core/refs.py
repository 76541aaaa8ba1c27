"""The reference grammar: one syntax for naming registry objects everywhere.

``@`` pins, ``:`` follows:

============================  =================  ==========================================
text                          type               meaning
============================  =================  ==========================================
``sha256:<64 hex>``           :class:`DigestRef`      exactly this content
``name@sha256:<64 hex>``      :class:`NameDigestRef`  this content, asserted to be ``name``
``name@2.1.0`` / ``name@7``   :class:`VersionRef`     a component version (semver or integer)
``name@agent_v7``             :class:`VersionRef`     an agent version label
``name:prod``                 :class:`TagRef`         whatever the tag points at when used
``name@^2.1``                 :class:`RangeRef`       highest matching version, at publish time
============================  =================  ==========================================

Ranges follow node-semver (caret, tilde, x-ranges, comparator sets, ``||``) and are accepted
only when the caller says so (``allow_range=True``), because a range is resolved once, when a
definition is published; everywhere else a range would make a reference mean different things
on different days.

This module is pure (no I/O) and is the lowest layer of the registry: :mod:`agentrt_core.canonical`
builds on its name, version and digest grammar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from agentrt_core.tag_names import is_tag_spelling

__all__ = [
    "DIGEST_RE",
    "NAME_RE",
    "TAG_RE",
    "Comparator",
    "DigestRef",
    "NameDigestRef",
    "RangeRef",
    "Ref",
    "RefError",
    "TagRef",
    "Version",
    "VersionRange",
    "VersionRef",
    "compare_versions",
    "format_ref",
    "is_digest",
    "is_int_version",
    "is_semver",
    "is_settable_tag",
    "is_valid_label",
    "is_valid_name",
    "is_valid_tag",
    "is_valid_version",
    "max_satisfying",
    "parse_range",
    "parse_ref",
    "parse_version",
]

# ``\Z`` rather than ``$``: in Python ``$`` also matches before a trailing newline, and
# "sha256:…\n" must not pass as a digest.
DIGEST_RE: Final = re.compile(r"^sha256:[0-9a-f]{64}\Z")
"""A content digest: ``sha256:`` and 64 lowercase hex digits (the only accepted spelling)."""

# A tool's name is sent to model providers as the function name, and providers accept
# `^[a-zA-Z0-9_-]{1,64}$` (no dots), so every name fits that. Lowercase only: `Repo-Debug` and
# `repo-debug` as two objects would confuse every auditor reading a log. A leading letter
# keeps names apart from versions and digests at a glance.
NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_-]{0,63}\Z")
"""Component and agent names: 1-64 of ``[a-z0-9_-]``, starting with a letter."""

# The OCI tag grammar, used for tags and agent version labels alike.
TAG_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
"""Tags and version labels: 1-128 of ``[A-Za-z0-9._-]``, not starting with ``.`` or ``-``."""

_HEX64_RE: Final = re.compile(r"[0-9a-fA-F]{64}")
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
# The one name that would make `sha256:<hex>` ambiguous between a digest and a tag.
_RESERVED_NAMES: Final = frozenset({"sha256"})


class RefError(ValueError):
    """A reference, version or range that does not follow the grammar.

    The message says what is wrong in words a caller can act on; it is meant to be used as the
    ``description`` of a ``google.rpc.BadRequest.FieldViolation`` whose ``field`` the caller
    knows (this module does not know which request field the text came from).
    """


# --------------------------------------------------------------------------------------------
# Grammar predicates
# --------------------------------------------------------------------------------------------


def is_digest(s: str) -> bool:
    """Return whether ``s`` is a digest: ``sha256:`` and 64 lowercase hex digits."""
    return DIGEST_RE.match(s) is not None


def is_valid_name(s: str) -> bool:
    """Return whether ``s`` is a valid component or agent name (see :data:`NAME_RE`).

    ``sha256`` is reserved so that ``sha256:<hex>`` can only ever be read as a digest.
    """
    return NAME_RE.match(s) is not None and s not in _RESERVED_NAMES


def _looks_like_digest(s: str) -> bool:
    # A 64-hex-digit tag or label would read, in a log or a CLI, as an abbreviated digest.
    return _HEX64_RE.fullmatch(s) is not None


def is_valid_tag(s: str) -> bool:
    """Return whether ``s`` is a valid tag (OCI tag grammar, and not 64 hex digits)."""
    return TAG_RE.match(s) is not None and not _looks_like_digest(s)


def is_settable_tag(s: str) -> bool:
    """Return whether a caller may set ``s`` as a tag: a valid tag, spelt as tags are set
    (lower case: ``agentrt_core.tag_names``, the rule tag policies' patterns follow too, so a
    policy covers every tag that can be set). Tags that older servers stored with capitals
    still resolve, and can be deleted."""
    return is_valid_tag(s) and is_tag_spelling(s)


def is_valid_label(s: str) -> bool:
    """Return whether ``s`` is a valid agent version label such as ``agent_v7``.

    Labels use the tag grammar and, like tags, may not look like a digest.
    """
    return is_valid_tag(s)


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


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def _require_name(name: str) -> None:
    if not is_valid_name(name):
        raise RefError(
            f"{name!r} is not a valid name: use 1-64 lowercase letters, digits, '_' or '-', "
            "starting with a letter ('sha256' is reserved)"
        )


def _require_digest(digest: str) -> None:
    if not is_digest(digest):
        hint = " (hex digits must be lowercase)" if digest.lower() != digest else ""
        raise RefError(
            f"{digest!r} is not a valid digest: expected 'sha256:' and 64 hex digits{hint}"
        )


@dataclass(frozen=True, slots=True)
class DigestRef:
    """A bare digest, ``sha256:<hex>``: names content, of whatever object has it."""

    digest: str

    def __post_init__(self) -> None:
        _require_digest(self.digest)


@dataclass(frozen=True, slots=True)
class NameDigestRef:
    """``name@sha256:<hex>``: a digest, plus the name the caller expects it to belong to."""

    name: str
    digest: str

    def __post_init__(self) -> None:
        _require_name(self.name)
        _require_digest(self.digest)


@dataclass(frozen=True, slots=True)
class VersionRef:
    """``name@version``: a component version (semver/integer) or an agent version label.

    The parser cannot know whether ``name`` is a component or an agent, so it accepts either
    form; the registry checks the right one when it looks the reference up.
    """

    name: str
    version: str

    def __post_init__(self) -> None:
        _require_name(self.name)
        if not (is_valid_version(self.version) or is_valid_label(self.version)):
            raise RefError(
                f"{self.version!r} is not a valid version or label: expected a version such "
                "as '2.1.0' or '3', or a label such as 'agent_v7' (1-128 of A-Z a-z 0-9 . _ -, "
                "not starting with '.' or '-', not 64 hex digits)"
            )


@dataclass(frozen=True, slots=True)
class TagRef:
    """``name:tag``: follows a mutable tag; resolved when used and recorded as its digest."""

    name: str
    tag: str

    def __post_init__(self) -> None:
        _require_name(self.name)
        if not is_valid_tag(self.tag):
            raise RefError(
                f"{self.tag!r} is not a valid tag: use 1-128 of A-Z a-z 0-9 . _ -, not starting "
                "with '.' or '-', and not 64 hex digits"
            )


@dataclass(frozen=True, slots=True)
class RangeRef:
    """``name@<range>``: allowed only inside a definition being published, resolved then."""

    name: str
    range: str

    def __post_init__(self) -> None:
        _require_name(self.name)
        if is_valid_version(self.range):
            # `x@1.2.3` and `x@2` are exact versions wherever they appear; a RangeRef that
            # held one would not survive a format/parse round trip.
            raise RefError(f"{self.range!r} is an exact version, not a range")
        parse_range(self.range)

    @property
    def parsed(self) -> VersionRange:
        """The parsed range."""
        return parse_range(self.range)


Ref = DigestRef | NameDigestRef | VersionRef | TagRef | RangeRef
"""Any reference."""


def parse_ref(s: str, *, allow_range: bool = False) -> Ref:
    """Parse a reference.

    An exact version wins over a range (``read_file@1`` is version 1, not ``1.x``); with
    ``allow_range`` a text that is not an exact version but reads as a range (``2.1``,
    ``1.x``) is a range, even if it would also be a valid label.

    Args:
        s: The reference text.
        allow_range: Accept ``name@<range>``; only a definition being published may.

    Returns:
        The typed reference.

    Raises:
        RefError: ``s`` is not a valid reference; the message says which part is wrong.
    """
    if not s:
        raise RefError("the reference is empty")
    if s != s.strip():
        raise RefError(f"{s!r} is not a valid reference: it has leading or trailing spaces")
    if s.startswith("sha256:"):
        return DigestRef(s)
    if "@" in s:
        name, _, rest = s.partition("@")
        _require_name(name)
        if rest.startswith("sha256:"):
            return NameDigestRef(name, rest)
        if is_valid_version(rest):
            return VersionRef(name, rest)
        if allow_range:
            try:
                return RangeRef(name, rest)
            except RefError:
                if not is_valid_label(rest):
                    raise
        if is_valid_label(rest):
            return VersionRef(name, rest)
        try:
            parse_range(rest)
        except RefError:
            pass
        else:
            raise RefError(
                f"{s!r}: version ranges such as {rest!r} are allowed only in a definition "
                "being published; pin a version, a digest or a tag"
            )
        return VersionRef(name, rest)  # raises, with the version/label explanation
    if ":" in s:
        name, _, tag = s.partition(":")
        return TagRef(name, tag)
    raise RefError(
        f"{s!r} is not a reference: add '@<version>', '@sha256:<hex>' or ':<tag>' to the name"
    )


def format_ref(ref: Ref) -> str:
    """Format a reference back to text; ``parse_ref(format_ref(r)) == r`` for every ``r``.

    Args:
        ref: A reference.

    Returns:
        The reference text.
    """
    match ref:
        case DigestRef(digest=digest):
            return digest
        case NameDigestRef(name=name, digest=digest):
            return f"{name}@{digest}"
        case VersionRef(name=name, version=version):
            return f"{name}@{version}"
        case TagRef(name=name, tag=tag):
            return f"{name}:{tag}"
        case RangeRef(name=name, range=range_):
            return f"{name}@{range_}"
    raise TypeError(f"not a reference: {ref!r}")  # pragma: no cover
