"""Reading an ONNX file's protobuf wire format without decoding it: the cheap node count
:func:`onnx_node_count` that the importer (:mod:`engine.models.onnx_import`) runs before
anything is parsed."""

from __future__ import annotations

__all__ = ["onnx_node_count"]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The protobuf varint at ``data[pos:]`` and the position after it."""
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes, start: int, end: int):
    """(field number, wire type, payload start, payload end) of each field of the protobuf
    message in ``data[start:end]``, read from the wire format alone (nothing decoded)."""
    pos = start
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:  # varint
            _, after = _varint(data, pos)
        elif wire == 1:  # 64-bit
            after = pos + 8
        elif wire == 2:  # length-delimited: bytes, string, sub-message, packed
            size, pos = _varint(data, pos)
            after = pos + size
        elif wire == 5:  # 32-bit
            after = pos + 4
        else:  # groups (3, 4) are not in onnx.proto; anything else is not protobuf
            raise ValueError(f"wire type {wire}")
        if after > end or number == 0:
            raise ValueError("a field runs past its message")
        yield number, wire, pos, after
        pos = after


#: field numbers in onnx.proto: ModelProto.graph = 7, GraphProto.node = 1
_MODEL_GRAPH, _GRAPH_NODE = 7, 1


def onnx_node_count(data: bytes, stop_after: int | None = None) -> int:
    """How many nodes the main graph of an ONNX file's bytes holds, counted from protobuf's wire
    format without decoding a message (a 7 MB file of 190,000 nodes in about 0.1 s, where
    importing it costs 15 CPU-s): the cheap check before an import.

    Counts the ``node`` fields (1) of every ``graph`` field (7) of the ``ModelProto`` (protobuf
    merges repeated occurrences of a message field). With ``stop_after``, stops counting past it.

    Raises
    ------
    ValueError
        When the bytes are not a well-formed protobuf message.

    Examples
    --------
    >>> onnx_node_count(b"")
    0
    """
    data = bytes(data)
    count = 0
    for number, wire, start, end in _fields(data, 0, len(data)):
        if number == _MODEL_GRAPH and wire == 2:
            for n, w, _, _ in _fields(data, start, end):
                if n == _GRAPH_NODE and w == 2:
                    count += 1
                    if stop_after is not None and count > stop_after:
                        return count
    return count
