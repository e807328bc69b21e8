"""Matplotlib plots of results.  Every function takes a DataFrame (or Result) and ``ax=None`` and
returns the Axes it drew on; a frame with nothing to plot gives empty axes with a note saying so.

Importing it leaves matplotlib's backend alone (a notebook keeps its inline figures); the ``gpusim``
command draws into files only (the Agg backend, unless ``MPLBACKEND`` says otherwise)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd


def save_figure(fig, path, dpi: int = 120) -> None:
    """Lay out ``fig``, write it to ``path`` (PNG, PDF, ... by the suffix) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _axes(ax):
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    return ax


def _no_data(ax, note: str = "no data"):
    """Write ``note`` in the middle of ``ax`` (a plot with nothing to draw) and return ``ax``."""
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="0.4")
    return ax


def timeline(ops: pd.DataFrame, ax=None, gpus: list[int] | None = None):
    """Gantt chart of ops per GPU and stream (``Result.ops``)."""
    ax = _axes(ax)
    frame = ops if gpus is None else ops[ops["gpu"].isin(gpus)]
    ax.set_xlabel("time (ms)")
    if frame.empty:
        return _no_data(ax, "no ops")
    lanes = sorted({(int(g), s) for g, s in zip(frame["gpu"], frame["stream"])})
    index = {lane: i for i, lane in enumerate(lanes)}
    kinds = sorted(frame["kind"].unique())
    colours = {kind: f"C{i}" for i, kind in enumerate(kinds)}
    for row in frame.itertuples(index=False):
        y = index[(int(row.gpu), row.stream)]
        ax.barh(y, row.duration_s * 1e3, left=row.start_s * 1e3, color=colours[row.kind], edgecolor="k", linewidth=0.3)
    ax.set_yticks(range(len(lanes)), [f"GPU{g} {s}" for g, s in lanes])
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in kinds]
    ax.legend(handles, kinds, loc="upper right", fontsize="small")
    ax.invert_yaxis()
    return ax


def dram_bandwidth(bandwidth: pd.DataFrame, ax=None, title: str | None = None):
    """DRAM bandwidth over time per stream and direction (``Result.dram_bandwidth(gpu)``)."""
    ax = _axes(ax)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("DRAM bandwidth (GB/s)")
    if title:
        ax.set_title(title)
    series = [column for column in bandwidth.columns if column != "t_s"]
    if bandwidth.empty or not series:
        return _no_data(ax, "no DRAM traffic")
    for column in series:
        ax.plot(bandwidth["t_s"] * 1e3, bandwidth[column], label=column, linewidth=1)
    ax.legend(fontsize="small")
    return ax


def bars(frame: pd.DataFrame, x: str, y: str, hue: str | None = None, ax=None, ylabel: str | None = None,
         xlabel: str | None = None):
    """Grouped bar chart of ``y`` by ``x`` (and ``hue``); the axes are labelled ``xlabel`` and ``ylabel``
    (default: the column names), which should say the unit or what a ratio is of."""
    ax = _axes(ax)
    if frame.empty:
        _no_data(ax)
    elif hue is None:
        ax.bar(frame[x].astype(str), frame[y])
    else:
        table = frame.pivot_table(index=x, columns=hue, values=y, aggfunc="first", sort=False)
        table.plot.bar(ax=ax, rot=30)  # pandas labels the x axis with the column's name; the labels below replace it
    ax.set_ylabel(ylabel or y)
    ax.set_xlabel(xlabel or x)
    return ax


def stacked_bars(frame: pd.DataFrame, x: str, y: str, stack: str, ax=None, ylabel: str | None = None):
    """Bars of ``y`` by ``x``, each split into the parts named by ``stack`` (in order of appearance)."""
    ax = _axes(ax)
    ax.set_ylabel(ylabel or y)
    ax.set_xlabel(x)
    if frame.empty:
        return _no_data(ax)
    table = frame.pivot_table(index=x, columns=stack, values=y, aggfunc="sum", sort=False).fillna(0.0)
    table.plot.bar(stacked=True, ax=ax, rot=30)
    ax.legend(title=stack, fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)  # off the bars
    return ax


def measured_vs_simulated(frame: pd.DataFrame, measured: str = "measured_s", simulated: str = "simulated_s",
                          ax=None, label: str | None = None):
    """Scatter of simulated against measured times on log axes, with the ideal line."""
    ax = _axes(ax)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("simulated (ms)")
    if frame.empty:
        return _no_data(ax)
    ax.loglog(frame[measured] * 1e3, frame[simulated] * 1e3, "o", markersize=4, label=label)
    low = min(frame[measured].min(), frame[simulated].min()) * 1e3
    high = max(frame[measured].max(), frame[simulated].max()) * 1e3
    ax.loglog([low, high], [low, high], "k--", linewidth=0.8)
    return ax


def measured_and_simulated(frame: pd.DataFrame, x: str, by: str | None = None, measured: str = "measured_s",
                           simulated: str = "simulated_s", ax=None, xlabel: str | None = None, logx: bool = True):
    """Measured (lines) and simulated (markers) times against ``x``, one colour per value of ``by``."""
    ax = _axes(ax)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("time (ms)")
    if frame.empty:
        return _no_data(ax)
    groups = [(None, frame)] if by is None else list(frame.groupby(by, sort=True))
    for index, (value, part) in enumerate(groups):
        part = part.sort_values(x)
        label = "" if value is None else f"{by}={value} "
        colour = f"C{index}"
        ax.plot(part[x], part[measured] * 1e3, "-", color=colour, linewidth=1, label=f"{label}measured")
        ax.plot(part[x], part[simulated] * 1e3, "o", color=colour, markersize=3, label=f"{label}simulated")
    if logx:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend(fontsize="x-small", ncol=2)
    return ax


def relative_error(frame: pd.DataFrame, x: str = "measured_s", error: str = "error", ax=None,
                   xlabel: str | None = None, tolerance: float | None = None):
    """Signed relative error (simulated / measured - 1) of each point against ``x`` (log axis)."""
    ax = _axes(ax)
    ax.set_xlabel(xlabel or (f"{x[:-2]} (ms)" if x.endswith("_s") else x))
    ax.set_ylabel("error (%)")
    if frame.empty:
        return _no_data(ax)
    scale = 1e3 if x.endswith("_s") else 1.0
    ax.semilogx(frame[x] * scale, frame[error] * 100, "o", markersize=3)
    ax.axhline(0.0, color="k", linewidth=0.8)
    if tolerance is not None:
        for sign in (-1, 1):
            ax.axhline(sign * tolerance * 100, color="r", linewidth=0.8, linestyle="--")
    return ax


def lines(frame: pd.DataFrame, x: str, y: str, by: str | None = None, ax=None, xlabel: str | None = None,
          ylabel: str | None = None, logx: bool = False, marker: str = "o"):
    """``y`` against ``x`` as lines with markers, one line per value of ``by`` (sweep results)."""
    ax = _axes(ax)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    if frame.empty:
        return _no_data(ax)
    groups = [(None, frame)] if by is None else list(frame.groupby(by, sort=False))
    for value, part in groups:
        part = part.sort_values(x)
        ax.plot(part[x], part[y], marker=marker, markersize=4, linewidth=1, label=None if value is None else str(value))
    if logx:
        ax.set_xscale("log")
    if by is not None:
        ax.legend(fontsize="small", title=by)
    return ax


def sweep_totals(points: pd.DataFrame, fields: list[str], ax=None, title: str | None = None):
    """A what-if sweep's total simulated time (ms) against its first varied field, one line per
    combination of the other fields' values (:func:`gpusim.parameter_sweep.point_totals`)."""
    frame = points.assign(total_ms=points["total_s"] * 1e3)
    by = None
    if len(fields) > 1:
        by = ", ".join(fields[1:])
        frame[by] = frame[fields[1:]].astype(str).agg(", ".join, axis=1)
    ax = lines(frame, x=fields[0], y="total_ms", by=by, ax=ax, ylabel="simulated time (ms)")
    if title:
        ax.set_title(title)
    return ax


BREAKDOWN_PARTS = (
    ("compute only", "C0"),
    ("overlapped communication", "C2"),
    ("exposed communication", "C3"),
    ("idle", "0.8"),
)


def breakdown(frame: pd.DataFrame, ax=None, label: str = "gpu", title: str | None = None):
    """Stacked bars of where time goes (``gpusim.trace.breakdown`` output, one bar per row).

    Each bar sums to the iteration time: compute alone, compute overlapped with communication,
    exposed communication and idle, in ms.  ``label`` names the column that labels the bars
    (e.g. ``"gpu"`` or a ``"system"`` column added by the caller).
    """
    ax = _axes(ax)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(label)
    if title:
        ax.set_title(title, pad=24)
    if frame.empty:
        return _no_data(ax)
    parts = {
        "compute only": frame["compute_s"] - frame["overlapped_comm_s"],
        "overlapped communication": frame["overlapped_comm_s"],
        "exposed communication": frame["exposed_comm_s"],
        "idle": frame["idle_s"],
    }
    names = [str(value) for value in frame[label]]
    left = pd.Series(0.0, index=frame.index)
    for part, colour in BREAKDOWN_PARTS:
        ax.barh(names, parts[part] * 1e3, left=left * 1e3, color=colour, label=part, edgecolor="k", linewidth=0.3)
        left = left + parts[part]
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    return ax
