"""Results of a simulation: pandas DataFrames, a summary, and a Perfetto timeline.

Times in results are seconds (``*_s`` columns); bytes are bytes.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpusim.engine.simulation import Span
from gpusim.errors import GpusimError
from gpusim.output_files import write_whole

OP_DTYPES = {
    "op_id": "int64",
    "name": "str",
    "kind": "str",
    "gpu": "int64",
    "stream": "str",
    "start_s": "float64",
    "end_s": "float64",
    "duration_s": "float64",
    "impl": "str",
    "flops": "float64",
    "bytes": "float64",
    "measured_s": "float64",
}
"""Columns every :attr:`Result.ops` has, and their dtypes (ops add their own, e.g. workgroups)."""
OP_COLUMNS = list(OP_DTYPES)
KERNEL_DTYPES = {
    "name": "str",
    "gpu": "int64",
    "stream": "str",
    "start_s": "float64",
    "end_s": "float64",
    "duration_s": "float64",
    "op_id": "int64",
}
"""Columns every :attr:`Result.kernels` has, and their dtypes (kernels add their own, e.g. impl and workgroups)."""
KERNEL_COLUMNS = list(KERNEL_DTYPES)
L2_DTYPES = {"gpu": "int64", "t_s": "float64", "bytes": "float64"}
"""Columns of :attr:`Result.l2` and their dtypes."""
L2_COLUMNS = list(L2_DTYPES)
DRAM_DTYPES = {"gpu": "int64", "channel": "int64", "stream": "str", "direction": "str", "t_s": "float64",
               "bytes": "float64"}
"""Columns of :attr:`Result.dram` and their dtypes."""
DRAM_COLUMNS = list(DRAM_DTYPES)
LINK_DTYPES = {"link": "str", "src": "int64", "dst": "int64", "t_s": "float64", "bytes": "float64"}
"""Columns of :attr:`Result.links` and their dtypes."""
LINK_COLUMNS = list(LINK_DTYPES)
SUMMARY_DTYPES = {
    "op_id": "int64",
    "name": "str",
    "kind": "str",
    "impl": "str",
    "gpus": "int64",
    "start_s": "float64",
    "end_s": "float64",
    "flops": "float64",
    "bytes": "float64",
    "duration_s": "float64",
    "tflop_per_s": "float64",
    "gb_per_s": "float64",
}
"""Columns of :meth:`Result.summary` and their dtypes."""
SUMMARY_COLUMNS = list(SUMMARY_DTYPES)
RATED_KINDS = ("gemm", "fused", "attention")
"""Kinds of op whose summary row has a ``tflop_per_s``: the ones whose FLOPs are their matrix products'."""
DRAM_TOTAL_DTYPES = {"gpu": "int64", "stream": "str", "direction": "str", "bytes": "float64"}
"""Columns of :meth:`Result.dram_totals` and their dtypes."""


def empty_frame(dtypes: dict[str, str]) -> pd.DataFrame:
    """A frame without rows whose columns have the given dtypes (not pandas' default, object)."""
    return pd.DataFrame({column: pd.Series(dtype=dtype) for column, dtype in dtypes.items()})


def nested_lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """A lane for each ``(start, end)`` interval such that intervals sharing a lane are disjoint or
    nested, never partly overlapping (what a timeline thread can show), using as few lanes as the
    greedy pass over the intervals by start finds.

    Returns
    -------
    list[int]
        The lane (0, 1, ...) of each interval, in the order given.
    """
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    open_ends: list[list[float]] = []  # per lane, the ends of the intervals still open, innermost last
    lanes = [0] * len(intervals)
    for index in order:
        start, end = intervals[index]
        chosen = len(open_ends)
        for lane, stack in enumerate(open_ends):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                chosen = lane
                break
        if chosen == len(open_ends):
            open_ends.append([])
        open_ends[chosen].append(end)
        lanes[index] = chosen
    return lanes


@dataclass
class Result:
    """What a run produced.

    Attributes
    ----------
    time_s
        Simulated time from the first op's start to the last op's end, s.
    ops
        One row per op execution per GPU: op_id (one per execution: an op object run twice has
        two), name, kind, gpu, stream, start_s, end_s, duration_s, impl, flops, bytes, measured_s
        (empty unless the op came from a measured trace) and more.
    kernels
        One row per kernel per GPU: name, gpu, stream, start_s, end_s, duration_s, op_id (the
        ``op_id`` of the op that launched it, as in ``ops``) and the kernel's own fields.
    dram
        DRAM traffic: gpu, channel, stream, direction, t_s (start of its time bin), bytes; only
        bins with traffic have rows.  With layer caching, the simulated rows' traffic on their own
        time axis (:attr:`traffic_on_timeline`); so are ``links`` and ``l2``.
    links
        Link traffic: link, src, dst, t_s, bytes; only bins with traffic have rows.  Bytes are
        wire bytes: a collective's protocol flags are included (NCCL's LL moves twice its
        payload, LL128 128/120 of it), so a ring all-reduce of S bytes over N GPUs sends
        2 (N - 1) / N x S / wire efficiency from each GPU.
    counters
        Named totals (L2 hits, DMA bytes, tracker overflows...).
    config
        The resolved system description the run used (as plain data).
    stats
        Simulator statistics: events, wall_s, events_per_s, mode.
    spans
        The raw timeline (for :meth:`to_perfetto`).
    bin_s
        Width of the traffic tables' time bins, s.
    l2
        Bytes read from and written to the L2 by the GPU's requesters: gpu, t_s (start of its time
        bin), bytes; only bins with traffic have rows.
    """

    time_s: float
    ops: pd.DataFrame
    kernels: pd.DataFrame
    dram: pd.DataFrame
    links: pd.DataFrame
    counters: dict[str, float]
    config: dict[str, Any]
    stats: dict[str, Any]
    spans: list[Span] = field(default_factory=list, repr=False)
    bin_s: float = 5e-6
    l2: pd.DataFrame = field(default_factory=lambda: empty_frame(L2_DTYPES), repr=False)

    def summary(self) -> pd.DataFrame:
        """One row per op execution (over all its GPUs): :data:`SUMMARY_COLUMNS`.

        ``gpus`` counts the GPUs with a row in :attr:`ops` (1 in symmetric mode, which simulates
        GPU 0 only); ``start_s`` and ``end_s`` are the earliest start and latest end over them, s,
        and ``duration_s`` the difference.  ``flops`` and ``bytes`` are one GPU's (each GPU of a
        collective or of a GEMM on several GPUs does the same work), so the rates ``tflop_per_s``
        (:data:`RATED_KINDS` only; a fused GEMM's FLOPs over its whole span, collective included) and
        ``gb_per_s`` are per GPU, and the same in full and
        symmetric mode; an op that took no time has no rate (NaN).  A collective's ``bytes`` are its
        buffer's, so its ``gb_per_s`` is NCCL's algorithm bandwidth (``busbw`` is it times
        ``2 (n - 1) / n`` for an all-reduce over ``n`` GPUs, ``(n - 1) / n`` for a reduce-scatter or
        all-gather).
        """
        if self.ops.empty:
            return empty_frame(SUMMARY_DTYPES)
        grouped = self.ops.groupby("op_id", sort=True)
        table = grouped.agg(
            name=("name", "first"),
            kind=("kind", "first"),
            impl=("impl", "first"),
            gpus=("gpu", "nunique"),
            start_s=("start_s", "min"),
            end_s=("end_s", "max"),
            flops=("flops", "first"),
            bytes=("bytes", "first"),
        )
        table["duration_s"] = table["end_s"] - table["start_s"]
        took = table["duration_s"].where(table["duration_s"] > 0)  # an op that took no time has no rate
        table["tflop_per_s"] = table["flops"] / took / 1e12
        table.loc[~table["kind"].isin(RATED_KINDS), "tflop_per_s"] = float("nan")
        table["gb_per_s"] = table["bytes"] / took / 1e9
        return table.reset_index()[SUMMARY_COLUMNS]

    def energy(self) -> pd.DataFrame:
        """Energy per simulated GPU and component, J (:func:`gpusim.energy.energy`; needs the GPU's
        ``power`` section)."""
        from gpusim.energy import energy

        return energy(self)

    def power(self) -> pd.DataFrame:
        """Energy, average power and power limit per simulated GPU (:func:`gpusim.energy.power`)."""
        from gpusim.energy import power

        return power(self)

    @property
    def traffic_on_timeline(self) -> bool:
        """Whether ``dram``, ``links`` and ``l2`` lie on the ops' time axis.  Not for a trace replayed
        with layer caching: its traffic is that of the rows it simulated, on their own (shorter) time
        axis, while its ops are re-timed over the whole iteration; the totals of the simulated rows
        still hold."""
        rows, simulated = self.stats.get("trace_rows"), self.stats.get("simulated_rows")
        return rows is None or simulated is None or simulated >= rows

    def dram_totals(self) -> pd.DataFrame:
        """DRAM bytes per GPU, stream and direction."""
        if self.dram.empty:
            return empty_frame(DRAM_TOTAL_DTYPES)
        return self.dram.groupby(["gpu", "stream", "direction"], as_index=False)["bytes"].sum()

    def time_bins(self) -> np.ndarray:
        """Indices of the ``bin_s``-wide time bins from the first op's start to the last op's end (and
        any DRAM traffic): bin ``i`` starts at ``i * bin_s`` seconds.  The traffic tables (``dram``,
        ``links``, ``l2``) and the timelines built from them use these bins."""
        first: list[int] = []
        last: list[int] = []
        if not self.ops.empty:
            first.append(math.floor(float(self.ops["start_s"].min()) / self.bin_s))
            last.append(max(first[0], math.ceil(float(self.ops["end_s"].max()) / self.bin_s) - 1))
        if not self.dram.empty:
            indices = self.bin_of(self.dram["t_s"])
            first.append(int(indices.min()))
            last.append(int(indices.max()))
        if not first:
            return np.arange(0)
        return np.arange(min(first), max(last) + 1)

    def bin_of(self, t_s: pd.Series) -> np.ndarray:
        """The bin index (:meth:`time_bins`) of each bin start ``t_s`` of a traffic table, s."""
        return np.rint(t_s.to_numpy(dtype=float) / self.bin_s).astype(int)

    def dram_bandwidth(self, gpu: int = 0) -> pd.DataFrame:
        """DRAM traffic of one GPU over time: t_s and GB/s per stream and direction.

        Parameters
        ----------
        gpu
            The GPU.

        Returns
        -------
        pandas.DataFrame
            One row per time bin (``bin_s`` wide, ``t_s`` its start) from the first op's start to
            the last op's end, bins without traffic included as 0, and one column
            ``{stream}_{direction}`` of GB/s per stream and direction the GPU moved data on (none
            when it moved nothing).  The mean of a column times the span (rows x ``bin_s``) is its
            bytes.

        Raises
        ------
        GpusimError
            ``gpu`` was not simulated (a GPU other than 0 in symmetric mode, or one the system
            lacks), rather than a table of zeros that looks like an idle GPU.
        """
        simulated = self.stats.get("simulated_gpus")
        if simulated is not None and not (isinstance(gpu, numbers.Integral) and 0 <= gpu < simulated):
            only = " (symmetric mode simulates GPU 0 only)" if self.stats.get("mode") == "symmetric" else ""
            raise GpusimError(f"dram_bandwidth: GPU {gpu!r} was not simulated; this run simulated GPUs "
                              f"0..{simulated - 1}{only}")
        bins = self.time_bins()
        table = self._dram_rates(gpu).reindex(bins, fill_value=0.0)
        table.columns = [str(column) for column in table.columns]
        table.insert(0, "t_s", bins * self.bin_s)
        return table.reset_index(drop=True)

    def _dram_rates(self, gpu: int) -> pd.DataFrame:
        """GB/s of one GPU per busy time bin and ``{stream}_{direction}`` (:meth:`_rates`)."""
        traffic = self.dram[self.dram["gpu"] == gpu]
        return self._rates(traffic, traffic["stream"] + "_" + traffic["direction"])

    def to_perfetto(self, path: str | os.PathLike) -> Path:
        """Write the timeline as Chrome-trace JSON that opens in Perfetto (ui.perfetto.dev).

        Processes are GPUs; threads are streams (ops, kernels) and DMA engines; DRAM bandwidth per
        GPU and stream, and link bandwidth, are counter tracks, 0 while nothing moves and after the
        last bin; so is each GPU's power by kind of activity (:func:`gpusim.energy.power_timeline`)
        where its GPU has a power model.  A trace replayed with layer caching has no counter
        tracks: its traffic is the simulated rows' on their own time axis
        (:attr:`traffic_on_timeline`), which Perfetto would draw against the wrong ops.  Spans of
        one thread that partly overlap (a fused collective's steps) go to extra threads of the same
        name, numbered (:func:`nested_lanes`): a thread shows nested slices only, written in order
        of start and, at one start, longest first (the parent before its children).

        Span times are rounded to whole ns and written in us with three decimals, so ``ts + dur``
        is exactly the span's end as a reader that rounds to ns (Perfetto) sees it: an op that
        starts where the previous one ends does not overlap it by a rounding nanosecond, which
        Perfetto would show as a misnested slice.  The file is strict JSON (no NaN or Infinity):
        a non-finite span argument is written as text (``"nan"``, ``"inf"``).

        Parameters
        ----------
        path
            The file to write (its folder is created); written whole or not at all.

        Returns
        -------
        pathlib.Path
            ``path``.

        Raises
        ------
        GpusimError
            ``path`` is empty or a folder, or the file cannot be written; the message names it.
        """
        from gpusim.energy import has_power_timeline, power_timeline

        if not isinstance(path, (str, os.PathLike)):
            raise GpusimError(f"cannot write the Perfetto timeline to {path!r}: give the file's path as text or a "
                              f"pathlib.Path, not {type(path).__name__}")
        target = Path(path)
        if not os.fspath(path):
            raise GpusimError("cannot write the Perfetto timeline to an empty path; give a file name")
        if target.name in ("", ".", "..") or target.is_dir():
            raise GpusimError(f"{target}: cannot write the Perfetto timeline: it is a folder; give a file name")
        events: list[dict[str, Any]] = []
        threads: dict[tuple[int, str], list[Span]] = {}
        for span in self.spans:
            threads.setdefault((span.gpu, f"{span.lane} {span.category}s"), []).append(span)
        lanes: dict[tuple[int, str], int] = {}
        placed: list[tuple[Span, tuple[int, str]]] = []
        for (gpu, name), spans in threads.items():
            chosen = nested_lanes([(span.start_ns, span.end_ns) for span in spans])
            keys = [(gpu, name if lane == 0 else f"{name} ({lane + 1})") for lane in range(max(chosen) + 1)]
            for key in keys:  # a thread's extra lanes follow it, in order
                lanes[key] = len(lanes) + 1
            placed += [(span, keys[lane]) for span, lane in zip(spans, chosen)]
        placed.sort(key=lambda item: (lanes[item[1]], round(item[0].start_ns), -round(item[0].end_ns)))
        for span, key in placed:
            start_ns = round(span.start_ns)  # whole ns: ts + dur is then exactly the end, see the docstring
            end_ns = max(start_ns, round(span.end_ns))
            events.append(
                {
                    "name": span.name,
                    "cat": span.category,
                    "ph": "X",
                    "ts": start_ns / 1e3,
                    "dur": (end_ns - start_ns) / 1e3,
                    "pid": span.gpu,
                    "tid": lanes[key],
                    "args": {name: _arg(value) for name, value in span.args.items()},
                }
            )
        gpus = sorted({gpu for gpu, _ in lanes} | set(self.dram["gpu"].unique() if not self.dram.empty else []))
        for gpu in gpus:
            events.append({"name": "process_name", "ph": "M", "pid": int(gpu), "args": {"name": f"GPU {gpu}"}})
        for (gpu, lane), tid in lanes.items():
            events.append({"name": "thread_name", "ph": "M", "pid": int(gpu), "tid": tid, "args": {"name": lane}})
        if self.traffic_on_timeline:
            for gpu in gpus:
                events += self._counter("DRAM GB/s", int(gpu), self._dram_rates(int(gpu)))
        if has_power_timeline(self):
            for gpu in gpus:
                timeline = power_timeline(self, int(gpu))
                events += self._counter("power W", int(gpu), timeline.drop(columns="t_s").set_index(
                    self.bin_of(timeline["t_s"])))
        if not self.links.empty and self.traffic_on_timeline:
            link_pid = (max(gpus) + 1) if gpus else 0
            events.append({"name": "process_name", "ph": "M", "pid": int(link_pid), "args": {"name": "links"}})
            for link, traffic in self.links.groupby("link", sort=True):  # Perfetto names the track "<link> GB/s"
                events += self._counter(str(link), int(link_pid), self._rates(traffic, pd.Series("GB/s",
                                                                                               index=traffic.index)))
        text = json.dumps({"traceEvents": events}, allow_nan=False, separators=(",", ":"))
        return write_whole(target, lambda tmp: tmp.write_text(text), "the Perfetto timeline")

    def _rates(self, traffic: pd.DataFrame, series: pd.Series) -> pd.DataFrame:
        """GB/s per time bin (index: the bins with traffic, in order) and ``series`` (columns)."""
        if traffic.empty:
            return pd.DataFrame()
        table = traffic.assign(bin=self.bin_of(traffic["t_s"]), series=series.to_numpy()).pivot_table(
            index="bin", columns="series", values="bytes", aggfunc="sum")
        return table.fillna(0.0).sort_index() / self.bin_s / 1e9

    def _bin_us(self, index: int) -> float:
        """The start of time bin ``index``, us, to the ps (``35.0``, not ``35.00000000000001``)."""
        return round(index * self.bin_s * 1e9, 3) / 1e3

    def _counter(self, name: str, pid: int, rates: pd.DataFrame) -> list[dict[str, Any]]:
        """Counter events of one track from the bins with traffic (:meth:`_rates`).

        A counter holds its value until the next sample, so a sample is written where the values
        change, and a sample of 0 where a run of busy bins ends (idle bins carry no rows, so long
        idle spans cost nothing).
        """
        if rates.empty:
            return []
        zero = dict.fromkeys((str(column) for column in rates.columns), 0.0)
        events: list[dict[str, Any]] = []
        previous: dict[str, float] | None = None
        bins = rates.index.to_numpy()
        for position, (index, row) in enumerate(zip(bins, rates.to_numpy())):
            values = {column: round(float(value), 3) for column, value in zip(zero, row)}
            if values != previous:
                events.append({"name": name, "ph": "C", "ts": self._bin_us(index), "pid": pid, "args": values})
                previous = values
            if position + 1 == len(bins) or bins[position + 1] != index + 1:
                events.append({"name": name, "ph": "C", "ts": self._bin_us(index + 1), "pid": pid,
                               "args": dict(zero)})
                previous = zero
        return events


def _arg(value: object) -> int | float | str | bool:
    """A span argument as the timeline shows it: numbers (NumPy's too) and text as they are,
    a non-finite number (which strict JSON lacks) and anything else as text."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else str(float(value))
    return value if isinstance(value, str) else str(value)


def build_result(records, recorder, config, stats: dict[str, Any]) -> Result:
    """Assemble a :class:`Result` from an executor's op records and a recorder."""
    rows = []
    for record in records:
        info = dict(record.info)
        rows.append(
            {
                "op_id": record.op.uid,
                "name": record.op.label,
                "kind": record.op.category,
                "gpu": record.rank,
                "stream": record.stream,
                "start_s": record.start_ns * 1e-9,
                "end_s": record.end_ns * 1e-9,
                "duration_s": (record.end_ns - record.start_ns) * 1e-9,
                "impl": info.pop("impl", ""),
                "flops": float(info.pop("flops", 0.0)),
                "bytes": float(info.pop("bytes", 0.0)),
                "measured_s": info.pop("measured_s", float("nan")),
                **info,
            }
        )
    ops = pd.DataFrame(rows) if rows else empty_frame(OP_DTYPES)
    kernel_rows = [
        {
            "name": span.name,
            "gpu": span.gpu,
            "stream": span.lane,
            "start_s": span.start_ns * 1e-9,
            "end_s": span.end_ns * 1e-9,
            "duration_s": (span.end_ns - span.start_ns) * 1e-9,
            **{k: v for k, v in span.args.items() if isinstance(v, (int, float, str))},
        }
        for span in recorder.spans
        if span.category == "kernel"
    ]
    kernels = pd.DataFrame(kernel_rows) if kernel_rows else empty_frame(KERNEL_DTYPES)
    bin_s = recorder.bin_ns * 1e-9
    dram_rows = [(g, c, s, d, b * bin_s, n) for (g, c, s, d, b), n in recorder.dram.items()]
    dram = pd.DataFrame(dram_rows, columns=DRAM_COLUMNS) if dram_rows else empty_frame(DRAM_DTYPES)
    link_rows = [(link, src, dst, b * bin_s, n) for (link, src, dst, b), n in recorder.links.items()]
    links = pd.DataFrame(link_rows, columns=LINK_COLUMNS) if link_rows else empty_frame(LINK_DTYPES)
    l2_rows = [(gpu, b * bin_s, n) for (gpu, b), n in sorted(recorder.l2.items())]
    l2 = pd.DataFrame(l2_rows, columns=L2_COLUMNS) if l2_rows else empty_frame(L2_DTYPES)
    time_s = float(ops["end_s"].max() - ops["start_s"].min()) if not ops.empty else 0.0
    return Result(
        time_s=time_s,
        ops=ops,
        kernels=kernels,
        dram=dram,
        links=links,
        counters=dict(recorder.counters),
        config=config,
        stats=stats,
        spans=list(recorder.spans),
        bin_s=bin_s,
        l2=l2,
    )
