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

Versions and ranges themselves (their grammar, precedence and matching) are in
:mod:`agentrt_core.semver`; this module names things: names, tags, labels, digests, and the
references made of them. :class:`~agentrt_core.semver.RefError` and the version predicates
(:func:`~agentrt_core.semver.is_valid_version`, :func:`~agentrt_core.semver.is_semver`,
:func:`~agentrt_core.semver.is_int_version`) are part of this module's API too: every parser
here raises the one, and a reference's grammar includes the others (``name@2.1.0``).

This module is pure (no I/O) and is the lowest layer of the registry: :mod:`agentrt_core.canonical`
builds on its name, version and digest grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from agentrt_core.semver import (
    RefError,
    VersionRange,
    is_int_version,
    is_semver,
    is_valid_version,
    parse_range,
)
from agentrt_core.tag_names import is_tag_spelling

__all__ = [
    "DIGEST_RE",
    "NAME_RE",
    "TAG_RE",
    "DigestRef",
    "NameDigestRef",
    "RangeRef",
    "Ref",
    "RefError",
    "TagRef",
    "VersionRef",
    "format_ref",
    "is_digest",
    "is_int_version",
    "is_semver",
    "is_settable_tag",
    "is_valid_label",
    "is_valid_name",
    "is_valid_tag",
    "is_valid_version",
    "parse_ref",
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
# The one name that would make `sha256:<hex>` ambiguous between a digest and a tag.
_RESERVED_NAMES: Final = frozenset({"sha256"})


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
