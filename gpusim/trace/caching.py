"""Layer caching: simulate repeated identical layers once and reuse their timings.

A *layer instance* is the set of rows with the same ``(phase, step, layer)`` (``layer >= 0``),
over all GPUs.  Two instances are *alike* when their rows match one for one: GPU, stream, kind,
shape, group, measured issue time, and dependencies — a dependency is described relative to the instance (a row of
the same instance, or of the instance ``d`` layers away at the same position), so layer 7's
dependency on layer 6 matches layer 8's on layer 7; a dependency on the row just before on the
same stream adds nothing to stream order and is ignored.  Within one ``(phase, step)``, consecutive
alike instances form a *run*.

For every run longer than ``warmup + 1`` instances only the first ``warmup`` instances and one
*representative* (the next one) are simulated (``warmup`` is 1 when a layer can overlap other
streams' work and 0 when every GPU has one stream, see :func:`default_warmup`); the rest of the run is dropped from the simulation.
A kept row that depended on a dropped row depends instead on the row at the same position of the
representative.  Afterwards :func:`reconstruct` recomputes the start and end of *every* row by list
scheduling over the full DAG (dependencies, stream order, collectives that wait for all their
ranks), where each row takes the simulated duration of its representative (itself if it was
simulated), counted from its first kernel's launch: the host thread that issues the kernels is
replayed too, so a left-out layer waits for the host where the host has fallen behind the GPU.
A collective's duration is counted from the arrival of its last rank.

The approximation: a dropped layer is assumed to run exactly as long as the representative, which
saw the interference of its own neighbours (e.g. a gradient all-reduce of the previous layer
overlapping its GEMMs).  Layers whose neighbourhood differs (a growing communication backlog,
different overlap partners) are timed with the representative's durations, and the DAG decides
how they line up.  DRAM, L2 and link traffic in the result cover the simulated rows only;
:func:`replica_windows` says where to find one layer's traffic for each run, from which
:func:`gpusim.energy.energy` prices the left-out layers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpusim.trace.schema import (
    SHAPE_FIELDS,
    SYNCHRONISING_KINDS,
    dependency_graph,
    row_positions,
    stream_predecessors,
)

SIGNATURE_FIELDS = ("gpu", "stream", "kind", *dict.fromkeys(f for fields in SHAPE_FIELDS.values() for f in fields),
                    "send_bytes", "issue_s")
"""Fields two rows must share to be alike: placement, every kind's shape fields
(:data:`gpusim.trace.schema.SHAPE_FIELDS`), an uneven all-to-all's own sends (which differ between
the rows of one op) and the measured host issue time, which the list scheduling of
:func:`reconstruct` does not replay (rows issued at different moments are simulated)."""


@dataclass
class StandIn:
    """A run of alike layer instances from which some were left out of the simulation.

    Attributes
    ----------
    run
        Index of the run in :attr:`CachePlan.runs`.
    representative
        Row positions of the simulated instance whose timing the left-out ones take.
    before
        Row positions of the instance simulated just before it (empty without warm-up).
    left_out
        Row positions of each left-out instance, in the run's order.
    kept
        Row positions of all the run's simulated instances.
    """

    run: int
    representative: list[int]
    before: list[int]
    left_out: list[list[int]]
    kept: list[int]


@dataclass
class CachePlan:
    """Which rows to simulate and whose timing every row takes.

    Attributes
    ----------
    simulate
        Per row position: simulate it.
    representative
        Per row position: the row whose simulated duration it takes (itself when simulated).
    runs
        One entry per run of alike layer instances: phase, step, layers, instances, simulated.
    stand_ins
        One entry per run with left-out instances.
    """

    simulate: np.ndarray
    representative: np.ndarray
    runs: list[dict] = field(default_factory=list)
    stand_ins: list[StandIn] = field(default_factory=list)

    @property
    def reduced(self) -> bool:
        """Whether any row is left out of the simulation."""
        return not bool(self.simulate.all())


def full_plan(rows: int) -> CachePlan:
    """A plan that simulates every row."""
    return CachePlan(np.ones(rows, dtype=bool), np.arange(rows))


def _instances(frame: pd.DataFrame) -> dict[tuple, list[int]]:
    layered = frame.index[frame["layer"].to_numpy() >= 0]
    keys = zip(frame.loc[layered, "phase"], frame.loc[layered, "step"], frame.loc[layered, "layer"])
    instances: dict[tuple, list[int]] = {}
    for position, key in zip(layered, keys):
        instances.setdefault((key[0], int(key[1]), int(key[2])), []).append(int(position))
    return instances


def _signatures(frame: pd.DataFrame, deps: list[list[int]], instances: dict[tuple, list[int]]) -> dict[tuple, tuple | None]:
    instance_of: dict[int, tuple] = {}
    index_in: dict[int, int] = {}
    for key, positions in instances.items():
        for index, position in enumerate(positions):
            instance_of[position] = key
            index_in[position] = index
    position_of = row_positions(frame)
    values = frame[list(SIGNATURE_FIELDS)].astype(str).to_numpy()
    gpus = frame["gpu"].tolist()
    kinds = frame["kind"].tolist()
    op_ids = frame["op_id"].tolist()
    rows_per_op = frame.groupby("op_id")["gpu"].size().to_dict()
    stream_predecessor = stream_predecessors(frame)
    asynchronous = frame["async_collective"].tolist()
    signatures: dict[tuple, tuple | None] = {}
    for key, positions in instances.items():
        parts = []
        members = set(positions)
        ok = True
        for position in positions:
            if kinds[position] in SYNCHRONISING_KINDS:
                peers = sum(1 for p in positions if op_ids[p] == op_ids[position])
                if peers != rows_per_op[op_ids[position]]:
                    ok = False  # a collective whose other ranks sit outside this instance
                    break
            described = []
            for dep in deps[position]:
                target = position_of[(dep, gpus[position])]
                if target == stream_predecessor.get(position) and not asynchronous[target]:
                    continue  # implied by stream order
                if target in members:
                    described.append(("in", index_in[target]))
                elif target in instance_of:
                    phase, step, layer = instance_of[target]
                    described.append(("layer", phase, step, layer - key[2], index_in[target]))
                else:
                    described.append(("op", dep))
            parts.append((tuple(values[position]), tuple(described)))
        signatures[key] = tuple(parts) if ok else None
    return signatures


def default_warmup(frame: pd.DataFrame) -> int:
    """Warm-up instances to simulate before a run's representative.

    One when some GPU has rows on several streams (a layer can then overlap its neighbour's work,
    e.g. the previous layer's gradient all-reduce, and the representative should see that);
    zero when every GPU has a single stream, since nothing then overlaps a layer.
    """
    streams_per_gpu = frame.groupby("gpu")["stream"].nunique()
    return int((streams_per_gpu > 1).any())


def plan_layer_cache(frame: pd.DataFrame, deps: list[list[int]], warmup: int | None = None,
                     whole: set[int] | None = None) -> CachePlan:
    """Decide which rows to simulate (see the module documentation).

    Parameters
    ----------
    frame
        A validated trace table.
    deps
        Its parsed ``deps`` lists.
    warmup
        Instances of a run simulated before its representative (default: :func:`default_warmup`).
    whole
        Indices of the runs to simulate whole (:func:`straddled_runs`).
    """
    whole = whole or set()
    plan = full_plan(len(frame))
    if warmup is None:
        warmup = default_warmup(frame)
    instances = _instances(frame)
    if not instances:
        return plan
    signatures = _signatures(frame, deps, instances)
    sequences: dict[tuple, list[tuple]] = {}
    for key in instances:
        sequences.setdefault(key[:2], []).append(key)
    for (phase, step), keys in sequences.items():
        start = 0
        while start < len(keys):
            end = start + 1
            signature = signatures[keys[start]]
            while signature is not None and end < len(keys) and signatures[keys[end]] == signature:
                end += 1
            run = keys[start:end]
            simulated = len(run) if len(plan.runs) in whole else min(len(run), warmup + 1)
            if len(run) > simulated:
                representative = instances[run[simulated - 1]]
                for key in run[simulated:]:
                    positions = instances[key]
                    plan.simulate[positions] = False
                    plan.representative[positions] = representative
                before = instances[run[simulated - 2]] if simulated > 1 else []
                plan.stand_ins.append(StandIn(len(plan.runs), representative, before,
                                              [instances[key] for key in run[simulated:]],
                                              [p for key in run[:simulated] for p in instances[key]]))
            plan.runs.append({"phase": phase, "step": step, "first_layer": run[0][2], "last_layer": run[-1][2],
                              "instances": len(run), "simulated": simulated})
            start = end
    return plan


def remap_dependencies(frame: pd.DataFrame, deps: list[list[int]], plan: CachePlan) -> list[list[int]]:
    """Dependencies of the simulated rows, with dropped targets replaced by their representatives."""
    op_ids = frame["op_id"].tolist()
    gpus = frame["gpu"].tolist()
    position_of = row_positions(frame)
    remapped = []
    for position, row_deps in enumerate(deps):
        targets = []
        for dep in row_deps:
            target = position_of[(dep, gpus[position])]
            if not plan.simulate[target]:
                target = int(plan.representative[target])
            if op_ids[target] not in targets and target != position:
                targets.append(op_ids[target])
        remapped.append(targets)
    return remapped


@dataclass(frozen=True)
class HostLaunch:
    """What the host thread did for one simulated row whose kernels it issued (no measured issue
    time): when the call that launched its first kernel returned, what that call cost, and what
    all of the row's calls cost, ns (:meth:`gpusim.sched.executor.Executor.issue`)."""

    first_returned_ns: float
    first_cost_ns: float
    cost_ns: float


def reconstruct(
    frame: pd.DataFrame,
    deps: list[list[int]],
    plan: CachePlan,
    simulated: dict[int, tuple[float, float]],
    rows: np.ndarray,
    released: dict[int, float] | None = None,
    launches: dict[int, HostLaunch] | None = None,
    dependent_launch_ns: dict[int, float] | None = None,
) -> dict[int, tuple[float, float]]:
    """Start and end (ns) of every row in ``rows`` by list scheduling with representative durations.

    Rows are scheduled in the order they become ready, as the simulation starts them.  A row whose
    representative's kernels the host thread issued (``launches``) is split into the wait for its
    first kernel's launch and the rest: the host thread is a cursor per GPU that every such row
    advances by its calls' cost, as :meth:`gpusim.sched.executor.Executor.issue` does, so a
    left-out layer waits for the host where the host has fallen behind, even if its representative,
    simulated while the host was still ahead, did not.  Other rows last as long as their
    representative from their start.

    Parameters
    ----------
    frame, deps
        The full table and its dependencies.
    plan
        The cache plan the simulation followed.
    simulated
        Simulated ``(start, end)`` of the rows that were simulated.
    rows
        Boolean mask of the rows to schedule (those of the simulated GPUs).
    released
        When simulated rows let their stream move on before they ended (an ``async_collective``
        row, after its GEMM), ns; the next row on the stream follows that moment, not the end.
    launches
        The host's calls for the simulated rows whose kernels it issued.
    dependent_launch_ns
        Each simulated GPU's gap between a kernel and the one that waited for it
        (``GpuConfig.dependent_launch_ns``), by GPU.
    """
    released = released or {}
    launches = launches or {}
    gaps = dependent_launch_ns or {}
    graph = dependency_graph(frame, deps)
    gpus = frame["gpu"].tolist()
    streams = frame["stream"].tolist()
    kinds = frame["kind"].tolist()
    position_of = row_positions(frame)
    previous_on_stream: dict[int, int] = {}
    last: dict[tuple[int, str], int] = {}
    for position in range(len(frame)):
        if not rows[position]:
            continue
        lane = (gpus[position], streams[position])
        if lane in last:
            previous_on_stream[position] = last[lane]
        last[lane] = position

    def gap(position: int) -> float:
        """The dispatch gap before ``position``'s first kernel: none for a row that waits for nothing."""
        follows = bool(deps[position]) or position in previous_on_stream
        return gaps.get(gpus[position], 0.0) if follows else 0.0

    def launched(source: int) -> float:
        """When the simulated row ``source``'s first kernel was ready: its launch's return, and no
        earlier than the dispatch gap after its start; its start where the host did not launch it."""
        launch = launches.get(source)
        start = simulated[source][0]
        if launch is None:
            return start
        return max(launch.first_returned_ns, start + gap(source))

    arrival: dict[int, float] = {}
    for position in simulated:
        if kinds[position] in SYNCHRONISING_KINDS:
            node = graph.node_of[position]
            arrival[node] = max(arrival.get(node, -np.inf), launched(position))

    def begun(source: int) -> float:
        """When the simulated row ``source`` began its work: its first kernel's launch, or its ranks' meeting."""
        return arrival[graph.node_of[source]] if kinds[source] in SYNCHRONISING_KINDS else launched(source)

    def work(position: int) -> float:
        source = int(plan.representative[position])
        return simulated[source][1] - begun(source)

    host: dict[int, float] = {}

    def launch_of(position: int, ready: float) -> float:
        """When ``position``'s first kernel is ready, having started at ``ready``; advances its GPU's host cursor."""
        launch = launches.get(int(plan.representative[position]))
        if launch is None:
            return ready
        gpu = gpus[position]
        cursor = host.get(gpu, 0.0)
        host[gpu] = cursor + launch.cost_ns
        return max(ready + gap(position), cursor + launch.first_cost_ns)

    times: dict[int, tuple[float, float]] = {}
    begins: dict[int, float] = {}

    def moved_on(position: int) -> float:
        """When the next row on ``position``'s stream may start."""
        source = int(plan.representative[position])
        if source not in released:
            return times[position][1]
        return begins[position] + released[source] - begun(source)

    def ready_of(position: int) -> float:
        moment = 0.0
        for dep in deps[position]:
            target = position_of[(dep, gpus[position])]
            moment = max(moment, times[target][1])
        before = previous_on_stream.get(position)
        if before is not None:
            moment = max(moment, moved_on(before))
        return moment

    successors = graph.successors()
    waiting = [len(preds) for preds in graph.predecessors]
    heap: list[tuple[float, int, dict[int, float]]] = []

    def offer(node: int) -> None:
        members = [p for p in graph.rows_of[node] if rows[p]]
        ready = {position: ready_of(position) for position in members}
        heapq.heappush(heap, (max(ready.values(), default=0.0), node, ready))

    for node, count in enumerate(waiting):
        if count == 0:
            offer(node)
    while heap:
        _, node, ready = heapq.heappop(heap)
        if ready:
            members = list(ready)
            if kinds[members[0]] in SYNCHRONISING_KINDS:
                begin = max(launch_of(position, ready[position]) for position in members)
                for position in members:
                    begins[position] = begin
                    times[position] = (ready[position], begin + work(position))
            else:
                position = members[0]
                begins[position] = launch_of(position, ready[position])
                times[position] = (ready[position], begins[position] + work(position))
        for successor in successors[node]:
            waiting[successor] -= 1
            if waiting[successor] == 0:
                offer(successor)
    return times


def replica_windows(frame: pd.DataFrame, plan: CachePlan, simulated: dict[int, tuple[float, float]]) -> list[dict]:
    """The span of one layer of each run in the simulated timeline, per GPU, and how many left-out
    layers it stands for.

    The left-out layers moved no bytes in the simulation; :func:`gpusim.energy.energy` takes their
    DRAM, L2 and link traffic from this span on the same GPU.  With a warm-up instance the span is
    one period of the run in steady state: from the representative's first start for as long as
    the warm-up instance's first start preceded it, so that it holds one layer's work and what
    overlaps a layer (the previous layer's all-reduce on another stream) once.  Without warm-up
    (one stream per GPU, nothing overlaps) it is the representative's own span.

    Parameters
    ----------
    frame
        The full trace table.
    plan
        The cache plan the simulation followed.
    simulated
        Simulated ``(start, end)`` of the rows that were simulated, ns.

    Returns
    -------
    list of dict
        One per GPU and run with left-out instances: ``gpu``, ``start_s`` and ``end_s`` (s) and
        ``copies`` (the left-out instances).
    """
    gpus = frame["gpu"].tolist()
    windows = []
    for stand_in in plan.stand_ins:
        for gpu in sorted({gpus[position] for position in stand_in.representative}):
            rows = _times_of(stand_in.representative, gpu, gpus, simulated)
            if not rows:  # a GPU that symmetric mode leaves out
                continue
            start = min(begin for begin, _ in rows)
            previous = _times_of(stand_in.before, gpu, gpus, simulated)
            end = start + (start - min(begin for begin, _ in previous)) if previous else max(finish for _, finish in rows)
            windows.append({"gpu": int(gpu), "start_s": start * 1e-9, "end_s": end * 1e-9,
                            "copies": len(stand_in.left_out)})
    return windows


def straddled_runs(frame: pd.DataFrame, plan: CachePlan, times: dict[int, tuple[float, float]]) -> set[int]:
    """Runs whose left-out instances a simulated row outside the run ran beside.

    Such a row (the embedding's gradient all-reduce beside the per-layer optimizer steps) was
    running where the run's simulated instances ended, and in the simulation the left-out
    instances were not there to contend with it: it ran faster than beside them, by as much as
    they would have slowed it, which only simulating them tells.  The run is then to be simulated
    whole.  A row that begins after the first left-out instance began is not counted: what
    follows a run overlapped the simulated representative's trailing work as it overlaps the last
    instance's.

    Parameters
    ----------
    frame
        The full trace table.
    plan
        The cache plan the simulation followed.
    times
        Re-timed ``(start, end)`` of every row of the simulated GPUs (:func:`reconstruct`), ns.

    Returns
    -------
    set
        Indices of the runs (:attr:`CachePlan.runs`).
    """
    gpus = frame["gpu"].tolist()
    others = [position for position in times if plan.simulate[position]]
    straddled: set[int] = set()
    for stand_in in plan.stand_ins:
        members = set(stand_in.kept)
        for gpu in sorted({gpus[position] for position in stand_in.representative}):
            first = _times_of(stand_in.left_out[0], gpu, gpus, times)
            if not first:  # a GPU that symmetric mode leaves out
                continue
            start = min(begin for begin, _ in first)
            if any(gpus[p] == gpu and p not in members and times[p][0] < start < times[p][1] for p in others):
                straddled.add(stand_in.run)
    return straddled


def _times_of(positions: list[int], gpu: int, gpus: list[int], times: dict[int, tuple[float, float]]) -> list:
    """The ``times`` of the rows among ``positions`` on ``gpu``."""
    return [times[p] for p in positions if gpus[p] == gpu and p in times]
