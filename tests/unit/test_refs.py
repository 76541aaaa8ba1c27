"""The reference grammar: names, tags, labels, versions, ranges and references
(``agentrt_core.refs`` and ``agentrt_core.semver``)."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt_core.refs import (
    DigestRef,
    NameDigestRef,
    RangeRef,
    Ref,
    RefError,
    TagRef,
    VersionRef,
    format_ref,
    is_digest,
    is_valid_label,
    is_valid_name,
    is_valid_tag,
    parse_ref,
)
from agentrt_core.semver import (
    compare_versions,
    is_int_version,
    is_semver,
    is_valid_version,
    max_satisfying,
    parse_range,
    parse_version,
)

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"

# --------------------------------------------------------------------------------------------
# Grammar tables
# --------------------------------------------------------------------------------------------

GOOD_NAMES = [
    "a",
    "repo-debug",
    "coding_agent",
    "read_file",
    "a-",
    "a_",
    "a--b",
    "a0",
    "sha",
    "sha256x",
    "x" * 64,
]
BAD_NAMES = [
    "",
    "0",
    "0a",
    "_a",
    "-a",
    "A",
    "Repo",
    "readFile",
    "a.b",
    "a.",
    "x" * 65,
    "sha256",
    "\u00e9",
    "a\u0661",
    "a\n",
    "a/b",
    "a:b",
    "a@b",
    "a b",
]
GOOD_TAGS = ["prod", "canary", "v1.2.3", "_x", "A", "agent_v7", "0", "a" * 128, "a" * 63 + "g" * 1]
BAD_TAGS = [
    "",
    ".x",
    "-x",
    "a:b",
    "a@b",
    "a b",
    "a" * 129,
    "0" * 64,
    "aBcDeF" * 10 + "abcd",
    "prod\n",
    "\u00e9",
    "1.0.0+build",
]
GOOD_SEMVER = [
    "0.0.0",
    "1.2.3",
    "10.20.30",
    "1.0.0-rc.1+build.5",
    "1.0.0-alpha",
    "1.0.0-0.3.7",
    "1.0.0-x.7.z.92",
    "1.0.0+20130313144700",
    "1.0.0-beta+exp.sha.5114f85",
    "1.0.0-alpha-a.b-c-somethinglong+build.1-aef.1-its-okay",
    "1.0.0--",
]
BAD_SEMVER = [
    "1",
    "1.2",
    "01.2.3",
    "1.02.3",
    "1.2.03",
    "1.2.3-01",
    "1.2.3-",
    "1.2.3+",
    "v1.2.3",
    "1.2.3.4",
    "1.2.3-a..b",
    "\u0661.\u0662.\u0663",
    "1.2.3\n",
    " 1.2.3",
    "1.2.3+a+b",
    "1.2.3-" + "a" * 130,
]
GOOD_INT = ["1", "7", "10", "123456789012345678901234567890"]
BAD_INT = ["0", "01", "-1", "+1", "1.0", "", "1\n", "\u0661"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names(name: str) -> None:
    assert is_valid_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names(name: str) -> None:
    assert not is_valid_name(name)


# What model providers accept as a function (tool) name.
PROVIDER_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@given(st.text(alphabet="az09_-.AZ\u00e9\n", max_size=70))
def test_every_valid_name_is_a_valid_provider_function_name(text: str) -> None:
    if is_valid_name(text):
        assert PROVIDER_FUNCTION_NAME.fullmatch(text)
        assert text == text.lower() and text[0].isalpha()


@pytest.mark.parametrize("tag", GOOD_TAGS)
def test_good_tags_and_labels(tag: str) -> None:
    assert is_valid_tag(tag) and is_valid_label(tag)


@pytest.mark.parametrize("tag", BAD_TAGS)
def test_bad_tags_and_labels(tag: str) -> None:
    assert not is_valid_tag(tag) and not is_valid_label(tag)


@pytest.mark.parametrize("version", GOOD_SEMVER)
def test_good_semver(version: str) -> None:
    assert is_semver(version) and is_valid_version(version) and not is_int_version(version)


@pytest.mark.parametrize("version", BAD_SEMVER)
def test_bad_semver(version: str) -> None:
    assert not is_semver(version)


@pytest.mark.parametrize("version", GOOD_INT)
def test_good_int_versions(version: str) -> None:
    assert is_int_version(version) and is_valid_version(version) and not is_semver(version)


@pytest.mark.parametrize("version", BAD_INT)
def test_bad_int_versions(version: str) -> None:
    assert not is_int_version(version)


def test_digests() -> None:
    assert is_digest(DIGEST)
    for bad in [
        HEX,
        DIGEST.upper(),
        f"sha256:{HEX.upper()}",
        DIGEST[:-1],
        DIGEST + "0",
        f"sha512:{HEX}",
        DIGEST + "\n",
        f"SHA256:{HEX}",
    ]:
        assert not is_digest(bad), bad


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------

PARSED: list[tuple[str, Ref, Ref]] = [
    (DIGEST, DigestRef(DIGEST), DigestRef(DIGEST)),
    (
        f"coding_agent@{DIGEST}",
        NameDigestRef("coding_agent", DIGEST),
        NameDigestRef("coding_agent", DIGEST),
    ),
    ("repo-debug@2.1.0", VersionRef("repo-debug", "2.1.0"), VersionRef("repo-debug", "2.1.0")),
    ("read_file@1", VersionRef("read_file", "1"), VersionRef("read_file", "1")),
    (
        "x@1.0.0-rc.1+build.5",
        VersionRef("x", "1.0.0-rc.1+build.5"),
        VersionRef("x", "1.0.0-rc.1+build.5"),
    ),
    (
        "coding_agent@agent_v7",
        VersionRef("coding_agent", "agent_v7"),
        VersionRef("coding_agent", "agent_v7"),
    ),
    ("coding_agent:prod", TagRef("coding_agent", "prod"), TagRef("coding_agent", "prod")),
    ("coding_agent:v1.2", TagRef("coding_agent", "v1.2"), TagRef("coding_agent", "v1.2")),
    # Label-looking ranges: a label outside a definition, a range inside one.
    ("x@1.x", VersionRef("x", "1.x"), RangeRef("x", "1.x")),
    ("x@2.1", VersionRef("x", "2.1"), RangeRef("x", "2.1")),
]


@pytest.mark.parametrize(("text", "plain", "in_definition"), PARSED)
def test_parse_ref(text: str, plain: Ref, in_definition: Ref) -> None:
    assert parse_ref(text) == plain
    assert parse_ref(text, allow_range=True) == in_definition
    assert format_ref(plain) == text
    assert format_ref(in_definition) == text


@pytest.mark.parametrize(
    "text", ["x@^2.1", "x@~1.2.3", "x@1.2.*", "x@*", "x@>=1.2.0 <2.0.0", "x@^1 || ^2"]
)
def test_ranges_only_in_definitions(text: str) -> None:
    with pytest.raises(RefError, match="only in a definition being published"):
        parse_ref(text)
    ref = parse_ref(text, allow_range=True)
    assert isinstance(ref, RangeRef)
    assert format_ref(ref) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("x", "not a reference"),
        (" x@1", "spaces"),
        ("x@1 ", "spaces"),
        ("X@1", "not a valid name"),
        ("sha256@1", "not a valid name"),
        ("@1", "not a valid name"),
        ("a.b@1", "not a valid name"),
        ("1x@1", "not a valid name"),
        ("x" * 65 + "@1", "1-64 lowercase"),
        ("x@", "not a valid version or label"),
        ("x:", "not a valid tag"),
        (f"x:{HEX}", "not a valid tag"),
        ("x:a:b", "not a valid tag"),
        ("x@sha256:abc", "not a valid digest"),
        (f"x@sha256:{HEX.upper()}", "lowercase"),
        (f"sha256:{HEX.upper()}", "lowercase"),
        ("sha256:prod", "not a valid digest"),
        ("x@a b", "not a valid version or label"),
        ("x@.x", "not a valid version or label"),
        ("x@1.2.3 - 2.0.0", "not a valid version or label"),
    ],
)
def test_bad_refs(text: str, message: str) -> None:
    with pytest.raises(RefError, match=message):
        parse_ref(text)


def test_bad_ranges_in_definitions() -> None:
    with pytest.raises(RefError, match="hyphen"):
        parse_ref("x@1.2.3 - 2.0.0", allow_range=True)
    with pytest.raises(RefError, match="not a valid version range"):
        parse_ref("x@^1.x.3", allow_range=True)
    with pytest.raises(RefError, match="exact version"):
        RangeRef("x", "1.2.3")


def test_ref_types_validate_on_construction() -> None:
    makers: list[Callable[[], object]] = [
        lambda: DigestRef("sha256:x"),
        lambda: NameDigestRef("X", DIGEST),
        lambda: VersionRef("x", "a b"),
        lambda: TagRef("x", "0" * 64),
        lambda: RangeRef("x", "^^1"),
    ]
    for make in makers:
        with pytest.raises(RefError):
            make()


names = st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True).filter(is_valid_name)
digests = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(
    lambda h: f"sha256:{h}"
)
numbers = st.integers(0, 30).map(str)
identifiers = st.from_regex(
    r"(?:0|[1-9][0-9]{0,2}|[0-9]*[a-zA-Z-][0-9a-zA-Z-]{0,4})", fullmatch=True
)
semvers = st.builds(
    lambda M, m, p, pre, build: (
        f"{M}.{m}.{p}"
        + (f"-{'.'.join(pre)}" if pre else "")
        + (f"+{'.'.join(build)}" if build else "")
    ),
    numbers,
    numbers,
    numbers,
    st.lists(identifiers, max_size=3),
    st.lists(st.from_regex(r"[0-9a-zA-Z-]{1,4}", fullmatch=True), max_size=2),
)
int_versions = st.integers(1, 10**6).map(str)
labels = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,15}", fullmatch=True).filter(is_valid_label)
partials = st.one_of(
    semvers,
    st.builds(lambda M, m: f"{M}.{m}", numbers, numbers),
    numbers,
    st.builds(lambda M, x: f"{M}.{x}", numbers, st.sampled_from(["x", "X", "*"])),
    st.builds(lambda M, m, x: f"{M}.{m}.{x}", numbers, numbers, st.sampled_from(["x", "*"])),
    st.just("*"),
)
comparators = st.builds(
    lambda op, v: op + v, st.sampled_from(["", "^", "~", ">", ">=", "<", "<=", "="]), partials
)
ranges = st.lists(
    st.lists(comparators, min_size=1, max_size=3).map(" ".join), min_size=1, max_size=3
).map(" || ".join)
refs = st.one_of(
    st.builds(DigestRef, digests),
    st.builds(NameDigestRef, names, digests),
    st.builds(VersionRef, names, st.one_of(semvers, int_versions, labels)),
    st.builds(TagRef, names, labels),
    st.builds(RangeRef, names, ranges.filter(lambda r: not is_valid_version(r))),
)


@given(refs)
def test_format_then_parse_round_trips(ref: Ref) -> None:
    text = format_ref(ref)
    assert parse_ref(text, allow_range=isinstance(ref, RangeRef)) == ref
    if not isinstance(ref, RangeRef | VersionRef):
        assert parse_ref(text, allow_range=True) == ref


@given(st.text(max_size=40), st.booleans())
def test_parse_ref_raises_only_ref_error(text: str, allow_range: bool) -> None:
    try:
        ref = parse_ref(text, allow_range=allow_range)
    except RefError:
        return
    assert format_ref(ref) == text


@given(st.text(alphabet="0123456789.xX*^~<>=| -+abc", max_size=24))
def test_parse_range_raises_only_ref_error(text: str) -> None:
    try:
        parsed = parse_range(text)
    except RefError:
        return
    assert parsed.text == text
    assert all(parsed.alternatives)


# --------------------------------------------------------------------------------------------
# Versions and ranges
# --------------------------------------------------------------------------------------------


def test_precedence_follows_semver_section_11() -> None:
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2",
        "2.1.0",
        "10.0.0",
    ]
    for lower, higher in itertools.pairwise(chain):
        assert compare_versions(lower, higher) < 0, (lower, higher)
        assert compare_versions(higher, lower) > 0
    assert compare_versions("1.0.0+a", "1.0.0+b") == 0
    assert compare_versions("2", "2.0.0") == 0
    assert parse_version("3") == parse_version("3.0.0")
    assert str(parse_version("1.0.0-rc.1+build.5")) == "1.0.0-rc.1+build.5"
    with pytest.raises(RefError):
        compare_versions("1.0", "1.0.0")


@pytest.mark.parametrize(
    ("range_", "desugared"),
    [
        ("^1.2", ">=1.2.0 <2.0.0-0"),
        ("^1.2.3", ">=1.2.3 <2.0.0-0"),
        ("^0.2.3", ">=0.2.3 <0.3.0-0"),
        ("^0.0.3", ">=0.0.3 <0.0.4-0"),
        ("^0.0", ">=0.0.0 <0.1.0-0"),
        ("^0", ">=0.0.0 <1.0.0-0"),
        ("^1.2.3-beta.2", ">=1.2.3-beta.2 <2.0.0-0"),
        ("~1.2", ">=1.2.0 <1.3.0-0"),
        ("~1.2.3", ">=1.2.3 <1.3.0-0"),
        ("~1", ">=1.0.0 <2.0.0-0"),
        ("1.x", ">=1.0.0 <2.0.0-0"),
        ("1", ">=1.0.0 <2.0.0-0"),
        ("1.2.*", ">=1.2.0 <1.3.0-0"),
        ("*", ">=0.0.0"),
        ("x", ">=0.0.0"),
        ("1.2.3", "=1.2.3"),
        ("=1.2", ">=1.2.0 <1.3.0-0"),
        (">1.2", ">=1.3.0"),
        (">1", ">=2.0.0"),
        (">=1.2", ">=1.2.0"),
        ("<1.2", "<1.2.0-0"),
        ("<=1.2", "<1.3.0-0"),
        ("<=1", "<2.0.0-0"),
        (">*", "<0.0.0-0"),
        (">= 1.2.0  < 2", ">=1.2.0 <2.0.0-0"),
        ("^1 || ~2.1", ">=1.0.0 <2.0.0-0 || >=2.1.0 <2.2.0-0"),
    ],
)
def test_ranges_desugar_like_node_semver(range_: str, desugared: str) -> None:
    parsed = parse_range(range_)
    assert parsed.text == range_
    text = " || ".join(" ".join(str(c) for c in cs) for cs in parsed.alternatives)
    assert text == desugared


MATCHES = [
    ("^1.2", "1.2.0", True),
    ("^1.2", "1.9.9", True),
    ("^1.2", "2.0.0", False),
    ("^1.2", "1.1.9", False),
    ("^1.2", "2.0.0-rc.1", False),
    ("^1.2", "1.5.0-rc.1", False),
    ("^1.2.3", "1.2.3", True),
    ("^1.2.3", "1.2.2", False),
    ("^0.2.3", "0.2.9", True),
    ("^0.2.3", "0.3.0", False),
    ("^0.0.3", "0.0.3", True),
    ("^0.0.3", "0.0.4", False),
    ("^0", "0.9.0", True),
    ("^0", "1.0.0", False),
    ("^0.0", "0.0.9", True),
    ("^0.0", "0.1.0", False),
    ("~1.2", "1.2.9", True),
    ("~1.2", "1.3.0", False),
    ("~1.2.3", "1.2.3", True),
    ("~1.2.3", "1.2.2", False),
    ("~1", "1.9.0", True),
    ("~1", "2.0.0", False),
    ("1.x", "1.0.0", True),
    ("1.x", "2.0.0", False),
    ("1.2.*", "1.2.7", True),
    ("1.2.*", "1.3.0", False),
    ("*", "0.0.0", True),
    ("*", "999.0.0", True),
    ("*", "1.0.0-rc.1", False),
    (">=1.2.0 <2.0.0", "1.5.0", True),
    (">=1.2.0 <2.0.0", "2.0.0", False),
    (">=1.2.0 <2.0.0", "1.1.0", False),
    ("^1 || ^3", "3.1.0", True),
    ("^1 || ^3", "2.0.0", False),
    (">1.2", "1.3.0", True),
    (">1.2", "1.2.9", False),
    ("<=1.2", "1.2.9", True),
    ("<=1.2", "1.3.0", False),
    ("<1.2", "1.1.9", True),
    ("<1.2", "1.2.0-rc.1", False),
    ("<*", "0.0.0", False),
    (">=*", "1.0.0", True),
    # Prereleases match only a comparator naming the same major.minor.patch with a prerelease.
    ("^1.2.3-beta.1", "1.2.3-beta.2", True),
    ("^1.2.3-beta.1", "1.2.3-alpha", False),
    ("^1.2.3-beta.1", "1.2.4-beta.1", False),
    ("^1.2.3-beta.1", "1.2.3", True),
    ("^1.2.3-beta.1", "1.9.0", True),
    (">=1.0.0-rc.1", "1.0.0-rc.2", True),
    (">=1.0.0-rc.1", "1.0.1-rc.1", False),
    ("1.0.0-rc.1", "1.0.0-rc.1", True),
    ("~1.2.3-beta.2", "1.2.3-beta.4", True),
    ("~1.2.3-beta.2", "1.2.4-beta.2", False),
    ("<1.2.3-rc.1", "1.2.3-beta", True),
    ("<1.2.3-rc.1", "1.2.2-zzz", False),
    # Build metadata is ignored.
    ("=1.0.0", "1.0.0+build", True),
    ("1.2.3+b", "1.2.3", True),
    ("^1.0.0+x", "1.4.0+y", True),
    # Integer versions are N.0.0.
    ("^3", "3", True),
    ("^3", "4", False),
    ("2", "2", True),
    (">=2 <4", "3", True),
    ("^2.1", "2", False),
    ("~2", "2", True),
]


@pytest.mark.parametrize(("range_", "version", "expected"), MATCHES)
def test_range_matches(range_: str, version: str, expected: bool) -> None:
    assert parse_range(range_).matches(version) is expected


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ^1",
        "^1 ",
        "^",
        "1.x.3",
        "^1.2.3-",
        "a",
        ">=",
        "1 ||",
        "|| 1",
        "v1.2.3",
        "^1.2.x-beta",
        "1.2.3.4",
        "1.2.3 - 2.0.0",
        "^01.2",
        "~>1.2",
        "1 | 2",
        "1.2.3-01",
    ],
)
def test_bad_ranges(bad: str) -> None:
    with pytest.raises(RefError):
        parse_range(bad)


def test_matches_refuses_invalid_versions() -> None:
    with pytest.raises(RefError):
        parse_range("^1").matches("agent_v7")


def test_max_satisfying() -> None:
    versions = ["1.0.0", "1.2.0", "1.10.0", "2.0.0", "1.11.0-rc.1", "0.9.0"]
    assert max_satisfying("^1.2", versions) == "1.10.0"  # numeric, not string, order
    assert max_satisfying(parse_range("~1.2"), versions) == "1.2.0"
    assert max_satisfying(">=1.11.0-rc.0 <2", versions) == "1.11.0-rc.1"
    assert max_satisfying("^3", versions) is None
    assert max_satisfying("^1", []) is None
    assert max_satisfying("^2", ["1", "2", "3"]) == "2"
    assert max_satisfying("*", ["2", "2.0.0"]) == "2.0.0"
    assert max_satisfying("1.x", ["1.0.0+b", "1.0.0+a"]) == "1.0.0+b"
    assert max_satisfying("1.x", ["1.0.0+a", "1.0.0+b"]) == "1.0.0+b"
    with pytest.raises(RefError):
        max_satisfying("^1", ["1.0.0", "latest"])


version_lists = st.lists(
    st.one_of(semvers, int_versions.map(lambda v: str(int(v) % 20 + 1))), max_size=8
)


@given(ranges, version_lists, st.randoms(use_true_random=False))
def test_max_satisfying_is_the_highest_match_whatever_the_order(
    range_: str, versions: list[str], rnd: random.Random
) -> None:
    parsed = parse_range(range_)
    best = max_satisfying(parsed, versions)
    shuffled = list(versions)
    rnd.shuffle(shuffled)
    assert max_satisfying(parsed, shuffled) == best
    matching = [v for v in versions if parsed.matches(v)]
    if best is None:
        assert not matching
    else:
        assert best in matching
        assert all(compare_versions(v, best) <= 0 for v in matching)


@given(numbers, numbers, numbers, semvers)
def test_caret_and_tilde_agree_with_their_definitions(
    M: str, m: str, p: str, candidate: str
) -> None:
    base = parse_version(f"{M}.{m}.{p}")
    v = parse_version(candidate)
    at_least = v.precedence >= base.precedence
    caret_same = (
        v.major == base.major
        if base.major
        else (v.major, v.minor) == (0, base.minor)
        if base.minor
        else (v.major, v.minor, v.patch) == (0, 0, base.patch)
    )
    release = not v.prerelease
    assert parse_range(f"^{M}.{m}.{p}").matches(candidate) is (at_least and caret_same and release)
    tilde_same = (v.major, v.minor) == (base.major, base.minor)
    assert parse_range(f"~{M}.{m}.{p}").matches(candidate) is (at_least and tilde_same and release)
