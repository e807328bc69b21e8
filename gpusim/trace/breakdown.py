"""Where an iteration's time goes on each GPU: compute, exposed and overlapped communication, idle.

Over the iteration (first start to last end, over all GPUs), each GPU's time is split by what it is
doing: *compute* (GEMMs, element-wise, reductions, delays standing for compute), *communication*
(collectives and send/receives).  Communication that runs while the GPU also computes is
*overlapped*; communication alone is *exposed*; neither is *idle*.  Per GPU,
``compute_s + exposed_comm_s + idle_s == total_s`` and ``overlapped_comm_s <= compute_s``.

An op that overlaps a GEMM with a collective inside itself (kind ``fused``: T3's fused GEMMs, the
decompositions) is both: given the run's kernels, its launch and GEMM kernels are compute and it
communicates from its first GEMM kernel to its end, so a reduce-scatter's tail after the GEMM is
exposed and the rest overlapped; without them it counts as compute.  A GEMM kernel whose workgroups
all wait for their gathered input (T3's tracked all-gather) does not compute meanwhile: those times
are exposed communication.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpusim.errors import GpusimError
from gpusim.hw.compute import WAITING_PREFIX

COMMUNICATION_KINDS = ("collective", "sendrecv")
FUSED_KIND = "fused"
"""``Result.ops`` kind of an op that overlaps a GEMM with a collective inside itself."""
BREAKDOWN_COLUMNS = ["gpu", "total_s", "compute_s", "exposed_comm_s", "overlapped_comm_s", "idle_s"]


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    total = 0.0
    current_start, current_end = starts[order[0]], ends[order[0]]
    for index in order[1:]:
        start, end = starts[index], ends[index]
        if start > current_end:
            total += current_end - current_start
            current_start, current_end = start, end
        elif end > current_end:
            current_end = end
    return float(total + current_end - current_start)


def check_result_table(caller: str, argument: str, table: object, columns: tuple[str, ...]) -> None:
    """Raise unless ``table`` is a DataFrame with ``columns``, as a :class:`gpusim.Result`'s tables are.

    Parameters
    ----------
    caller
        The function that takes the table (``"breakdown"``), named in the message.
    argument
        Its argument: ``"ops"`` (``Result.ops``) or ``"kernels"`` (``Result.kernels``).
    table
        What was given.
    columns
        The columns the function reads.

    Raises
    ------
    GpusimError
        ``table`` is not a DataFrame (a whole ``Result``, say) or lacks one of ``columns``; the
        message names the argument, the attribute of a result to give and the column.
    """
    if not isinstance(table, pd.DataFrame):
        raise GpusimError(f"{caller}(): {argument} must be a result's {argument} table (result.{argument}), "
                          f"got {type(table).__name__}")
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise GpusimError(f"{caller}(): {argument} has no column {missing[0]!r}; give a result's {argument} table "
                          f"(result.{argument}), with columns {', '.join(columns)}")


def is_communication(ops: pd.DataFrame) -> np.ndarray:
    """Which rows of ``Result.ops`` are communication (delays count when their kernel class says so)."""
    communication = ops["kind"].isin(COMMUNICATION_KINDS).to_numpy()
    if "kernel_class" in ops.columns:
        communication = communication | ((ops["kind"] == "delay") & ops["kernel_class"].isin(COMMUNICATION_KINDS)).to_numpy()
    return communication


def _without(intervals: pd.DataFrame, holes: pd.DataFrame) -> pd.DataFrame:
    """The parts of ``intervals`` (gpu, op_id, start_s, end_s) outside the ``holes`` of the same
    (gpu, op_id)."""
    if holes.empty:
        return intervals
    cut = {key: sorted(zip(part["start_s"], part["end_s"], strict=True))
           for key, part in holes.groupby(["gpu", "op_id"])}
    pieces = []
    for row in intervals.itertuples(index=False):
        start = row.start_s
        for hole_start, hole_end in cut.get((row.gpu, row.op_id), []):
            if hole_end <= start or hole_start >= row.end_s:
                continue
            if hole_start > start:
                pieces.append((row.gpu, row.op_id, start, hole_start))
            start = max(start, hole_end)
        if start < row.end_s:
            pieces.append((row.gpu, row.op_id, start, row.end_s))
    return pd.DataFrame(pieces, columns=["gpu", "op_id", "start_s", "end_s"])


def _fused_intervals(ops: pd.DataFrame, fused: np.ndarray, kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compute and communication intervals (gpu, start_s, end_s) of the ``fused`` rows of ``ops``: the
    compute is each row's launch (its start to its first GEMM kernel) and its GEMM kernels, matched on
    (gpu, op_id), but for the times all their workgroups wait for input (the kernels' ``waiting:``
    spans, :attr:`gpusim.hw.compute.Kernel.stalls`); the communication runs from its first GEMM
    kernel to its end."""
    rows = ops.loc[fused, ["gpu", "op_id", "start_s", "end_s"]]
    columns = ["gpu", "op_id", "start_s", "end_s"]
    gemms = kernels.loc[kernels["name"].str.startswith("gemm"), columns]
    waits = kernels.loc[kernels["name"].str.startswith(WAITING_PREFIX), columns]
    first = gemms.groupby(["gpu", "op_id"], as_index=False)["start_s"].min().rename(columns={"start_s": "first_s"})
    rows = rows.merge(first, on=["gpu", "op_id"], how="left")
    rows["first_s"] = rows["first_s"].fillna(rows["start_s"]).clip(upper=rows["end_s"])
    launches = rows[["gpu", "start_s"]].assign(end_s=rows["first_s"])
    working = _without(gemms.merge(rows[["gpu", "op_id"]], on=["gpu", "op_id"]), waits)
    compute = pd.concat([launches, working[["gpu", "start_s", "end_s"]]])
    return compute, rows[["gpu", "end_s"]].assign(start_s=rows["first_s"])


def breakdown(ops: pd.DataFrame, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """Compute, exposed communication, overlapped communication and idle time per GPU.

    Parameters
    ----------
    ops
        ``Result.ops`` (gpu, kind, start_s, end_s; optionally kernel_class, op_id, chunks, and
        wait_s: the time at an op's start that it waited for its sender to begin, which counts as
        idle, as the bubble of a pipeline is).
    kernels
        ``Result.kernels`` of the same run (gpu, op_id, name, start_s, end_s): an op of kind
        ``fused`` that exchanged data (``chunks`` > 1) then counts its GEMM kernels as compute and
        its span as communication.  ``None``: such ops count as compute.

    Returns
    -------
    pandas.DataFrame
        Columns gpu, total_s, compute_s, exposed_comm_s, overlapped_comm_s, idle_s (seconds).

    Raises
    ------
    GpusimError
        ``ops`` or ``kernels`` is not such a table (:func:`check_result_table`).
    """
    check_result_table("breakdown", "ops", ops, ("gpu", "kind", "start_s", "end_s"))
    if kernels is not None:
        check_result_table("breakdown", "kernels", kernels, ("gpu", "op_id", "name", "start_s", "end_s"))
    if ops.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    begin, finish = float(ops["start_s"].min()), float(ops["end_s"].max())
    communication = is_communication(ops)
    fused = np.zeros(len(ops), dtype=bool)
    if kernels is not None and "chunks" in ops.columns:
        fused = ((ops["kind"] == FUSED_KIND) & (pd.to_numeric(ops["chunks"], errors="coerce") > 1)).to_numpy()
    empty = pd.DataFrame(columns=["gpu", "start_s", "end_s"])
    inner_compute, inner_comm = _fused_intervals(ops, fused, kernels) if fused.any() else (empty, empty)
    starts, ends = ops["start_s"].to_numpy(dtype=float), ops["end_s"].to_numpy(dtype=float)
    if "wait_s" in ops.columns:  # a receive waiting for its sender to begin: the pipeline's bubble, idle
        waits = pd.to_numeric(ops["wait_s"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
        starts = np.minimum(starts + waits, ends)

    def covered(mask: np.ndarray, inner: pd.DataFrame, gpu: int) -> float:
        """Length of the union of the ``mask`` rows' spans and ``inner``'s intervals on ``gpu``."""
        inside = inner[inner["gpu"] == gpu]
        return _union_length(np.concatenate([starts[mask], inside["start_s"].to_numpy(dtype=float)]),
                             np.concatenate([ends[mask], inside["end_s"].to_numpy(dtype=float)]))

    rows = []
    for gpu in sorted(ops["gpu"].unique()):
        mine = (ops["gpu"] == gpu).to_numpy()
        compute = covered(mine & ~communication & ~fused, inner_compute, gpu)
        comm = covered(mine & communication, inner_comm, gpu)
        busy = _union_length(starts[mine], ends[mine])
        total = finish - begin
        # the three unions are summed separately: clamp the rounding of their differences at zero
        rows.append({"gpu": int(gpu), "total_s": total, "compute_s": compute,
                     "exposed_comm_s": max(busy - compute, 0.0), "overlapped_comm_s": max(compute + comm - busy, 0.0),
                     "idle_s": max(total - busy, 0.0)})
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
