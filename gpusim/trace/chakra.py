"""Import Chakra execution traces (``.et``, one file per rank) without a protobuf dependency.

A ``.et`` file is a stream of varint-length-delimited protobuf messages: one ``GlobalMetadata``,
then ``Node`` messages (schema ``et_def.proto`` of mlcommons/chakra).  Nodes map onto ops:

* ``COMM_COLL_NODE``: ``comm_type`` ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL with
  ``comm_size`` bytes over all ranks (the file records no element type: fp16, or int8 for an odd
  size, since a collective moves whole elements); the k-th collective of every rank is one op (ranks whose
  k-th collectives differ in type or size, or that run different numbers of them, are an error
  naming the files and nodes).  The ranks are the files read, so one rank's file alone cannot
  model its collectives.
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: a send on rank s to ``comm_dst`` d is paired with the
  receive on d from ``comm_src`` s (same ``comm_tag``, in order) into one send/receive.
* ``COMP_NODE``: a GEMM when its inputs record two matrix shapes and its name is a matrix
  product (``aten::mm``, ``addmm``, ``bmm``, ``matmul``, ``linear``); otherwise it cannot be
  modelled (``unsupported="delay"`` replays it for ``duration_micros``).  A negative size in its
  ``inputs.shapes`` is an error naming the node.
* ``METADATA_NODE``: a no-op (a zero delay other nodes may depend on).

Nodes that cannot be modelled are an error, or with ``unsupported="delay"`` delays of their
``duration_micros`` listed in ``trace.metadata["not_modelled"]``.  ``ctrl_deps`` and ``data_deps``
become ``deps``; a dependency on a node the file does not have is an error naming both.  Compute
nodes run on the ``compute`` stream and collectives on ``comm``, in dependency order;
``duration_micros`` (when non-zero, at most :data:`gpusim.trace.schema.MAX_SECONDS`) becomes
``measured_s``.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gpusim.errors import ConfigError, TraceError, UnsupportedTraceError
from gpusim.trace import protobuf as pb
from gpusim.trace.schema import MAX_SECONDS, format_ints
from gpusim.trace.trace import Trace

NODE_TYPES = {
    0: "INVALID_NODE", 1: "METADATA_NODE", 2: "MEM_LOAD_NODE", 3: "MEM_STORE_NODE", 4: "COMP_NODE",
    5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE", 7: "COMM_COLL_NODE",
}  # fmt: skip
COLLECTIVE_TYPES = {
    0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER", 5: "BROADCAST", 6: "ALL_TO_ALL",
    7: "REDUCE_SCATTER", 8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER",
}  # fmt: skip
MODELLED_COLLECTIVES = {"ALL_REDUCE": "allreduce", "REDUCE_SCATTER": "reducescatter", "ALL_GATHER": "allgather",
                        "ALL_TO_ALL": "alltoall"}
GEMM_NAMES = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")
_RANK_IN_NAME = re.compile(r"(\d+)\.et$")

# {number: (name, wire types)} of the fields gpusim reads, by message of et_def.proto
_LEN = (pb.LENGTH_DELIMITED,)
METADATA_FIELDS = {1: ("version", _LEN), 2: ("attr", _LEN)}
NODE_FIELDS = {
    1: ("id", (pb.VARINT,)), 2: ("name", _LEN), 3: ("type", (pb.VARINT,)),
    4: ("ctrl_deps", (pb.VARINT, pb.LENGTH_DELIMITED)), 5: ("data_deps", (pb.VARINT, pb.LENGTH_DELIMITED)),
    6: ("start_time_micros", (pb.VARINT,)), 7: ("duration_micros", (pb.VARINT,)), 8: ("inputs", _LEN),
    10: ("attr", _LEN),
}  # fmt: skip
IO_INFO_FIELDS = {2: ("inputs.shapes", _LEN), 3: ("inputs.types", _LEN)}
_ATTRIBUTE_SCALARS = {
    "double": pb.FIXED64, "float": pb.FIXED32, "int32": pb.VARINT, "int64": pb.VARINT, "uint32": pb.VARINT,
    "uint64": pb.VARINT, "sint32": pb.VARINT, "sint64": pb.VARINT, "fixed32": pb.FIXED32, "fixed64": pb.FIXED64,
    "sfixed32": pb.FIXED32, "sfixed64": pb.FIXED64, "bool": pb.VARINT, "string": pb.LENGTH_DELIMITED,
    "bytes": pb.LENGTH_DELIMITED,
}  # fmt: skip
ATTRIBUTE_FIELDS = {  # <type>_val = 3, 5, 7...; <type>_list = 4, 6, 8... (a message of repeated values = 1)
    1: ("attr.name", _LEN), 2: ("attr.doc_string", _LEN),
    **{3 + 2 * i: (f"attr.{kind}_val", (wire,)) for i, (kind, wire) in enumerate(_ATTRIBUTE_SCALARS.items())},
    **{4 + 2 * i: (f"attr.{kind}_list", _LEN) for i, kind in enumerate(_ATTRIBUTE_SCALARS)},
}


@dataclass
class Node:
    """A decoded Chakra node (the fields gpusim uses)."""

    id: int = 0
    name: str = ""
    type: int = 0
    ctrl_deps: list[int] = field(default_factory=list)
    data_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    input_shapes: str = ""
    input_types: str = ""
    attrs: dict[str, object] = field(default_factory=dict)

    @property
    def type_name(self) -> str:
        """The NodeType enum name."""
        return NODE_TYPES.get(self.type, f"type {self.type}")


def _list_values(number: int, payload: bytes) -> list:
    (element_wire_type,) = ATTRIBUTE_FIELDS[number - 1][1]
    schema = {1: (f"{ATTRIBUTE_FIELDS[number][0]}.values", (element_wire_type, pb.LENGTH_DELIMITED))}  # packed or not
    values = []
    for inner, wire_type, value in pb.fields(payload, schema):
        if inner != 1:
            continue
        if number in (4,):  # DoubleList
            values.extend(pb.double(v) for v in _fixed_items(value, wire_type, 8))
        elif number in (6,):  # FloatList
            values.extend(pb.single(v) for v in _fixed_items(value, wire_type, 4))
        elif number in (30, 32):  # StringList, BytesList
            values.append(value.decode("utf-8", "replace") if number == 30 else value)
        elif number in (16, 18):  # Sint32List, Sint64List
            values.extend(pb.zigzag(v) for v in pb.packed_varints(value, wire_type))
        elif number in (20, 22, 24, 26):
            width = 4 if number in (20, 24) else 8
            values.extend(_fixed_items(value, wire_type, width))
        else:
            items = pb.packed_varints(value, wire_type)
            values.extend(pb.signed64(v) if number in (8, 10) else v for v in items)
    return values


def _fixed_items(value, wire_type: int, width: int) -> list[int]:
    if wire_type != pb.LENGTH_DELIMITED:
        return [int(value)]
    return [int.from_bytes(value[i:i + width], "little") for i in range(0, len(value), width)]


def decode_attribute(payload: bytes) -> tuple[str, object]:
    """``(name, value)`` of an encoded ``AttributeProto``."""
    name, value = "", None
    for number, _, raw in pb.fields(payload, ATTRIBUTE_FIELDS):
        if number == 1:
            name = raw.decode("utf-8", "replace")
        elif number == 2:
            continue
        elif number == 3:
            value = pb.double(raw)
        elif number == 5:
            value = pb.single(raw)
        elif number in (7, 9):
            value = pb.signed64(raw)
        elif number in (11, 13):
            value = raw
        elif number in (15, 17):
            value = pb.zigzag(raw)
        elif number in (19, 21):
            value = raw
        elif number == 23:
            value = raw - (1 << 32) if raw >= 1 << 31 else raw
        elif number == 25:
            value = pb.signed64(raw)
        elif number == 27:
            value = bool(raw)
        elif number == 29:
            value = raw.decode("utf-8", "replace")
        elif number == 31:
            value = raw
        elif number % 2 == 0 and 4 <= number <= 32:
            value = _list_values(number, raw)
    return name, value


def decode_node(payload: bytes) -> Node:
    """A :class:`Node` from an encoded ``Node`` message."""
    node = Node()
    for number, wire_type, value in pb.fields(payload, NODE_FIELDS):
        if number == 1:
            node.id = value
        elif number == 2:
            node.name = value.decode("utf-8", "replace")
        elif number == 3:
            node.type = value
        elif number == 4:
            node.ctrl_deps.extend(pb.packed_varints(value, wire_type))
        elif number == 5:
            node.data_deps.extend(pb.packed_varints(value, wire_type))
        elif number == 6:
            node.start_time_micros = value
        elif number == 7:
            node.duration_micros = value
        elif number == 8:
            for inner, _, text in pb.fields(value, IO_INFO_FIELDS):
                if inner == 2:
                    node.input_shapes = text.decode("utf-8", "replace")
                elif inner == 3:
                    node.input_types = text.decode("utf-8", "replace")
        elif number == 10:
            name, attribute = decode_attribute(value)
            node.attrs[name] = attribute
    return node


def decode_metadata(payload: bytes) -> dict[str, object]:
    """``version`` and the attributes of an encoded ``GlobalMetadata`` message."""
    metadata: dict[str, object] = {}
    for number, _, value in pb.fields(payload, METADATA_FIELDS):
        if number == 1:
            metadata["version"] = value.decode("utf-8", "replace")
        elif number == 2:
            name, attribute = decode_attribute(value)
            metadata[name] = attribute
    return metadata


def read_et(path: str | os.PathLike) -> tuple[dict, list[Node]]:
    """The global metadata (``version`` and attributes) and the nodes of one ``.et`` file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read: {exc}") from exc
    try:
        messages = list(pb.delimited(data))
    except pb.ProtobufError as exc:
        raise TraceError(f"{path}: not a Chakra execution trace: {exc}") from exc
    if not messages:
        raise TraceError(f"{path}: empty Chakra trace")
    nodes: list[Node] = []
    for index, message in enumerate(messages):
        try:
            if index == 0:
                metadata = decode_metadata(message)
            else:
                nodes.append(decode_node(message))
        except pb.ProtobufError as exc:
            where = "GlobalMetadata message 0" if index == 0 else f"Node message {index}"
            raise TraceError(f"{path}: not a Chakra execution trace: {where}: {exc}") from exc
    return metadata, nodes


def _expand(paths) -> list[Path]:
    many = isinstance(paths, Sequence) and not isinstance(paths, (str, bytes))
    items = list(paths) if many else [paths]
    files: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(path.glob("*.et")))
        elif any(char in str(item) for char in "*?["):
            files.extend(Path(p) for p in sorted(glob.glob(str(item))))
        else:
            files.append(path)
    if not files:
        raise TraceError(f"read_chakra(): no .et files in {paths!r}")
    return files


def _ranks(files: list[Path]) -> list[int]:
    """The rank of each file: the number that ends its name before ``.et`` (``trace.3.et``,
    ``rank_10.et``) when every name has one (files of some ranks of a job keep their ranks; their
    collectives then cannot be modelled, see :func:`read_chakra`), else its position in the list; a
    file read alone is rank 0 whatever its name.

    Raises
    ------
    TraceError
        When two names give one rank.
    """
    if len(files) == 1:
        return [0]
    found = [_RANK_IN_NAME.search(f.name) for f in files]
    if not all(found):
        return list(range(len(files)))
    ranks = [int(match.group(1)) for match in found]
    named: dict[int, Path] = {}
    for path, rank in zip(files, ranks):
        if rank in named:
            raise TraceError(f"{path}: its name gives rank {rank}, as the name of {named[rank]} does; each rank's "
                             f"file needs its own number before '.et'")
        named[rank] = path
    return ranks


def _topological(nodes: list[Node], path: Path) -> list[Node]:
    by_id: dict[int, Node] = {}
    for node in nodes:
        if node.id in by_id:
            raise TraceError(f"{path}: node {node.id} ('{node.name}'): field 'id': another node of the file "
                             "has the same id; every node needs its own")
        by_id[node.id] = node
    for node in nodes:
        for field_name, deps in (("ctrl_deps", node.ctrl_deps), ("data_deps", node.data_deps)):
            missing = [dep for dep in deps if dep not in by_id]
            if missing:
                raise TraceError(f"{path}: node {node.id} ('{node.name}'): field '{field_name}' names node "
                                 f"{missing[0]}, which is not in the file")
    waiting = {node.id: set(node.ctrl_deps + node.data_deps) for node in nodes}
    users: dict[int, list[int]] = {}
    for node_id, deps in waiting.items():
        for dep in deps:
            users.setdefault(dep, []).append(node_id)
    ready = sorted(node_id for node_id, deps in waiting.items() if not deps)
    order = []
    while ready:
        node_id = ready.pop(0)
        order.append(by_id[node_id])
        for user in users.get(node_id, []):
            waiting[user].discard(node_id)
            if not waiting[user]:
                ready.append(user)
        ready.sort()
    if len(order) != len(nodes):
        stuck = sorted(set(by_id) - {node.id for node in order})[:5]
        raise TraceError(f"{path}: field 'deps': dependency cycle among nodes {stuck}")
    return order


class UnsupportedNode(Exception):
    """A node that cannot be turned into a simulated op (the message says why)."""


def _gemm_fields(node: Node, path: Path) -> dict:
    """A compute node's GEMM fields from its name and ``inputs.shapes``.

    Raises
    ------
    UnsupportedNode
        The node is not a matrix product of recorded shapes, or one of empty matrices.
    TraceError
        A recorded size is negative (naming the file, the node and the field).
    """
    unsupported = UnsupportedNode("a compute node without a matrix-product name and input shapes")
    base = node.name.split("::")[-1].rstrip("_")
    if base not in GEMM_NAMES or not node.input_shapes:
        raise unsupported
    try:
        shapes = json.loads(node.input_shapes)
    except json.JSONDecodeError:
        raise unsupported from None
    matrices = [s for s in shapes if isinstance(s, list) and len(s) >= 2
                and all(isinstance(d, int) and not isinstance(d, bool) for d in s)]
    if any(d < 0 for matrix in matrices for d in matrix):
        raise TraceError(f"{path}: node {node.id} ('{node.name}'): field 'inputs.shapes' must list sizes >= 0, "
                         f"got {node.input_shapes}")
    if base in ("addmm", "baddbmm") and len(matrices) >= 3:
        matrices = matrices[1:]
    if len(matrices) < 2:
        raise unsupported
    a, b = matrices[0], matrices[1]
    if base == "linear":
        m, k, n, batch = math.prod(a[:-1]), a[-1], b[0], 1
    elif len(a) >= 3 and len(b) >= 3:
        batch, m, k, n = math.prod(a[:-2]), a[-2], a[-1], b[-1]
    else:
        m, k, n, batch = math.prod(a[:-1]), a[-1], b[-1], 1
    if min(m, n, k, batch) == 0:
        raise UnsupportedNode(f"a matrix product of empty matrices (inputs.shapes {node.input_shapes})")
    dtype = "fp16" if "half" in node.input_types.lower() else "bf16" if "bfloat16" in node.input_types.lower() else "fp32"
    return {"kind": "gemm", "m": int(m), "n": int(n), "k": int(k), "batch": int(batch), "dtype": dtype}


def _check_same_collective(node: Node, path: Path, collective: str, size: int,
                           first: tuple[int, Path, Node, str, int], position: int) -> None:
    """Raise :class:`TraceError` unless ``node`` (the ``position``-th collective of the rank in
    ``path``) has the type and size of the same collective of the first rank read, ``first``."""
    _, first_path, first_node, first_collective, first_size = first
    where = f"{path}: node {node.id} ('{node.name}')"
    theirs = f"collective {position + 1} of {first_path} (node {first_node.id}, '{first_node.name}')"
    rule = "every rank runs the same collectives, of the same sizes, in the same order"
    if collective != first_collective:
        raise TraceError(f"{where}: field 'comm_type': this rank's collective {position + 1} is {collective}, but "
                         f"{theirs} is {first_collective}; {rule}")
    if size != first_size:
        uneven = ("; an uneven all-to-all (all-to-allv) cannot be modelled from Chakra nodes, which record no split "
                  "sizes (the ranks' Kineto traces do)") if collective == "ALL_TO_ALL" else ""
        raise TraceError(f"{where}: field 'comm_size': this rank's collective {position + 1} has {size} bytes, but "
                         f"{theirs} has {first_size}; {rule}{uneven}")


def read_chakra(paths, *, unsupported: str = "error") -> Trace:
    """Read Chakra execution traces (one ``.et`` per rank) into a :class:`Trace`.

    Parameters
    ----------
    paths
        A folder of ``.et`` files, a glob pattern, or a list of files; the rank is the number
        before ``.et`` in the name (``all_reduce.3.et``), else the position in the sorted list.
        A single file is rank 0 (GPU 0) whatever its name.  A collective spans every rank of the
        job, so it is modelled only when the files read are ranks 0 to N-1: those of a single file,
        or of files with ranks missing, cannot be (a missing last rank cannot be told apart).
    unsupported
        ``"error"``: a node that cannot be modelled is an error naming the file and node;
        ``"delay"``: it becomes a delay of its ``duration_micros``.

    Returns
    -------
    Trace

    Raises
    ------
    gpusim.errors.ConfigError
        ``unsupported`` is not ``"error"`` or ``"delay"``.
    gpusim.errors.TraceError
        No files, or a file that is not a Chakra trace or holds a malformed node (naming it).
    """
    if unsupported not in ("error", "delay"):
        raise ConfigError(f"read_chakra(): unsupported must be 'error' or 'delay', got {unsupported!r}")
    files = _expand(paths)
    ranks = _ranks(files)
    world = sorted(ranks)
    # a collective spans every rank of its job: read with ranks missing, it cannot say over which
    gaps = ", ".join(map(str, sorted(set(range(world[-1] + 1)) - set(world))))
    rows: list[dict] = []
    next_id = 0
    collectives: dict[int, tuple[int, Path, Node, str, int]] = {}  # k-th collective: op_id, first rank's file...
    collective_counts: dict[Path, int] = {}
    pending_sends: dict[tuple[int, int, object], list[int]] = {}
    pending_recvs: dict[tuple[int, int, object], list[int]] = {}
    not_modelled: list[dict] = []
    for path, rank in sorted(zip(files, ranks), key=lambda item: item[1]):
        _, nodes = read_et(path)
        if not nodes:
            raise TraceError(f"{path}: the Chakra trace has no nodes (only its GlobalMetadata)")
        op_of_node: dict[int, int] = {}
        collectives_seen = 0
        for node in _topological(nodes, path):
            if node.duration_micros > MAX_SECONDS * 1e6:
                raise TraceError(f"{path}: node {node.id} ('{node.name}'): field 'duration_micros' must be at most "
                                 f"{MAX_SECONDS * 1e6:g} us, got {node.duration_micros}")
            measured = node.duration_micros * 1e-6 if node.duration_micros else float("nan")
            row: dict[str, object] = {"gpu": rank, "name": node.name or node.type_name, "measured_s": measured}
            kind = node.type_name
            reason = None
            if kind == "COMM_COLL_NODE":
                comm_type = node.attrs.get("comm_type")
                collective = COLLECTIVE_TYPES.get(comm_type, "unknown") if isinstance(comm_type, int) else "unknown"
                size = node.attrs.get("comm_size")
                if collective not in MODELLED_COLLECTIVES:
                    reason = f"collective {collective} has no gpusim op"
                elif not isinstance(size, int) or size <= 0:
                    reason = "collective without a positive comm_size"
                elif len(files) == 1:
                    reason = ("a collective over all ranks, but only one rank's file was given (read the files "
                              "of every rank together, e.g. their folder)")
                elif gaps:
                    reason = (f"a collective over all ranks, but the files read are ranks {', '.join(map(str, world))}, "
                              f"without {gaps} (read the files of every rank together, e.g. their folder)")
                else:
                    row.update(kind="collective", stream="comm", collective=MODELLED_COLLECTIVES[collective],
                               bytes=size, dtype="int8" if size % 2 else "fp16", group=format_ints(world),
                               kernel_class="collective")
                    if collectives_seen in collectives:
                        _check_same_collective(node, path, collective, size, collectives[collectives_seen],
                                               collectives_seen)
                    else:
                        next_id += 1
                        collectives[collectives_seen] = (next_id, path, node, collective, size)
                    row["op_id"] = collectives[collectives_seen][0]
                    collectives_seen += 1
            elif kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
                size = node.attrs.get("comm_size")
                peer = node.attrs.get("comm_dst" if kind == "COMM_SEND_NODE" else "comm_src")
                if not isinstance(size, int) or size <= 0 or not isinstance(peer, int):
                    reason = "send/receive without comm_size and peer"
                else:
                    src, dst = (rank, peer) if kind == "COMM_SEND_NODE" else (peer, rank)
                    key = (src, dst, node.attrs.get("comm_tag"))
                    mine, theirs = (pending_sends, pending_recvs) if kind == "COMM_SEND_NODE" else (pending_recvs, pending_sends)
                    if theirs.get(key):
                        op_id = theirs[key].pop(0)
                    else:
                        next_id += 1
                        op_id = next_id
                        mine.setdefault(key, []).append(op_id)
                    row.update(kind="sendrecv", stream="send" if kind == "COMM_SEND_NODE" else "recv", bytes=size,
                               group=f"{src} {dst}", kernel_class="sendrecv", op_id=op_id)
            elif kind == "COMP_NODE":
                try:
                    row.update(_gemm_fields(node, path), stream="compute", kernel_class="gemm")
                except UnsupportedNode as exc:
                    reason = str(exc)
            elif kind == "METADATA_NODE":
                row.update(kind="delay", delay_s=0.0, stream="compute", kernel_class="delay")
            else:
                reason = f"a {kind} is not modelled"
            if reason is not None:
                if unsupported == "error":
                    raise UnsupportedTraceError(f"{path}: node {node.id} ('{node.name}'): field 'type': cannot be "
                                                f"modelled: {reason}", "it as a delay of duration_micros",
                                                "read_chakra(..., unsupported='delay')")
                duration = node.duration_micros * 1e-6
                klass = "collective" if kind.startswith("COMM") else "gemm" if kind == "COMP_NODE" else "other"
                row.update(kind="delay", delay_s=duration, stream="comm" if kind.startswith("COMM") else "compute",
                           kernel_class=klass)
                not_modelled.append({"gpu": rank, "node": node.id, "name": node.name, "reason": reason})
            if "op_id" not in row:
                next_id += 1
                row["op_id"] = next_id
            op_of_node[node.id] = int(row["op_id"])
            row["_deps"] = node.ctrl_deps + node.data_deps
            rows.append(row)
        for row in rows:
            if row["gpu"] == rank and "_deps" in row:
                row["deps"] = format_ints(sorted({op_of_node[d] for d in row.pop("_deps")}))
        collective_counts[path] = collectives_seen
    if len(set(collective_counts.values())) > 1:
        counts = ", ".join(f"{path.name} {count}" for path, count in collective_counts.items())
        raise TraceError(f"{files[0].parent}: the ranks run different numbers of modelled collectives "
                         f"(COMM_COLL_NODE nodes): {counts}; every rank runs the same collectives in the same order")
    unmatched = [key for key, ids in {**pending_sends, **pending_recvs}.items() if ids]
    if unmatched:
        src, dst, tag = unmatched[0]
        raise TraceError(f"{files[0].parent}: a send from rank {src} to rank {dst} (tag {tag}) has no matching "
                         "receive (or the other way round)")
    frame = pd.DataFrame(rows)
    source = str(files[0].parent) if len(files) > 1 else str(files[0])
    return Trace(frame, source=source, metadata={"importer": "chakra", "files": [str(f) for f in files],
                                                 "unsupported": unsupported, "not_modelled": not_modelled})
