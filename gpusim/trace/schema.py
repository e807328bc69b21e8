"""The operator-trace schema: its columns, and the validation every trace passes when it is made.

A trace is a table with one row per op per GPU.  Rows of one op on several GPUs share an
``op_id`` (a collective has a row on every rank of its group; a tensor-parallel GEMM may have one
row on every rank).  ``deps`` names op_ids *on the same GPU* that must finish first; ops on one
``(gpu, stream)`` also run in table order.  A collective or send/receive synchronises the rows of
its op_id across GPUs.

=============== ======== =============================================================================
column          type     meaning
=============== ======== =============================================================================
op_id           int      identifier of the op (shared by its rows on several GPUs)
gpu             int      rank the row runs on
stream          str      stream on that GPU (ops on one stream run in order; streams overlap)
kind            str      ``gemm``, ``grouped_gemm``, ``elementwise``, ``reduction``, ``attention``,
                         ``collective``, ``sendrecv``, ``optimizer``, ``delay``, ``gemm_collective`` (a GEMM overlapped
                         with a collective of its output), ``collective_gemm`` (an all-gather overlapped
                         with the GEMM that consumes it; :mod:`gpusim.trace.fusion` makes both)
name            str      label in results (optional)
m, n, k         int      GEMM C[m, n] = A[m, k] B[k, n] (``gemm``, ``gemm_collective``: each rank's;
                         ``collective_gemm``: each rank's GEMM on the gathered A, ``m`` its gathered rows)
batch           int      GEMMs in a strided batch (``gemm``, ``gemm_collective``, default 1; 1 for
                         ``collective_gemm``); sequences (``attention``)
trans_a/b       bool     transposed GEMM inputs (``gemm``, ``grouped_gemm``, ``gemm_collective``,
                         ``collective_gemm``)
shapes          ints     a ``grouped_gemm``'s problems, ``m n k`` of each one after another (one kernel
                         over all of them, :class:`gpusim.ops.GroupedGemm`)
kernel          str      force a GEMM kernel of the library; a reduction's kernel library (``pytorch``,
                         ``pytorch-2.0``, ``inductor``; default ``pytorch``) (optional)
elements        int      elements per tensor (``elementwise``)
rows, cols      int      matrix shape (``reduction``)
heads, kv_heads int      query and key/value heads (``attention``; ``kv_heads`` blank: ``heads``)
q_len, kv_len   int      query and key/value lengths, tokens (``attention``)
head_dim        int      values per head (``attention``)
causal          bool     causal mask (``attention``)
function        str      element-wise function (``gelu``, ``add``...), reduction (``softmax``...),
                         optimizer algorithm (``adam``, ``lamb``...), attention pass (``forward``,
                         ``backward``) or how a ``gemm_collective`` overlaps (``t3``, the default:
                         T3's track and trigger; ``decomposed``: the GEMM cut into a kernel per rank
                         beside a CU-driven ring; ``decomposed_dma``: the same with a DMA ring) or a
                         ``collective_gemm`` (``decomposed_dma``, the default, or ``decomposed``: a GEMM
                         kernel per gathered chunk as it arrives, beside a DMA or CU-driven ring; ``t3``:
                         one GEMM kernel whose workgroups the tracker triggers as their rows arrive)
tensor_sizes    ints     elements of every parameter tensor an ``optimizer`` row updates
optimizer_impl  str      how the optimizer runs: ``multi_fused`` (default), ``fused``, ``unfused``,
                         ``multi_unfused`` or ``nmc`` (near-memory ALUs)
collective      str      ``allreduce``, ``reducescatter``, ``allgather``, ``alltoall`` (``collective``);
                         ``reducescatter``, ``allgather``, ``alltoall`` (``gemm_collective``);
                         ``allgather`` (``collective_gemm``)
bytes           int      message size: each rank's input (output for all-gather); send size
send_bytes      ints     an uneven ``alltoall`` (all-to-allv): the bytes this row's rank sends to each
                         rank of ``group``, in group order (its own entry stays in place); on every row
                         of the op or on none; each rank's sends and receives at most ``bytes``
                         (blank: ``bytes`` / ranks to each)
group           ints     ranks of a collective, ``gemm_collective`` or ``collective_gemm``; ``src dst`` of a
                         send/receive (blank:
                         all GPUs)
algorithm       str      collective algorithm (``ring``, ``direct``, ``hierarchical``, ``auto``; a
                         ``gemm_collective``: ``ring``, ``direct``, ``auto``; a ``collective_gemm``:
                         ``ring``, ``auto``)
channels        int      CUs of a CU-driven collective (``collective``, a ``decomposed``
                         ``gemm_collective`` or ``collective_gemm``; blank: the node's ``collectives.cus``, fewer for small
                         messages)
splits          int      kernels per rank's chunk of a ``decomposed`` or ``decomposed_dma``
                         ``gemm_collective`` (blank: 1)
async_collective bool    a ``gemm_collective`` whose collective finishes on its own: its stream moves
                         on once the GEMM has ended, and only rows naming it in ``deps`` wait for the
                         collective (what a collective on another stream than its GEMM had; blank:
                         false, the stream waits for the whole row)
dtype           str      element type (default ``fp16``)
deps            ints     op_ids on the same GPU that must finish before this row starts
delay_s         float    duration of a ``delay`` row, s
measured_s      float    measured duration (imported traces), s; blank when unknown
issue_s         float    when the host's launch call of the row's kernel returned, measured (imported
                         traces), s from the first launch call; blank: the model's host thread
inputs, output  strs     tensor names (rows naming the same tensor read the same memory); an attention
                         row's inputs are ``q k v`` (backward: ``q k v out grad_out``), its output is
                         ``out`` (backward: the gradient of ``q``)
layer           int      index of the repeated layer the row belongs to (-1: none; see caching)
phase           str      ``fwd``, ``bwd``, ``opt``, ``prompt``, ``decode``... (labels; used by caching)
step            int      microbatch (training, prompt) or token x microbatches + microbatch (decode)
kernel_class    str      class of the measured kernel (``gemm``, ``elementwise``, ``reduction``,
                         ``collective``, ``memcpy``, ``other``); blank: the row's ``kind``
=============== ======== =============================================================================

Lists (``group``, ``deps``, ``inputs``) are written as space-separated values.  Times (``delay_s``,
``measured_s``, ``issue_s``) are at most :data:`MAX_SECONDS`.  Validation raises
one :class:`gpusim.errors.TraceError` that names the source, the row and the field; it never
returns a partly valid trace.
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
import pandas as pd

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import TraceError
from gpusim.ops import (
    ATTENTION_DIRECTIONS,
    COLLECTIVE_ALGORITHMS,
    ELEMENTWISE_KINDS,
    FUSED_ALGORITHMS,
    MAX_INDEX_DIMS,
    OPTIMIZER_ALGORITHMS,
    OPTIMIZER_IMPLS,
    ROW_REDUCE_KINDS,
)

KINDS = ("gemm", "grouped_gemm", "elementwise", "reduction", "attention", "collective", "sendrecv", "optimizer",
         "delay", "gemm_collective", "collective_gemm")
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall")
FUSED_COLLECTIVES = ("reducescatter", "allgather", "alltoall")
"""Collectives a ``gemm_collective`` row overlaps with its GEMM (T3's fused ops)."""
OVERLAP_FUNCTIONS = ("t3", "decomposed", "decomposed_dma")
"""How a ``gemm_collective`` row overlaps: T3's hardware, or software decomposition (CU or DMA ring)."""
GATHER_FUNCTIONS = ("decomposed_dma", "decomposed", "t3")
"""How a ``collective_gemm`` row overlaps its all-gather with the GEMM: a kernel per chunk beside a DMA or
CU-driven ring, or T3's tracker triggering one GEMM kernel's workgroups as their rows arrive."""
GATHER_ALGORITHMS = ("ring", "auto")
SYNCHRONISING_KINDS = ("collective", "sendrecv", "gemm_collective", "collective_gemm")
GROUP_KINDS = ("collective", "gemm_collective", "collective_gemm")
"""Kinds whose ``group`` names the ranks that exchange data."""
KERNEL_CLASSES = ("gemm", "elementwise", "reduction", "attention", "collective", "sendrecv", "optimizer", "memcpy",
                  "delay", "gemm_collective", "collective_gemm", "other")

REQUIRED_COLUMNS = ("op_id", "gpu", "stream", "kind")
INT_COLUMNS = ("m", "n", "k", "batch", "elements", "index_dims", "rows", "cols", "heads", "kv_heads", "q_len", "kv_len",
               "head_dim", "bytes", "channels", "splits", "layer", "step")
FLOAT_COLUMNS = ("delay_s", "measured_s", "issue_s")
MAX_SECONDS = 1e6
"""Largest time a trace may give (``delay_s``, ``measured_s``, ``issue_s``), s: about 11.6 days, where the
simulation's float nanoseconds (1e15 ns) still resolve 0.125 ns; a larger time is an error, not an
overflow to inf that would leave the results NaN and their JSON invalid."""
BOOL_COLUMNS = ("trans_a", "trans_b", "causal", "async_collective")
TEXT_COLUMNS = (
    "name", "kernel", "shapes", "function", "tensor_sizes", "optimizer_impl", "collective", "send_bytes", "group",
    "algorithm", "dtype", "deps", "inputs", "output", "phase", "kernel_class",
)  # fmt: skip
COLUMNS = (
    "op_id", "gpu", "stream", "kind", "name", "m", "n", "k", "batch", "trans_a", "trans_b", "kernel", "shapes",
    "elements", "index_dims", "rows", "cols", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "function",
    "tensor_sizes", "optimizer_impl", "collective", "bytes", "send_bytes", "group", "algorithm", "channels",
    "splits", "async_collective", "dtype", "deps", "delay_s",
    "measured_s", "issue_s", "inputs", "output", "layer", "phase", "step", "kernel_class",
)  # fmt: skip
"""Every column, in the order traces are written."""

DEFAULTS: dict[str, object] = {"batch": 1, "index_dims": 0, "layer": -1, "step": 0, "dtype": "fp16",
                               "algorithm": "auto"}
FUNCTION_DEFAULTS: dict[str, str] = {"gemm_collective": "t3", "collective_gemm": "decomposed_dma"}
"""A blank ``function`` of these kinds means this one."""

SHAPE_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "batch", "trans_a", "trans_b", "dtype", "kernel"),
    "grouped_gemm": ("shapes", "trans_a", "trans_b", "dtype", "kernel"),
    "elementwise": ("elements", "function", "dtype", "index_dims", "rows"),
    "reduction": ("rows", "cols", "function", "dtype", "kernel"),
    "attention": ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "function", "dtype"),
    "collective": ("collective", "bytes", "group", "algorithm", "channels", "dtype"),
    "sendrecv": ("bytes", "group"),
    "optimizer": ("function", "tensor_sizes", "optimizer_impl", "dtype"),
    "delay": ("delay_s",),
    "gemm_collective": ("m", "n", "k", "batch", "trans_a", "trans_b", "dtype", "kernel", "collective", "group",
                        "algorithm", "channels", "splits", "async_collective", "function"),
    "collective_gemm": ("m", "n", "k", "batch", "trans_a", "trans_b", "dtype", "kernel", "collective", "group",
                        "algorithm", "channels", "function"),
}
"""Fields that define what a row of each kind computes (rows of one op_id must agree on them)."""


def parse_ints(text: str) -> list[int]:
    """``"3 4 5"`` (or ``"3,4,5"``) to ``[3, 4, 5]``; blank to ``[]``; raises ValueError otherwise."""
    if not text:
        return []
    return [int(part) for part in text.replace(",", " ").split()]


def _positive_ints(text: str) -> list[int]:
    """The numbers of a list column's ``text`` (:func:`parse_ints`), or ``[]`` when it is blank, not
    whole numbers, or not all positive."""
    try:
        values = parse_ints(text)
    except ValueError:
        return []
    return values if values and min(values) > 0 else []


def format_ints(values) -> str:
    """``[3, 4, 5]`` to ``"3 4 5"``."""
    return " ".join(str(int(value)) for value in values)


def _plain(value: object) -> object:
    """``value`` as a Python scalar (numpy's as Python's), or ``None`` when it is missing (None, NaN, NA)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def format_value(value: object) -> str:
    """A table value as error messages show it: a number plainly (``-64``, not ``np.int64(-64)``), text
    quoted, and a missing value (None, NaN, ``pd.NA``) as ``blank``."""
    plain = _plain(value)
    return "blank" if plain is None else repr(plain)


@dataclass(frozen=True)
class RowLocation:
    """Where a row is, for error messages (its op_id and gpu as written, a missing one as ``blank``)."""

    source: str
    index: int
    op_id: object
    gpu: object = None

    def __str__(self) -> str:
        op_id = _plain(self.op_id)
        where = f"{self.source}: row {self.index} (op_id {'blank' if op_id is None else op_id}"
        if self.gpu is not None:
            gpu = _plain(self.gpu)
            where += f", gpu {'blank' if gpu is None else gpu}"
        return where + ")"


def _fail(frame: pd.DataFrame, position: int, source: str, field: str, message: str) -> TraceError:
    op_id = frame["op_id"].iloc[position] if "op_id" in frame.columns else "?"
    gpu = frame["gpu"].iloc[position] if "gpu" in frame.columns else None
    location = RowLocation(source, position, op_id, gpu)
    return TraceError(f"{location}: field '{field}' {message}")


NUMBER_LOOKALIKES = (bool, np.bool_, datetime.date, datetime.timedelta, np.datetime64, np.timedelta64)
"""Values that pandas turns into numbers but that are not counts or times: a boolean (``True`` as
1) and a date or a duration (as nanoseconds)."""


def _lookalikes(raw: pd.Series) -> pd.Series:
    """Where ``raw`` holds one of :data:`NUMBER_LOOKALIKES` (a column of them from a DataFrame or a
    Parquet file; a CSV's text never is one)."""
    dtype = raw.dtype
    if (pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_datetime64_any_dtype(dtype)
            or pd.api.types.is_timedelta64_dtype(dtype)):
        return raw.notna()
    plain = ("string", "integer", "floating", "empty")  # told apart in C, without a Python call per value
    if not pd.api.types.is_object_dtype(dtype) or pd.api.types.infer_dtype(raw, skipna=True) in plain:
        return pd.Series(False, index=raw.index)
    return raw.map(lambda value: isinstance(value, NUMBER_LOOKALIKES)).astype(bool)


def _as_numbers(raw: pd.Series, blank: pd.Series) -> pd.Series:
    """``raw``'s values as numbers, NaN where they are ``blank``, not numbers, or :data:`NUMBER_LOOKALIKES`."""
    lookalikes = _lookalikes(raw)
    if lookalikes.any():  # as objects: a date column masked in place would give NaT, which pandas reads as -2**63
        raw = raw.astype(object)
    return pd.to_numeric(raw.where(~blank & ~lookalikes), errors="coerce")


def _blanks(raw: pd.Series) -> pd.Series:
    """Where ``raw`` is missing or blank text (a column of numbers has no text to read)."""
    if pd.api.types.is_numeric_dtype(raw.dtype) and not pd.api.types.is_bool_dtype(raw.dtype):
        return raw.isna()
    return raw.isna() | (raw.astype(str).str.strip() == "")


def _whole_numbers(frame: pd.DataFrame, column: str, source: str, nullable: bool) -> pd.Series:
    raw = frame[column]
    blank = _blanks(raw)
    numeric = _as_numbers(raw, blank)
    value = numeric.astype(float)
    bad = ~blank & ~(np.isfinite(value) & (value == np.floor(value)))
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise _fail(frame, position, source, column, f"must be a whole number, got {format_value(raw.iloc[position])}")
    too_large = ~blank & (value.abs() >= 2.0**63)
    if too_large.any():
        position = int(np.flatnonzero(too_large.to_numpy())[0])
        raise _fail(frame, position, source, column,
                    f"must be a whole number below 2**63 in magnitude, got {format_value(raw.iloc[position])}")
    if not nullable and blank.any():
        position = int(np.flatnonzero(blank.to_numpy())[0])
        raise _fail(frame, position, source, column, "must not be blank")
    return numeric.astype("Int64")


def _numbers(frame: pd.DataFrame, column: str, source: str) -> pd.Series:
    raw = frame[column]
    blank = _blanks(raw)
    numeric = _as_numbers(raw, blank)
    bad = ~blank & ~np.isfinite(numeric.astype(float))
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise _fail(frame, position, source, column, f"must be a finite number, got {format_value(raw.iloc[position])}")
    return numeric.astype(float)


_TRUTH = {"true": True, "1": True, "yes": True, "t": True, "false": False, "0": False, "no": False, "f": False,
          "": False, "nan": False, "none": False, "<na>": False}
"""How a boolean column's text reads (case and surrounding blanks aside; ``1.0`` reads as ``1``)."""


def _booleans(frame: pd.DataFrame, column: str, source: str) -> pd.Series:
    series = frame[column]
    if pd.api.types.is_bool_dtype(series.dtype) and not series.isna().any():
        return series.astype(bool)  # a generated trace's column: nothing to read
    keys = series.map(str).str.strip().str.lower().str.replace(r"\.0$", "", regex=True)
    values = keys.map(_TRUTH)
    unknown = values.isna().to_numpy()
    if unknown.any():
        position = int(np.flatnonzero(unknown)[0])
        raise _fail(frame, position, source, column, f"must be true or false, got {format_value(series.iloc[position])}")
    return values.astype(bool)


def _texts(frame: pd.DataFrame, column: str) -> pd.Series:
    series = frame[column]
    return series.where(series.notna(), "").astype(str).str.strip()


def check_column_names(names: Sequence[object], source: str) -> None:
    """Raise :class:`TraceError` for a column without a name or a name given to several columns.

    Parameters
    ----------
    names
        The column names in table order (a CSV header's fields, a Parquet schema's or a DataFrame's).
    source
        Where the table came from (named in the message).

    Raises
    ------
    TraceError
        A blank name (a trailing comma in a CSV header), naming its place; or a repeated name, naming
        it and how often it appears.
    """
    for position, name in enumerate(names):
        if name is None or not str(name).strip():
            raise TraceError(f"{source}: column {position + 1} has no name; give it a trace column's name or remove it")
    counts = Counter(names)
    repeated = next((name for name in names if counts[name] > 1), None)
    if repeated is not None:
        raise TraceError(f"{source}: column {str(repeated)!r} appears {counts[repeated]} times; give each column once")


def normalize(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check column names and types and fill defaults; return a new frame in :data:`COLUMNS` order.

    Raises
    ------
    TraceError
        A missing required column, an unknown, repeated or unnamed column
        (:func:`check_column_names`), or a value of the wrong type (naming the row and the field).
    """
    if not isinstance(frame, pd.DataFrame):
        raise TraceError(f"{source}: a trace is a table (pandas DataFrame), got {type(frame).__name__}")
    check_column_names(list(frame.columns), source)
    frame = frame.reset_index(drop=True)
    for column in REQUIRED_COLUMNS:
        if column not in frame.columns:
            joined = next((separator for separator in (";", "\t", "|") if len(frame.columns) == 1
                           and separator in str(frame.columns[0])), None)
            hint = f"; the header is one column holding {joined!r}: separate the columns with commas" if joined else ""
            raise TraceError(
                f"{source}: missing column '{column}' (every trace needs the columns {', '.join(REQUIRED_COLUMNS)}){hint}"
            )
    unknown = [column for column in frame.columns if column not in COLUMNS]
    if unknown:
        raise TraceError(f"{source}: unknown column '{unknown[0]}'; known columns: {', '.join(COLUMNS)}")
    if frame.empty:
        raise TraceError(f"{source}: the trace has no rows")
    result = pd.DataFrame(index=frame.index)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = DEFAULTS.get(column, pd.NA if column in INT_COLUMNS else "")
    result["op_id"] = _whole_numbers(frame, "op_id", source, nullable=False).astype("int64")
    result["gpu"] = _whole_numbers(frame, "gpu", source, nullable=False).astype("int64")
    if (result["gpu"] < 0).any():
        position = int(np.flatnonzero((result["gpu"] < 0).to_numpy())[0])
        raise _fail(frame, position, source, "gpu",
                    f"must be a GPU index >= 0, got {format_value(frame['gpu'].iloc[position])}")
    for column in COLUMNS[2:]:
        if column in INT_COLUMNS:
            values = _whole_numbers(frame, column, source, nullable=True)
            if column in DEFAULTS:
                values = values.fillna(DEFAULTS[column])
            result[column] = values
        elif column in FLOAT_COLUMNS:
            result[column] = _numbers(frame, column, source)
        elif column in BOOL_COLUMNS:
            result[column] = _booleans(frame, column, source)
        else:
            values = _texts(frame, column)
            if pd.api.types.is_float_dtype(frame[column].dtype):  # a list column of one number a row, as pandas
                whole = (frame[column].abs() < 2.0**63) & (frame[column] % 1 == 0)  # makes it: 1.0 is op_id 1
                values = values.where(~whole, frame[column][whole].astype("int64").astype(str))
            if column in DEFAULTS:
                values = values.replace("", DEFAULTS[column])
            result[column] = values
    blank_stream = (result["stream"] == "").to_numpy()
    if blank_stream.any():  # a row without a stream would run beside every named stream of its GPU
        raise _fail(frame, int(np.flatnonzero(blank_stream)[0]), source, "stream",
                    "must not be blank (rows of one stream run in order; name it, e.g. compute)")
    result["kind"] = result["kind"].str.lower()
    for kind, function in FUNCTION_DEFAULTS.items():
        result.loc[(result["kind"] == kind) & (result["function"] == ""), "function"] = function
    return result[list(COLUMNS)]


def _check_kind_fields(frame: pd.DataFrame, source: str) -> None:
    kinds = frame["kind"].to_numpy()
    unknown = ~np.isin(kinds, KINDS)
    if unknown.any():
        position = int(np.flatnonzero(unknown)[0])
        raise _fail(frame, position, source, "kind",
                    f"must be one of {', '.join(KINDS)}, got {format_value(kinds[position])}")
    bad_dtype = ~frame["dtype"].isin(list(DTYPE_BYTES)).to_numpy()
    if bad_dtype.any():
        position = int(np.flatnonzero(bad_dtype)[0])
        raise _fail(frame, position, source, "dtype",
                    f"must be one of {', '.join(DTYPE_BYTES)}, got {format_value(frame['dtype'].iloc[position])}")
    positive = {
        "gemm": ("m", "n", "k", "batch"),
        "elementwise": ("elements",),
        "reduction": ("rows", "cols"),
        "attention": ("batch", "heads", "q_len", "kv_len", "head_dim"),
        "collective": ("bytes",),
        "sendrecv": ("bytes",),
        "gemm_collective": ("m", "n", "k", "batch"),
        "collective_gemm": ("m", "n", "k", "batch"),
    }
    for kind, fields in positive.items():
        mask = kinds == kind
        if not mask.any():
            continue
        for field in fields:
            values = frame[field]
            bad = mask & (values.isna() | (values.fillna(0) <= 0)).to_numpy()
            if bad.any():
                position = int(np.flatnonzero(bad)[0])
                got = format_value(frame[field].iloc[position])
                raise _fail(frame, position, source, field,
                            f"must be a positive whole number for a {kind} row, got {got}")
    element_bytes = frame["dtype"].map(DTYPE_BYTES)
    partial = ((kinds == "collective") & (frame["bytes"].fillna(0) % element_bytes != 0)).to_numpy()
    if partial.any():
        position = int(np.flatnonzero(partial)[0])
        dtype = frame["dtype"].iloc[position]
        raise _fail(frame, position, source, "bytes",
                    f"must be a whole number of the row's {dtype} elements ({DTYPE_BYTES[dtype]} bytes each) for a "
                    f"collective row, got {format_value(frame['bytes'].iloc[position])}")
    choices = (
        ("elementwise", "function", tuple(ELEMENTWISE_KINDS)),
        ("reduction", "function", tuple(ROW_REDUCE_KINDS)),
        ("attention", "function", ATTENTION_DIRECTIONS),
        ("collective", "collective", COLLECTIVES),
        ("optimizer", "function", OPTIMIZER_ALGORITHMS),
        ("gemm_collective", "collective", FUSED_COLLECTIVES),
        ("collective_gemm", "collective", ("allgather",)),
        ("collective_gemm", "function", GATHER_FUNCTIONS),
    )
    for kind, field, allowed in choices:
        bad = (kinds == kind) & ~frame[field].isin(allowed).to_numpy()
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            got = format_value(frame[field].iloc[position])
            raise _fail(frame, position, source, field,
                        f"must be one of {', '.join(allowed)} for a {kind} row, got {got}")
    dims = frame["index_dims"]
    bad = (kinds == "elementwise") & (dims.isna() | (dims.fillna(0) < 0) | (dims.fillna(0) > MAX_INDEX_DIMS)).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "index_dims",
                    f"must be a whole number from 0 to {MAX_INDEX_DIMS} for an elementwise row, "
                    f"got {format_value(dims.iloc[position])}")
    for kind, allowed in (("collective", COLLECTIVE_ALGORITHMS), ("gemm_collective", FUSED_ALGORITHMS),
                          ("collective_gemm", GATHER_ALGORITHMS)):
        bad = (kinds == kind) & ~frame["algorithm"].isin(allowed).to_numpy()
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise _fail(frame, position, source, "algorithm",
                        f"must be one of {', '.join(allowed)} for a {kind} row, "
                        f"got {format_value(frame['algorithm'].iloc[position])}")
    for column, what in (("channels", "CUs"), ("splits", "kernels")):
        values = frame[column]
        bad = (values.notna() & (values.fillna(1) <= 0)).to_numpy()
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise _fail(frame, position, source, column,
                        f"must be blank or a positive whole number of {what}, got {format_value(values.iloc[position])}")
    _check_overlaps(frame, source)
    _check_send_bytes(frame, source)
    for position in np.flatnonzero(kinds == "grouped_gemm"):
        text = frame["shapes"].iloc[position]
        dims = _positive_ints(text)
        if not dims or len(dims) % 3:
            raise _fail(frame, int(position), source, "shapes",
                        f"must list the positive m n k of every problem of a grouped_gemm row, one after another, "
                        f"got {format_value(text)}")
    bad = (kinds == "optimizer") & ~frame["optimizer_impl"].isin(("", *OPTIMIZER_IMPLS)).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "optimizer_impl",
                    f"must be blank or one of {', '.join(OPTIMIZER_IMPLS)}, "
                    f"got {format_value(frame['optimizer_impl'].iloc[position])}")
    for position in np.flatnonzero(kinds == "optimizer"):
        text = frame["tensor_sizes"].iloc[position]
        if not _positive_ints(text):
            raise _fail(frame, int(position), source, "tensor_sizes",
                        f"must list the positive sizes of the parameter tensors, got {format_value(text)}")
    delays = frame["delay_s"].to_numpy()
    bad = (kinds == "delay") & ~(delays >= 0)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "delay_s",
                    f"must be a duration >= 0 s for a delay row, got {format_value(delays[position])}")
    for column in FLOAT_COLUMNS:
        values = frame[column].to_numpy()
        bad = values > MAX_SECONDS
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise _fail(frame, position, source, column,
                        f"must be a time of at most {MAX_SECONDS:g} s, got {format_value(values[position])}")
    for column in ("measured_s", "issue_s"):  # optional measured times
        values = frame[column].to_numpy()
        bad = values < 0
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise _fail(frame, position, source, column,
                        f"must be >= 0 s or blank, got {format_value(values[position])}")
    classes = frame["kernel_class"]
    bad = ((classes != "") & ~classes.isin(KERNEL_CLASSES)).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "kernel_class",
                    f"must be blank or one of {', '.join(KERNEL_CLASSES)}, got {format_value(classes.iloc[position])}")


def _check_send_bytes(frame: pd.DataFrame, source: str) -> None:
    """``send_bytes`` only on ``alltoall`` collective rows with a group, as many non-negative sizes as
    the group has ranks, adding up to at most ``bytes``, and on every row of its op_id or on none
    (the receives' limit is the op's own check, :class:`gpusim.ops.AllToAll`)."""
    given = (frame["send_bytes"] != "").to_numpy()
    if not given.any():
        return
    alltoall = ((frame["kind"] == "collective") & (frame["collective"] == "alltoall")).to_numpy()
    for position in np.flatnonzero(given):
        text = frame["send_bytes"].iloc[position]
        if not alltoall[position]:
            raise _fail(frame, int(position), source, "send_bytes",
                        f"must be blank except on an alltoall collective row, got {format_value(text)}")
        try:
            sizes = parse_ints(text)
            ranks = len(parse_ints(frame["group"].iloc[position]))
        except ValueError:
            sizes, ranks = [-1], 0  # _parse_lists names a bad group
        if not ranks or len(sizes) != ranks or min(sizes) < 0:
            raise _fail(frame, int(position), source, "send_bytes",
                        f"must list the non-negative bytes sent to each of the {ranks or 'listed'} ranks of the "
                        f"row's group, got {format_value(text)}")
        if sum(sizes) > frame["bytes"].iloc[position]:
            raise _fail(frame, int(position), source, "send_bytes",
                        f"must add up to at most the row's bytes ({frame['bytes'].iloc[position]}), got "
                        f"{format_value(text)} ({sum(sizes)})")
    partial = frame.groupby("op_id")["send_bytes"].transform(lambda texts: (texts == "").any() and (texts != "").any())
    if partial.any():
        position = int(np.flatnonzero(partial.to_numpy() & ~given)[0])
        raise _fail(frame, position, source, "send_bytes",
                    "is blank, but other rows of the same op_id give it (an uneven all-to-all needs every rank's sends)")
    uneven = frame[given]
    for op_id, rows in uneven.groupby("op_id"):
        group = parse_ints(rows["group"].iloc[0])
        if sorted(rows["gpu"]) != sorted(group):
            raise _fail(frame, int(rows.index[0]), source, "send_bytes",
                        f"needs a row on every rank of the group {format_value(rows['group'].iloc[0])} "
                        f"(op_id {op_id} has rows on GPUs {format_ints(sorted(rows['gpu']))})")


def _check_overlaps(frame: pd.DataFrame, source: str) -> None:
    """Rows that overlap a GEMM and a collective: ``async_collective`` only on ``gemm_collective``
    rows, ``channels`` only where a CU-driven ring has them, ``splits`` only on a decomposed
    ``gemm_collective``, and the decompositions' limits (a reduce-scatter of one GEMM's output or an
    all-gather of one GEMM's untransposed A, not a batch, whose rows split evenly over the group)."""
    kinds = frame["kind"].to_numpy()
    overlap = kinds == "gemm_collective"
    gather = kinds == "collective_gemm"
    bad = ~overlap & frame["async_collective"].to_numpy(dtype=bool)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "async_collective",
                    f"must be blank or false on a {kinds[position]} row (only a gemm_collective row's collective "
                    f"can finish after its stream moves on), got {format_value(frame['async_collective'].iloc[position])}")
    if not (overlap.any() or gather.any()):
        return
    bad = overlap & ~frame["function"].isin(OVERLAP_FUNCTIONS).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "function",
                    f"must be one of {', '.join(OVERLAP_FUNCTIONS)} for a gemm_collective row, "
                    f"got {format_value(frame['function'].iloc[position])}")
    bad = (overlap | gather) & (frame["function"] != "decomposed").to_numpy() & frame["channels"].notna().to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "channels",
                    f"must be blank for a {frame['function'].iloc[position]} {kinds[position]} row (no CU drives its "
                    f"collective; only a decomposed one has channels), got {format_value(frame['channels'].iloc[position])}")
    decomposed = overlap & frame["function"].str.startswith("decomposed").to_numpy()
    bad = ~decomposed & frame["splits"].notna().to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise _fail(frame, position, source, "splits",
                    "must be blank except on a decomposed or decomposed_dma gemm_collective row (the kernels of "
                    f"each rank's chunk), got {format_value(frame['splits'].iloc[position])}")
    bad = gather & frame["trans_a"].to_numpy(dtype=bool)
    if bad.any():
        raise _fail(frame, int(np.flatnonzero(bad)[0]), source, "trans_a",
                    "must be false for a collective_gemm row (the all-gather concatenates whole rows of A), got True")
    for position in np.flatnonzero(decomposed | gather):
        row = frame.iloc[position]
        what = f"{row['function']} {row['kind']}"
        if row["kind"] == "gemm_collective" and row["collective"] != "reducescatter":
            raise _fail(frame, int(position), source, "collective",
                        f"must be reducescatter for a {what} row, got {format_value(row['collective'])}")
        try:
            ranks = len(parse_ints(row["group"]))
        except ValueError:
            ranks = 0  # _parse_lists names the bad group
        splits = 1 if pd.isna(row["splits"]) else int(row["splits"])
        problem = decomposition_problem(int(row["m"]), int(row["batch"]), ranks, splits)
        if problem:
            field, message = problem
            raise _fail(frame, int(position), source, field, f"{message} for a {what} row, got {format_value(row[field])}")


def decomposition_problem(m: int, batch: int, ranks: int, splits: int = 1) -> tuple[str, str] | None:
    """Why a GEMM of ``m`` rows and ``batch`` cannot be decomposed into ``splits`` kernels per rank of
    ``ranks`` (0: not known yet), as ``(field, what it must be)``; None when it can."""
    if batch != 1:
        return "batch", "must be 1 (the chunks are cut along m)"
    if ranks and m % (ranks * splits):
        per = "" if splits == 1 else f" x {splits} kernels per chunk"
        return "m", f"must split evenly over the {ranks} ranks of the group{per}"
    return None


def _parse_lists(frame: pd.DataFrame, source: str) -> tuple[list[list[int]], list[list[int]]]:
    groups: list[list[int]] = []
    deps: list[list[int]] = []
    kinds = frame["kind"].tolist()
    gpus = frame["gpu"].tolist()
    parsed: dict[str, list[int]] = {}  # a trace repeats few groups: each text is read and checked once
    for position, (group_text, deps_text) in enumerate(zip(frame["group"].tolist(), frame["deps"].tolist())):
        group = parsed.get(group_text)
        if group is None:
            try:
                group = parse_ints(group_text)
            except ValueError:
                raise _fail(frame, position, source, "group",
                            f"must list GPU indices, got {format_value(group_text)}") from None
            if any(rank < 0 for rank in group) or len(set(group)) != len(group):
                raise _fail(frame, position, source, "group",
                            f"must list distinct GPU indices >= 0, got {format_value(group_text)}")
            parsed[group_text] = group
        kind = kinds[position]
        if kind == "sendrecv" and len(group) != 2:
            raise _fail(frame, position, source, "group",
                        f"must be 'src dst' for a sendrecv row, got {format_value(group_text)}")
        if kind in SYNCHRONISING_KINDS and group and gpus[position] not in group:
            raise _fail(frame, position, source, "group", f"does not contain the row's own gpu {gpus[position]}")
        try:
            row_deps = parse_ints(deps_text)
        except ValueError:
            raise _fail(frame, position, source, "deps", f"must list op_ids, got {format_value(deps_text)}") from None
        groups.append(group)
        deps.append(row_deps)
    return groups, deps


def _check_keys(frame: pd.DataFrame, source: str) -> None:
    duplicated = frame.duplicated(["op_id", "gpu"]).to_numpy()
    if duplicated.any():
        position = int(np.flatnonzero(duplicated)[0])
        raise _fail(frame, position, source, "op_id", "repeats an op_id already used on the same gpu")
    multi = frame[frame.duplicated("op_id", keep=False)]
    if multi.empty:
        return
    for kind, fields in SHAPE_FIELDS.items():
        rows = multi[multi["kind"] == kind]
        if rows.empty:
            continue
        first = rows.drop_duplicates("op_id").set_index("op_id")
        for field in ("kind", *fields):
            expected = first[field].reindex(rows["op_id"]).to_numpy()
            actual = rows[field].to_numpy()
            differs = ~((expected == actual) | (pd.isna(expected) & pd.isna(actual)))
            if differs.any():
                position = int(rows.index[np.flatnonzero(differs)[0]])
                raise _fail(frame, position, source, field, "differs from the other rows of the same op_id")
    kinds_per_op = multi.groupby("op_id")["kind"].nunique()
    if (kinds_per_op > 1).any():
        op_id = kinds_per_op[kinds_per_op > 1].index[0]
        position = int(multi.index[multi["op_id"] == op_id][1])
        raise _fail(frame, position, source, "kind", "differs from the other rows of the same op_id")


@dataclass
class DependencyGraph:
    """The DAG of a trace table: dependencies, stream order and collective synchronisation.

    Attributes
    ----------
    node_of
        Node index of every row; all rows of a collective or send/receive share one node.
    rows_of
        Row positions of every node.
    predecessors
        Nodes that must finish before each node starts.
    """

    node_of: list[int]
    rows_of: list[list[int]]
    predecessors: list[set[int]]

    def successors(self) -> list[list[int]]:
        """The nodes that wait for each node."""
        successors: list[list[int]] = [[] for _ in self.rows_of]
        for node, preds in enumerate(self.predecessors):
            for pred in preds:
                successors[pred].append(node)
        return successors

    def topological_order(self) -> list[int] | None:
        """Nodes in an order that respects every edge (Kahn's algorithm), or None if there is a cycle."""
        successors = self.successors()
        waiting = [len(preds) for preds in self.predecessors]
        ready = [node for node, count in enumerate(waiting) if count == 0]
        order: list[int] = []
        while ready:
            node = ready.pop()
            order.append(node)
            for successor in successors[node]:
                waiting[successor] -= 1
                if waiting[successor] == 0:
                    ready.append(successor)
        return order if len(order) == len(self.rows_of) else None


def row_positions(frame: pd.DataFrame) -> dict[tuple[int, int], int]:
    """The position of every row of a validated table by its ``(op_id, gpu)``."""
    return {(o, g): p for p, (o, g) in enumerate(zip(frame["op_id"].tolist(), frame["gpu"].tolist()))}


def stream_predecessors(frame: pd.DataFrame) -> dict[int, int]:
    """The position of the row before each row on its ``(gpu, stream)``, for rows that have one."""
    previous: dict[int, int] = {}
    last: dict[tuple[int, str], int] = {}
    for position, lane in enumerate(zip(frame["gpu"].tolist(), frame["stream"].tolist())):
        if lane in last:
            previous[position] = last[lane]
        last[lane] = position
    return previous


def dependency_graph(frame: pd.DataFrame, deps: list[list[int]]) -> DependencyGraph:
    """The :class:`DependencyGraph` of a table whose dependencies all exist."""
    op_ids = frame["op_id"].tolist()
    gpus = frame["gpu"].tolist()
    kinds = frame["kind"].tolist()
    node_of: list[int] = []
    rows_of: list[list[int]] = []
    sync_nodes: dict[int, int] = {}
    for position, (op_id, kind) in enumerate(zip(op_ids, kinds)):
        if kind in SYNCHRONISING_KINDS:
            node = sync_nodes.get(op_id)
            if node is None:
                node = sync_nodes[op_id] = len(rows_of)
                rows_of.append([])
        else:
            node = len(rows_of)
            rows_of.append([])
        rows_of[node].append(position)
        node_of.append(node)
    position_of = row_positions(frame)
    predecessors: list[set[int]] = [set() for _ in rows_of]
    last_on_stream: dict[tuple[int, str], int] = {}
    for position, (gpu, stream) in enumerate(zip(gpus, frame["stream"].tolist())):
        here = node_of[position]
        previous = last_on_stream.get((gpu, stream))
        if previous is not None and previous != here:
            predecessors[here].add(previous)
        last_on_stream[(gpu, stream)] = here
        for dep in deps[position]:
            target = node_of[position_of[(dep, gpu)]]
            if target != here:
                predecessors[here].add(target)
    return DependencyGraph(node_of, rows_of, predecessors)


def _check_graph(frame: pd.DataFrame, source: str, deps: list[list[int]]) -> None:
    keys = set(zip(frame["op_id"].tolist(), frame["gpu"].tolist()))
    op_ids = frame["op_id"].tolist()
    gpus = frame["gpu"].tolist()
    for position, row_deps in enumerate(deps):
        gpu = gpus[position]
        for dep in row_deps:
            if (dep, gpu) not in keys:
                raise _fail(frame, position, source, "deps", f"names op_id {dep}, which has no row on gpu {gpu}")
            if dep == op_ids[position]:
                raise _fail(frame, position, source, "deps", "names the row's own op_id")
    graph = dependency_graph(frame, deps)
    if graph.topological_order() is not None:
        return
    digraph = nx.DiGraph((pred, node) for node, preds in enumerate(graph.predecessors) for pred in preds)
    members = [edge[0] for edge in nx.find_cycle(digraph)]
    position = min(graph.rows_of[member][0] for member in members)
    path = " -> ".join(str(op_ids[graph.rows_of[member][0]]) for member in [*members, members[0]])
    raise _fail(frame, position, source, "deps",
                f"is part of a dependency cycle (op_ids {path}, counting stream order and collectives)")


def parse_deps(frame: pd.DataFrame) -> list[list[int]]:
    """The ``deps`` lists of a validated table."""
    return [parse_ints(text) for text in frame["deps"]]


def validate(frame: pd.DataFrame, source: str = "trace") -> pd.DataFrame:
    """Normalise and check a trace table; return the normalised table.

    Parameters
    ----------
    frame
        One row per op per GPU (see the module documentation for the columns).
    source
        Where the table came from (a file name), used in error messages.

    Raises
    ------
    TraceError
        The first problem found, naming the source, the row, and the field.
    """
    normalized = normalize(frame, source)
    _check_kind_fields(normalized, source)
    _, deps = _parse_lists(normalized, source)
    _check_keys(normalized, source)
    _check_graph(normalized, source, deps)
    return normalized
