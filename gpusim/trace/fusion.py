"""Overlapping a trace's GEMMs with the collectives that reduce their outputs, or that gather their
inputs (T3, or decomposition).

:func:`overlap_gemm_collectives` rewrites a trace so that every tensor-parallel GEMM whose output a
reduce-scatter or an all-reduce sums becomes one ``gemm_collective`` row: T3's fused GEMM and
reduce-scatter (dissertation chapter 8), or the software rival that cuts the GEMM into a kernel per
rank beside a ring (``decomposed``, ``decomposed_dma``).  An all-reduce becomes the overlapped
reduce-scatter followed by an all-gather, as T3 does it.  The rewritten trace replays like any
other, so the overlap meets the rest of the iteration (other streams, the layer's other kernels)
inside one simulation, rather than having its sub-layer times added to a layer simulated without it.

Which GEMM feeds a collective is found from the trace itself, on each GPU the collective has a row:

- a collective that names dependencies is fed by the latest GEMM among them;
- one without is fed by the GEMM found walking back over the GEMMs just before it on its stream
  (a backward pass's weight gradient may sit between the activation gradient and its all-reduce);

and that GEMM's output (``m * n * batch`` of its dtype) must be the collective's ``bytes``.  A
collective of several GEMMs accumulated into one buffer (separate Q, K and V projections) is
overlapped with the last of them only.

A collective that ran on another stream than its GEMM (Megatron-LM's asynchronous backward
all-reduces) did not hold up the GEMM's stream, and every row that needed it named it in its
dependencies.  Its overlapped row keeps that: it is ``async_collective``, so its stream moves on
once the GEMM has ended while the collective's tail finishes, and the rows that depended on the
collective wait for the whole row.

:func:`overlap_gather_gemms` does the consumer side: a sequence-parallel layer's all-gather of the
activations and the column-parallel GEMM right after it on its stream, whose A is the gathered tensor,
become one ``collective_gemm`` row: the GEMM run a chunk at a time as the ring delivers the chunks, as
Transformer Engine's overlap does, or one GEMM kernel whose workgroups T3's tracker triggers as their
rows arrive (the extension the dissertation sketches in section 8.6.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from gpusim.checks import as_int, one_of
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import ConfigError, TraceError
from gpusim.trace.schema import (
    GATHER_FUNCTIONS,
    OVERLAP_FUNCTIONS,
    SHAPE_FIELDS,
    decomposition_problem,
    format_ints,
    parse_deps,
    parse_ints,
    row_positions,
    stream_predecessors,
)
from gpusim.trace.trace import Trace

OVERLAPPED_COLLECTIVES = ("reducescatter", "allreduce")
"""Collectives of a GEMM's output that :func:`overlap_gemm_collectives` overlaps with it."""
GEMM_FIELDS = SHAPE_FIELDS["gemm"]
REPORT_COLUMNS = ["collective_op_id", "name", "collective", "function", "gemm_op_id", "overlapped_op_id", "status",
                  "reason"]


@dataclass
class _Pair:
    """A collective (its row positions) and the GEMM row that feeds it on each of those GPUs."""

    collective: list[int]
    gemm: dict[int, int]
    """GPU -> position of the feeding GEMM row."""


def _output_bytes(row: pd.Series) -> int:
    return int(row["m"]) * int(row["n"]) * int(row["batch"]) * DTYPE_BYTES[row["dtype"]]


class _Finder:
    """Finds the GEMM row feeding each collective row of a validated table."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        self.kinds = frame["kind"].tolist()
        self.deps = parse_deps(frame)
        self.position_of = row_positions(frame)
        self.previous = stream_predecessors(frame)

    def _feeds(self, gemm: int, collective: int) -> bool:
        rows = self.frame.iloc
        return (self.kinds[gemm] == "gemm" and rows[gemm]["dtype"] == rows[collective]["dtype"]
                and _output_bytes(rows[gemm]) == int(rows[collective]["bytes"]))

    def feeding_gemm(self, position: int) -> int | None:
        """The position of the GEMM row whose output the collective row at ``position`` reduces, or None."""
        gpu = int(self.frame["gpu"].iat[position])
        named = sorted(self.position_of[(dep, gpu)] for dep in self.deps[position])
        if named:
            gemms = [p for p in named if self.kinds[p] == "gemm"]
            return gemms[-1] if gemms and self._feeds(gemms[-1], position) else None
        candidate = self.previous.get(position)
        while candidate is not None and self.kinds[candidate] == "gemm":
            if self._feeds(candidate, position):
                return candidate
            candidate = self.previous.get(candidate)
        return None


def _pairs(frame: pd.DataFrame, function: str, splits: int, report: list[dict]) -> list[_Pair]:
    """Every collective that ``function`` can overlap with its GEMM; the others are reported as skipped."""
    finder = _Finder(frame)
    candidates = frame[(frame["kind"] == "collective") & frame["collective"].isin(OVERLAPPED_COLLECTIVES)]
    used: set[int] = set()
    pairs = []
    for op_id, rows in candidates.groupby("op_id", sort=False):
        positions = [int(p) for p in rows.index]
        first = frame.loc[positions[0]]
        entry = {"collective_op_id": int(op_id), "name": first["name"], "collective": first["collective"],
                 "function": function}

        def skip(reason: str, entry=entry) -> None:
            report.append({**entry, "gemm_op_id": None, "status": "skipped", "reason": reason})

        if first["algorithm"] == "hierarchical":
            skip("a hierarchical collective spans nodes; T3 overlaps a ring or direct one")
            continue
        gemms = {int(frame.at[p, "gpu"]): finder.feeding_gemm(p) for p in positions}
        if None in gemms.values():
            skip("no GEMM whose output it reduces (a dependency, or the GEMMs just before it on its stream)")
            continue
        shapes = frame.loc[list(gemms.values()), list(GEMM_FIELDS)].drop_duplicates()
        if len(shapes) > 1:
            skip("its GEMMs differ from GPU to GPU")
            continue
        if used & set(gemms.values()):
            skip("its GEMM already feeds another collective")
            continue
        gemm = frame.loc[next(iter(gemms.values()))]
        ranks = len(parse_ints(first["group"]))  # 0: every GPU of the system, known when it is replayed
        problem = None if function == "t3" else decomposition_problem(int(gemm["m"]), int(gemm["batch"]), ranks, splits)
        if problem:
            field, message = problem
            skip(f"{function}: the GEMM's {field} {message}, got {gemm[field]}")
            continue
        late = [dep for p in positions for dep in finder.deps[p]
                if finder.position_of[(dep, int(frame.at[p, "gpu"]))] > gemms[int(frame.at[p, "gpu"])]]
        if late:
            skip(f"it waits for op {late[0]}, which comes after its GEMM")
            continue
        used.update(gemms.values())
        pairs.append(_Pair(positions, gemms))
        report.append({**entry, "gemm_op_id": int(gemm["op_id"]), "status": "overlapped", "reason": ""})
    return pairs


def _overlapped_row(frame: pd.DataFrame, pair: _Pair, gpu: int, op_id: int, function: str,
                    channels: int | None, splits: int) -> dict:
    """The ``gemm_collective`` row that takes the place of ``pair``'s GEMM row on ``gpu``."""
    gemm = frame.loc[pair.gemm[gpu]]
    collective = frame.loc[next(p for p in pair.collective if int(frame.at[p, "gpu"]) == gpu)]
    extra = [d for d in parse_ints(collective["deps"]) if d != gemm["op_id"]]
    names = [name for name in (gemm["name"], collective["name"]) if name]
    return {
        **gemm.to_dict(), "op_id": op_id, "kind": "gemm_collective", "collective": "reducescatter",
        "group": collective["group"], "algorithm": collective["algorithm"], "function": function, "bytes": pd.NA,
        "channels": pd.NA if channels is None else channels, "splits": pd.NA if splits == 1 else splits,
        "async_collective": collective["stream"] != gemm["stream"],
        "deps": format_ints(dict.fromkeys([*parse_ints(gemm["deps"]), *extra])), "name": "+".join(names),
        "measured_s": float("nan"), "kernel_class": "",
    }  # fmt: skip


def overlap_gemm_collectives(trace: Trace, function: str = "t3", channels: int | None = None,
                             splits: int = 1) -> Trace:
    """``trace`` with each GEMM and the reduce-scatter or all-reduce of its output overlapped.

    Parameters
    ----------
    trace
        Any trace (generated, imported or written by hand).
    function
        How they overlap: ``"t3"`` (T3's fused GEMM and reduce-scatter; replay it with
        ``memory_policy="t3-mca"`` for T3-MCA), ``"decomposed"`` (the GEMM cut along ``m`` into a
        kernel per rank beside a CU-driven ring reduce-scatter) or ``"decomposed_dma"`` (the same
        with the DMA engines driving the ring).  T3 and ``decomposed_dma`` reduce with near-memory
        updates, so the replaying GPU needs ``gpu.nmc.enabled``.
    channels
        CUs of the ``decomposed`` ring (default: the node's ``collectives.cus``, fewer for small
        chunks; the GEMM kernels get the others).  Only for ``"decomposed"``.
    splits
        Kernels per rank's chunk of a decomposition (default 1, Wang et al.'s scheme); the ring sends a
        chunk's rows as the kernel writing them finishes.  Not for ``"t3"``.

    Returns
    -------
    Trace
        The rewritten trace (new op_ids for the ``gemm_collective`` rows, every dependency on the GEMM
        or on a replaced reduce-scatter pointing at them).  Its ``metadata["overlap"]`` holds the
        function and a report, one entry per reduce-scatter or all-reduce: ``status`` ``overlapped``
        or ``skipped`` with the ``reason`` (:func:`overlap_report` makes it a table).  A collective
        the chosen function cannot run (a decomposition of a batched GEMM, or of one whose ``m`` does
        not split over the group) is skipped, not an error.

    Raises
    ------
    gpusim.errors.TraceError
        ``trace`` is not a :class:`Trace`.
    gpusim.errors.ConfigError
        An unknown ``function``, or ``channels`` or ``splits`` that is not a positive integer or is
        given for a function that has none.
    """
    _check_trace("overlap_gemm_collectives()", trace)
    one_of("function", function, OVERLAP_FUNCTIONS, "overlap_gemm_collectives()")
    _check_options("overlap_gemm_collectives()", function,
                   [("channels", channels, None, ("decomposed",), "the CUs of its ring"),
                    ("splits", splits, 1, ("decomposed", "decomposed_dma"), "the kernels of each chunk")])
    report: list[dict] = []
    pairs = _pairs(trace.frame, function, splits, report)

    def replace_pair(frame: pd.DataFrame, pair: _Pair, op_id: int, rows: list[dict], remap: dict[tuple[int, int], int],
                     dropped: set[int]) -> None:
        for gpu, position in pair.gemm.items():
            rows[position] = _overlapped_row(frame, pair, gpu, op_id, function, channels, splits)
            remap[(gpu, int(frame.at[position, "op_id"]))] = op_id
        for position in pair.collective:
            gpu = int(frame.at[position, "gpu"])
            if frame.at[position, "collective"] == "allreduce":  # the reduce-scatter is overlapped; gather the sums
                rows[position] = {**rows[position], "collective": "allgather", "deps": str(op_id),
                                  "name": _gather_name(rows[position]["name"]),
                                  "measured_s": float("nan")}  # the all-reduce's measured time is not the gather's
            else:
                dropped.add(position)
                remap[(gpu, int(frame.at[position, "op_id"]))] = op_id

    return _rewrite(trace, "overlap", function, pairs, report, replace_pair, "overlapped")


def _check_trace(caller: str, trace: object) -> None:
    """Raise :class:`TraceError` unless ``trace`` is a :class:`Trace` (not a path or a table)."""
    if not isinstance(trace, Trace):
        raise TraceError(f"{caller}: trace must be a gpusim.trace.Trace (a file's: gpusim.trace.read(path); a "
                         f"table's: gpusim.trace.Trace(frame)), got {type(trace).__name__}")


def _check_options(caller: str, function: str, options: list[tuple[str, object, object, tuple[str, ...], str]]) -> None:
    """Each option ``(name, value, default, functions, what)`` left at its default, or a positive whole
    number given for one of the ``functions`` it applies to; a :class:`ConfigError` naming it otherwise."""
    for name, value, default, functions, what in options:
        if value == default:
            continue
        if (as_int(value) or 0) <= 0:
            raise ConfigError(f"{caller}: '{name}' must be a positive whole number, got {value!r}")
        if function not in functions:
            raise ConfigError(f"{caller}: '{name}' ({what}) applies to function "
                              f"{' or '.join(repr(f) for f in functions)} only, not to {function!r}")


def _rewrite(trace: Trace, key: str, function: str, pairs: list[_Pair], report: list[dict],
             replace_pair: Callable[..., None], label: str) -> Trace:
    """``trace`` with each of ``pairs`` replaced by one row of a new op_id.

    ``replace_pair(frame, pair, op_id, rows, remap, dropped)`` puts the new rows into ``rows`` (the
    table's records), adds the positions to drop to ``dropped`` and maps every replaced
    ``(gpu, op_id)`` to ``op_id`` in ``remap``; every dependency on a replaced op_id then points at
    its replacement.  The report (``report``'s overlapped entries gain ``overlapped_op_id``) goes to
    ``metadata[key]`` with the function, and ``label`` into the trace's source."""
    frame = trace.frame
    metadata = {**trace.metadata, key: {"function": function, "report": report}}
    if not pairs:
        return Trace(frame, trace.source, metadata)
    rows = frame.to_dict("records")
    remap: dict[tuple[int, int], int] = {}
    dropped: set[int] = set()
    op_id = int(frame["op_id"].max()) + 1
    for pair, entry in zip(pairs, [entry for entry in report if entry["status"] == "overlapped"]):
        entry["overlapped_op_id"] = op_id
        replace_pair(frame, pair, op_id, rows, remap, dropped)
        op_id += 1
    out = [row for position, row in enumerate(rows) if position not in dropped]
    for row in out:
        deps = [remap.get((int(row["gpu"]), dep), dep) for dep in parse_ints(row["deps"])]
        row["deps"] = format_ints(dep for dep in dict.fromkeys(deps) if dep != row["op_id"])
    return Trace(pd.DataFrame(out, columns=frame.columns), f"{trace.source} ({label}: {function})", metadata)


def _gather_name(name: str) -> str:
    """The name of the all-gather that takes an all-reduce's place: ``allreduce`` in it becomes
    ``allgather`` (``L0.attn_allreduce`` -> ``L0.attn_allgather``), or ``.allgather`` is added."""
    if not name:
        return name
    return name.replace("allreduce", "allgather") if "allreduce" in name else f"{name}.allgather"


def _gather_pairs(frame: pd.DataFrame, function: str, report: list[dict]) -> list[_Pair]:
    """Every all-gather whose gathered tensor the next row on its stream, a GEMM, takes as its A; the
    others are reported as skipped."""
    finder = _Finder(frame)
    following = {before: after for after, before in finder.previous.items()}
    candidates = frame[(frame["kind"] == "collective") & (frame["collective"] == "allgather")]
    pairs = []
    for op_id, rows in candidates.groupby("op_id", sort=False):
        positions = [int(p) for p in rows.index]
        first = frame.loc[positions[0]]
        entry = {"collective_op_id": int(op_id), "name": first["name"], "collective": "allgather", "function": function}

        def skip(reason: str, entry=entry) -> None:
            report.append({**entry, "gemm_op_id": None, "status": "skipped", "reason": reason})

        if first["algorithm"] not in ("ring", "auto"):
            skip(f"a {first['algorithm']} all-gather; the decomposition runs a ring")
            continue
        gemms = {int(frame.at[p, "gpu"]): following.get(p) for p in positions}
        if any(g is None or finder.kinds[g] != "gemm" for g in gemms.values()):
            skip("the next op on its stream is not a GEMM")
            continue
        shapes = frame.loc[list(gemms.values()), list(GEMM_FIELDS)].drop_duplicates()
        if len(shapes) > 1:
            skip("its GEMMs differ from GPU to GPU")
            continue
        gemm = frame.loc[next(iter(gemms.values()))]
        a_bytes = int(gemm["m"]) * int(gemm["k"]) * int(gemm["batch"]) * DTYPE_BYTES[gemm["dtype"]]
        if bool(gemm["trans_a"]) or gemm["dtype"] != first["dtype"] or a_bytes != int(first["bytes"]):
            skip("the GEMM after it does not take the gathered tensor as its untransposed A")
            continue
        problem = decomposition_problem(int(gemm["m"]), int(gemm["batch"]), len(parse_ints(first["group"])))
        if problem:
            field, message = problem
            skip(f"{function}: the GEMM's {field} {message}, got {gemm[field]}")
            continue
        pairs.append(_Pair(positions, gemms))
        report.append({**entry, "gemm_op_id": int(gemm["op_id"]), "status": "overlapped", "reason": ""})
    return pairs


def overlap_gather_gemms(trace: Trace, function: str = "decomposed_dma", channels: int | None = None) -> Trace:
    """``trace`` with each all-gather and the GEMM that consumes the gathered tensor overlapped.

    Parameters
    ----------
    trace
        Any trace; an all-gather is overlapped when the next row on its stream (on every GPU it has a
        row) is a GEMM whose untransposed A is the gathered tensor (``m * k * batch`` of its dtype
        equal to the all-gather's ``bytes``) and whose ``m`` splits over the group.
    function
        ``"decomposed_dma"`` (the DMA engines forward the chunks, as Transformer Engine's copy-engine
        ring exchange; the GEMM keeps every CU), ``"decomposed"`` (a ring kernel on ``channels``
        CUs of its own), each with a GEMM kernel per chunk, or ``"t3"`` (the DMA ring, and T3's
        tracker triggering one GEMM kernel's workgroups as their rows arrive:
        :class:`gpusim.ops.AllGatherGemm`).
    channels
        CUs of the ``decomposed`` ring (default: the node's ``collectives.cus``, fewer for small
        chunks).  Only for ``"decomposed"``.

    Returns
    -------
    Trace
        The rewritten trace: a ``collective_gemm`` row (new op_id) in place of each pair's GEMM, the
        all-gather's rows gone, every dependency on either pointing at the new row.  Its
        ``metadata["gather_overlap"]`` holds the function and a report, one entry per all-gather
        (:func:`overlap_report` lists it with the reduce-scatters').

    Raises
    ------
    gpusim.errors.TraceError
        ``trace`` is not a :class:`Trace`.
    gpusim.errors.ConfigError
        An unknown ``function``, or ``channels`` that is not a positive integer or is given for
        ``"decomposed_dma"``.
    """
    _check_trace("overlap_gather_gemms()", trace)
    one_of("function", function, GATHER_FUNCTIONS, "overlap_gather_gemms()")
    _check_options("overlap_gather_gemms()", function,
                   [("channels", channels, None, ("decomposed",), "the CUs of its ring")])
    report: list[dict] = []
    pairs = _gather_pairs(trace.frame, function, report)

    def replace_pair(frame: pd.DataFrame, pair: _Pair, op_id: int, rows: list[dict], remap: dict[tuple[int, int], int],
                     dropped: set[int]) -> None:
        for position in pair.collective:
            gpu = int(frame.at[position, "gpu"])
            gather, gemm = frame.loc[position], frame.loc[pair.gemm[gpu]]
            deps = [d for d in (*parse_ints(gather["deps"]), *parse_ints(gemm["deps"])) if d != gather["op_id"]]
            names = [name for name in (gather["name"], gemm["name"]) if name]
            rows[pair.gemm[gpu]] = {
                **gemm.to_dict(), "op_id": op_id, "kind": "collective_gemm", "collective": "allgather",
                "group": gather["group"], "algorithm": gather["algorithm"], "function": function, "bytes": pd.NA,
                "channels": pd.NA if channels is None else channels, "deps": format_ints(dict.fromkeys(deps)),
                "name": "+".join(names), "measured_s": float("nan"), "kernel_class": "",
            }  # fmt: skip
            dropped.add(position)
            remap[(gpu, int(gather["op_id"]))] = remap[(gpu, int(gemm["op_id"]))] = op_id

    return _rewrite(trace, "gather_overlap", function, pairs, report, replace_pair, "gathers overlapped")


def overlap_report(trace: Trace) -> pd.DataFrame:
    """The reports of :func:`overlap_gemm_collectives` and :func:`overlap_gather_gemms` on ``trace``
    as one table (columns :data:`REPORT_COLUMNS`); empty for a trace neither rewrote.

    Raises
    ------
    gpusim.errors.TraceError
        ``trace`` is not a :class:`Trace`.
    """
    _check_trace("overlap_report()", trace)
    entries = [entry for key in ("overlap", "gather_overlap") for entry in (trace.metadata.get(key) or {}).get("report", [])]
    table = pd.DataFrame(entries, columns=REPORT_COLUMNS)
    return table.astype({"gemm_op_id": "Int64", "overlapped_op_id": "Int64"})  # blank where skipped

