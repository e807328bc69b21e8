"""A minimal protocol-buffers wire-format decoder (enough for Chakra execution traces).

Messages are decoded field by field without a schema: :func:`fields` yields ``(number, wire_type,
value)`` where ``value`` is an int for varint and fixed-width fields and bytes for length-delimited
ones; the caller interprets them by field number, after :func:`fields` has checked the wire types
of the fields it names.  :func:`delimited` splits a stream of varint-length-prefixed messages (how
Chakra writes its ``.et`` files).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
WIRE_TYPE_NAMES = {VARINT: "varint", FIXED64: "64-bit", LENGTH_DELIMITED: "length-delimited", FIXED32: "32-bit"}


class ProtobufError(ValueError):
    """Bytes that are not a valid protobuf encoding (the message says where)."""


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at ``position`` and the position after it."""
    result = 0
    shift = 0
    while True:
        if position >= len(data):
            raise ProtobufError(f"truncated varint at byte {position}")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ProtobufError(f"varint longer than 10 bytes at byte {position}")


def fields(
    data: bytes, schema: Mapping[int, tuple[str, tuple[int, ...]]] | None = None
) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field_number, wire_type, value)`` of every field of one encoded message.

    Parameters
    ----------
    data
        The encoded message.
    schema
        ``{field_number: (field_name, allowed_wire_types)}``: a field it names with another wire
        type is a :class:`ProtobufError` naming the field; fields it does not name are not checked.
    """
    position = 0
    end = len(data)
    while position < end:
        key, position = read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ProtobufError(f"field number 0 at byte {position}")
        if wire_type == VARINT:
            value, position = read_varint(data, position)
        elif wire_type == FIXED64:
            if position + 8 > end:
                raise ProtobufError(f"truncated 64-bit field {number} at byte {position}")
            value = int.from_bytes(data[position:position + 8], "little")
            position += 8
        elif wire_type == LENGTH_DELIMITED:
            length, position = read_varint(data, position)
            if position + length > end:
                raise ProtobufError(f"field {number} claims {length} bytes at byte {position}; only {end - position} left")
            value = data[position:position + length]
            position += length
        elif wire_type == FIXED32:
            if position + 4 > end:
                raise ProtobufError(f"truncated 32-bit field {number} at byte {position}")
            value = int.from_bytes(data[position:position + 4], "little")
            position += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire_type} (field {number}) at byte {position}")
        if schema is not None and number in schema and wire_type not in schema[number][1]:
            name, allowed = schema[number]
            raise ProtobufError(f"field {number} ('{name}') is {WIRE_TYPE_NAMES[wire_type]}-encoded, expected "
                                f"{' or '.join(WIRE_TYPE_NAMES[w] for w in allowed)}")
        yield number, wire_type, value


def delimited(data: bytes) -> Iterator[bytes]:
    """The messages of a stream of varint-length-prefixed messages."""
    position = 0
    while position < len(data):
        length, position = read_varint(data, position)
        if position + length > len(data):
            raise ProtobufError(f"message at byte {position} claims {length} bytes; only {len(data) - position} left")
        yield data[position:position + length]
        position += length


def signed64(value: int) -> int:
    """A varint read as two's-complement int64 (int32/int64 fields)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def zigzag(value: int) -> int:
    """A varint read as sint32/sint64 (zigzag encoding)."""
    return (value >> 1) ^ -(value & 1)


def packed_varints(value: int | bytes, wire_type: int) -> list[int]:
    """A repeated varint field: packed (length-delimited) or one element."""
    if wire_type == VARINT:
        return [int(value)]
    result = []
    position = 0
    while position < len(value):
        item, position = read_varint(value, position)
        result.append(item)
    return result


def double(value: int) -> float:
    """A fixed64 field read as a double."""
    return struct.unpack("<d", value.to_bytes(8, "little"))[0]


def single(value: int) -> float:
    """A fixed32 field read as a float."""
    return struct.unpack("<f", value.to_bytes(4, "little"))[0]
