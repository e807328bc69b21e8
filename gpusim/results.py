"""Results of a simulation: pandas DataFrames, a summary, and a Perfetto timeline.

Times in results are seconds (``*_s`` columns); bytes are bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpusim.engine.simulation import Span

OP_COLUMNS = [
    "op_id",
    "name",
    "kind",
    "gpu",
    "stream",
    "start_s",
    "end_s",
    "duration_s",
    "impl",
    "flops",
    "bytes",
    "measured_s",
]
SUMMARY_COLUMNS = [
    "op_id",
    "name",
    "kind",
    "impl",
    "gpus",
    "start_s",
    "end_s",
    "flops",
    "bytes",
    "duration_s",
    "tflop_per_s",
    "gb_per_s",
]
"""Columns of :meth:`Result.summary`."""


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
        One row per kernel per GPU.
    dram
        DRAM traffic: gpu, channel, stream, direction, t_s (start of its time bin), bytes.
    links
        Link traffic: link, src, dst, t_s, bytes.
    counters
        Named totals (L2 hits, DMA bytes, tracker overflows...).
    config
        The resolved system description the run used (as plain data).
    stats
        Simulator statistics: events, wall_s, events_per_s, mode.
    spans
        The raw timeline (for :meth:`to_perfetto`).
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

    def summary(self) -> pd.DataFrame:
        """One row per op execution (over all its GPUs): :data:`SUMMARY_COLUMNS`, i.e. op_id, name,
        kind, implementation, GPUs, start, end, FLOPs, bytes, duration and rates (TFLOP/s for
        GEMMs)."""
        if self.ops.empty:
            return pd.DataFrame(columns=SUMMARY_COLUMNS)
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
        table["tflop_per_s"] = table["flops"] / table["duration_s"] / 1e12
        table.loc[table["kind"] != "gemm", "tflop_per_s"] = float("nan")
        table["gb_per_s"] = table["bytes"] / table["duration_s"] / 1e9
        return table.reset_index()[SUMMARY_COLUMNS]

    def dram_totals(self) -> pd.DataFrame:
        """DRAM bytes per GPU, stream and direction."""
        if self.dram.empty:
            return pd.DataFrame(columns=["gpu", "stream", "direction", "bytes"])
        return self.dram.groupby(["gpu", "stream", "direction"], as_index=False)["bytes"].sum()

    def dram_bandwidth(self, gpu: int = 0) -> pd.DataFrame:
        """DRAM traffic of one GPU over time: t_s and GB/s per stream and direction."""
        frame = self.dram[self.dram["gpu"] == gpu]
        if frame.empty:
            return pd.DataFrame(columns=["t_s"])
        table = frame.pivot_table(index="t_s", columns=["stream", "direction"], values="bytes", aggfunc="sum")
        table = table.fillna(0.0) / self.bin_s / 1e9
        table.columns = [f"{stream}_{direction}" for stream, direction in table.columns]
        return table.reset_index()

    def to_perfetto(self, path: str | os.PathLike) -> Path:
        """Write the timeline as Chrome-trace JSON that opens in Perfetto (ui.perfetto.dev).

        Processes are GPUs; threads are streams (ops, kernels) and DMA engines; DRAM bandwidth per
        GPU and stream, and link bandwidth, are counter tracks.
        """
        events: list[dict[str, Any]] = []
        lanes: dict[tuple[int, str], int] = {}
        for span in self.spans:
            key = (span.gpu, f"{span.lane} {span.category}s")
            if key not in lanes:
                lanes[key] = len(lanes) + 1
            args = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in span.args.items()}
            events.append(
                {
                    "name": span.name,
                    "cat": span.category,
                    "ph": "X",
                    "ts": span.start_ns / 1e3,
                    "dur": max(0.0, span.end_ns - span.start_ns) / 1e3,
                    "pid": span.gpu,
                    "tid": lanes[key],
                    "args": args,
                }
            )
        gpus = sorted({gpu for gpu, _ in lanes} | set(self.dram["gpu"].unique() if not self.dram.empty else []))
        for gpu in gpus:
            events.append({"name": "process_name", "ph": "M", "pid": int(gpu), "args": {"name": f"GPU {gpu}"}})
        for (gpu, lane), tid in lanes.items():
            events.append({"name": "thread_name", "ph": "M", "pid": int(gpu), "tid": tid, "args": {"name": lane}})
        for gpu in gpus:
            bandwidth = self.dram_bandwidth(int(gpu))
            for row in bandwidth.itertuples(index=False):
                values = {name: round(float(value), 3) for name, value in zip(bandwidth.columns[1:], row[1:])}
                events.append(
                    {"name": "DRAM GB/s", "ph": "C", "ts": row[0] * 1e6, "pid": int(gpu), "args": values}
                )
        if not self.links.empty:
            link_pid = (max(gpus) + 1) if gpus else 0
            events.append({"name": "process_name", "ph": "M", "pid": int(link_pid), "args": {"name": "links"}})
            per_bin = self.links.groupby(["link", "t_s"], as_index=False)["bytes"].sum()
            for row in per_bin.itertuples(index=False):
                events.append(
                    {
                        "name": f"{row.link} GB/s",
                        "ph": "C",
                        "ts": row.t_s * 1e6,
                        "pid": int(link_pid),
                        "args": {"GB/s": round(row.bytes / self.bin_s / 1e9, 3)},
                    }
                )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
        tmp.replace(path)
        return path


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
    ops = pd.DataFrame(rows, columns=None if rows else OP_COLUMNS)
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
    kernels = pd.DataFrame(kernel_rows)
    bin_s = recorder.bin_ns * 1e-9
    dram = pd.DataFrame(
        [(g, c, s, d, b * bin_s, n) for (g, c, s, d, b), n in recorder.dram.items()],
        columns=["gpu", "channel", "stream", "direction", "t_s", "bytes"],
    )
    links = pd.DataFrame(
        [(link, src, dst, b * bin_s, n) for (link, src, dst, b), n in recorder.links.items()],
        columns=["link", "src", "dst", "t_s", "bytes"],
    )
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
    )
