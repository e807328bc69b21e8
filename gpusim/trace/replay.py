"""DAG replay of a trace: every row becomes an op execution on its GPU and stream.

A row starts when the rows it depends on (same GPU) and the row before it on the same stream have
finished; rows on different streams of a GPU overlap and share the GPU (e.g. a gradient all-reduce
on a communication stream overlapping the backward GEMMs on the compute stream).  Collectives and
send/receives synchronise their ranks inside the simulation.  A row with ``issue_s`` (an imported
trace's measured launch) has its kernel issued by the host then; the others by the host thread's
model (:mod:`gpusim.sched.executor`).

In ``full`` mode every GPU with rows is simulated.  In ``symmetric`` mode only GPU 0's rows are
simulated and its neighbours' traffic is mirrored into it; the trace must then describe the same
work on every GPU (or only GPU 0's).  Repeated identical layers are simulated once and reused
(:mod:`gpusim.trace.caching`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from gpusim.checks import as_int, as_real, is_flag
from gpusim.engine.simulation import Recorder, Simulation, Span
from gpusim.errors import TraceError
from gpusim.hw.system import Machine
from gpusim.results import Result, build_result
from gpusim.sched.executor import OpRecord, Stream
from gpusim.simulate import (
    chunks_leave_ranks_empty,
    close_progress_bar,
    finish,
    one_symmetric_node,
    prepare,
    progress_bar,
    resolve_mode,
    run_stats,
    warn_if_symmetric_approximates,
)
from gpusim.system import System, load_system
from gpusim.trace.caching import (
    CachePlan,
    HostLaunch,
    full_plan,
    plan_layer_cache,
    reconstruct,
    remap_dependencies,
    replica_windows,
    straddled_runs,
)
from gpusim.trace.lowering import build_ops
from gpusim.trace.schema import (
    GROUP_KINDS,
    SHAPE_FIELDS,
    SYNCHRONISING_KINDS,
    RowLocation,
    parse_deps,
    parse_ints,
)

if TYPE_CHECKING:
    from gpusim.trace.trace import Trace

EXTRA_COLUMNS = ("phase", "layer", "step", "kernel_class")
"""Trace columns copied into ``Result.ops`` beside the simulated timing."""


def _check_against_system(trace: Trace, system: System, mode: str) -> None:
    frame = trace.frame
    gpus = frame["gpu"].to_numpy()
    bad = gpus >= system.num_gpus
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        if trace.metadata.get("generator"):  # a generated model: its parallelism, not a row, is too large
            raise TraceError(f"{trace.source} uses {int(gpus.max()) + 1} GPUs (its tp x pp x dp), but {system.name} "
                             f"has {system.num_gpus}")
        raise TraceError(
            f"{RowLocation(trace.source, position, frame['op_id'].iloc[position], int(gpus[position]))}: field 'gpu' "
            f"names GPU {gpus[position]}, but {system.name} has GPUs 0..{system.num_gpus - 1}"
        )
    present: dict[int, set[int]] = {}
    for op_id, gpu in zip(frame["op_id"].tolist(), frame["gpu"].tolist()):
        present.setdefault(op_id, set()).add(gpu)
    sync = frame[frame["kind"].isin(SYNCHRONISING_KINDS)].drop_duplicates("op_id")
    for position, row in zip(sync.index, sync.itertuples(index=False)):
        group = parse_ints(row.group) or list(range(system.num_gpus))
        where = RowLocation(trace.source, int(position), row.op_id, row.gpu)
        if max(group) >= system.num_gpus:
            raise TraceError(f"{where}: field 'group' names GPU {max(group)}, but {system.name} has "
                             f"GPUs 0..{system.num_gpus - 1}")
        missing = sorted(set(group) - present[row.op_id])
        if mode == "full" and missing:
            remedy = ("give the sender's and the receiver's rows (symmetric mode cannot replay a send/receive)"
                      if row.kind == "sendrecv" else
                      "give every rank's rows, or replay in symmetric mode (mode='symmetric') if all ranks do the "
                      "same work")
            raise TraceError(f"{where}: the {row.kind} spans GPUs {group} but GPUs {missing} have no row for it; "
                             f"{remedy}")


def _check_symmetric(trace: Trace) -> None:
    frame = trace.frame
    if (frame["kind"] == "sendrecv").any():
        position = int(np.flatnonzero((frame["kind"] == "sendrecv").to_numpy())[0])
        raise TraceError(f"{RowLocation(trace.source, position, frame['op_id'].iloc[position])}: symmetric mode "
                         "cannot replay a send/receive (its two ranks do different work); use mode='full'")
    uneven = (frame["send_bytes"] != "").to_numpy()
    if uneven.any():
        position = int(np.flatnonzero(uneven)[0])
        raise TraceError(f"{RowLocation(trace.source, position, frame['op_id'].iloc[position])}: symmetric mode "
                         "cannot replay an uneven all-to-all (field 'send_bytes': its ranks do different work); "
                         "use mode='full'")
    fields = ["stream", "kind", *sorted({f for fs in SHAPE_FIELDS.values() for f in fs if f != "group"})]
    reference = frame[frame["gpu"] == 0][fields].reset_index(drop=True)
    for gpu in trace.gpus:
        if gpu == 0:
            continue
        rows = frame[frame["gpu"] == gpu]
        other = rows[fields].reset_index(drop=True)
        if len(other) != len(reference):
            raise TraceError(f"{trace.source}: symmetric mode needs every GPU to do the same work, but GPU {gpu} has "
                             f"{len(other)} rows and GPU 0 has {len(reference)}; use mode='full'")
        differs = ~((other == reference) | (other.isna() & reference.isna()))
        if differs.to_numpy().any():
            row_index, column = np.argwhere(differs.to_numpy())[0]
            position = int(rows.index[row_index])
            raise TraceError(f"{RowLocation(trace.source, position, rows['op_id'].iloc[row_index], gpu)}: field "
                             f"'{fields[column]}' differs from GPU 0's row at the same place; symmetric mode needs "
                             "every GPU to do the same work; use mode='full'")


def _spans_other_ranks(trace: Trace, num_gpus: int) -> bool:
    """Whether a collective (or a GEMM overlapped with one) of ``trace`` runs on GPUs besides 0 (a blank
    group: all ``num_gpus``)."""
    frame = trace.frame
    groups = frame.loc[frame["kind"].isin(GROUP_KINDS), "group"]
    return any((parse_ints(group) or list(range(num_gpus))) != [0] for group in groups)


def choose_mode(trace: Trace, system: System) -> str:
    """``"symmetric"`` when the trace and the system allow it (every GPU of the system in the trace and
    alike, a symmetric single-node topology, no send/receive) and it is exact for the trace's
    collectives, else ``"full"``.

    A trace that leaves GPUs out (a lone group, such as a collective over GPUs 0, 2, 4 and 6 of a
    ring) would be mirrored as if every rotation of its groups ran too, charging its links the
    traffic of rotations that do not exist (docs/model.md), so it is replayed in full mode.  One
    rank's profile (GPU 0's rows alone, with collectives over other ranks, as a Kineto trace of rank
    0 is) is the exception: full mode has no rows for its peers, so on a symmetric single-node
    topology it is mirrored.

    A collective too small to give every rank a byte of its own (a 1-byte all-reduce on 8 GPUs) is
    replayed in full mode too: its ranks do different work.

    Symmetric mode is exact for ring collectives and, on a fully connected node, for direct ones;
    on a switch it is within 1.5% of full mode for direct collectives and all-to-all.  On a ring
    those route over several hops, where one GPU's mirrored traffic meets the other ranks' at other
    moments than theirs do: up to 4.4% slow at 16 MiB (docs/model.md), so such traces are replayed
    in full mode.
    """
    if not one_symmetric_node(system):
        return "full"
    if trace.gpus == [0] and _spans_other_ranks(trace, system.num_gpus):
        return "symmetric"
    if sorted(trace.gpus) != list(range(system.num_gpus)):
        return "full"
    try:
        _check_symmetric(trace)
    except TraceError:
        return "full"
    frame = trace.frame
    collectives = frame[frame["kind"].isin(GROUP_KINDS)]
    direct = (collectives["collective"] == "alltoall") | (collectives["algorithm"] == "direct")
    if direct.any() and not system.topology.mirrors_direct_traffic:
        return "full"
    ranks = [len(group.split()) if isinstance(group, str) and group.strip() else system.num_gpus  # blank: all
             for group in collectives["group"]]
    sizes = pd.to_numeric(collectives["bytes"], errors="coerce")
    if any(chunks_leave_ranks_empty(int(size), n) for size, n in zip(sizes, ranks) if not pd.isna(size)):
        return "full"
    return "symmetric"


def _kernel_spans(recorder: Recorder) -> dict[tuple[int, object], list[Span]]:
    """The kernel spans of a recorder by GPU and the ``op_id`` (op uid) of the op that launched them."""
    kernels: dict[tuple[int, object], list[Span]] = {}
    for span in recorder.spans:
        if span.category == "kernel":
            kernels.setdefault((span.gpu, span.args.get("op_id")), []).append(span)
    return kernels


def _with_op_id(span: Span, op_id: int, shift: float = 0.0) -> Span:
    """``span`` moved by ``shift`` ns, its ``op_id`` arg the trace's ``op_id``."""
    return Span(span.name, span.category, span.gpu, span.lane, span.start_ns + shift, span.end_ns + shift,
                {**span.args, "op_id": op_id})


def replay(
    trace: Trace,
    system: System | str,
    *,
    mode: str = "full",
    memory_policy: str | None = None,
    dispatch_policy: str | None = None,
    progress: bool = False,
    bin_s: float = 5e-6,
    cache_layers: bool = True,
    warmup_layers: int | None = None,
) -> Result:
    """Simulate ``trace`` on ``system`` as a DAG and return a :class:`gpusim.Result`.

    Parameters
    ----------
    trace
        The trace.
    system
        A :class:`gpusim.System` or a preset name.
    mode
        ``"full"`` (every GPU), ``"symmetric"`` (GPU 0 stands for all; see the module doc) or
        ``"auto"`` (symmetric where :func:`choose_mode` finds it exact for the trace, else full).
    memory_policy, dispatch_policy, progress, bin_s
        As in :func:`gpusim.run`.
    cache_layers
        Simulate runs of identical layers once (:mod:`gpusim.trace.caching`); a run whose left-out
        layers a row outside it ran beside is then simulated whole, in a second simulation
        (``stats["simulations"]``).
    warmup_layers
        Layers of each run simulated before the representative one (default: 1 when GPUs have
        several streams, else 0; see :func:`gpusim.trace.caching.default_warmup`).

    Returns
    -------
    Result
        ``ops`` has one row per trace row of the simulated GPUs, with the trace's ``op_id``,
        ``measured_s`` (blank where none), ``phase``, ``layer``, ``step``, ``kernel_class``,
        ``simulated`` (False for rows timed from a representative) and ``replica_of``.

    Raises
    ------
    TraceError
        The trace does not fit the system or the mode, or ``bin_s``, ``warmup_layers``, ``cache_layers``
        or ``progress`` is invalid.
    ConfigError
        ``mode`` is none of the three (as in :func:`gpusim.run`).
    """
    wall_start = time.perf_counter()
    seconds = as_real(bin_s)
    if seconds is None or seconds <= 0:
        raise TraceError(f"replay(): 'bin_s' must be a positive number of seconds, got {bin_s!r}")
    layers = as_int(warmup_layers)
    if warmup_layers is not None and (layers is None or layers < 0):
        raise TraceError(f"replay(): 'warmup_layers' must be a non-negative integer or None, got {warmup_layers!r}")
    for name, value in (("cache_layers", cache_layers), ("progress", progress)):
        if not is_flag(value):
            raise TraceError(f"replay(): {name!r} must be True or False, got {value!r}")
    if isinstance(system, str):
        system = load_system(system)
    mode = resolve_mode(mode, system, lambda machine: choose_mode(trace, machine))
    _check_against_system(trace, system, mode)
    if mode == "symmetric":
        _check_symmetric(trace)
    frame = trace.frame
    deps = parse_deps(frame)
    on_simulated_gpu = (frame["gpu"].to_numpy() == 0) if mode == "symmetric" else np.ones(len(frame), dtype=bool)
    plan: CachePlan = plan_layer_cache(frame, deps, warmup_layers) if cache_layers else full_plan(len(frame))
    earlier_events = 0
    for rounds in range(1, MAX_CACHE_ROUNDS + 1):
        record_of, simulated, sim, machine, released = _simulate(
            trace, deps, plan, on_simulated_gpu, system, mode, memory_policy, dispatch_policy, bin_s, progress,
            wall_start, rounds)
        if not plan.reduced:
            times = simulated
            break
        gaps = {rank: machine.gpu(rank).config.dependent_launch_ns for rank in {record.rank for record in record_of.values()}}
        times = reconstruct(frame, deps, plan, simulated, on_simulated_gpu, released,
                            _host_launches(frame, sim, record_of), gaps)
        straddled = straddled_runs(frame, plan, times)
        if not straddled or rounds == MAX_CACHE_ROUNDS:
            break
        earlier_events += sim.events_scheduled
        plan = plan_layer_cache(frame, deps, warmup_layers, straddled)
    result = _assemble(trace, plan, record_of, simulated, sim, machine, times, system, wall_start, rounds)
    if earlier_events:  # the stats count the events of every simulation, as their wall time does
        stats = result.stats
        stats["events"] += earlier_events
        stats["events_per_s"] = stats["events"] / stats["wall_s"]
    return result


MAX_CACHE_ROUNDS = 2
"""Simulations a layer-cached replay may take: a second one simulates whole the runs whose left-out
layers a row outside them ran beside (:func:`gpusim.trace.caching.straddled_runs`)."""


def _simulate(trace: Trace, deps: list[list[int]], plan: CachePlan, on_simulated_gpu: np.ndarray, system: System,
              mode: str, memory_policy: str | None, dispatch_policy: str | None, bin_s: float,
              progress: bool, wall_start: float, rounds: int):
    """Simulate the rows ``plan`` keeps (the replay's simulation number ``rounds``); return the
    records by row position, their simulated ``(start, end)``, the simulation, the machine and
    the stream release times (ns)."""
    frame = trace.frame
    run_rows = plan.simulate & on_simulated_gpu
    run_deps = remap_dependencies(frame, deps, plan) if plan.reduced else deps
    reduced = frame[run_rows]
    built = build_ops(reduced, trace.source)

    bar = None

    def advance() -> None:
        if bar is not None:
            bar.update()

    system, sim, machine, executor = prepare(system, mode, memory_policy, dispatch_policy, bin_s, advance)
    if mode == "symmetric":
        warn_if_symmetric_approximates(built.values(), system)
    if progress:
        again = ", again: runs that other rows ran beside simulated whole" if rounds > 1 else ""
        bar = progress_bar(int(run_rows.sum()), f"{trace.source} on {system.name}{again}", sim)
    try:
        done: dict[tuple[int, int], object] = {}
        last: dict[tuple[int, str], object] = {}
        streams: dict[str, Stream] = {}
        position_of: dict[tuple[int, int], int] = {}
        op_ids = frame["op_id"].tolist()
        gpus = frame["gpu"].tolist()
        stream_names = frame["stream"].tolist()
        issued_ns = (frame["issue_s"].to_numpy(dtype=float) * 1e9).tolist()
        asynchronous = frame["async_collective"].tolist()
        for position in np.flatnonzero(run_rows):
            op_id, gpu, stream_name = op_ids[position], gpus[position], stream_names[position]
            op = built[op_id]
            stream = streams.setdefault(stream_name, Stream(stream_name))
            after = [done[(dep, gpu)] for dep in run_deps[position]]
            previous = last.get((gpu, stream_name))
            if previous is not None:
                after.append(previous)
            issue_ns = issued_ns[position]
            released = sim.event() if asynchronous[position] else None  # the stream moves on after its GEMM
            event = executor.submit(op, gpu, stream, after, issue_ns=issue_ns if math.isfinite(issue_ns) else None,
                                    released=released)
            done[(op_id, gpu)] = event
            last[(gpu, stream_name)] = event if released is None else released
            position_of[(op.uid, gpu)] = int(position)
        finish(system, sim, machine, executor, len(position_of), wall_start)
    finally:
        if bar is not None:
            close_progress_bar(bar, sim)

    record_of = {position_of[(record.op.uid, record.rank)]: record for record in executor.records}
    simulated = {position: (record.start_ns, record.end_ns) for position, record in record_of.items()}
    released = {position: record.released_ns for position, record in record_of.items()
                if record.released_ns is not None}
    return record_of, simulated, sim, machine, released


def _host_launches(frame: pd.DataFrame, sim: Simulation, record_of: dict[int, OpRecord]) -> dict[int, HostLaunch]:
    """The host thread's launch calls (its ``call`` spans) of each simulated row whose kernels it
    issued, by row position; rows with a measured issue time are left out."""
    calls: dict[tuple[int, int], list[Span]] = {}
    for span in sim.recorder.spans:
        if span.category == "call":
            calls.setdefault((span.gpu, span.args["op_id"]), []).append(span)
    measured = np.isfinite(frame["issue_s"].to_numpy(dtype=float))
    launches = {}
    for position, record in record_of.items():
        spans = calls.get((record.rank, record.op.uid))
        if spans and not measured[position]:
            first = min(spans, key=lambda span: span.end_ns)
            launches[position] = HostLaunch(first.end_ns, first.end_ns - first.start_ns,
                                            sum(span.end_ns - span.start_ns for span in spans))
    return launches


def _assemble(
    trace: Trace,
    plan: CachePlan,
    record_of: dict[int, OpRecord],
    simulated: dict[int, tuple[float, float]],
    sim: Simulation,
    machine: Machine,
    times: dict[int, tuple[float, float]],
    system: System,
    wall_start: float,
    simulations: int,
) -> Result:
    """Build the Result from the row timings (simulated, or re-timed after layer caching) of the
    last of ``simulations`` simulations."""
    frame = trace.frame
    kernels = _kernel_spans(sim.recorder)
    recorder = Recorder(sim.recorder.bin_ns)
    recorder.dram = sim.recorder.dram
    recorder.links = sim.recorder.links
    recorder.l2 = sim.recorder.l2
    recorder.counters = sim.recorder.counters
    if not plan.reduced:  # the simulation's spans carry op uids: give them the trace's op_id
        trace_op_id = {record.op.uid: int(frame["op_id"].iat[position]) for position, record in record_of.items()}
        recorder.spans = [
            _with_op_id(span, trace_op_id[span.args["op_id"]]) if span.args.get("op_id") in trace_op_id else span
            for span in sim.recorder.spans
            if span.category != "op"
        ]
    records: list[OpRecord] = []
    rows = frame.to_dict("records")
    for position in sorted(times):
        row = rows[position]
        source = int(plan.representative[position])
        model = record_of[source]
        start, end = times[position]
        info = dict(model.info)
        info.update(
            measured_s=row["measured_s"],
            simulated=bool(plan.simulate[position]),
            replica_of=int(frame["op_id"].iat[source]),
            **{column: row[column] for column in EXTRA_COLUMNS},
        )
        records.append(OpRecord(model.op, int(row["gpu"]), row["stream"], start, end, info))
        name = row["name"] or model.op.label
        args = {"category": model.op.category, "op_id": int(row["op_id"]), "replica_of": info["replica_of"]}
        recorder.span(Span(name, "op", int(row["gpu"]), row["stream"], start, end, args))
        if plan.reduced:
            shift = end - simulated[source][1]  # its kernels end with it; a host wait it did not have comes first
            for span in kernels.get((model.rank, model.op.uid), []):
                recorder.span(_with_op_id(span, int(row["op_id"]), shift))
    stats = {
        **run_stats(sim, machine, wall_start),
        "trace_rows": len(records),
        "simulated_rows": int(sum(1 for position in times if plan.simulate[position])),
        "layer_runs": plan.runs,
        "simulations": simulations,
        "replica_windows": replica_windows(frame, plan, simulated) if plan.reduced else [],
    }
    result = build_result(records, recorder, system.config.model_dump(mode="json"), stats)
    ordered = sorted(times)
    result.ops["op_id"] = frame["op_id"].to_numpy()[ordered]
    names = frame["name"].to_numpy()[ordered]
    result.ops["name"] = np.where(names != "", names, result.ops["name"].to_numpy())
    result.ops["measured_s"] = pd.to_numeric(result.ops["measured_s"], errors="coerce")
    return result
