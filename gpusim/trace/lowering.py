"""Turning trace rows into gpusim ops (one :class:`gpusim.ops.Op` per op_id, shared by its rows)."""

from __future__ import annotations

import pandas as pd

from gpusim import ops
from gpusim.errors import OpError, TraceError
from gpusim.trace.schema import RowLocation, parse_ints

COLLECTIVE_OPS: dict[str, type[ops.Collective]] = {
    "allreduce": ops.AllReduce,
    "reducescatter": ops.ReduceScatter,
    "allgather": ops.AllGather,
    "alltoall": ops.AllToAll,
}
FUSED_OPS: dict[str, type[ops.FusedGemm]] = {
    "reducescatter": ops.GemmReduceScatter,
    "allgather": ops.GemmAllGather,
    "alltoall": ops.GemmAllToAll,
}
"""T3's op for each collective a ``gemm_collective`` row may overlap."""
DECOMPOSED_DRIVERS = {"decomposed": "cu", "decomposed_dma": "dma"}
"""The :class:`gpusim.ops.DecomposedGemmReduceScatter` (or :class:`gpusim.ops.DecomposedAllGatherGemm`)
driver of each decomposition."""


def _names(text: str) -> list[str]:
    return text.split() if text else []


def _channels(row) -> int | None:
    """A row's ``channels`` (None when blank)."""
    return None if pd.isna(row.channels) else int(row.channels)


def op_of_row(row, ranks: list[int], send_bytes: list[list[int]] | None = None) -> ops.Op:
    """The op a row describes; ``ranks`` are the GPUs that have rows of its op_id.

    Parameters
    ----------
    row
        A row of a validated trace table (a namedtuple from ``itertuples``).
    ranks
        GPUs with rows of the same op_id (the op's ranks for compute ops).
    send_bytes
        An uneven all-to-all's sends, every rank's row in group order (:func:`build_ops`).
    """
    kind = row.kind
    name = row.name or None
    inputs = _names(row.inputs)
    output = row.output or None
    first_input = inputs[0] if inputs else None
    if kind in ("gemm", "gemm_collective", "collective_gemm"):
        gemm = dict(dtype=row.dtype, trans_a=bool(row.trans_a), trans_b=bool(row.trans_b), a=first_input,
                    b=inputs[1] if len(inputs) > 1 else None, out=output, kernel=row.kernel or None, name=name)
        shape = (int(row.m), int(row.n), int(row.k))
        if kind == "gemm":
            return ops.Gemm(*shape, batch=int(row.batch), ranks=ranks, **gemm)
        group = parse_ints(row.group) or None
        if kind == "collective_gemm" and row.function == "t3":
            return ops.AllGatherGemm(*shape, ranks=group, **gemm)
        if kind == "collective_gemm":
            return ops.DecomposedAllGatherGemm(*shape, driver=DECOMPOSED_DRIVERS[row.function], channels=_channels(row),
                                               ranks=group, **gemm)
        if row.function in DECOMPOSED_DRIVERS:
            splits = 1 if pd.isna(row.splits) else int(row.splits)
            return ops.DecomposedGemmReduceScatter(*shape, driver=DECOMPOSED_DRIVERS[row.function],
                                                   channels=_channels(row), splits=splits, ranks=group, **gemm)
        return FUSED_OPS[row.collective](*shape, batch=int(row.batch), algorithm=row.algorithm, ranks=group, **gemm)
    if kind == "grouped_gemm":
        dims = parse_ints(row.shapes)
        return ops.GroupedGemm(tuple(zip(dims[::3], dims[1::3], dims[2::3])), dtype=row.dtype,
                               trans_a=bool(row.trans_a), trans_b=bool(row.trans_b), a=first_input,
                               b=inputs[1] if len(inputs) > 1 else None, out=output, kernel=row.kernel or None,
                               name=name, ranks=ranks)
    if kind == "elementwise":
        rows = None if pd.isna(row.rows) or not row.rows else int(row.rows)
        return ops.Elementwise(row.function, int(row.elements), dtype=row.dtype, inputs=tuple(inputs) or None,
                               out=output, index_dims=int(row.index_dims), rows=rows, name=name, ranks=ranks)
    if kind == "reduction":
        return ops.RowReduce(row.function, int(row.rows), int(row.cols), dtype=row.dtype, input=first_input,
                             out=output, library=row.kernel or "pytorch", name=name, ranks=ranks)
    if kind == "attention":
        tensors = dict(zip(("q", "k", "v", "out", "grad_out"), inputs))
        outputs = {"grad_q": output} if row.function == "backward" else {"out": output}
        return ops.Attention(int(row.batch), int(row.heads), int(row.q_len), int(row.kv_len), int(row.head_dim),
                             dtype=row.dtype, causal=bool(row.causal),
                             kv_heads=None if pd.isna(row.kv_heads) else int(row.kv_heads), direction=row.function,
                             **{**tensors, **outputs}, name=name, ranks=ranks)
    if kind == "collective":
        group = parse_ints(row.group) or None
        uneven = {} if send_bytes is None else {"send_bytes": send_bytes}
        return COLLECTIVE_OPS[row.collective](int(row.bytes), dtype=row.dtype, algorithm=row.algorithm,
                                              channels=_channels(row), input=first_input, out=output, name=name,
                                              ranks=group, **uneven)
    if kind == "sendrecv":
        src, dst = parse_ints(row.group)
        return ops.SendRecv(int(row.bytes), src=src, dst=dst, input=first_input, out=output, name=name)
    if kind == "optimizer":
        return ops.Optimizer(row.function, parse_ints(row.tensor_sizes), impl=row.optimizer_impl or "multi_fused",
                             dtype=row.dtype, prefix=output or f"optimizer{row.op_id}", name=name, ranks=ranks)
    return ops.Delay(seconds=float(row.delay_s), name=name, ranks=ranks)


def build_ops(frame: pd.DataFrame, source: str) -> dict[int, ops.Op]:
    """One op per op_id of ``frame`` (built from its first row).

    Raises
    ------
    TraceError
        A row the op model rejects, naming the row.
    """
    ranks_of = frame.groupby("op_id")["gpu"].apply(lambda gpus: sorted(int(g) for g in gpus)).to_dict()
    uneven = frame[frame["send_bytes"] != ""]
    sends_of = {op_id: dict(zip(rows["gpu"], rows["send_bytes"])) for op_id, rows in uneven.groupby("op_id")}
    built: dict[int, ops.Op] = {}
    first_rows = frame.drop_duplicates("op_id")
    for position, row in zip(first_rows.index, first_rows.itertuples(index=False)):
        try:
            sends = sends_of.get(row.op_id)
            matrix = None if sends is None else [parse_ints(sends[gpu]) for gpu in parse_ints(row.group)]
            built[int(row.op_id)] = op_of_row(row, ranks_of[row.op_id], matrix)
        except OpError as exc:
            raise TraceError(f"{RowLocation(source, int(position), row.op_id, row.gpu)}: {exc}") from None
    return built
