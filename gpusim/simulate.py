"""``gpusim.run``: simulate ops (or a trace) on a system and return a :class:`Result`."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpusim.checks import as_int, as_real, is_flag
from gpusim.engine.simulation import Simulation
from gpusim.errors import ConfigError, OpError, SimulationError, SymmetricModeWarning
from gpusim.hw.system import Machine
from gpusim.ops import Op
from gpusim.results import Result, build_result
from gpusim.sched.executor import Executor, Stream
from gpusim.system import System, load_system

GC_THRESHOLDS = (100_000, 10, 100)
"""The garbage collector's thresholds while :func:`prepare` builds a simulation and :func:`finish`
runs it and builds its result (:func:`gc.set_threshold`; Python's defaults: 700, 10, 10): a
collection of the youngest generation every 100,000 net allocations of container objects, and a
full collection only after 100 collections of the middle one."""


@contextmanager
def fewer_collections(thresholds: tuple[int, int, int]) -> Iterator[None]:
    """Raise the garbage collector's thresholds to at least ``thresholds`` in the ``with`` block and
    restore them after it; a disabled collector (a first threshold of 0) is left alone.

    A simulation allocates and frees millions of small objects (requests, events, joins) and keeps
    thousands in flight.  With Python's defaults the collector ran 484 times in the 256 MiB
    all-reduce, three of them full collections that walk every object of the process, and took
    11% of its time; with :data:`GC_THRESHOLDS`, 1-2% (docs/benchmarks.md, stop 38).  Reference
    counting frees the simulation's objects either way: the benchmark cases' peak memory is the same.
    """
    saved = gc.get_threshold()
    if saved[0]:
        gc.set_threshold(*(max(old, new) for old, new in zip(saved, thresholds)))
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _as_stream(stream: str | Stream) -> Stream:
    if isinstance(stream, Stream):
        if not (isinstance(stream.name, str) and stream.name):
            raise OpError(f"a stream's name must be a non-empty string, got {stream.name!r}")
        return stream
    if isinstance(stream, str) and stream:
        return Stream(stream)
    raise OpError(f"a stream must be a non-empty name or a gpusim.Stream, got {stream!r}")


def _checked_cu_mask(stream: Stream, num_cus: int, system_name: str) -> Stream:
    """``stream`` with its CU mask checked and made a tuple of ints (NumPy integers accepted)."""
    mask = stream.cu_mask
    if mask is None:
        return stream
    if isinstance(mask, (str, bytes)) or not isinstance(mask, Iterable):
        raise OpError(f"stream {stream.name!r}: cu_mask must be a collection of CU indices 0..{num_cus - 1} "
                      f"or None for all CUs, got {mask!r}")
    given = list(mask)
    if not given:
        raise OpError(f"stream {stream.name!r}: cu_mask is empty; give CU indices 0..{num_cus - 1} or None for all CUs")
    indices = [as_int(cu) for cu in given]
    outside = [cu for cu, index in zip(given, indices) if index is None or not 0 <= index < num_cus]
    if outside:
        raise OpError(f"stream {stream.name!r}: cu_mask has {outside[:5]}, outside {system_name}'s CUs 0..{num_cus - 1}")
    if len(set(indices)) != len(indices):
        raise OpError(f"stream {stream.name!r}: cu_mask repeats a CU: {indices}")
    return dataclasses.replace(stream, cu_mask=tuple(indices))


def _check_bin(bin_s: object) -> None:
    """Raise :class:`ConfigError` unless ``bin_s`` is a positive finite number of seconds."""
    value = as_real(bin_s)
    if value is None or value <= 0:
        raise ConfigError(f"bin_s must be a positive finite number of seconds, got {bin_s!r}")


def _group_of(op: Op, executor: Executor) -> list[int]:
    """The ranks ``op`` runs on; :class:`OpError` if one does not exist or symmetric mode cannot run it."""
    machine = executor.machine
    group = executor.group_of(op)
    if machine.mode == "symmetric" and not op.symmetric:
        raise OpError(f"{op.label}: {type(op).__name__} needs mode='full' (its ranks do different work)")
    if machine.mode == "symmetric" and 0 not in group:
        raise OpError(f"{op.label}: symmetric mode simulates rank 0 only, and this op runs on ranks {group}, "
                      f"not on rank 0; use mode='full'")
    return group


def routes_directly(op: Op) -> bool:
    """Whether ``op`` is a collective, or a GEMM fused with one, whose every rank sends to every other:
    the ``direct`` algorithm, or an all-to-all left to ``auto``."""
    algorithm = getattr(op, "algorithm", None)
    if algorithm == "auto":
        return getattr(op, "collective", None) == "alltoall"
    return algorithm == "direct"


def chunks_leave_ranks_empty(nbytes: int, ranks: int) -> bool:
    """Whether a collective of ``nbytes`` over ``ranks`` ranks is too small to give every rank's
    chunk a byte (a 1-byte all-reduce on 8 GPUs): its ranks then do different work, which symmetric
    mode, which mirrors rank 0's, cannot show."""
    return ranks > 1 and (ranks - 1) * math.ceil(nbytes / ranks) >= nbytes


def leaves_ranks_empty(op: Op, ranks: int) -> bool:
    """:func:`chunks_leave_ranks_empty` for an op: false for an op that is not a collective."""
    nbytes = getattr(op, "nbytes", None)
    return (getattr(op, "collective", None) is not None and isinstance(nbytes, int)
            and chunks_leave_ranks_empty(nbytes, ranks))


def one_symmetric_node(system: System) -> bool:
    """Whether ``system`` is a single node whose GPUs all see the same network (symmetric mode's
    first condition)."""
    return system.topology.symmetric and system.config.nodes == 1


def choose_mode(op_list: Sequence[Op], system: System) -> str:
    """``"symmetric"`` where it is exact for ``op_list`` on ``system``, else ``"full"``.

    Exact means: a single node whose GPUs all see the same network; every op runs on every GPU
    alike (no :class:`gpusim.ops.SendRecv`, no op on a subset of the GPUs, which symmetric mode
    would mirror as if every rotation of its group ran it, no collective too small to give every
    rank a chunk: :func:`leaves_ranks_empty`); and no direct collective or all-to-all where peers
    are several hops apart (:func:`warn_if_symmetric_approximates`).
    """
    topology = system.topology
    if not one_symmetric_node(system):
        return "full"
    everyone = list(range(system.num_gpus))
    for op in op_list:
        if not op.symmetric or (op.ranks is not None and sorted(op.ranks) != everyone):
            return "full"
        if leaves_ranks_empty(op, len(everyone)):
            return "full"
        if routes_directly(op) and not topology.mirrors_direct_traffic:
            return "full"
    return "symmetric"


def resolve_mode(mode: str, system: Any, choose: Callable[[System], str]) -> str:
    """``mode`` checked (``full``, ``symmetric`` or ``auto``), with ``auto`` resolved: ``choose(system)``
    for a :class:`System`, else ``full``; a :class:`gpusim.errors.ConfigError` names the choices."""
    if mode not in ("full", "symmetric", "auto"):
        raise ConfigError(f"mode must be one of full, symmetric, auto, got {mode!r}")
    if mode != "auto":
        return mode
    return choose(system) if isinstance(system, System) else "full"


def warn_if_symmetric_approximates(ops: Iterable[Op], system: System) -> None:
    """Warn once (:class:`gpusim.errors.SymmetricModeWarning`) when symmetric mode on ``system``
    only approximates some of ``ops``: direct collectives and all-to-all where the topology puts
    peers several hops apart (:attr:`gpusim.hw.topology.Topology.mirrors_direct_traffic`)."""
    if system.topology.mirrors_direct_traffic:
        return
    direct = [op for op in ops if routes_directly(op)]
    if direct:
        warnings.warn(
            f"symmetric mode only approximates the {len(direct)} direct collective(s) and all-to-all(s) of this run "
            f"(the first: {direct[0].label}) on {system.name}, whose {system.config.topology.kind} topology puts "
            "peers several hops apart; use mode='full' for their exact link contention (docs/model.md)",
            SymmetricModeWarning, stacklevel=3)


def progress_bar(total: int, description: str, sim: Simulation):
    """A bar of ``total`` finished ops that also shows ``sim``'s simulated time, at most twice a
    wall-clock second (through :attr:`gpusim.engine.simulation.CountingEnvironment.on_progress`):
    a long op shows that it is moving before it finishes.  Close it with :func:`close_progress_bar`."""
    from gpusim.progress import progress_bar as bar_of

    bar = bar_of(total, description, "op")
    shown = -1.0

    def show(now_ns: float) -> None:
        nonlocal shown
        wall = time.perf_counter()
        if wall - shown >= 0.5:
            shown = wall
            bar.set_postfix_str(f"simulated {now_ns / 1e3:,.1f} us", refresh=False)
            bar.update(0)  # shown as often as the bar's own updates (sparser in a log)

    sim.env.on_progress = show
    return bar


def close_progress_bar(bar, sim: Simulation) -> None:
    """Close ``bar`` (from :func:`progress_bar`) showing the ops finished and the simulated time at
    the end: it stays on screen, and in a log, as the run ended (its redraws are rate-limited, so
    the last one may predate the last ops)."""
    bar.set_postfix_str(f"simulated {sim.env.now / 1e3:,.1f} us", refresh=False)
    bar.close()


@fewer_collections(GC_THRESHOLDS)
def prepare(
    system: System | str,
    mode: str = "full",
    memory_policy: str | None = None,
    dispatch_policy: str | None = None,
    bin_s: float = 5e-6,
    on_op_done=None,
) -> tuple[System, Simulation, Machine, Executor]:
    """Build a simulation, its machine and an executor (for callers that submit ops themselves).

    Arguments are those of :func:`run`; bad settings raise :class:`ConfigError`.
    """
    if isinstance(system, str):
        system = load_system(system)
    if not isinstance(system, System):
        raise ConfigError(f"expected a gpusim.System or a preset name, got {type(system).__name__}")
    _check_bin(bin_s)
    sim = Simulation(bin_ns=bin_s * 1e9)
    machine = Machine(sim, system.config, mode=mode, memory_policy=memory_policy, dispatch_policy=dispatch_policy,
                      topology=system.topology)
    executor = Executor(sim, machine, on_op_done=on_op_done)
    return system, sim, machine, executor


def run_stats(sim: Simulation, machine: Machine, wall_start: float) -> dict:
    """Events scheduled, wall-clock seconds since ``wall_start`` (a ``time.perf_counter()``), event
    rate, simulation mode and simulated GPUs of a finished run."""
    wall = time.perf_counter() - wall_start
    return {
        "events": sim.events_scheduled,
        "wall_s": wall,
        "events_per_s": sim.events_scheduled / wall if wall > 0 else float("nan"),
        "mode": machine.mode,
        "simulated_gpus": len(machine.gpus),
    }


@fewer_collections(GC_THRESHOLDS)
def finish(system: System, sim: Simulation, machine: Machine, executor: Executor, expected: int, wall_start: float) -> Result:
    """Run the simulation to the end, check every op finished, and build the result."""
    sim.run()
    if len(executor.records) != expected:
        done = {(r.op.uid, r.rank) for r in executor.records}
        raise SimulationError(
            f"simulation stopped with {expected - len(executor.records)} of {expected} op executions unfinished "
            f"(a deadlock: an op waits for data that never comes); finished: {sorted(done)[:10]}..."
        )
    stats = run_stats(sim, machine, wall_start)
    for rank, gpu in machine.gpus.items():
        l2 = gpu.l2.stats
        sim.recorder.count(f"gpu{rank}.l2_hits", l2.hits)
        sim.recorder.count(f"gpu{rank}.l2_misses", l2.misses)
        sim.recorder.count(f"gpu{rank}.l2_merged", l2.merged)
        sim.recorder.count(f"gpu{rank}.l2_bytes_read", l2.bytes_read)
        sim.recorder.count(f"gpu{rank}.l2_bytes_written", l2.bytes_written)
        for time_bin, nbytes in gpu.l2.traffic.items():
            sim.recorder.l2[(rank, time_bin)] += nbytes
        sim.recorder.count(f"gpu{rank}.dram_activations", sum(ch.stats.activations for ch in gpu.channels))
        sim.recorder.count(f"gpu{rank}.dram_run_activations", sum(ch.stats.run_activations for ch in gpu.channels))
        sim.recorder.count(f"gpu{rank}.mc_max_queue", max(mc.max_occupancy for mc in gpu.controllers))
        sim.recorder.count(f"gpu{rank}.dram_requests", sum(mc.served for mc in gpu.controllers))
    return build_result(executor.records, sim.recorder, system.config.model_dump(mode="json"), stats)


def run(
    system: System | str,
    ops: Op | Sequence[Op] | Any,
    streams: Sequence[str | Stream] | None = None,
    *,
    mode: str = "full",
    memory_policy: str | None = None,
    dispatch_policy: str | None = None,
    progress: bool = False,
    bin_s: float = 5e-6,
) -> Result:
    """Simulate ``ops`` on ``system``.

    Parameters
    ----------
    system
        A :class:`System` (see :func:`gpusim.load_system`) or a preset name.
    ops
        One op, a list of ops, or a :class:`gpusim.trace.Trace` (replayed as a DAG).
    streams
        For a list of ops: the stream of each op (a name or a :class:`gpusim.Stream` with a CU
        mask).  Ops on one stream run in order; ops on different streams of a GPU run concurrently
        and share its CUs, L2 and HBM.  Default: all ops on one stream.  Not for a trace (its rows
        name their streams).
    mode
        ``"full"`` simulates every GPU; ``"symmetric"`` simulates GPU 0 and mirrors its
        neighbours' traffic into it (for work that every GPU does alike; an op that does not run
        on rank 0, or a :class:`gpusim.ops.SendRecv`, is an error there).  An op on a subset of
        the GPUs runs as if every rotation of its group ran it too (docs/model.md).  Direct
        collectives and all-to-all on a ring are approximated there, with a
        :class:`gpusim.errors.SymmetricModeWarning`.  ``"auto"`` takes symmetric mode where it
        is exact for these ops (:func:`choose_mode`; for a trace,
        :func:`gpusim.trace.replay.choose_mode`), else full mode; ``Result.stats["mode"]`` says
        which ran.
    memory_policy
        Memory-controller arbitration for all GPUs (``fr-fcfs``, ``fcfs``, ``round-robin``,
        ``t3-mca``); default: each GPU's configured policy.
    dispatch_policy
        How concurrent kernels share CUs for all GPUs: ``round_robin`` or ``fifo``; default: each
        GPU's configured policy (``gpu.dispatch_policy``).
    progress
        Show a progress bar of finished ops.
    bin_s
        Time resolution of the DRAM and link traffic in the result, s (positive).

    Returns
    -------
    Result
        An op object that appears several times in ``ops`` runs (and is reported) once per
        appearance, each with its own ``op_id``.

    Raises
    ------
    OpError
        For bad ops or streams (also streams given with a trace), including ranks that the system lacks.
    ConfigError
        For bad settings (mode, policies, ``bin_s``, ``progress``).
    """
    wall_start = time.perf_counter()
    if hasattr(ops, "replay"):
        if streams is not None:
            raise OpError(f"streams applies to a list of ops, not to a trace, whose rows name their streams (its "
                          f"'stream' column); got {streams!r}")
        return ops.replay(system, mode=mode, memory_policy=memory_policy, dispatch_policy=dispatch_policy,
                          progress=progress, bin_s=bin_s)
    op_list = [ops] if isinstance(ops, Op) else list(ops) if isinstance(ops, Iterable) else None
    if not op_list or not all(isinstance(op, Op) for op in op_list):
        raise OpError(f"run() takes an op, a non-empty list of ops, or a trace; got {ops!r}")
    if not is_flag(progress):
        raise ConfigError(f"progress must be True or False, got {progress!r}")
    if streams is None:
        stream_list = [Stream()] * len(op_list)
    elif isinstance(streams, (str, Stream)):
        raise OpError(f"streams must be a list with a stream for each op, got {streams!r}")
    else:
        stream_list = [_as_stream(s) for s in streams]
        if len(stream_list) != len(op_list):
            raise OpError(f"streams has {len(stream_list)} entries for {len(op_list)} ops")
    if isinstance(system, str) and mode == "auto":
        system = load_system(system)
    mode = resolve_mode(mode, system, lambda machine: choose_mode(op_list, machine))
    bar = None

    def advance() -> None:
        if bar is not None:
            bar.update()

    system, sim, machine, executor = prepare(system, mode, memory_policy, dispatch_policy, bin_s, advance)
    stream_list = [_checked_cu_mask(stream, system.gpu.num_cus, system.name) for stream in stream_list]
    last: dict[tuple[int, str], Any] = {}
    expected = 0
    plans = []
    seen: set[int] = set()
    for op, stream in zip(op_list, stream_list):
        group = _group_of(op, executor)
        if op.uid in seen:
            op = op.copy()
        seen.add(op.uid)
        for rank in group:
            if machine.is_simulated(rank):
                plans.append((op, rank, stream))
    if machine.mode == "symmetric":
        warn_if_symmetric_approximates(op_list, system)
    if progress:
        bar = progress_bar(len(plans), system.name, sim)
    try:
        for op, rank, stream in plans:
            key = (rank, stream.name)
            previous = last.get(key)
            last[key] = executor.submit(op, rank, stream, [previous] if previous is not None else [])
            expected += 1
        return finish(system, sim, machine, executor, expected, wall_start)
    finally:
        if bar is not None:
            close_progress_bar(bar, sim)
