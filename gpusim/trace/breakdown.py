"""Where an iteration's time goes on each GPU: compute, exposed and overlapped communication, idle.

Over the iteration (first start to last end, over all GPUs), each GPU's time is split by what it is
doing: *compute* (GEMMs, element-wise, reductions, delays standing for compute), *communication*
(collectives and send/receives).  Communication that runs while the GPU also computes is
*overlapped*; communication alone is *exposed*; neither is *idle*.  Per GPU,
``compute_s + exposed_comm_s + idle_s == total_s`` and ``overlapped_comm_s <= compute_s``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COMMUNICATION_KINDS = ("collective", "sendrecv")
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


def is_communication(ops: pd.DataFrame) -> np.ndarray:
    """Which rows of ``Result.ops`` are communication (delays count when their kernel class says so)."""
    communication = ops["kind"].isin(COMMUNICATION_KINDS).to_numpy()
    if "kernel_class" in ops.columns:
        communication = communication | ((ops["kind"] == "delay") & ops["kernel_class"].isin(COMMUNICATION_KINDS)).to_numpy()
    return communication


def breakdown(ops: pd.DataFrame) -> pd.DataFrame:
    """Compute, exposed communication, overlapped communication and idle time per GPU.

    Parameters
    ----------
    ops
        ``Result.ops`` (gpu, kind, start_s, end_s; optionally kernel_class).

    Returns
    -------
    pandas.DataFrame
        Columns gpu, total_s, compute_s, exposed_comm_s, overlapped_comm_s, idle_s (seconds).
    """
    if ops.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    begin, finish = float(ops["start_s"].min()), float(ops["end_s"].max())
    communication = is_communication(ops)
    rows = []
    for gpu in sorted(ops["gpu"].unique()):
        mine = (ops["gpu"] == gpu).to_numpy()
        starts, ends = ops["start_s"].to_numpy(), ops["end_s"].to_numpy()
        compute = _union_length(starts[mine & ~communication], ends[mine & ~communication])
        comm = _union_length(starts[mine & communication], ends[mine & communication])
        busy = _union_length(starts[mine], ends[mine])
        total = finish - begin
        # the three unions are summed separately: clamp the rounding of their differences at zero
        rows.append({"gpu": int(gpu), "total_s": total, "compute_s": compute,
                     "exposed_comm_s": max(busy - compute, 0.0), "overlapped_comm_s": max(compute + comm - busy, 0.0),
                     "idle_s": max(total - busy, 0.0)})
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
