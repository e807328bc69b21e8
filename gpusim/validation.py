"""Comparisons of the simulator against measured hardware data (``validation/measured/``).

A :class:`DataSet` names a measured CSV, the preset it is compared on, how one measured row becomes
a simulation, and the error tolerances it must meet.  :func:`compare` simulates the rows (in
parallel processes through :func:`gpusim.sweep.sweep`) and returns measured and simulated times
and their relative error; :func:`error_stats` summarises the errors; :func:`violations` says which
tolerances a comparison breaks.  ``gpusim validate``, the scripts in ``validation/calibration/`` and
the calibration tests all go through here, so they judge the same numbers.

Errors are relative to the measurement: ``error = simulated / measured - 1``; statistics are of
``|error|``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.data_paths import data_root
from gpusim.errors import ConfigError
from gpusim.ops import Elementwise, as_int

MEASURED_DIR = data_root() / "validation" / "measured"
"""Where the repository keeps its copies of the measured data (with SOURCES.md)."""

STATISTICS = ("median", "p90", "max")


@dataclass(frozen=True)
class DataSet:
    """One measured data set and how the simulator is compared with it.

    Attributes
    ----------
    name
        Identifier (``gemm-v100-deepbench``).
    description
        One line: what was measured, on what.
    file
        CSV file name under :data:`MEASURED_DIR`.
    system
        Preset the rows are simulated on.
    point
        ``point(row) -> dict``: the simulation parameters of one measured row (plain values).
    measured_s
        ``measured_s(frame) -> Series``: the measured time of every row, s.
    tolerances
        Largest allowed absolute relative error per statistic (``{"median": 0.15, "p90": 0.35}``).
    select
        ``select(frame) -> frame``: the rows that belong to the comparison (default: all).
    group
        Column whose values are reported separately as well (e.g. the GPU count).
    plot_x, plot_by
        Column to plot measured and simulated times against (and to colour by) in reports.
    columns
        Further values the simulation of a point returns (beside ``simulated_s`` and ``impl``)
        that the comparison keeps as columns.
    read
        ``read(path) -> frame``: how to read a file kept as its source wrote it (default: a CSV
        with a header).
    """

    name: str
    description: str
    file: str
    system: str
    point: Callable[[pd.Series], dict[str, Any]]
    measured_s: Callable[[pd.DataFrame], pd.Series]
    tolerances: dict[str, float]
    select: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    group: str | None = None
    plot_x: str | None = None
    plot_by: str | None = None
    columns: tuple[str, ...] = ()
    read: Callable[[Path], pd.DataFrame] | None = None

    def load(self) -> pd.DataFrame:
        """The measured rows of the comparison, with a ``measured_s`` column."""
        path = MEASURED_DIR / self.file
        if not path.is_file():
            raise ConfigError(f"data set {self.name!r}: measured data {path} is missing")
        frame = pd.read_csv(path) if self.read is None else self.read(path)
        if self.select is not None:
            frame = self.select(frame)
        frame = frame.reset_index(drop=True)
        frame["measured_s"] = self.measured_s(frame).to_numpy(dtype=float)
        return frame


# -- simulation of one point (top level, so that worker processes can run it) -------------------
WARM_INPUT = "warm_input"
"""Name of the tensor a ``warm`` validation point's producer writes and its op reads."""
FLUSH_BUFFER = "l2_flush"
"""Name of the buffer a ``flush_bytes`` validation point's fill writes."""


def l2_flush(nbytes: int) -> Elementwise:
    """The fill of ``nbytes`` (fp32) with which a benchmark flushes the L2 before the call it times."""
    return Elementwise("fill", nbytes // DTYPE_BYTES["fp32"], "fp32", out=FLUSH_BUFFER)


def simulate_point(kind: str, system: str, overrides: dict[str, Any] | None = None, mode: str = "full",
                   **params: Any) -> dict[str, Any]:
    """Simulate one measured configuration and return ``simulated_s`` and the implementation used.

    Parameters
    ----------
    kind
        ``gemm``, ``elementwise``, ``rowreduce``, ``allreduce``, ``attention`` (a prompt's fused
        attention: ``seqlen`` queries and keys), ``concurrency`` (see
        :func:`simulate_concurrency`), ``reuse`` (see :func:`simulate_reuse`), ``interference``
        (see :func:`simulate_interference`) or ``bert_layer`` (see :func:`simulate_bert_layer`).
    system
        Preset name.
    overrides
        Dotted-path overrides of the preset (e.g. ``{"nodes": 2}``).
    mode
        ``full`` or ``symmetric``.
    params
        The op's parameters; ``warm=True`` has an element-wise add write the op's input (a GEMM's
        A) just before it, as the operation before it in a model's layer does, and times the op alone;
        with ``producer={"m": M, "n": N, "k": K, "trans_b": bool}`` as well, that operation is the
        GEMM that writes the input in the layer (its ``M x N`` output; B transposed as
        ``torch.nn.Linear`` stores it), so the L2 holds what the GEMM left of it;
        ``flush_bytes`` has a fill of that many bytes run just before it (a benchmark's L2 flush) and
        times the op as a lone call (the GPU's per-call cost and the op's kernels).
    """
    import gpusim
    from gpusim import ops

    if kind == "bert_layer":
        return simulate_bert_layer(system, overrides or {}, mode, **params)
    hardware = gpusim.load_system(system, overrides or {})
    if kind == "concurrency":
        return simulate_concurrency(hardware, **params)
    if kind == "reuse":
        return simulate_reuse(hardware, **params)
    if kind == "interference":
        return simulate_interference(hardware, **params)
    dtype = params.get("dtype", "fp16")
    warm = bool(params.get("warm", False))
    if warm and kind not in ("gemm", "elementwise", "rowreduce"):
        raise ValueError("simulate_point: 'warm' applies to gemm, elementwise and rowreduce points")
    flush_bytes = int(params.get("flush_bytes", 0))
    if warm and flush_bytes:
        raise ValueError("simulate_point: 'warm' and 'flush_bytes' exclude each other")
    producer = params.get("producer")
    if producer is not None and not warm:
        raise ValueError("simulate_point: 'producer' describes a warm point's producer; give 'warm' too")
    source = WARM_INPUT if warm else None
    if kind == "gemm":
        batch = int(params.get("batch", 1))
        op = ops.Gemm(params["m"], params["n"], params["k"], dtype, bool(params.get("trans_a", False)),
                      bool(params.get("trans_b", False)), batch, a=source)
        input_elements = batch * params["m"] * params["k"]
    elif kind == "elementwise":
        op = ops.Elementwise(params["op"], params["elements"], dtype, inputs=(source,) if warm else None,
                             rows=params.get("rows"))
        input_elements = params["elements"] * ops.ELEMENTWISE_INPUT_WIDTH.get(params["op"], 1)
    elif kind == "rowreduce":
        op = ops.RowReduce(params["op"], params["rows"], params["cols"], dtype,
                           library=params.get("library", "pytorch"), input=source)
        input_elements = params["rows"] * params["cols"]
    elif kind == "allreduce":
        op = ops.AllReduce(params["nbytes"], dtype)
    elif kind == "attention":
        op = ops.Attention(params["batch"], params["heads"], params["seqlen"], params["seqlen"], params["head_dim"],
                           dtype, bool(params["causal"]), direction=params["direction"])
    else:
        raise ValueError(f"unknown kind of validation point {kind!r}; known: gemm, elementwise, rowreduce, allreduce, "
                         f"attention, concurrency, reuse, interference, bert_layer")
    if warm or flush_bytes:
        # the op's kernels, from the first one's start (not the gap behind the one before) to the last one's end
        if producer is not None:
            before = ops.Gemm(producer["m"], producer["n"], producer["k"], dtype, trans_b=bool(producer["trans_b"]),
                              out=WARM_INPUT)
        else:
            before = ops.Elementwise("add", input_elements, dtype, out=WARM_INPUT) if warm else l2_flush(flush_bytes)
        result = gpusim.run(hardware, [before, op], mode=mode)
        kernels = result.kernels[result.kernels["op_id"] == result.ops["op_id"].iloc[-1]]
        span = float(kernels["end_s"].max() - kernels["start_s"].min())
        call = 0.0 if warm else hardware.gpu.kernel_launch_ns * 1e-9
        return {"simulated_s": call + span, "impl": str(result.ops["impl"].iloc[-1]),
                "sim_wall_s": result.stats["wall_s"]}
    result = gpusim.run(hardware, op, mode=mode)
    return {"simulated_s": result.time_s, "impl": str(result.ops["impl"].iloc[0]),
            "sim_wall_s": result.stats["wall_s"]}


def simulate_bert_layer(system: str, overrides: dict[str, Any], mode: str, direction: str, batch: int, seq_len: int,
                        dtype: str, kernel: str | None = None) -> dict[str, Any]:
    """One pass of Hugging Face's ``BertLayer`` (:func:`gpusim.hf_bert.bert_layer_ops`) on one stream.

    Parameters
    ----------
    system, overrides, mode
        As :func:`simulate_point`'s.
    direction, batch, seq_len, dtype
        The pass, as :func:`gpusim.hf_bert.bert_layer_ops` takes them.
    kernel
        A kernel's name (an op's ``impl``): ``simulated_s`` is then the mean duration of the pass's
        calls of it; without one, the pass's span from its first kernel's start to its last's end.

    Returns
    -------
    dict
        ``simulated_s`` (s), ``impl`` and ``sim_wall_s``.
    """
    span_s, kernels, wall_s = _bert_layer_pass(system, json.dumps(overrides, sort_keys=True, default=str), mode,
                                               direction, int(batch), int(seq_len), dtype)
    if not kernel:
        return {"simulated_s": span_s, "impl": f"BertLayer {direction}", "sim_wall_s": wall_s}
    if kernel not in kernels:
        raise ValueError(f"simulate_bert_layer: the {direction} pass runs no kernel {kernel!r}; it runs "
                         f"{', '.join(sorted(kernels))}")
    return {"simulated_s": kernels[kernel], "impl": kernel, "sim_wall_s": wall_s}


@functools.lru_cache(maxsize=4)
def _bert_layer_pass(system: str, overrides_json: str, mode: str, direction: str, batch: int, seq_len: int,
                     dtype: str) -> tuple[float, dict[str, float], float]:
    """The pass's span (s), the mean duration of each of its kernels (s) and the simulation's wall
    time (s); cached, as the points of a pass share one simulation."""
    import gpusim
    from gpusim.hf_bert import bert_layer_ops

    hardware = gpusim.load_system(system, json.loads(overrides_json))
    result = gpusim.run(hardware, bert_layer_ops(direction, batch, seq_len, dtype), mode=mode)
    span_s = float(result.kernels["end_s"].max() - result.kernels["start_s"].min())
    kernels = result.ops.groupby("impl")["duration_s"].mean().astype(float).to_dict()
    return span_s, kernels, float(result.stats["wall_s"])


def simulate_concurrency(hardware: Any, m: int, n: int, k: int, count: int, measured_sequential_s: float,
                         dtype: str = "fp16", fixed_ns: float = 0.0) -> dict[str, Any]:
    """``count`` independent copies of one GEMM, one after another on one stream and each on its
    own stream, as :data:`DATASETS`' ``concurrency-h200`` measured them.

    Parameters
    ----------
    hardware
        The system (a :class:`gpusim.System`).
    m, n, k, dtype
        The GEMM (row-major, no transposes).
    count
        Copies.
    measured_sequential_s
        The measured time of the copies on one stream, s.
    fixed_ns
        Fixed cost of the measurement, added once to both simulated times, ns.

    Returns
    -------
    dict
        ``sim_sequential_s`` and ``sim_concurrent_s`` (the simulated times, s),
        ``simulated_speedup`` (their ratio), ``simulated_s``: the concurrent time the simulated
        speedup predicts for the measured sequential time, s (so that the comparison's error,
        ``simulated_s / measured_s - 1``, is that of the concurrent / sequential ratio), and the
        kernel ``impl``.
    """
    import gpusim
    from gpusim import ops

    gemms = [ops.Gemm(m, n, k, dtype) for _ in range(count)]
    sequential = gpusim.run(hardware, gemms)
    concurrent = gpusim.run(hardware, gemms, streams=[f"stream{index}" for index in range(count)])
    sequential_s = sequential.time_s + fixed_ns * 1e-9
    concurrent_s = concurrent.time_s + fixed_ns * 1e-9
    wall = sequential.stats["wall_s"] + concurrent.stats["wall_s"]
    return {"simulated_s": measured_sequential_s * concurrent_s / sequential_s, "impl": str(sequential.ops["impl"].iloc[0]),
            "sim_wall_s": wall, "sim_sequential_s": sequential_s, "sim_concurrent_s": concurrent_s,
            "simulated_speedup": sequential_s / concurrent_s}


INTERFERENCE_COPY_MARGIN = 2.0
"""The simulated copy moves the bytes the measured one moved while the GEMM ran, times this (at
most all it moved: it outlasted the GEMM 1.8-21 times), so that it outlasts the GEMM though the
model copies up to 1.4 times as fast; what it moves after the GEMM ends does not change the GEMM."""
INTERFERENCE_INFLIGHT_BYTES_PER_THREAD = 64
"""Bytes each thread of that copy loads at once (a block of 8192 fp16 values over 256 threads)."""


def simulate_interference(hardware: Any, m: int, n: int, k: int, programs: int, copy_bytes: int,
                          measured_alone_s: float, dtype: str = "fp16") -> dict[str, Any]:
    """A GEMM alone, and beside a persistent copy of ``programs`` workgroups launched before it on
    another stream, as ``interference-h200`` and ``interference-h100`` measured them.

    Parameters
    ----------
    hardware
        The system (a :class:`gpusim.System`).
    m, n, k, dtype
        The GEMM (row-major, no transposes).
    programs
        Workgroups of the copy (each thread :data:`INTERFERENCE_INFLIGHT_BYTES_PER_THREAD` in flight).
    copy_bytes
        Bytes the copy moves, read and written (enough to outlast the GEMM:
        :data:`INTERFERENCE_COPY_MARGIN`).
    measured_alone_s
        The GEMM's measured time alone, s.

    Returns
    -------
    dict
        ``sim_alone_s`` and ``sim_beside_s`` (the GEMM's simulated time alone and beside the copy,
        s), ``simulated_slowdown`` (their ratio), ``simulated_s``: the measured time alone times that
        ratio (so that the comparison's error is the slowdown's), and the GEMM's ``impl``.
    """
    import gpusim
    from gpusim import ops

    copy = ops.Elementwise("copy", copy_bytes // (2 * DTYPE_BYTES[dtype]), dtype, workgroups=programs,
                           inflight_bytes_per_thread=INTERFERENCE_INFLIGHT_BYTES_PER_THREAD)
    alone = gpusim.run(hardware, ops.Gemm(m, n, k, dtype))
    beside = gpusim.run(hardware, [copy, ops.Gemm(m, n, k, dtype)], streams=["background", "gemm"])
    alone_s = float(alone.ops["duration_s"].iloc[0])
    beside_s = float(beside.ops.loc[beside.ops["kind"] == "gemm", "duration_s"].iloc[0])
    return {"simulated_s": measured_alone_s * beside_s / alone_s, "impl": str(alone.ops["impl"].iloc[0]),
            "sim_wall_s": alone.stats["wall_s"] + beside.stats["wall_s"], "sim_alone_s": alone_s,
            "sim_beside_s": beside_s, "simulated_slowdown": beside_s / alone_s}


REUSE_ROW_VALUES = 2048
"""Values per row of the read-only working-set sweep (row sums; ``measure.py``'s ``l2`` section)."""


def simulate_reuse(hardware: Any, access: str, nbytes: int, calls: int = 4) -> dict[str, Any]:
    """One fp32 buffer of ``nbytes`` used by ``calls`` kernels in a row, as the working-set sweep
    (``measure.py``, section ``l2``) replays them from a CUDA graph; the time per call is that of
    the calls after the second, when the buffer has had one full pass to settle in the L2.  The
    calls follow a long write (:data:`FLUSH_BYTES`), so that an L2 that keeps part of its writes
    waiting for their write-back (``l2.dirty_fraction``) is as full of them as the graph's earlier
    replays leave it, not empty.

    Parameters
    ----------
    hardware
        The system (a :class:`gpusim.System`); its host cost per call should be 0, as in a graph.
    access
        ``read_write_inplace`` (the buffer scaled in place) or ``read_rowsum`` (sums of rows of
        :data:`REUSE_ROW_VALUES` values).
    nbytes
        Size of the buffer, bytes.
    calls
        Kernels simulated (at least 3).

    Returns
    -------
    dict
        ``simulated_s`` (time per call, s) and the kernel ``impl``.
    """
    import gpusim
    from gpusim import ops

    if calls < 3:
        raise ValueError(f"simulate_reuse: calls must be at least 3, got {calls}")
    elements = nbytes // 4
    if access == "read_write_inplace":
        kernels = [ops.Elementwise("scale", elements, "fp32", inputs=("buffer",), out="buffer") for _ in range(calls)]
    elif access == "read_rowsum":
        kernels = [ops.RowReduce("sum", elements // REUSE_ROW_VALUES, REUSE_ROW_VALUES, "fp32", input="buffer")
                   for _ in range(calls)]
    else:
        raise ValueError(f"simulate_reuse: unknown access {access!r}; known: read_write_inplace, read_rowsum")
    result = gpusim.run(hardware, [l2_flush(FLUSH_BYTES), *kernels])
    ends = result.ops["end_s"].to_numpy()[1:]
    return {"simulated_s": float(ends[-1] - ends[1]) / (calls - 2), "impl": str(result.ops["impl"].iloc[1]),
            "sim_wall_s": result.stats["wall_s"]}


# -- the data sets ----------------------------------------------------------------------------
def _ms(column: str) -> Callable[[pd.DataFrame], pd.Series]:
    def measured(frame: pd.DataFrame) -> pd.Series:
        return frame[column] * 1e-3

    return measured


def _host(host_ns: float | None) -> dict[str, Any]:
    """The point's preset overrides for a measurement whose host costs ``host_ns`` per call (none:
    the preset's ``kernel_launch_ns``)."""
    return {} if host_ns is None else {"overrides": {"gpu.kernel_launch_ns": host_ns}}


def _gemm_point(system: str, column_major: bool, host_ns: float | None = None) -> Callable[[pd.Series], dict[str, Any]]:
    """Rows of m, n, k (and, for BLAS data, the column-major ``N``/``T`` flags of A and B).

    gpusim's GEMM is row-major: a column-major operand that is not transposed (``N``) is, in
    row-major terms, stored transposed, so the flags flip.  PyTorch's matmul (LLMCompass) is
    row-major with no transposes.
    """

    def point(row: pd.Series) -> dict[str, Any]:
        if column_major:
            transposes = {"trans_a": str(row["trans_a"]) == "N", "trans_b": str(row["trans_b"]) == "N"}
        else:
            transposes = {"trans_a": False, "trans_b": False}
        return {"kind": "gemm", "system": system, "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                "dtype": str(row.get("dtype", "fp16")), **transposes, **_host(host_ns)}

    return point


def _gelu_point(system: str, host_ns: float | None = None) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "elementwise", "system": system, "op": "gelu", "elements": int(row["elements"]),
                "dtype": str(row["dtype"]), **_host(host_ns)}

    return point


def _rowreduce_point(kind: str, library: str, system: str = "mi210",
                     host_ns: float | None = None) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "rowreduce", "system": system, "op": kind, "rows": int(row["m"]), "cols": int(row["n"]),
                "dtype": str(row["dtype"]), "library": library, **_host(host_ns)}

    return point


LLMCOMPASS_A100_HOST_NS = {"gemm": 26000.0, "softmax": 10000.0, "layernorm": 46000.0, "gelu": 46000.0}
"""Host cost of one timed call on LLMCompass's A100 machine, by call, ns: ``torch.matmul`` and
``torch.softmax`` eager, GeLU and layer norm under ``torch.compile`` (PyTorch 2.0).  Each is the
preset's ``kernel_launch_ns`` for its data set, fitted on its smallest calls
(``validation/calibration/fits.sh``); the machine's host is not the GPU's, so the preset keeps
its own."""


def _llmcompass_gemm(path: Path) -> pd.DataFrame:
    """LLMCompass's ``matmul_<GPU>.csv`` as written: ``m, n, k, <ms>ms, <TFLOPS>Tflops`` (no
    header); ``run_on_gpu`` multiplies bf16 matrices."""
    frame = pd.read_csv(path, header=None, names=["m", "n", "k", "time", "tflops"], skipinitialspace=True)
    frame["time_ms"] = frame["time"].str.removesuffix("ms").astype(float)
    return frame[["m", "n", "k", "time_ms"]].assign(dtype="bf16")


def _llmcompass_rate(columns: list[str]) -> Callable[[Path], pd.DataFrame]:
    """A reader of LLMCompass's row-reduction and GeLU files as written: the shape's ``columns``,
    then the rate in 10^9 elements per second (no header); fp16."""

    def read(path: Path) -> pd.DataFrame:
        frame = pd.read_csv(path, header=None, names=[*columns, "gelements_per_s"], skipinitialspace=True)
        elements = frame[columns].prod(axis=1)
        return frame.assign(time_ms=elements / frame["gelements_per_s"] * 1e-6, dtype="fp16")

    return read


HOPPER_COLD_CALL_NS = 2800.0
"""Fixed cost of the H200's and H100's cold method (``validation/measured/h200/measure.py``), ns: a
call timed between two CUDA events and queued behind the kernel that flushes the L2, so that the
host's per-call cost is hidden and the events' own cost is not.  The H200's 1024-element copy's
cold time (3.78 us) less the model's 0.99 us span of that kernel (0.49 us of work and the GPU's
``kernel_device_ns``; 3.3 us before stop 19 gave the model that per-kernel cost); the H100's copy
measured 3.76 us.  It takes the place of the preset's host per-call cost (``kernel_launch_ns``)."""

HOPPER_COLD_OVERRIDES = {"gpu.kernel_launch_ns": HOPPER_COLD_CALL_NS}
"""The preset overrides under which a simulated call compares with a Hopper ``cold_ms`` time."""

FLUSH_BYTES = 128 * 2**20
"""Bytes of the fill simulated before a Hopper ``cold_ms`` call, and before the working-set sweep's
calls.  The measurement flushes the L2 by writing 512 MiB (``validation/measured/h200/measure.py``);
any write of more than twice the L2 leaves the L2 as that one does (full of the fill's blocks, the
last of them dirty as far as ``l2.dirty_fraction`` allows), at a quarter of the simulation's cost."""

HOPPER_MEASUREMENTS = {"h200": "h200-sxm", "h100": "h100-sxm5"}
"""This project's Hopper measurements: folder under :data:`MEASURED_DIR` -> the preset of that GPU."""


def aligned_rows(frame: pd.DataFrame) -> pd.Series:
    """Whether every operand row of each GEMM (A, B and C; row-major, with the transposes) starts on
    a 16-byte boundary, which vectorized and TMA loads need, as
    :attr:`gpusim.kernels.gemm.GemmProblem.row_alignment` decides it.  cuBLAS runs the others in
    fallback kernels (``gemm-h200-unaligned``; docs/validation.md)."""
    size = frame["dtype"].map(DTYPE_BYTES)
    lda = frame["m"].where(frame["trans_a"].astype(bool), frame["k"])
    ldb = frame["k"].where(frame["trans_b"].astype(bool), frame["n"])
    return ((lda * size) % 16 == 0) & ((ldb * size) % 16 == 0) & ((frame["n"] * size) % 16 == 0)


def _hopper_gemm_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "gemm", "system": system, "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                "dtype": str(row["dtype"]), "trans_a": bool(row["trans_a"]), "trans_b": bool(row["trans_b"]),
                "flush_bytes": FLUSH_BYTES, "overrides": dict(HOPPER_COLD_OVERRIDES)}

    return point


def _hopper_streaming_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        shape = ({"elements": int(row["elements"])} if row["op"] == "elementwise"
                 else {"rows": int(row["rows"]), "cols": int(row["cols"])})
        return {"kind": str(row["op"]), "system": system, "op": str(row["kind"]), "dtype": str(row["dtype"]),
                **shape, "flush_bytes": FLUSH_BYTES, "overrides": dict(HOPPER_COLD_OVERRIDES)}

    return point


def _hopper_concurrency_select(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per GEMM and count of copies above one: the measured ``sequential_ms`` and
    ``concurrent_ms`` and their ratio, ``measured_speedup``."""
    wide = frame.pivot_table(index=["m", "n", "k", "dtype", "count"], columns="mode", values="ms").reset_index()
    wide = wide[wide["count"] > 1].rename(columns={"sequential": "sequential_ms", "concurrent": "concurrent_ms"})
    wide.columns.name = None
    wide["measured_speedup"] = wide["sequential_ms"] / wide["concurrent_ms"]
    return wide


def _hopper_concurrency_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """The measurements queued their calls (eager, or one CUDA graph) behind the 512 MiB write that
    flushes the L2 (about 115 us on an H200), so every kernel is ready when the timing starts, unless
    eager launches outlast the flush: no host cost per call (``kernel_launch_ns`` 0), and the
    events' fixed cost (:data:`HOPPER_COLD_CALL_NS`) once in both times."""

    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "concurrency", "system": system, "m": int(row["m"]), "n": int(row["n"]),
                "k": int(row["k"]), "dtype": str(row["dtype"]), "count": int(row["count"]),
                "measured_sequential_s": float(row["sequential_ms"]) * 1e-3, "fixed_ns": HOPPER_COLD_CALL_NS,
                "overrides": {"gpu.kernel_launch_ns": 0.0}}

    return point


def _interference_select(frame: pd.DataFrame) -> pd.DataFrame:
    """The GEMMs beside the copying programs, each with its measured time alone (``alone_ms``) and
    the ratio of the two (``measured_slowdown``)."""
    alone = frame[frame["mode"] == "alone"].set_index(["m", "n", "k"])["gemm_ms"].rename("alone_ms")
    rows = frame[frame["mode"] == "copy"].join(alone, on=["m", "n", "k"])
    return rows.assign(measured_slowdown=rows["gemm_ms"] / rows["alone_ms"])


def _interference_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """Both measured times are between two events on the GEMM's stream, so their fixed costs cancel
    in the ratio; the measurement charges no host cost (the GEMM was queued behind a sleep)."""

    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "interference", "system": system, "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                "programs": int(row["programs"]), "measured_alone_s": float(row["alone_ms"]) * 1e-3,
                "copy_bytes": round(float(row["background_gb_per_s_alone"]) * float(row["background_alone_ms"]) * 1e6
                                    * min(1.0, INTERFERENCE_COPY_MARGIN * float(row["gemm_ms"])
                                          / float(row["background_ms"]))),
                "overrides": {"gpu.kernel_launch_ns": 0.0}}

    return point


def _kernel_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """A row reduction timed by the profiler: the kernel's duration, without a host's cost per call."""

    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "rowreduce", "system": system, "op": str(row["kind"]), "rows": int(row["rows"]),
                "cols": int(row["cols"]), "dtype": str(row["dtype"]), "overrides": {"gpu.kernel_launch_ns": 0.0}}

    return point


def _reuse_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """A row of a working-set sweep, replayed from a CUDA graph: no host cost per call."""

    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "reuse", "system": system, "access": str(row["access"]), "nbytes": int(row["bytes"]),
                "overrides": {"gpu.kernel_launch_ns": 0.0}}

    return point


def _hopper_datasets(folder: str) -> tuple[DataSet, ...]:
    """The data sets of one Hopper GPU's measurements (``validation/measured/<folder>``): aligned and
    unaligned GEMMs, concurrent GEMMs, element-wise kernels and row reductions (all with a cold L2),
    GEMMs beside a persistent copy, and the two working-set sweeps (warm, from a CUDA graph)."""
    system = HOPPER_MEASUREMENTS[folder]
    gpu = folder.upper()

    def gemm(suffix: str, description: str, aligned: bool) -> DataSet:
        return DataSet(name=f"gemm-{folder}{suffix}", description=f"{description}; cold L2", file=f"{folder}/gemm.csv",
                       system=system, point=_hopper_gemm_point(system), measured_s=_ms("cold_ms"),
                       tolerances={"median": 0.15, "p90": 0.35},
                       select=lambda frame: frame[aligned_rows(frame) == aligned], group="set" if aligned else None)

    def streaming(op: str, description: str) -> DataSet:
        return DataSet(name=f"{op}-{folder}", description=f"{description} on an {gpu}; cold L2",
                       file=f"{folder}/streaming.csv", system=system, point=_hopper_streaming_point(system),
                       measured_s=_ms("cold_ms"), tolerances={"median": 0.20},
                       select=lambda frame: frame[frame["op"] == op], group="kind", plot_x="elements", plot_by="kind")

    def concurrency(name: str, file: str, how: str) -> DataSet:
        return DataSet(name=f"{name}-{folder}", description=f"1, 2, 4, 8 copies of ten fp16 GEMMs on an {gpu} (PyTorch, "
                       f"cuBLAS), each on its own stream against one after another on one stream, {how}; compared as "
                       "the concurrent / sequential ratio (simulated_s: the measured sequential time over the "
                       "simulated speedup); cold L2", file=f"{folder}/{file}", system=system,
                       point=_hopper_concurrency_point(system), measured_s=_ms("concurrent_ms"),
                       tolerances={"median": 0.05, "p90": 0.15}, select=_hopper_concurrency_select, group="count",
                       columns=("sim_sequential_s", "sim_concurrent_s", "simulated_speedup"))

    def interference() -> DataSet:
        return DataSet(name=f"interference-{folder}", description=f"three fp16 GEMMs (8192^3, T-NLG FC-2 and OP at "
                       f"TP 8) on an {gpu} beside a persistent copy over 1 GiB by 8-66 programs (one per SM, 16 KiB "
                       "in flight each) launched before them on another stream and outlasting them; compared as the "
                       "GEMM's time beside the copy over its time alone", file=f"{folder}/interference.csv",
                       system=system, point=_interference_point(system), measured_s=_ms("gemm_ms"),
                       tolerances={"median": 0.10, "p90": 0.25}, select=_interference_select, group="programs",
                       columns=("sim_alone_s", "sim_beside_s", "simulated_slowdown"))

    def grid() -> DataSet:
        return DataSet(name=f"rowreduce-grid-{folder}", description="PyTorch eager softmax, layer norm, RMS norm and "
                       f"column sums over 64-16384 rows of 32-4096 fp16 values on an {gpu}: the profiler's kernel "
                       "durations in a CUDA-graph replay after an L2 flush (no host cost)",
                       file=f"{folder}/reduction_grid.csv", system=system, point=_kernel_point(system),
                       measured_s=lambda frame: frame["duration_us"] * 1e-6, tolerances={"median": 0.20},
                       group="kind", plot_x="rows", plot_by="kind")

    def sweep(name: str, access: str, description: str) -> DataSet:
        return DataSet(name=f"{name}-{folder}", description=f"{description}, on an {gpu}, call after call from a "
                       "CUDA graph; time per call", file=f"{folder}/l2.csv", system=system, point=_reuse_point(system),
                       measured_s=_ms("graph_ms"), tolerances={"median": 0.15, "p90": 0.35},
                       select=lambda frame: frame[frame["access"] == access], plot_x="bytes")

    return (
        gemm("", f"torch.matmul on an {gpu} (cuBLAS, CUDA 13.0): DeepBench's and LLMCompass's shapes, a "
             "transformer grid and squares in fp16/bf16/tf32/fp32, whose rows are 16-byte aligned", aligned=True),
        gemm("-unaligned", f"the {gpu}'s torch.matmul GEMMs whose rows are not 16-byte aligned (DeepBench's odd "
             "sizes), which cuBLAS runs in its fallback kernels", aligned=False),
        concurrency("concurrency", "concurrency_graph.csv", "all the calls in one CUDA graph, so no host launch is "
                    "timed"),
        concurrency("concurrency-eager", "concurrency.csv", "eager calls queued behind the L2 flush; with eight "
                    "streams the host's launches can outlast it, which the comparison does not charge"),
        streaming("elementwise", "PyTorch element-wise kernels (copy, fill, add, mul, scale, relu, gelu, sigmoid, "
                  "tanh) over 2^10-2^30 values"),
        streaming("rowreduce", "PyTorch eager softmax, layernorm, rmsnorm and row sums over LLMCompass's fp16 shapes"),
        grid(),
        interference(),
        sweep("l2", "read_write_inplace", "an fp32 buffer of 4-256 MiB scaled in place: the L2's bandwidth while it "
              "fits, the capacity where it stops fitting, then the HBM's"),
        sweep("l2-rowsum", "read_rowsum", "an fp32 buffer of 4-256 MiB summed by rows of 2048 values (the L2 read back "
              "by PyTorch's reduce kernel)"),
    )


ALLREDUCE_MIN_BYTES = 2**20
ALLREDUCE_MAX_BYTES = 64 * 2**20


def _allreduce_rows(frame: pd.DataFrame, placements: pd.Series) -> pd.DataFrame:
    """The rows of ``placements`` within the compared sizes, with ``gpus`` and ``size_mib`` columns."""
    sizes = frame["size_bytes"].between(ALLREDUCE_MIN_BYTES, ALLREDUCE_MAX_BYTES)
    chosen = frame[placements & sizes].copy()
    chosen["gpus"] = chosen["num_workers"]
    chosen["size_mib"] = chosen["size_bytes"] / 2**20
    return chosen


def _allreduce_select(frame: pd.DataFrame) -> pd.DataFrame:
    in_node = frame["num_workers"] == frame["devices_per_node"]
    two_full_nodes = (frame["num_workers"] == 16) & (frame["devices_per_node"] == 8)
    return _allreduce_rows(frame, in_node | two_full_nodes)


def _two_node_select(frame: pd.DataFrame) -> pd.DataFrame:
    two_nodes = frame["num_workers"] == 2 * frame["devices_per_node"]
    smaller = frame["num_workers"] < 16
    return _allreduce_rows(frame, two_nodes & smaller)


def _vidur_allreduce(name: str, description: str, file: str, system: str,
                     select: Callable[[pd.DataFrame], pd.DataFrame]) -> DataSet:
    """A data set of vidur's all-reduce profile: the median time per size, by GPU count."""
    return DataSet(name=name, description=description, file=file, system=system, point=_allreduce_point(system),
                   measured_s=_ms("time_ms_median"), tolerances={"median": 0.15}, select=select, group="gpus",
                   plot_x="size_mib", plot_by="gpus")


def _allreduce_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """A row of vidur's all-reduce profile on ``system``'s nodes: the measured GPUs per node, and
    as many nodes as the row spans."""

    def point(row: pd.Series) -> dict[str, Any]:
        workers, per_node = int(row["num_workers"]), int(row["devices_per_node"])
        if workers > per_node:
            overrides = {"nodes": workers // per_node, "num_gpus": per_node}
        else:
            overrides = {"num_gpus": workers}
        return {"kind": "allreduce", "system": system, "overrides": overrides, "nbytes": int(row["size_bytes"]),
                "dtype": "fp16"}

    return point


def _llmcompass_gpt3_calls(batch: int, tokens: int, context: int) -> tuple[dict[str, Any], ...]:
    """The lines of LLMCompass's layer files: GPT-3's layer (d = 12288, 96 heads of 128, an MLP of
    4d) sliced four ways, on one GPU, for ``batch`` sequences of ``tokens`` new tokens attending to
    ``context`` tokens, in the order its ``run_on_gpu`` prints them.  ``calls``: the line is that
    many identical calls; ``host``: which call's host cost it pays (the artifact subtracts a
    one-element call's time from the layer norm's, so it pays none).  The two all-reduce lines
    are not timed by ``run_on_gpu``; where they come from is not stated."""
    model, heads, head, ways = 12288, 96, 128, 4
    rows, width, mlp, pairs = batch * tokens, model // ways, 4 * model // ways, batch * heads // ways
    norm = {"kind": "rowreduce", "op": "layernorm", "rows": rows, "cols": model, "library": "inductor-2.0",
            "dtype": "fp16", "host": None}
    return (
        {"name": "Q, K, V projections", "kind": "gemm", "m": rows, "n": width, "k": model, "dtype": "bf16", "calls": 3,
         "host": "gemm"},
        {"name": "Q x K^T", "kind": "gemm", "m": tokens, "n": context, "k": head, "batch": pairs, "dtype": "fp16",
         "host": "gemm"},
        {"name": "A x V", "kind": "gemm", "m": tokens, "n": head, "k": context, "batch": pairs, "dtype": "fp16",
         "host": "gemm"},
        {"name": "output projection", "kind": "gemm", "m": rows, "n": model, "k": width, "dtype": "bf16", "host": "gemm"},
        {"name": "FC-1", "kind": "gemm", "m": rows, "n": mlp, "k": model, "dtype": "bf16", "host": "gemm"},
        {"name": "FC-2", "kind": "gemm", "m": rows, "n": model, "k": mlp, "dtype": "bf16", "host": "gemm"},
        {"name": "softmax", "kind": "rowreduce", "op": "softmax", "rows": pairs * tokens, "cols": context,
         "library": "pytorch-2.0", "dtype": "fp16", "host": "softmax"},
        {"name": "layernorm 0", **norm},
        {"name": "layernorm 1", **norm},
        {"name": "GeLU", "kind": "elementwise", "op": "gelu", "elements": rows * mlp, "dtype": "fp16", "host": "gelu"},
        {"name": "all-reduce 0", "kind": None},
        {"name": "all-reduce 1", "kind": None},
    )


LLMCOMPASS_GPT3_LAYER = _llmcompass_gpt3_calls(batch=8, tokens=2048, context=2048)
"""The lines of ``transformer_A100.csv``: the layer processing 8 prompts of 2048 tokens
(``TransformerBlockInitComputationTP``)."""
LLMCOMPASS_GPT3_DECODE = _llmcompass_gpt3_calls(batch=8, tokens=1, context=3073)
"""The lines of ``transformerAR_A100.csv``: the layer generating one token per sequence for 8
sequences with 2048 + 1024 tokens cached, 3073 with the new one
(``TransformerBlockAutoRegressionTP``)."""


def _llmcompass_layer(table: tuple[dict[str, Any], ...]) -> Callable[[Path], pd.DataFrame]:
    """A reader of LLMCompass's ``transformer*_<GPU>.csv`` as written (one time in seconds per
    line): each line with its operation from ``table`` and ``time_ms`` per call."""

    def read(path: Path) -> pd.DataFrame:
        seconds = pd.read_csv(path, header=None, names=["seconds"])["seconds"]
        if len(seconds) != len(table):
            raise ConfigError(f"{path}: expected {len(table)} lines (one per operation of the layer), "
                              f"got {len(seconds)}")
        frame = pd.DataFrame([{"calls": 1, **row} for row in table])
        frame["time_ms"] = seconds.to_numpy() / frame["calls"] * 1e3
        return frame

    return read


def _transformer_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    fields = {"gemm": ("m", "n", "k", "batch"), "rowreduce": ("op", "rows", "cols", "library"),
              "elementwise": ("op", "elements")}

    def point(row: pd.Series) -> dict[str, Any]:
        values = {field: row[field] for field in fields[row["kind"]] if pd.notna(row[field])}
        values = {field: value if isinstance(value, str) else int(value) for field, value in values.items()}
        host = LLMCOMPASS_A100_HOST_NS[row["host"]] if pd.notna(row["host"]) else 0.0
        return {"kind": row["kind"], "system": system, "dtype": row["dtype"], **values, **_host(host)}

    return point


@dataclass(frozen=True)
class VidurModel:
    """A model whose layer vidur's MLP profiler times operation by operation (sarathi's layers).

    Attributes
    ----------
    name
        As in vidur's profile's path.
    hidden, heads, kv_heads, mlp
        Hidden size, query and key/value heads, MLP width.
    gated
        A gated MLP (SwiGLU: the up projection is twice as wide and vLLM's ``silu_and_mul`` is
        the activation); otherwise ``torch.nn.GELU()`` (the exact GeLU).
    post_attention_norm
        A LLaMA block: vLLM's RMS norm before the attention and before the MLP, and one residual
        add (``residual + hidden``); otherwise phi-2's parallel block: ``torch.nn.LayerNorm`` before
        both, whose outputs and the residual are summed, ``a + b + c``, two element-wise adds.
    """

    name: str
    hidden: int
    heads: int
    kv_heads: int
    mlp: int
    gated: bool
    post_attention_norm: bool

    @property
    def head(self) -> int:
        """Head dimension."""
        return self.hidden // self.heads

    @property
    def add_calls(self) -> int:
        """Element-wise add kernels of vidur's ``add`` operation."""
        return 1 if self.post_attention_norm else 2


PHI2 = VidurModel("phi-2", hidden=2560, heads=32, kv_heads=32, mlp=10240, gated=False, post_attention_norm=False)
"""phi-2's layer (vidur's profile): 32 heads of 80, MLP width 10240."""
LLAMA2_7B = VidurModel("Llama-2-7b", hidden=4096, heads=32, kv_heads=32, mlp=11008, gated=True,
                       post_attention_norm=True)
"""Llama-2-7B's layer (vidur's profile): 32 heads of 128, SwiGLU MLP of width 11008, RMS norms."""
LLAMA2_70B = VidurModel("Llama-2-70b", hidden=8192, heads=64, kv_heads=8, mlp=28672, gated=True,
                        post_attention_norm=True)
"""Llama-2-70B's layer (vidur's profile): 64 query heads of 128 sharing 8 key/value heads, SwiGLU MLP
of width 28672, RMS norms."""


def _vidur_mlp(model: VidurModel, reader: Callable[[Path], pd.DataFrame]) -> Callable[[Path], pd.DataFrame]:
    """A reader of vidur's per-operation profile of ``model``'s layer (the rows ``reader`` gives: the
    repository's long layout, or :func:`read_vidur_profile`): with ``calls``, the kernels of each
    operation (:attr:`VidurModel.add_calls` for ``add``, else one; its time is their sum), and
    ``time_ms`` per kernel."""

    def read(path: Path) -> pd.DataFrame:
        frame = reader(path)
        calls = (frame["op"] == "add") * (model.add_calls - 1) + 1
        return frame.assign(calls=calls, time_ms=frame["time_ms_median"] / calls)

    return read


def _vidur_mlp_point(model: VidurModel, system: str) -> Callable[[pd.Series], dict[str, Any]]:
    """A row of vidur's per-operation profile of ``model``'s layer: ``num_tokens`` rows through one
    operation, its weights split ``num_tensor_parallel_workers`` ways (``torch.nn.Linear`` stores
    them ``[out, in]``: B transposed), its input written just before it (``warm``) by the operation
    before it in the layer: the GEMM whose output it reads (``producer``: the rotary embedding's
    query and key projection, the MLP activation's up projection, the post-attention norm's
    output projection and the residual add's down projection), else an element-wise op. The
    profiler's kernel durations: no host cost per call."""

    def point(row: pd.Series) -> dict[str, Any]:
        tokens, parts = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
        heads, kv_heads, head = model.heads // parts, max(1, model.kv_heads // parts), model.head
        hidden, mlp = model.hidden, model.mlp // parts
        gemms = {"attn_pre_proj": ((heads + 2 * kv_heads) * head, hidden), "attn_post_proj": (hidden, heads * head),
                 "mlp_up_proj": ((2 if model.gated else 1) * mlp, hidden), "mlp_down_proj": (hidden, mlp)}
        base = {"system": system, "dtype": "fp16", "warm": True, **_host(0.0)}
        norm = ({"op": "rmsnorm", "library": "vllm"} if model.post_attention_norm
                else {"op": "layernorm", "library": "pytorch"})
        op = row["op"]

        def output_of(gemm: str) -> dict[str, Any]:
            n, k = gemms[gemm]
            return {"producer": {"m": tokens, "n": n, "k": k, "trans_b": True}, **base}

        if op in gemms:
            n, k = gemms[op]
            return {"kind": "gemm", "m": tokens, "n": n, "k": k, "trans_b": True, **base}
        if op == "input_layernorm":
            return {"kind": "rowreduce", "rows": tokens, "cols": hidden, **norm, **base}
        if op == "post_attention_layernorm" and model.post_attention_norm:
            return {"kind": "rowreduce", "rows": tokens, "cols": hidden, **norm, **output_of("attn_post_proj")}
        if op == "attn_rope":
            return {"kind": "elementwise", "op": "rope", "elements": tokens * (heads + kv_heads) * head,
                    "rows": tokens, **output_of("attn_pre_proj")}
        if op == "mlp_act" and model.gated:
            return {"kind": "elementwise", "op": "silu_and_mul", "elements": tokens * mlp, "rows": tokens,
                    **output_of("mlp_up_proj")}
        if op == "mlp_act":
            return {"kind": "elementwise", "op": "gelu_erf", "elements": tokens * mlp, **output_of("mlp_up_proj")}
        if op == "add":
            return {"kind": "elementwise", "op": "add", "elements": tokens * hidden, **output_of("mlp_down_proj")}
        known = ["input_layernorm", *(["post_attention_layernorm"] if model.post_attention_norm else []), *gemms,
                 "attn_rope", "mlp_act", "add"]
        raise ConfigError(f"vidur's {model.name} profile: field 'op' must be one of {', '.join(known)}; got {op!r}")

    return point


VIDUR_OPERATIONS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
                    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""The operations of vidur's MLP profiles gpusim simulates (their ``emb``, the embedding's gather, is
left out)."""
VIDUR_UNSIMULATED = ("emb",)
"""Operations vidur's MLP profiles time that gpusim leaves out."""
VIDUR_MODEL_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                       "num_tensor_parallel_workers")
"""Columns every row of a vidur MLP profile has beside its timings."""
VIDUR_COUNT_COLUMNS = tuple(column for column in VIDUR_MODEL_COLUMNS if column != "use_gated_mlp")
"""Those of them that are counts: whole numbers above 0."""


def read_vidur_profile(path: str | Path) -> pd.DataFrame:
    """vidur's MLP profile as vidur writes it (``data/profiling/compute/<gpu>/<model>/mlp.csv``: one
    row per token count and tensor-parallel degree, ``time_stats.<op>.<statistic>`` columns in
    milliseconds) in the long layout of the repository's copies: one row per operation with
    ``time_ms_median``, ``time_ms_min`` and ``time_ms_max`` and the model's columns. Where vidur
    repeats a (token count, degree), the first row is kept.

    Raises
    ------
    ConfigError
        The path is a folder, or the file is missing or lacks a column, naming the file and the
        column.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; a vidur profile is a file (data/profiling/compute/<gpu>/<model>/mlp.csv)")
    if not path.is_file():
        raise ConfigError(f"{path}: vidur profile not found")
    try:
        wide = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a vidur MLP profile (a CSV file with a header row): {exc}") from None
    missing = [column for column in VIDUR_MODEL_COLUMNS if column not in wide.columns]
    if missing:
        raise ConfigError(f"{path}: field {missing[0]!r} is missing; a vidur MLP profile has the columns "
                          f"{', '.join(VIDUR_MODEL_COLUMNS)} beside its time_stats.<op>.median/min/max columns")
    operations = [op for op in VIDUR_OPERATIONS if f"time_stats.{op}.median" in wide.columns]
    if not operations:
        raise ConfigError(f"{path}: no time_stats.<op>.median column of the operations {', '.join(VIDUR_OPERATIONS)}")
    timed = {column.split(".")[1] for column in wide.columns if column.startswith("time_stats.")}
    unknown = sorted(timed - set(VIDUR_OPERATIONS) - set(VIDUR_UNSIMULATED))
    if unknown:
        raise ConfigError(f"{path}: field 'time_stats.{unknown[0]}.*' times an operation gpusim does not know; a vidur "
                          f"MLP profile times {', '.join(VIDUR_OPERATIONS)} (and {', '.join(VIDUR_UNSIMULATED)}, not "
                          "simulated)")
    for column in VIDUR_COUNT_COLUMNS:
        _check_column(path, wide, column, lambda v: v > 0 and float(v).is_integer(), "a whole number above 0",
                      allow_missing=False)
    wide = wide.drop_duplicates(["num_tokens", "num_tensor_parallel_workers"])
    frames = []
    for op in operations:
        columns = {f"time_stats.{op}.{stat}": f"time_ms_{stat}" for stat in ("median", "min", "max")}
        absent = [column for column in columns if column not in wide.columns]
        if absent:
            raise ConfigError(f"{path}: field {absent[0]!r} is missing")
        for column in columns:
            _check_column(path, wide, column, lambda v: v > 0 and math.isfinite(v), "a time above 0 ms")
        low, middle, high = (pd.to_numeric(wide[f"time_stats.{op}.{stat}"]) for stat in ("min", "median", "max"))
        disordered = wide.index[(middle < low) | (middle > high)]
        if len(disordered):
            raise ConfigError(f"{path}: line {_line(wide, disordered[0])}: field 'time_stats.{op}.median' "
                              f"({middle[disordered[0]]}) must lie between its min ({low[disordered[0]]}) and max "
                              f"({high[disordered[0]]})")
        frames.append(wide[[*VIDUR_MODEL_COLUMNS, *columns]].rename(columns=columns).assign(op=op))
    return pd.concat(frames, ignore_index=True).dropna(subset=["time_ms_median"])


def _line(frame: pd.DataFrame, index: Any) -> int:
    """The line of the CSV file that holds row ``index`` of ``frame`` (read with its header)."""
    return int(index) + 2


def _check_column(path: Path, frame: pd.DataFrame, column: str, valid: Callable[[float], bool], expected: str,
                  allow_missing: bool = True) -> None:
    """Refuse the first row whose ``column`` is not a number for which ``valid`` holds (an empty cell
    is allowed where ``allow_missing``), naming the file, the line, the field and the value."""
    numbers = pd.to_numeric(frame[column], errors="coerce")
    for index, raw in frame[column].items():
        number = numbers[index]
        if pd.isna(raw) and allow_missing:
            continue
        if pd.isna(number) or not valid(float(number)):
            raise ConfigError(f"{path}: line {_line(frame, index)}: field {column!r} must be {expected}, got {raw!r}")


def vidur_model(frame: pd.DataFrame, name: str = "the profile's model") -> VidurModel:
    """The :class:`VidurModel` of a profile read by :func:`read_vidur_profile`: its sizes from its
    columns, LLaMA's block where it times a ``post_attention_layernorm``, phi-2's otherwise."""
    models = frame[["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]].drop_duplicates()
    if len(models) != 1:
        raise ConfigError(f"{name}: a vidur profile holds one model; got {len(models)} sets of model columns")
    heads, kv_heads, hidden, mlp, gated = models.iloc[0].tolist()
    gated = str(gated).strip().lower() in ("true", "1")
    for parts in sorted(set(frame["num_tensor_parallel_workers"].astype(int))):
        # Megatron's split: whole heads and MLP columns per GPU; key/value heads fewer than the GPUs
        # are replicated (each GPU keeps one), so the GPUs must be a multiple of them
        kv_split = kv_heads % parts == 0 if kv_heads >= parts else parts % kv_heads == 0
        if heads % parts or mlp % parts or not kv_split:
            raise ConfigError(f"{name}: field 'num_tensor_parallel_workers': {parts} GPUs do not split the model "
                              f"({int(heads)} heads, {int(kv_heads)} key/value heads, an MLP of {int(mlp)}) into "
                              "equal parts")
    return VidurModel(name, hidden=int(hidden), heads=int(heads), kv_heads=int(kv_heads), mlp=int(mlp), gated=gated,
                      post_attention_norm=bool((frame["op"] == "post_attention_layernorm").any()))


def vidur_dataset(path: str | Path, system: str, tolerance: float = 0.20) -> DataSet:
    """A :class:`DataSet` of any vidur MLP profile as vidur writes it (:func:`read_vidur_profile`),
    simulated on the preset ``system`` the way the repository's phi-2 and Llama-2-7B data sets are
    (:func:`_vidur_mlp_point`); ``gpusim validate --vidur PATH --system PRESET``.

    Raises
    ------
    ConfigError
        An empty path, or a profile that :func:`read_vidur_profile` refuses.
    """
    if not str(path).strip():  # else the current folder
        raise ConfigError("vidur profile: expected the path of an mlp.csv, got an empty path")
    path = Path(path).resolve()
    model = vidur_model(read_vidur_profile(path), path.parent.name or path.name)
    return _vidur_profile_dataset(model, f"vidur-{path.parent.name or path.stem}-{system}",
                                  f"vidur's profile of {model.name}'s layer ({path}) on {system}", str(path), system,
                                  read_vidur_profile, tolerance)


def _vidur_profile_dataset(model: VidurModel, name: str, description: str, file: str, system: str,
                           reader: Callable[[Path], pd.DataFrame], tolerance: float = 0.20) -> DataSet:
    """The :class:`DataSet` of a vidur MLP profile of ``model``, its rows read by ``reader``."""
    return DataSet(name=name, description=description, file=file, system=system,
                   point=_vidur_mlp_point(model, system), read=_vidur_mlp(model, reader), measured_s=_ms("time_ms"),
                   tolerances={"median": tolerance}, group="op", plot_x="num_tokens", plot_by="op")


def _vidur_layer(model: VidurModel, tag: str, gpu: str, system: str, native: bool = False) -> DataSet:
    """vidur's per-operation profile of ``model``'s layer on one GPU (``vidur_<gpu>_<file tag>_mlp.csv``,
    the tag with ``_`` for ``-``): in the repository's long layout, or with ``native`` as vidur
    writes it (:func:`read_vidur_profile`)."""
    ops_text = ("its four GEMMs, RMS norms, rotary embedding, SwiGLU activation and residual add" if model.gated
                else "its four GEMMs, layer norm, GeLU and residual adds (per kernel)")
    description = (f"vidur's profile of {model.name}'s layer on an {gpu.upper()} (PyTorch, sarathi's layers; the "
                   f"profiler's kernel durations, median of 20 repeats of the layer): {ops_text} for 1-4096 tokens")
    return _vidur_profile_dataset(model, f"mlp-{gpu}-{tag}", description, f"vidur_{gpu}_{tag.replace('-', '_')}_mlp.csv",
                                  system, read_vidur_profile if native else pd.read_csv)


def _attention_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        return {"kind": "attention", "system": system, "batch": int(row["batch"]), "heads": int(row["heads"]),
                "seqlen": int(row["seqlen"]), "head_dim": int(row["head_dim"]), "causal": bool(row["causal"]),
                "direction": row["direction"], "dtype": row["dtype"]}

    return point


def _bert_layer_point(system: str) -> Callable[[pd.Series], dict[str, Any]]:
    def point(row: pd.Series) -> dict[str, Any]:
        kernel = row["kernel"] if isinstance(row["kernel"], str) and row["kernel"] else None
        return {"kind": "bert_layer", "system": system, "direction": str(row["pass"]), "batch": int(row["batch"]),
                "seq_len": int(row["seq_len"]), "dtype": str(row["dtype"]), "kernel": kernel}

    return point


def _published_attention_s(frame: pd.DataFrame) -> pd.Series:
    """The time of each published FlashAttention-2 benchmark row, from its TFLOP/s and the
    benchmark's FLOP count: 4 per query, key and head value (half with a causal mask), 2.5 times
    that backward."""
    flops = 4.0 * frame["batch"] * frame["heads"] * frame["seqlen"] ** 2 * frame["head_dim"]
    flops = flops / frame["causal"].map({True: 2.0, False: 1.0}) * frame["direction"].map({"forward": 1.0,
                                                                                           "backward": 2.5})
    return flops / (frame["tflops"] * 1e12)


def _llmcompass_a100_datasets() -> tuple[DataSet, ...]:
    """LLMCompass's A100 measurements (``validation/measured/llmcompass-a100``, files as published):
    the MI210 data sets' calls, timed the same way on an A100 SXM4 80GB."""
    folder = "llmcompass-a100"
    system = "a100-sxm4"
    host = LLMCOMPASS_A100_HOST_NS
    how = "on an A100 SXM4 80GB, host wall clock of one call"
    return (
        DataSet(name="gemm-a100", description=f"LLMCompass's 20 bf16 GEMMs (torch.matmul, cuBLAS) {how}",
                file=f"{folder}/matmul_A100.csv", system=system, read=_llmcompass_gemm,
                point=_gemm_point(system, column_major=False, host_ns=host["gemm"]), measured_s=_ms("time_ms"),
                tolerances={"median": 0.15, "p90": 0.35}),
        DataSet(name="softmax-a100", description=f"LLMCompass's row-wise softmax over m x n fp16 (PyTorch 2.0) {how}",
                file=f"{folder}/softmax_A100.csv", system=system, read=_llmcompass_rate(["m", "n"]),
                point=_rowreduce_point("softmax", "pytorch-2.0", system, host["softmax"]),
                measured_s=_ms("time_ms"), tolerances={"median": 0.20}),
        DataSet(name="layernorm-a100", description=f"LLMCompass's row-wise layernorm over m x n fp16 (torch.compile) "
                f"{how}", file=f"{folder}/layernorm_A100.csv", system=system, read=_llmcompass_rate(["m", "n"]),
                point=_rowreduce_point("layernorm", "inductor-2.0", system, host["layernorm"]),
                measured_s=_ms("time_ms"), tolerances={"median": 0.20}),
        DataSet(name="gelu-a100", description=f"LLMCompass's element-wise GeLU over N fp16 values (torch.compile) {how}",
                file=f"{folder}/gelu_A100.csv", system=system, read=_llmcompass_rate(["elements"]),
                point=_gelu_point(system, host["gelu"]), measured_s=_ms("time_ms"), tolerances={"median": 0.20},
                plot_x="elements"),
        _llmcompass_layer_dataset("transformer-layer-a100", "processing 8 x 2048 tokens", f"{folder}/transformer_A100.csv",
                                  LLMCOMPASS_GPT3_LAYER, system, how),
        _llmcompass_layer_dataset("transformer-layer-decode-a100", "generating one token for 8 sequences with 3072 "
                                  "cached", f"{folder}/transformerAR_A100.csv", LLMCOMPASS_GPT3_DECODE, system, how),
    )


def _llmcompass_layer_dataset(name: str, phase: str, file: str, table: tuple[dict[str, Any], ...], system: str,
                              how: str) -> DataSet:
    """A data set of one of LLMCompass's layer files: each timed call with its kind's host cost
    (the two all-reduce lines are not timed, so not compared)."""
    return DataSet(name=name, description=f"LLMCompass's GPT-3 layer sliced four ways {phase}: its GEMMs, attention "
                   f"GEMMs, softmax, layer norms and GeLU one call at a time {how}", file=file, system=system,
                   read=_llmcompass_layer(table), point=_transformer_point(system), measured_s=_ms("time_ms"),
                   tolerances={"median": 0.15}, select=lambda frame: frame[frame["kind"].notna()])


DATASETS: dict[str, DataSet] = {
    dataset.name: dataset
    for dataset in (
        DataSet(
            name="gemm-v100-deepbench",
            description="DeepBench's 160 FP16 GEMMs (cuBLAS, CUDA 10.1) on a V100 SXM2",
            file="deepbench_v100_gemm_fp16.csv",
            system="v100-sxm2",
            point=_gemm_point("v100-sxm2", column_major=True),
            measured_s=_ms("time_ms"),
            tolerances={"median": 0.15, "p90": 0.35},
        ),
        DataSet(
            name="gemm-mi210",
            description="LLMCompass's 22 FP16 GEMMs (PyTorch/rocBLAS) on an MI210",
            file="llmcompass_mi210_gemm_fp16.csv",
            system="mi210",
            point=_gemm_point("mi210", column_major=False),
            measured_s=_ms("time_ms"),
            tolerances={"median": 0.15, "p90": 0.35},
        ),
        DataSet(
            name="softmax-mi210",
            description="LLMCompass's row-wise softmax over m x n fp16 (PyTorch) on an MI210",
            file="llmcompass_mi210_softmax_fp16.csv",
            system="mi210",
            point=_rowreduce_point("softmax", "pytorch-2.0"),
            measured_s=_ms("time_ms"),
            tolerances={"median": 0.20},
        ),
        DataSet(
            name="layernorm-mi210",
            description="LLMCompass's row-wise layernorm over m x n fp16 (torch.compile) on an MI210",
            file="llmcompass_mi210_layernorm_fp16.csv",
            system="mi210",
            point=_rowreduce_point("layernorm", "inductor-2.0"),
            measured_s=_ms("time_ms"),
            tolerances={"median": 0.20},
        ),
        DataSet(
            name="gelu-mi210",
            description="LLMCompass's element-wise GeLU over N fp16 values (torch.compile) on an MI210",
            file="llmcompass_mi210_gelu_fp16.csv",
            system="mi210",
            point=_gelu_point("mi210"),
            measured_s=_ms("time_ms"),
            tolerances={"median": 0.20},
            plot_x="elements",
        ),
        *_llmcompass_a100_datasets(),
        *_hopper_datasets("h200"),
        *_hopper_datasets("h100"),
        _vidur_allreduce("allreduce-dgx-a100", "vidur's NCCL all-reduce (median of repeats) on DGX A100: 2, 4, 8 "
                         "GPUs in a node and 16 GPUs in two nodes, 1-64 MiB", "vidur_a100_dgx_all_reduce.csv",
                         "dgx-a100", _allreduce_select),
        _vidur_layer(PHI2, "phi2", "a100", "a100-sxm4"),
        _vidur_layer(PHI2, "phi2", "h100", "h100-sxm5"),
        _vidur_layer(LLAMA2_7B, "llama2-7b", "a100", "a100-sxm4"),
        _vidur_layer(LLAMA2_7B, "llama2-7b", "h100", "h100-sxm5"),
        _vidur_layer(LLAMA2_70B, "llama2-70b-tp4", "h100", "h100-sxm5", native=True),
        _vidur_allreduce("allreduce-hgx-h100", "vidur's NCCL all-reduce (median of repeats) on H100 DGX nodes: 2, 4, "
                         "8 GPUs in a node, 1-64 MiB (40 sizes each)", "vidur_h100_dgx_all_reduce.csv", "hgx-h100",
                         _allreduce_select),
        DataSet(name="attention-h100-published", description="FlashAttention-2's own benchmarks (prompt forward and "
                "backward, 16K tokens a call) published in two pull requests of its repository, on an H100 SXM and on "
                "an unnamed GPU as fast (compared as an H100)", file="published/flash_attention_h100.csv",
                system="h100-sxm5", point=_attention_point("h100-sxm5"), measured_s=_published_attention_s,
                tolerances={"median": 0.10, "p90": 0.25}, group="direction", plot_x="seqlen", plot_by="direction"),
        DataSet(name="bert-layer-v100", description="Hugging Face's BERT-Base layer training in fp32 (PyTorch eager, "
                "batch 16 x 512 tokens) on an Azure V100 PCIe: one layer's forward and backward pass and its softmax "
                "and layer-norm kernels (seeds/000 Table 3.3, profiler means)", file="published/bert_base_v100_seed000.csv",
                system="v100-pcie", point=_bert_layer_point("v100-pcie"), measured_s=lambda frame: frame["measured_us"] * 1e-6,
                tolerances={"median": 0.15, "max": 0.25}, group="pass"),
        _vidur_allreduce("allreduce-dgx-a100-2nodes", "vidur's NCCL all-reduce across two DGX A100 nodes with 1, 2 and "
                         "4 GPUs each, 1-64 MiB (the data the inter-node network is fitted to)",
                         "vidur_a100_dgx_all_reduce.csv", "dgx-a100", _two_node_select),
    )
}
"""The comparisons ``gpusim validate`` runs, by name."""


def get(name: str) -> DataSet:
    """The data set called ``name``; the error lists the known ones."""
    if name not in DATASETS:
        raise ConfigError(f"unknown validation data set {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name]


def sample(frame: pd.DataFrame, count: int | None, seed: int = 0, by: str | None = None) -> pd.DataFrame:
    """A reproducible random subset of ``count`` rows (all rows when ``count`` is None or larger).

    With ``by``, the ``count`` rows are spread as evenly as the groups (the values of that column)
    allow: every group gets ``count // groups`` rows or one more, the groups that get one more
    being drawn at random, so that when ``count`` is smaller than the number of groups only
    ``count`` groups, drawn at random, are represented; a group too small for its share gives the
    rest to the others.  The subset has exactly ``count`` rows.  ``count`` must be a
    positive integer (:class:`ConfigError` otherwise).
    """
    rows = as_int(count)
    if count is not None and (rows is None or rows <= 0):
        raise ConfigError(f"points: expected a positive number of rows to sample, got {count!r}")
    if count is None or count >= len(frame):
        return frame
    if by is None:
        return frame.sample(n=count, random_state=seed).sort_index()
    groups = [part for _, part in frame.groupby(by, sort=True, dropna=False)]
    order = np.random.default_rng(seed).permutation(len(groups))
    shares = [0] * len(groups)
    left = count
    while left:  # one row per group and round, in the drawn order, until count rows are handed out
        for index in order:
            if left and shares[index] < len(groups[index]):
                shares[index] += 1
                left -= 1
    parts = [part.sample(n=share, random_state=seed) for part, share in zip(groups, shares) if share]
    return pd.concat(parts).sort_index()


def holdout_split(frame: pd.DataFrame, seed: int = 0, fraction: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A reproducible random split into a fitting part and a held-out part."""
    fit = frame.sample(frac=fraction, random_state=seed)
    return fit.sort_index(), frame.drop(fit.index)


def compare(dataset: DataSet | str, rows: pd.DataFrame | None = None, overrides: dict[str, Any] | None = None,
            mode: str = "full", workers: int | None = None, progress: bool = True) -> pd.DataFrame:
    """Simulate the measured rows of ``dataset`` and return them with the simulated times.

    Parameters
    ----------
    dataset
        A data set or its name.
    rows
        The rows to simulate (default: all of :meth:`DataSet.load`).
    overrides
        Extra preset overrides applied to every row (e.g. to try a calibration value).
    mode
        Simulation mode of single-node points (multi-node points always run in full mode).
    workers
        Processes (default: the CPUs available).
    progress
        Show a progress bar.

    Returns
    -------
    pandas.DataFrame
        The rows with ``measured_s``, ``simulated_s``, ``error`` (simulated / measured - 1),
        ``abs_error`` and ``impl``.
    """
    from gpusim.sweep import sweep

    dataset = get(dataset) if isinstance(dataset, str) else dataset
    frame = dataset.load() if rows is None else rows.reset_index(drop=True)
    points = []
    for _, row in frame.iterrows():
        point = dataset.point(row)
        merged = {**point.get("overrides", {}), **(overrides or {})}
        point["overrides"] = merged
        multi_node = int(merged.get("nodes", 1)) > 1
        point["mode"] = "full" if multi_node else mode
        points.append(point)
    simulated = sweep(simulate_point, points, workers=workers, progress=progress, description=dataset.name)
    frame = frame.copy()
    frame["simulated_s"] = simulated["simulated_s"].to_numpy()
    frame["impl"] = simulated["impl"].to_numpy()
    frame["sim_wall_s"] = simulated["sim_wall_s"].to_numpy()
    for column in dataset.columns:
        frame[column] = simulated[column].to_numpy()
    frame["error"] = frame["simulated_s"] / frame["measured_s"] - 1.0
    frame["abs_error"] = frame["error"].abs()
    frame.insert(0, "dataset", dataset.name)
    return frame


def error_stats(frame: pd.DataFrame) -> dict[str, float]:
    """Median, 90th percentile and maximum of ``|error|``, the number of points, and the median of
    the signed error (``bias``: below 0 where the simulator is fast in the main)."""
    errors = frame["abs_error"].to_numpy(dtype=float)
    if errors.size == 0:
        return {"points": 0, "median": math.nan, "p90": math.nan, "max": math.nan, "bias": math.nan}
    return {
        "points": int(errors.size),
        "median": float(np.median(errors)),
        "p90": float(np.quantile(errors, 0.9)),
        "max": float(errors.max()),
        "bias": float(np.median(frame["error"].to_numpy(dtype=float))),
    }


def summary(frame: pd.DataFrame, dataset: DataSet | str | None = None) -> pd.DataFrame:
    """One row of error statistics per data set (and per group of a grouped data set)."""
    rows = []
    for name, part in frame.groupby("dataset", sort=False):
        current = get(name) if dataset is None else (get(dataset) if isinstance(dataset, str) else dataset)
        rows.append({"dataset": name, "subset": "all", **error_stats(part)})
        if current.group is not None:
            for value, sub in part.groupby(current.group, sort=True):
                rows.append({"dataset": name, "subset": f"{current.group}={value}", **error_stats(sub)})
    return pd.DataFrame(rows)


def violations(frame: pd.DataFrame, dataset: DataSet | str) -> list[str]:
    """The tolerances of ``dataset`` that the comparison ``frame`` breaks (empty when it meets them)."""
    dataset = get(dataset) if isinstance(dataset, str) else dataset
    stats = error_stats(frame)
    broken = []
    for statistic, limit in dataset.tolerances.items():
        value = stats[statistic]
        if not value <= limit:
            broken.append(f"{dataset.name}: {statistic} |error| {value:.1%} exceeds its tolerance {limit:.0%}")
    return broken


def report(dataset: DataSet | str, out: str | Path | None = None, points: int | None = None, seed: int = 0,
           mode: str = "full", workers: int | None = None, progress: bool = True,
           overrides: dict[str, Any] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Compare ``dataset`` (or a random subset of ``points`` rows), and write its CSV and plot.

    Parameters
    ----------
    dataset
        A data set or its name.
    out
        Folder for ``NAME.csv`` (measured, simulated, error per point) and ``NAME.png``; nothing
        is written when None.
    points
        Simulate at most this many rows, drawn at random and spread evenly over the data set's
        groups (:func:`sample`).
    seed
        Seed of that draw.
    mode, workers, progress, overrides
        As in :func:`compare` (the overrides apply to every point, over the data set's own).

    Returns
    -------
    tuple
        The compared rows, their :func:`summary` and the :func:`violations` of the tolerances.
    """
    dataset = get(dataset) if isinstance(dataset, str) else dataset
    rows = sample(dataset.load(), points, seed, by=dataset.group)
    frame = compare(dataset, rows, overrides=overrides, mode=mode, workers=workers, progress=progress)
    table = summary(frame, dataset)
    broken = violations(frame, dataset)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_csv(folder / f"{dataset.name}.csv", index=False)
        write_plot(frame, dataset, folder / f"{dataset.name}.png")
    return frame, table, broken


def write_plot(frame: pd.DataFrame, dataset: DataSet, path: Path) -> None:
    """Measured against simulated, and the error of every point (and the times against
    :attr:`DataSet.plot_x` when the data set has one), as a PNG."""
    import matplotlib.pyplot as plt

    from gpusim import plot

    panels = 3 if dataset.plot_x else 2
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    plot.measured_vs_simulated(frame, ax=axes[0])
    axes[0].set_title(dataset.name)
    tolerance = dataset.tolerances.get("median")
    plot.relative_error(frame, ax=axes[1], tolerance=tolerance)
    axes[1].set_title("simulated / measured - 1")
    if dataset.plot_x:
        plot.measured_and_simulated(frame, dataset.plot_x, by=dataset.plot_by, ax=axes[2])
    plot.save_figure(figure, path, dpi=110)
