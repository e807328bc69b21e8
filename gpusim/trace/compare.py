"""Simulated versus measured durations of an imported trace, per kernel class and for the whole.

Only rows that were simulated and carry a measured duration are compared per class; rows replayed
as delays of their measured duration (kernels gpusim cannot model) are counted separately and
never enter a class's error.  The ``all kernels`` row sums every kernel (delays included) and the
``iteration`` row compares the measured span of the kernels (first start to last end) with the
simulated one; the simulation does not replay CPU-side gaps between launches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CLASS_ORDER = ("gemm", "elementwise", "reduction", "collective", "sendrecv", "memcpy", "other")
COMPARISON_COLUMNS = ["kernel_class", "kernels", "measured_s", "simulated_s", "error", "median_kernel_error",
                      "not_simulated", "not_simulated_s"]


def kernel_comparison(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel with a measured duration: name, kernel_class, simulated (bool), measured_s, simulated_s."""
    frame = ops[np.isfinite(pd.to_numeric(ops["measured_s"], errors="coerce"))].copy()
    classes = frame["kernel_class"] if "kernel_class" in frame.columns else frame["kind"]
    frame["kernel_class"] = np.where(classes.astype(str) != "", classes, frame["kind"])
    frame["modelled"] = frame["kind"] != "delay"
    frame["simulated_s"] = frame["duration_s"]
    frame["error"] = frame["simulated_s"] / frame["measured_s"] - 1.0
    return frame[["op_id", "gpu", "name", "kernel_class", "kind", "modelled", "measured_s", "simulated_s", "error"]]


def compare(ops: pd.DataFrame, measured_span_s: float | None = None) -> pd.DataFrame:
    """Per kernel class, all kernels, and (when given) the iteration span: measured, simulated, error.

    Parameters
    ----------
    ops
        ``Result.ops`` of a replayed imported trace.
    measured_span_s
        Measured time from the first kernel's start to the last kernel's end, s.

    Returns
    -------
    pandas.DataFrame
        Columns kernel_class, kernels, measured_s, simulated_s, error (simulated / measured - 1),
        median_kernel_error, not_simulated (kernels replayed as delays), not_simulated_s.
    """
    kernels = kernel_comparison(ops)
    rows = []
    present = [c for c in CLASS_ORDER if c in set(kernels["kernel_class"])]
    present += sorted(set(kernels["kernel_class"]) - set(present))
    for klass in present:
        mine = kernels[kernels["kernel_class"] == klass]
        modelled = mine[mine["modelled"]]
        delayed = mine[~mine["modelled"]]
        measured = float(modelled["measured_s"].sum())
        simulated = float(modelled["simulated_s"].sum())
        rows.append({
            "kernel_class": klass, "kernels": len(modelled), "measured_s": measured, "simulated_s": simulated,
            "error": simulated / measured - 1.0 if measured > 0 else float("nan"),
            "median_kernel_error": float(modelled["error"].median()) if len(modelled) else float("nan"),
            "not_simulated": len(delayed), "not_simulated_s": float(delayed["measured_s"].sum()),
        })  # fmt: skip
    measured = float(kernels["measured_s"].sum())
    simulated = float(kernels["simulated_s"].sum())
    delayed = kernels[~kernels["modelled"]]
    rows.append({
        "kernel_class": "all kernels", "kernels": len(kernels), "measured_s": measured, "simulated_s": simulated,
        "error": simulated / measured - 1.0 if measured > 0 else float("nan"),
        "median_kernel_error": float(kernels.loc[kernels["modelled"], "error"].median()),
        "not_simulated": len(delayed), "not_simulated_s": float(delayed["measured_s"].sum()),
    })  # fmt: skip
    if measured_span_s:
        span = float(ops["end_s"].max() - ops["start_s"].min())
        rows.append({"kernel_class": "iteration", "kernels": len(kernels), "measured_s": measured_span_s,
                     "simulated_s": span, "error": span / measured_span_s - 1.0, "median_kernel_error": float("nan"),
                     "not_simulated": len(delayed), "not_simulated_s": float(delayed["measured_s"].sum())})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
