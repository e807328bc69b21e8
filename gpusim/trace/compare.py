"""Simulated versus measured durations of an imported trace, per kernel class and for the whole.

Only rows that were simulated and carry a measured duration are compared; rows replayed as delays
of their measured duration (kernels gpusim cannot model) are counted separately (``not_simulated``)
and never enter an error, neither their class's nor the ``all kernels`` row's, which sums every
simulated kernel.  The ``iteration`` row compares the measured span of the kernels (first start to
last end) with the simulated one; the simulation does not replay CPU-side gaps between launches.
Where nothing was simulated (every kernel a delay), ``all kernels`` has ``kernels`` 0 and both its
error and the iteration's are NaN, so that no tolerance can be met by measured durations alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from gpusim.trace.breakdown import check_result_table

CLASS_ORDER = ("gemm", "elementwise", "reduction", "attention", "collective", "sendrecv", "memcpy", "other")
COMPARISON_COLUMNS = ["kernel_class", "kernels", "measured_s", "simulated_s", "error", "median_kernel_error",
                      "not_simulated", "not_simulated_s"]


def kernel_comparison(ops: pd.DataFrame, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kernel with a measured duration (above 0: a kernel measured at 0 is left out, with a
    warning): name, kernel_class, simulated (bool), measured_s, simulated_s.

    A profiler's kernel duration runs from the kernel's start to its end on the GPU, without the
    host's launch cost; so an op's simulated duration is the span of its kernels in ``kernels``
    (``Result.kernels``: first start to last end on its GPU) where it ran any, else the op's own
    duration (copies, delays, or when ``kernels`` is not given).

    Raises
    ------
    GpusimError
        ``ops`` or ``kernels`` is not such a table (:func:`~gpusim.trace.breakdown.check_result_table`).
    """
    check_result_table("kernel_comparison", "ops", ops, ("op_id", "gpu", "name", "kind", "measured_s", "duration_s"))
    if kernels is not None:
        check_result_table("kernel_comparison", "kernels", kernels, ("op_id", "gpu", "start_s", "end_s"))
    measured = pd.to_numeric(ops["measured_s"], errors="coerce")
    unresolved = int((measured == 0).sum())
    if unresolved:  # a profiler writes 0 for a kernel it did not time: no error can be taken against it
        warnings.warn(f"{unresolved} kernel(s) with a measured duration of 0 are left out of the comparison",
                      UserWarning, stacklevel=2)
    frame = ops[np.isfinite(measured) & (measured > 0)].copy()
    classes = frame["kernel_class"] if "kernel_class" in frame.columns else frame["kind"]
    frame["kernel_class"] = np.where(classes.astype(str) != "", classes, frame["kind"])
    frame["modelled"] = frame["kind"] != "delay"
    frame["simulated_s"] = frame["duration_s"]
    if kernels is not None and len(kernels):
        spans = kernels.groupby(["op_id", "gpu"]).agg(first=("start_s", "min"), last=("end_s", "max"))
        span = frame.join(spans, on=["op_id", "gpu"])
        ran = span["first"].notna() & frame["modelled"]
        frame.loc[ran, "simulated_s"] = (span["last"] - span["first"])[ran]
    frame["error"] = frame["simulated_s"] / frame["measured_s"] - 1.0
    return frame[["op_id", "gpu", "name", "kernel_class", "kind", "modelled", "measured_s", "simulated_s", "error"]]


def compare(ops: pd.DataFrame, measured_span_s: float | None = None, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per kernel class, all kernels, and (when given) the iteration span: measured, simulated, error.

    Parameters
    ----------
    ops
        ``Result.ops`` of a replayed imported trace.
    measured_span_s
        Measured time from the first kernel's start to the last kernel's end, s.
    kernels
        ``Result.kernels`` of the same replay: the simulated kernel spans that profiled kernel
        durations are compared with (:func:`kernel_comparison`).

    Returns
    -------
    pandas.DataFrame
        Columns kernel_class, kernels (simulated kernels compared), measured_s, simulated_s, error
        (simulated / measured - 1; NaN where no kernel was simulated), median_kernel_error,
        not_simulated (kernels replayed as delays, in no error), not_simulated_s.

    Raises
    ------
    GpusimError
        ``ops`` or ``kernels`` is not such a table (:func:`~gpusim.trace.breakdown.check_result_table`).
    """
    check_result_table("compare", "ops", ops, ("op_id", "gpu", "name", "kind", "measured_s", "duration_s", "start_s",
                                               "end_s"))
    compared = kernel_comparison(ops, kernels)
    present = [c for c in CLASS_ORDER if c in set(compared["kernel_class"])]
    present += sorted(set(compared["kernel_class"]) - set(present))
    rows = [_row(klass, compared[compared["kernel_class"] == klass]) for klass in present]
    rows.append(_row("all kernels", compared))
    if measured_span_s:
        # the GPU's work: a delay lasts its measured time up to its end, an op begins with its first kernel
        starts = ops["start_s"].where(ops["kind"] != "delay", ops["end_s"] - ops["measured_s"])
        if kernels is not None and len(kernels):
            first = kernels.groupby(["op_id", "gpu"])["start_s"].min().rename("first")
            starts = ops.join(first, on=["op_id", "gpu"])["first"].fillna(starts)
        span = float(ops["end_s"].max() - starts.min())
        delayed = compared[~compared["modelled"]]
        rows.append({"kernel_class": "iteration", "kernels": len(compared), "measured_s": measured_span_s,
                     "simulated_s": span,
                     "error": span / measured_span_s - 1.0 if compared["modelled"].any() else float("nan"),
                     "median_kernel_error": float("nan"), "not_simulated": len(delayed),
                     "not_simulated_s": float(delayed["measured_s"].sum())})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def _row(label: str, kernels: pd.DataFrame) -> dict:
    """The comparison row of ``kernels`` (rows of :func:`kernel_comparison`): simulated ones compared,
    delays counted apart."""
    modelled = kernels[kernels["modelled"]]
    delayed = kernels[~kernels["modelled"]]
    measured = float(modelled["measured_s"].sum())
    simulated = float(modelled["simulated_s"].sum())
    return {
        "kernel_class": label, "kernels": len(modelled), "measured_s": measured, "simulated_s": simulated,
        "error": simulated / measured - 1.0 if measured > 0 else float("nan"),
        "median_kernel_error": float(modelled["error"].median()) if len(modelled) else float("nan"),
        "not_simulated": len(delayed), "not_simulated_s": float(delayed["measured_s"].sum()),
    }  # fmt: skip
