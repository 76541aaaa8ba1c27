"""Request bytes no protobuf encoder produces, for every RPC.

Invalid UTF-8 in each string field (top level and one message down), truncated varints and
lengths, wrong wire types, stray group tags, unknown fields, and Structs nested past the
parser's recursion limit. The server must answer each with a caller-error code; today's
generated code raises while decoding, before any handler runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from tests.fuzz.rpcs import Rpc, message_type

LEN, VARINT, I64, SGROUP, EGROUP, I32 = 2, 0, 1, 3, 4, 5
BAD_UTF8 = b"\xc3\x28"


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, body: bytes) -> bytes:
    return tag(number, LEN) + varint(len(body)) + body


def deep_struct(depth: int) -> bytes:
    """A google.protobuf.Struct ``{"a": {"a": ... 1.0}}`` ``depth`` Structs deep."""
    value = tag(2, I64) + b"\x00\x00\x00\x00\x00\x00\xf0\x3f"  # Value.number_value = 1.0
    for _ in range(depth):
        entry = length_delimited(1, b"a") + length_delimited(2, value)  # map entry key, value
        struct = length_delimited(1, entry)  # Struct.fields
        value = length_delimited(5, struct)  # Value.struct_value
    return struct


def _wire_type(field: FieldDescriptor) -> int:
    if (
        field.type
        in (
            FieldDescriptor.TYPE_STRING,
            FieldDescriptor.TYPE_BYTES,
            FieldDescriptor.TYPE_MESSAGE,
        )
        or field.is_repeated
    ):
        return LEN
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64):
        return I64
    if field.type in (
        FieldDescriptor.TYPE_FLOAT,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return I32
    return VARINT


def _bad_utf8_paths(descriptor: Descriptor, depth: int = 0) -> Iterator[tuple[str, bytes]]:
    """(field path, bytes) for invalid UTF-8 in each string field, and in the string fields
    of message fields one level down (``fence.attempt_id``, ``goal.objective``...)."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            yield field.name, length_delimited(field.number, BAD_UTF8)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and depth < 1:
            if message_type(field).full_name == "google.protobuf.Struct":
                entry = length_delimited(1, BAD_UTF8) + length_delimited(2, b"")
                yield (
                    f"{field.name}{{key}}",
                    length_delimited(field.number, length_delimited(1, entry)),
                )
                continue
            for path, inner in _bad_utf8_paths(message_type(field), depth + 1):
                yield f"{field.name}.{path}", length_delimited(field.number, inner)


def _struct_paths(descriptor: Descriptor, depth: int = 0) -> Iterator[tuple[str, list[int]]]:
    """Paths (names, field numbers) from the request to each Struct field, 3 levels down."""
    for field in descriptor.fields:
        if field.type != FieldDescriptor.TYPE_MESSAGE or message_type(field).GetOptions().map_entry:
            continue
        if message_type(field).full_name == "google.protobuf.Struct":
            yield field.name, [field.number]
        elif depth < 2 and not message_type(field).full_name.startswith("google.protobuf."):
            for path, numbers in _struct_paths(message_type(field), depth + 1):
                yield f"{field.name}.{path}", [field.number, *numbers]


def cases(rpc: Rpc) -> Iterator[tuple[str, bytes]]:
    """(what, bytes) for one request message of ``rpc``."""
    descriptor = rpc.input
    yield from ((f"invalid UTF-8 in {path}", body) for path, body in _bad_utf8_paths(descriptor))
    first = descriptor.fields[0] if descriptor.fields else None
    number = first.number if first else 1
    yield "truncated varint", tag(number, VARINT) + b"\xff"
    yield "length past the end", tag(number, LEN) + b"\x05ab"
    yield "tag without a value", tag(number, LEN)
    yield "overlong varint (11 bytes)", tag(number, VARINT) + b"\xff" * 10 + b"\x01"
    if first is not None:
        wrong = VARINT if _wire_type(first) != VARINT else LEN
        body = tag(number, wrong) + (b"\x01" if wrong == VARINT else b"\x01x")
        yield f"wrong wire type for {first.name}", body
        yield f"fixed32 for {first.name}", tag(number, I32) + b"\x00\x00\x00\x00"
    yield "stray start-group", tag(number, SGROUP)
    yield "stray end-group", tag(number, EGROUP)
    yield "field number 0", b"\x02\x00"
    yield "unknown field 1000 (varint)", tag(1000, VARINT) + b"\x01"
    yield "unknown field 1001 (invalid UTF-8 bytes)", length_delimited(1001, BAD_UTF8)
    yield "garbage", b"\xff\xff\xff\xff"
    for path, numbers in _struct_paths(descriptor):
        for depth in (101, 1000):
            body = deep_struct(depth)
            for number in reversed(numbers):
                body = length_delimited(number, body)
            yield f"{path} nested {depth} deep", body


def streams(rpc: Rpc) -> Iterator[tuple[str, list[bytes]]]:
    """(what, payloads) for every case: the single message of a unary request, or for a
    client stream the case alone, after a valid header, and the issue's bad chunk."""
    for what, body in cases(rpc):
        yield what, [body]
    if rpc.client_streaming:
        header = length_delimited(1, tag(2, VARINT) + varint(4))  # header{size: 4}
        for what, body in cases(rpc):
            yield f"header, then {what}", [header, body]
        yield "header with invalid UTF-8 media_type (0a040a01ff)", [bytes.fromhex("0a040a01ff")]
        yield (
            "header, then a chunk, then a truncated message",
            [
                header,
                length_delimited(2, b"abcd"),
                b"\x12\x05ab",
            ],
        )
