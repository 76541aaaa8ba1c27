"""Hypothesis strategies for any request message, built from its descriptor.

Every field gets either a value that passes validation (from the :class:`~tests.fuzz.pool.Pool`
of real ids, or a plain well-formed value) or a hostile one: NUL bytes, very long and odd
unicode strings, int64 extremes, non-finite and huge doubles, out-of-range enums, Timestamps
and Durations out of range or with bad nanos, Structs holding NaN, Infinity, huge numbers or
nesting past the parser's limit, and page tokens of the wrong shape. Mixing the two is what
makes a request reach the code that handles the hostile field.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from agentrt.runtime.v1 import message_pb2 as runtime_messages
from tests.fuzz.pool import Pool, encode_token
from tests.fuzz.rpcs import Rpc, message_type

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)

HOSTILE_STRINGS = [
    "",
    "a\x00b",
    "\x00",
    "run_\x00",
    "x" * 70_000,
    "\u202e\u0000\ufeff",
    "é" * 3000,
    "🦀" * 500,
    "../../etc/passwd",
    "'; DROP TABLE runs; --",
    "%s%s%n",
    " ",
    "\n\r\t",
    "sha256:" + "0" * 64,
    "sha256:" + "g" * 64,
    "coding_agent@",
    "@^1.0",
    "a" * 256,
]
HOSTILE_INTS = [0, -1, 1, I64_MAX, I64_MIN, I32_MAX, I32_MIN, 2**53 + 1]
HOSTILE_DOUBLES = [
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    -0.0,
    5e-324,
    float(2**70),
]
# Timestamps valid are 0001-01-01..9999-12-31 with nanos 0..999,999,999.
TIMESTAMP_SECONDS = [253402300800, -62135596801, I64_MAX, I64_MIN, 0, -1, 1_700_000_000]
DURATION_SECONDS = [2**62, -(2**62), 315_576_000_001, I64_MAX, I64_MIN, -1, 0, 1]
BAD_NANOS = [-1, 1_000_000_000, I32_MAX, I32_MIN]

#: Page-token payloads of the shapes paging.py does not expect (``k`` filled in later for
#: those with a real fingerprint).
ODD_KEYS: list[Any] = [
    [],
    ["x", "y"],
    [None, None],
    [{"a": 1}, [1]],
    [2**70, 2**70],
    [math.nan, math.inf],
    ["x"],
    [1, 2, 3, 4, 5, 6, 7],
    [-(2**63), "x"],
    "x",
    {"a": 1},
    None,
]
ODD_TOKENS = [
    encode_token(["x", "y"]),
    encode_token([None, None]),
    encode_token([{"a": 1}, [1]]),
    encode_token([2**70, 2**70]),
    encode_token({"f": 1, "k": []}),
    encode_token({"f": "", "k": None}),
    encode_token({"k": []}),
    encode_token(1e400),
    "!!!!",
    "e30",  # {}
    "a\x00b",
    "x" * 10_000,
]


@functools.cache
def strings() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=24))


@functools.cache
def _from_pool(pool: Pool, field_name: str) -> st.SearchStrategy[str]:
    """A value filed in the pool for this field, read when drawn (the pool grows as the
    server answers), or a plain string when it has none."""

    @st.composite
    def draw(data: st.DrawFn) -> str:
        index = data(st.integers(0, 1 << 16))
        found = pool.candidates(field_name)
        if not found:
            return data(st.sampled_from(["x", "fuzz", "a-b_c.1"]))
        # Mostly the first values (the witness's), which point at the deepest state.
        return found[index % min(len(found), 4)] if index % 3 else found[index % len(found)]

    return draw()


@functools.cache
def page_tokens(pool: Pool) -> st.SearchStrategy[str]:
    @st.composite
    def forged(data: st.DrawFn) -> str:
        keys = data(st.sampled_from(ODD_KEYS))
        fingerprint: Any = data(st.sampled_from(pool.fingerprints or ["0" * 16]))
        return encode_token({"f": fingerprint, "k": keys})

    return st.one_of(
        _from_pool(pool, "page_token"), forged(), st.sampled_from(ODD_TOKENS), strings()
    )


def timestamps() -> st.SearchStrategy[timestamp_pb2.Timestamp]:
    return st.builds(
        timestamp_pb2.Timestamp,
        seconds=st.one_of(st.sampled_from(TIMESTAMP_SECONDS), st.integers(0, 4_000_000_000)),
        nanos=st.one_of(st.just(0), st.sampled_from(BAD_NANOS), st.integers(0, 999_999_999)),
    )


def durations() -> st.SearchStrategy[duration_pb2.Duration]:
    return st.builds(
        duration_pb2.Duration,
        seconds=st.one_of(st.sampled_from(DURATION_SECONDS), st.integers(0, 120)),
        nanos=st.one_of(st.just(0), st.sampled_from(BAD_NANOS), st.integers(0, 999_999_999)),
    )


def _deep_value(depth: int, leaf: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if isinstance(leaf, float):
        value.number_value = leaf
    else:
        value.string_value = str(leaf)
    for level in range(depth):
        outer = struct_pb2.Value()
        if level % 2:
            outer.list_value.values.add().CopyFrom(value)
        else:
            outer.struct_value.fields["n"].CopyFrom(value)
        value = outer
    return value


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HOSTILE_DOUBLES),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(HOSTILE_STRINGS[:8]),
    st.text(max_size=8),
)


def _to_value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if data is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(data, bool):
        value.bool_value = data
    elif isinstance(data, float):
        value.number_value = data
    elif isinstance(data, str):
        value.string_value = data
    elif isinstance(data, list):
        for item in data:
            value.list_value.values.add().CopyFrom(_to_value(item))
    else:
        for key, item in data.items():
            value.struct_value.fields[key].CopyFrom(_to_value(item))
    return value


def structs() -> st.SearchStrategy[struct_pb2.Struct]:
    """Struct fields (arguments, goal.extra, message data...): sensible JSON objects, ones
    holding NaN/Infinity/huge numbers/NUL keys, and ones nested past 100 levels."""
    plain = st.recursive(
        json_leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(["path", "x", "", "a\x00b", "é"]), inner, max_size=3),
        ),
        max_leaves=8,
    )

    @st.composite
    def build(data: st.DrawFn) -> struct_pb2.Struct:
        struct = struct_pb2.Struct()
        shape = data(st.sampled_from(["plain", "path", "deep", "nonfinite"]))
        if shape == "path":
            struct.fields["path"].string_value = data(st.sampled_from(["a.txt", "a\x00b", ""]))
        elif shape == "deep":
            depth = data(st.sampled_from([50, 99, 101, 150, 400]))
            struct.fields["x"].CopyFrom(_deep_value(depth, data(st.sampled_from(HOSTILE_DOUBLES))))
        elif shape == "nonfinite":
            struct.fields["x"].number_value = data(st.sampled_from(HOSTILE_DOUBLES[:3]))
            struct.fields["path"].string_value = "a.txt"
        else:
            for key, item in data(st.dictionaries(st.text(max_size=6), plain, max_size=4)).items():
                struct.fields[key].CopyFrom(_to_value(item))
        return struct

    return build()


_TIMESTAMPS = timestamps()
_DURATIONS = durations()
_STRUCTS = structs()


@functools.cache
def fences(pool: Pool) -> st.SearchStrategy[runtime_messages.Fence]:
    """Mostly a real fence (of the witness's live attempt or another handed out), sometimes
    with its epoch pushed to an extreme."""

    @st.composite
    def build(data: st.DrawFn) -> runtime_messages.Fence:
        fence = runtime_messages.Fence()
        if pool.fences and data(st.integers(0, 4)) > 0:
            fence.CopyFrom(pool.fences[data(st.integers(0, len(pool.fences) - 1))])
            if not data(st.integers(0, 5)):
                fence.lease_epoch = data(st.sampled_from(HOSTILE_INTS))
        else:
            fence.attempt_id = data(st.one_of(_from_pool(pool, "attempt_id"), strings()))
            fence.lease_epoch = data(st.sampled_from(HOSTILE_INTS))
        return fence

    return build()


_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
}
_UINT32 = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32}
_UINT64 = {FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64}


_SCALARS: dict[tuple[str, int, bool], st.SearchStrategy[Any]] = {}


def scalar(field: FieldDescriptor, pool: Pool, calm: bool = False) -> st.SearchStrategy[Any]:
    """A value for a scalar field: hostile or valid, or with ``calm`` only valid ones."""
    key = (field.full_name, id(pool), calm)
    if key not in _SCALARS:
        _SCALARS[key] = _calm_scalar(field, pool) if calm else _scalar(field, pool)
    return _SCALARS[key]


def _calm_scalar(field: FieldDescriptor, pool: Pool) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return _from_pool(pool, field.name)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=16)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(0, 10)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values]
        return st.sampled_from(numbers[1:] or numbers)
    return st.integers(0, 10)


def _scalar(field: FieldDescriptor, pool: Pool) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        if field.name == "page_token":
            return page_tokens(pool)
        return st.one_of(_from_pool(pool, field.name), _from_pool(pool, field.name), strings())
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 4096), st.just(b"\x00"))
    if kind in _INT32:
        return st.one_of(
            st.integers(0, 10), st.sampled_from([-1, I32_MAX, I32_MIN]), st.integers(I32_MIN, 0)
        )
    if kind in _INT64:
        return st.one_of(st.integers(0, 10), st.sampled_from(HOSTILE_INTS))
    if kind in _UINT32:
        return st.one_of(st.integers(0, 10), st.just(2**32 - 1))
    if kind in _UINT64:
        return st.one_of(st.integers(0, 10), st.just(2**64 - 1))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.floats(0, 10), st.sampled_from(HOSTILE_DOUBLES))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.sampled_from([-1, 99, I32_MAX, I32_MIN]))
    raise AssertionError(f"unhandled field type {kind} of {field.full_name}")


_CACHE: dict[tuple[str, int, int, bool], st.SearchStrategy[Any]] = {}
_NOW = 1_800_000_000


def messages(
    descriptor: Descriptor, pool: Pool, depth: int = 0, calm: bool = False
) -> st.SearchStrategy[Any]:
    """A message of this type with a random subset of its fields set (built once per type:
    Hypothesis spends most of its time on strategies it has not seen before). A ``calm``
    message holds valid values only but for (at the top) one field, so it gets past the
    checks of every other field to the code that handles the hostile one."""
    key = (descriptor.full_name, id(pool), depth, calm)
    if key not in _CACHE:
        _CACHE[key] = _messages(descriptor, pool, depth, calm)
    return _CACHE[key]


def _messages(descriptor: Descriptor, pool: Pool, depth: int, calm: bool) -> st.SearchStrategy[Any]:
    special = descriptor.full_name
    if special == "google.protobuf.Timestamp":
        if calm:
            return st.builds(timestamp_pb2.Timestamp, seconds=st.integers(_NOW, _NOW + 86_400))
        return _TIMESTAMPS
    if special == "google.protobuf.Duration":
        if calm:
            return st.builds(duration_pb2.Duration, seconds=st.integers(0, 2))
        return _DURATIONS
    if special == "google.protobuf.Struct":
        if calm:
            return st.just({"path": "a.txt"}).map(_to_value).map(lambda v: v.struct_value)
        return _STRUCTS
    if special == "google.protobuf.Value":
        return (st.text(max_size=8) if calm else json_leaves).map(_to_value)
    if special == runtime_messages.Fence.DESCRIPTOR.full_name:
        return fences(pool)
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)

    @st.composite
    def build(data: st.DrawFn) -> Message:
        message = cls()
        hostile = data(st.integers(0, len(descriptor.fields))) if calm and depth == 0 else -1
        for index, field in enumerate(descriptor.fields):
            if index != hostile and not data(st.integers(0, 9)) < (6 if depth == 0 else 4):
                continue
            _fill(message, field, data, pool, depth, calm and index != hostile)
        return message

    return build()


def _fill(
    message: Message, field: FieldDescriptor, data: st.DrawFn, pool: Pool, depth: int, calm: bool
) -> None:
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and message_type(field).GetOptions().map_entry:
        key_field = message_type(field).fields_by_name["key"]
        value_field = message_type(field).fields_by_name["value"]
        for _ in range(data(st.integers(0, 3))):
            key = data(scalar(key_field, pool, calm))
            target = getattr(message, field.name)
            try:
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    value = data(messages(message_type(value_field), pool, depth + 1, calm))
                    target[key].CopyFrom(value)
                else:
                    target[key] = data(scalar(value_field, pool, calm))
            except (ValueError, TypeError):
                pass  # a value the Python runtime itself refuses to hold
        return
    if is_message and depth >= 3:
        return

    def one() -> Any:
        if is_message:
            return data(messages(message_type(field), pool, depth + 1, calm))
        return data(scalar(field, pool, calm))

    try:
        if field.is_repeated:
            sizes = st.integers(0, 3) if calm else st.one_of(st.integers(0, 3), st.just(200))
            count = data(sizes)
            items = [one() for _ in range(count if not is_message else min(count, 3))]
            target = getattr(message, field.name)
            if is_message:
                for item in items:
                    target.add().CopyFrom(item)
            else:
                target.extend(items)
        elif is_message:
            getattr(message, field.name).CopyFrom(one())
        else:
            setattr(message, field.name, one())
    except (ValueError, TypeError):
        pass


def requests(rpc: Rpc, pool: Pool) -> st.SearchStrategy[list[bytes]]:
    key = (rpc.path, id(pool), -1, False)
    if key not in _CACHE:
        _CACHE[key] = _requests(rpc, pool)
    return _CACHE[key]


def _requests(rpc: Rpc, pool: Pool) -> st.SearchStrategy[list[bytes]]:
    """The payloads of one call: one message, or for a client stream 1-4 messages (a header
    then chunks, or anything)."""
    single = st.one_of(messages(rpc.input, pool, calm=True), messages(rpc.input, pool)).map(
        lambda m: m.SerializeToString()
    )
    if not rpc.client_streaming:
        return single.map(lambda b: [b])
    return st.lists(single, min_size=1, max_size=4)
