"""Hardware what-ifs: the same ops or trace on a system over a grid of configuration values.

::

    from gpusim import ops
    from gpusim.parameter_sweep import sweep_parameters

    table = sweep_parameters("t3-ring8", [ops.GemmReduceScatter(8192, 4256, 2128)],
                             {"links.bandwidth": ["75 GB/s", "150 GB/s"], "gpu.num_cus": [80, 160]})

simulates the ops once per combination of the values (the grid of :func:`parameter_grid`), each
point a :func:`gpusim.sweep.sweep` point: parallel processes or a Dask cluster, a progress bar, and
with a cache folder a resumable sweep whose points are keyed by the whole resolved hardware
description (an edited YAML file or preset is simulated again) and by the ops or the trace's
contents.  Every point's description is checked before the first simulation starts: a bad value
fails at once, naming the override.

The table starts with ``point`` (the grid's index) and the resolved value of each varied field
under its field's name and base unit (``links.bandwidth`` given as ``"150 GB/s"`` is
``links.bandwidth_bytes_per_s`` = 1.5e11; whole systems varied under ``"system"`` by the preset
or file as given).  Then, for a list of ops, one row per point and op:
``op_index`` (the op's place in the list), the op's row of :meth:`gpusim.Result.summary` (but
``op_id``); for a :class:`gpusim.trace.Trace`, one row per point and simulated GPU: the iteration's
:func:`gpusim.trace.breakdown.breakdown` (``gpu``, ``compute_s``, ``exposed_comm_s``,
``overlapped_comm_s``, ``idle_s``) and the summed durations of the GPU's ops of each kind
(``busy_gemm_s``, ``busy_collective_s``...; ops on several streams may overlap, so they can add
up to more than the iteration), ``simulated_rows``, and for a generated transformer the GPU's
``memory_bytes`` and whether it ``fits``.  Every row also has the point's ``total_s`` (first op start to
last op end, s), ``mode`` (the simulation mode that ran) and ``sim_wall_s`` (the simulator's own time
for the point, s); where the GPU has a power model (:mod:`gpusim.energy`; a trace's layers that
layer caching left out priced as their representatives), also ``energy_per_gpu_j`` (the simulated
GPUs' energy, averaged over them) and
``average_w`` (the most power-hungry GPU's average power) and ``over_tdp`` (whether a GPU averages
more than its power limit, which the simulation does not enforce).  With ``within_power_limit`` every point
runs at the highest clock its power limit allows (:func:`gpusim.power_limit.run_within_power_limit`)
and has that SM clock as ``clock_hz``: vary ``gpu.power.tdp_watts`` for a power-capping study.
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpusim.checks import is_flag
from gpusim.config.loader import load_system_config, override_field
from gpusim.config.node import SystemConfig
from gpusim.energy import has_energy, power
from gpusim.errors import ConfigError, GpusimError, NoEffectWarning, OpError, TraceError
from gpusim.hw.memctrl import PICK_POLICIES
from gpusim.ops import Op
from gpusim.results import Result
from gpusim.sched.executor import Stream
from gpusim.simulate import run
from gpusim.sweep import sweep
from gpusim.system import System
from gpusim.trace.breakdown import BREAKDOWN_COLUMNS, breakdown
from gpusim.trace.memory import memory_per_gpu
from gpusim.trace.trace import Trace

MODES = ("full", "symmetric", "auto")
POINT_COLUMNS = ["total_s", "mode", "sim_wall_s"]
"""Columns of :func:`sweep_parameters` that belong to the point rather than to one op or GPU."""
ENERGY_POINT_COLUMNS = ["energy_per_gpu_j", "average_w", "over_tdp", "clock_hz"]
"""Point columns of :func:`sweep_parameters` where the points' GPUs have a power model
(``clock_hz`` only in a sweep ``within_power_limit``)."""
SYSTEM_KEY = "system"
"""A key of ``vary`` whose values are whole systems (preset names or YAML paths) rather than a field."""
BUSY_PREFIX = "busy_"
"""A trace's rows have ``busy_<kind>_s``: the summed durations of the GPU's ops of each kind."""
ROW_KEYS = ("op_index", "gpu")
"""The column after the varied fields: ``op_index`` in a table of ops, ``gpu`` in one of a trace."""


MAX_POINTS = 1_000_000
"""Most points a sweep's grid may have: checked before the grid is listed, which would otherwise fill
the memory (a mapping per point) long before the first simulation."""


def _first_repeat(options: Sequence[Any]) -> tuple[Any] | tuple[()]:
    """The first value of ``options`` equal to one before it, as a 1-tuple, or ``()`` if none is
    (hashable values by a set, so that long lists of numbers check in one pass; a list or a
    mapping against every value before it)."""
    hashable: set[Any] = set()
    others: list[Any] = []
    for value in options:
        try:
            seen = value in hashable or value in others
            hashable.add(value)
        except TypeError:  # a list or a mapping
            seen = value in others or any(value == before for before in hashable)
            others.append(value)
        if seen:
            return (value,)
    return ()


def parameter_grid(vary: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values of ``vary``, the last parameter varying fastest.

    Parameters
    ----------
    vary
        Keys (override paths such as ``"gpu.num_cus"``, workload parameters, :data:`SYSTEM_KEY`)
        to the values each takes (``[80, 160]``).

    Returns
    -------
    list of dict
        One mapping of the keys to their values per point.

    Raises
    ------
    ConfigError
        ``vary`` is empty or not a mapping, a key is not a non-empty string, its values are not a
        non-empty list of distinct values, or the grid has more than :data:`MAX_POINTS` points.
    """
    if not isinstance(vary, Mapping) or not vary:
        raise ConfigError(f"vary must map override paths to lists of values, e.g. {{'gpu.num_cus': [80, 160]}}, "
                          f"got {vary!r}")
    values = []
    for path, options in vary.items():
        if not isinstance(path, str) or not path.strip():
            raise ConfigError(f"vary: keys must be override paths such as 'gpu.num_cus' or parameter names, got {path!r}")
        if isinstance(options, str | bytes | Mapping) or not isinstance(options, Sequence) or not options:
            raise ConfigError(f"vary {path!r}: expected a non-empty list of values, got {options!r}")
        values.append(options)
    points = math.prod(len(options) for options in values)
    if points > MAX_POINTS:
        sizes = " x ".join(f"{len(options)} ({path})" for path, options in zip(vary, values, strict=True))
        raise ConfigError(f"vary: the grid has {points:,} points ({sizes}); at most {MAX_POINTS:,} are allowed, "
                          f"so split the sweep or vary fewer values")
    checked = []
    for path, options in zip(vary, values, strict=True):
        repeated = _first_repeat(options)
        if repeated:
            raise ConfigError(f"vary {path!r}: the value {repeated[0]!r} is given more than once")
        checked.append(list(options))
    return [dict(zip(vary, combination, strict=True)) for combination in itertools.product(*checked)]


def simulate_point(point: int, config: dict[str, Any], source: str, ops: list[Op] | Trace, simulation_mode: str,
                   memory_policy: str | None, cache_layers: bool = True,
                   streams: list[str | Stream] | None = None, within_power_limit: bool = False) -> pd.DataFrame:
    """Simulate ``ops`` on one resolved description (a top-level function for :func:`gpusim.sweep.sweep`).

    Parameters
    ----------
    point
        The point's index in the grid (a column of the rows).
    config
        The resolved description, as :meth:`gpusim.System.to_dict` gives it.
    source
        The preset or file it came from (the system's ``source``).
    ops
        A list of ops, run on one stream as :func:`gpusim.run` runs them, or a trace, replayed.
    simulation_mode, memory_policy
        As :func:`gpusim.run` takes ``mode`` and ``memory_policy``.
    cache_layers
        A trace's identical layers are simulated once (:meth:`gpusim.trace.Trace.replay`).
    streams
        The stream of each op, a name or a :class:`gpusim.Stream` with a CU mask (:func:`gpusim.run`;
        ``None``: all on one).
    within_power_limit
        Run at the highest clock within the GPUs' power limit
        (:func:`gpusim.power_limit.run_within_power_limit`; a trace then has every row simulated,
        whatever ``cache_layers`` says).

    Returns
    -------
    pandas.DataFrame
        For ops, the run's :meth:`~gpusim.Result.summary`, with ``op_index`` (the op's place in
        ``ops``) instead of ``op_id`` (which differs from process to process); for a trace, its
        breakdown per GPU, the GPU's busy time per kind of op (``busy_gemm_s``...), the trace
        rows simulated (``simulated_rows``; the others timed from identical layers), and for a
        generated transformer each GPU's ``memory_bytes`` and whether it ``fits``
        (:func:`gpusim.trace.memory.memory_footprint`) and, for a mixture of experts under uneven
        routing, the share of the routed copies its layers drop at the experts' capacity, on
        average (``expert_dropped``).  Both with the
        point's ``total_s``, ``mode`` (the mode that ran: ``"auto"`` resolved) and ``sim_wall_s``,
        and :data:`ENERGY_POINT_COLUMNS` where :func:`gpusim.energy.has_energy`.
    """
    system = System(SystemConfig.model_validate(config), source)
    result = _point_result(system, ops, simulation_mode, memory_policy, cache_layers, streams, within_power_limit)
    if isinstance(ops, Trace):
        busy = result.ops.pivot_table(index="gpu", columns="kind", values="duration_s", aggfunc="sum", fill_value=0.0)
        busy.columns = [f"{BUSY_PREFIX}{kind}_s" for kind in busy.columns]
        rows = breakdown(result.ops, result.kernels).drop(columns="total_s").merge(busy.reset_index(), on="gpu")
        rows["simulated_rows"] = result.stats["simulated_rows"]  # of the trace's, the rest timed from identical layers
        memory = memory_per_gpu(ops, system)
        if memory is not None:
            rows = rows.merge(memory, on="gpu", how="left")
        dropped = ops.metadata.get("expert_dropped")
        if dropped is not None:  # a generated mixture of experts under uneven routing: the copies dropped, on average
            rows["expert_dropped"] = sum(dropped) / len(dropped)
    else:
        rows = result.summary()  # in the list's order: the copies' op ids grow with it
        rows = rows.drop(columns="op_id").assign(op_index=range(len(rows)))
    rows = rows.assign(total_s=result.time_s, mode=result.stats["mode"], sim_wall_s=result.stats["wall_s"])
    if has_energy(result):
        watts = power(result)
        rows = rows.assign(energy_per_gpu_j=float(watts["energy_j"].mean()), average_w=float(watts["average_w"].max()),
                           over_tdp=bool(watts["over_tdp"].any()))
    if within_power_limit:
        rows = rows.assign(clock_hz=result.stats["clock_hz"])
    return rows


def _point_result(system: System, ops: list[Op] | Trace, simulation_mode: str, memory_policy: str | None,
                  cache_layers: bool, streams: list[str | Stream] | None, within_power_limit: bool) -> Result:
    """The run of one point (:func:`simulate_point`'s arguments)."""
    if within_power_limit:
        from gpusim.power_limit import run_within_power_limit

        options = {} if isinstance(ops, Trace) else {"streams": streams}
        return run_within_power_limit(system, ops, mode=simulation_mode, memory_policy=memory_policy, **options)
    if isinstance(ops, Trace):
        return ops.replay(system, mode=simulation_mode, memory_policy=memory_policy, cache_layers=cache_layers)
    return run(system, [op.copy() for op in ops], streams, mode=simulation_mode, memory_policy=memory_policy)


def _checked_ops(ops: Op | Sequence[Op] | Trace, where: str = "sweep_parameters: ops") -> list[Op] | Trace:
    if isinstance(ops, Trace):
        return ops
    op_list = [ops] if isinstance(ops, Op) else list(ops) if isinstance(ops, Sequence) and not isinstance(ops, str) else None
    if not op_list or not all(isinstance(op, Op) for op in op_list):
        raise ConfigError(f"{where} must be an op, a non-empty list of gpusim.ops ops or a trace, got {ops!r}")
    return op_list


class WorkloadFunction:
    """``make(**values)`` presented as a function of exactly the workload parameters ``names`` (what
    :func:`workload_parameters` reads), for a ``make`` that takes its values as ``**values``.

    Parameters
    ----------
    make
        Makes the ops or the trace of one point from its values.
    names
        The parameters' names.
    """

    def __init__(self, make: Callable[..., Any], names: Sequence[str]):
        self.make = make
        self.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names])

    def __call__(self, **values: Any) -> Any:
        return self.make(**values)


def workload_parameters(ops: Any, vary: Mapping[str, Sequence[Any]]) -> list[str]:
    """The keys of ``vary`` that ``ops`` takes as workload parameters: the named parameters of
    ``ops`` when it is a function (or other callable) that makes the ops or the trace, else none.

    Raises
    ------
    ConfigError
        ``ops`` is a callable that takes arguments ``vary`` does not give, or none of its keys.
    """
    if isinstance(ops, Op | Trace) or not callable(ops):
        return []
    try:
        parameters = inspect.signature(ops).parameters
    except (TypeError, ValueError):
        raise ConfigError(f"sweep_parameters: cannot read the parameters of {ops!r}; give a function with named "
                          "parameters") from None
    named = [name for name, parameter in parameters.items()
             if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]
    missing = [name for name in named if name not in vary and parameters[name].default is parameters[name].empty]
    if missing or not any(name in vary for name in named):
        raise ConfigError(f"sweep_parameters: ops is a function of {', '.join(named) or 'nothing'}; vary must give "
                          f"{'its ' + repr(missing[0]) if missing else 'at least one of them'} (vary has "
                          f"{', '.join(vary)})")
    return [key for key in vary if key in named]


def _point_ops(make: Callable[..., Any], workload: list[str], values: dict[str, Any], index: int) -> list[Op] | Trace:
    """What the workload function ``make`` makes of point ``index``'s ``values``."""
    arguments = {key: values[key] for key in workload}
    try:
        made = make(**arguments)
    except GpusimError as exc:  # e.g. an op that refuses these values
        error = type(exc) if type(exc) in (ConfigError, OpError, TraceError) else GpusimError
        raise error(f"sweep point {index} ({arguments}): {exc}") from None
    return _checked_ops(made, f"sweep point {index} ({arguments}): what ops made")


def _point_system(source: str | None, base: dict[str, Any], values: dict[str, Any], workload: list[str],
                  index: int) -> tuple[str, SystemConfig, dict[str, tuple[str, Any]]]:
    """Point ``index``'s system: where it comes from, its resolved description, and each varied key's
    column and value (a field's under its field path, in base units).

    Raises
    ------
    ConfigError
        A varied system that is not a name or path, or an invalid description (naming the point).
    """
    point_source = values.get(SYSTEM_KEY, source)
    if not isinstance(point_source, str | os.PathLike):
        raise ConfigError(f"vary {SYSTEM_KEY!r}: expected preset names or YAML paths, got {point_source!r}")
    point_source = os.fspath(point_source)
    changes = {key: value for key, value in values.items() if key != SYSTEM_KEY and key not in workload}
    try:
        config = load_system_config(point_source, {**base, **changes})
    except ConfigError as exc:
        raise ConfigError(f"sweep point {index} ({values}): {exc}") from None
    fields = {key: override_field(config, key, value) if key in changes
              else (key, point_source if key == SYSTEM_KEY else value) for key, value in values.items()}
    return point_source, config, fields


def sweep_parameters(
    system: System | str | os.PathLike | None,
    ops: Op | Sequence[Op] | Trace | Callable[..., Op | Sequence[Op] | Trace],
    vary: Mapping[str, Sequence[Any]],
    *,
    overrides: Mapping[str, Any] | None = None,
    streams: Sequence[str | Stream] | None = None,
    mode: str = "auto",
    memory_policy: str | None = None,
    cache_layers: bool = True,
    within_power_limit: bool = False,
    workers: int | None = None,
    scheduler: str | None = None,
    cache: str | os.PathLike | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Simulate ``ops`` on ``system`` at every point of the grid ``vary`` spans.

    Parameters
    ----------
    system
        A :class:`gpusim.System` (its overrides are kept), a preset name or a YAML path; ``None``
        when ``vary`` gives the systems under :data:`SYSTEM_KEY` (``{"system": ["a100-sxm4",
        "h100-sxm5"]}``: the ops on each, with the other values and ``overrides`` applied to each).
    ops
        One op or a list of ops, run on one stream as :func:`gpusim.run` runs them, or a
        :class:`gpusim.trace.Trace`, replayed as :meth:`gpusim.trace.Trace.replay` does; or a
        function that makes them from workload parameters that ``vary`` gives under its
        parameters' names (``lambda nbytes: ops.AllReduce(nbytes)`` with ``{"nbytes": [2**20,
        2**26]}``), called once per point in this process (the point is keyed by what it makes).
    vary
        Override paths to the values each takes (:func:`parameter_grid`), as :func:`gpusim.load_system`
        reads overrides: ``{"links.bandwidth": ["75 GB/s", "300 GB/s"], "gpu.num_cus": [80, 160]}``;
        the workload parameters of a function ``ops``; and :data:`SYSTEM_KEY`.
    overrides
        Overrides applied at every point; ``vary``'s paths may not be among them, nor among a
        System's own overrides.
    streams
        For a list of ops, each op's stream (a name, or a :class:`gpusim.Stream` with a CU mask):
        ops on one stream run in order, on different streams concurrently (:func:`gpusim.run`;
        default: all on one stream).
    mode
        ``"auto"`` (symmetric where it is exact, else full), ``"full"`` or ``"symmetric"``.
    memory_policy
        Memory-controller policy of every GPU (default: each GPU's configured one).
    cache_layers
        A trace's runs of identical layers are simulated once (:meth:`gpusim.trace.Trace.replay`).
    within_power_limit
        Run every point at the highest SM clock at which its GPUs keep within their power limit
        (:func:`gpusim.power_limit.run_within_power_limit`: several runs a point; a trace has every
        row simulated, whatever ``cache_layers`` says) and add that clock as ``clock_hz``.
    workers, scheduler, cache, progress
        As :func:`gpusim.sweep.sweep` takes them; with ``cache`` a finished point is not simulated
        again unless the description, the ops or gpusim's code changed.

    Returns
    -------
    pandas.DataFrame
        One row per point and op, or per point and GPU for a trace (see the module's description).

    Raises
    ------
    ConfigError
        A bad grid, op list (also one a function made: the message names the point), streams (not
        one per op), mode, memory policy, ``cache_layers``, ``within_power_limit`` or ``progress``; a
        function ``ops`` whose
        parameters ``vary`` does not give; a path in both ``vary`` and ``overrides`` (or a System's
        overrides); a field that two paths name (``links.bandwidth`` and
        ``links.bandwidth_bytes_per_s``), or two of its values that are one (``1 GHz`` and
        ``1000 MHz``); a system given both as the argument and in ``vary`` (or in neither); or a
        point whose description is invalid (the message names the point's values and the override).
    gpusim.errors.UnknownPresetError
        A system is neither a preset nor a file.
    gpusim.errors.SweepError
        A point failed to simulate (the finished points are cached).
    """
    points = parameter_grid(vary)
    workload = workload_parameters(ops, vary)
    op_list = None if workload else _checked_ops(ops)
    if streams is not None and (isinstance(streams, str) or not isinstance(streams, Sequence) or not all(
            isinstance(stream, Stream) or (isinstance(stream, str) and stream) for stream in streams)):
        raise ConfigError(f"sweep_parameters: streams must be a list of stream names or gpusim.Stream, one per op, "
                          f"got {streams!r}")
    if mode not in MODES:
        raise ConfigError(f"sweep_parameters: mode must be one of {', '.join(MODES)}, got {mode!r}")
    for name, value in (("cache_layers", cache_layers), ("within_power_limit", within_power_limit),
                        ("progress", progress)):
        if not is_flag(value):
            raise ConfigError(f"sweep_parameters: {name} must be True or False, got {value!r}")
    if memory_policy is not None and memory_policy not in PICK_POLICIES:
        raise ConfigError(f"sweep_parameters: memory_policy must be one of {', '.join(PICK_POLICIES)} (or None for "
                          f"each GPU's configured one), got {memory_policy!r}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"sweep_parameters: overrides must be a mapping of dotted paths to values, got {overrides!r}")
    if (system is None) == (SYSTEM_KEY not in vary):
        raise ConfigError("sweep_parameters: give the system either as the argument or as the values of "
                          f"vary[{SYSTEM_KEY!r}] (presets or YAML paths), not both or neither")
    if isinstance(system, System):
        source, base = system.source, {**system.overrides, **(overrides or {})}
    elif isinstance(system, str | os.PathLike) or system is None:
        source, base = system and os.fspath(system), dict(overrides or {})
    else:
        raise ConfigError(f"sweep_parameters: system must be a System, a preset name or a YAML path, got {system!r}")
    both = [path for path in vary if path in base]  # else the point's value would replace the override unseen
    if both:
        raise ConfigError(f"sweep_parameters: {both[0]!r} is both varied and overridden; give it in one of them")
    calls, columns = [], []
    given_as: dict[str, dict[str, Any]] = {}  # a varied field -> its values as resolved -> as given
    for index, values in enumerate(points):
        made = _point_ops(ops, workload, values, index) if workload else op_list
        if calls and isinstance(made, Trace) != isinstance(calls[0]["ops"], Trace):
            raise ConfigError(f"sweep point {index} ({values}): ops made {'a trace' if isinstance(made, Trace) else 'ops'}, "
                              f"point 0 {'ops' if isinstance(made, Trace) else 'a trace'}; make one kind for all")
        if streams is not None and (isinstance(made, Trace) or len(streams) != len(made)):
            what = "a trace (whose rows name their streams)" if isinstance(made, Trace) else f"{len(made)} ops"
            raise ConfigError(f"sweep point {index} ({values}): streams gives {len(streams)} stream name(s) for {what}")
        point_source, config, fields = _point_system(source, base, values, workload, index)
        for key, (_, value) in fields.items():
            if key == SYSTEM_KEY or key in workload:
                continue
            first = given_as.setdefault(key, {}).setdefault(repr(value), values[key])
            if first != values[key]:
                raise ConfigError(f"vary {key!r}: {first!r} and {values[key]!r} are one value ({value!r}); "
                                  f"give each value once")
        calls.append({"point": index, "config": config.model_dump(mode="json"), "source": point_source, "ops": made,
                      "simulation_mode": mode, "memory_policy": memory_policy, "cache_layers": cache_layers,
                      "streams": None if streams is None else list(streams), "within_power_limit": within_power_limit})
        columns.append({"point": index, **dict(fields.values())})
    column_of = {key: column for key, (column, _) in fields.items()}  # a varied key -> its column, alike at every point
    rows = sweep(simulate_point, calls, workers=workers, scheduler=scheduler, cache=cache, progress=progress,
                 description=f"sweep over {', '.join(vary)}", labels=[repr(values) for values in points])
    rows = rows.drop(columns=["config", "source", "ops", "simulation_mode", "memory_policy", "cache_layers", "streams",
                              "within_power_limit"])
    table = pd.DataFrame(columns).merge(rows, on="point", how="left")
    first = [*columns[0], "gpu" if isinstance(made, Trace) else "op_index"]
    table = table[first + [column for column in table.columns if column not in first]]
    _warn_without_effect(table, {path: column_of[path] for path in vary if path != SYSTEM_KEY and path not in workload},
                         list(column_of.values()))
    return table


def _warn_without_effect(table: pd.DataFrame, overridden: dict[str, str], columns: list[str]) -> None:
    """Warn (:class:`~gpusim.errors.NoEffectWarning`) for each varied override (path -> its column)
    whose values give the same simulated time wherever the other varied ``columns`` are the same."""
    points = table.drop_duplicates("point").assign(_all=0)
    for path, field in overridden.items():
        others = [other for other in columns if other != field] or ["_all"]
        try:
            if points[field].nunique() < 2:
                continue
            spread = points.groupby(others, dropna=False)["total_s"].agg(lambda times: times.max() - times.min())
        except TypeError:  # values that cannot be compared (a whole section)
            continue
        if (spread <= 1e-9 * points["total_s"].abs().max()).all():
            warnings.warn(f"sweep: {path} ({field}) changed no point's simulated time: the ops do not depend on it, "
                          "or the system does not use it (e.g. links.* on a switch topology: vary switch.* there)",
                          NoEffectWarning, stacklevel=3)


def varied_fields(table: pd.DataFrame) -> list[str]:
    """The varied fields' columns of a :func:`sweep_parameters` table, in the grid's order.

    Raises
    ------
    ConfigError
        ``table`` is not a :func:`sweep_parameters` table.
    """
    columns = list(table.columns) if isinstance(table, pd.DataFrame) else []
    needed = {"point", *POINT_COLUMNS}
    key = next((column for column in columns if column in ROW_KEYS), None)
    if not needed <= set(columns) or columns[0] != "point" or key is None:
        raise ConfigError(f"expected a sweep_parameters table (columns point, the varied fields, op_index or gpu, ..., "
                          f"{', '.join(POINT_COLUMNS)})")
    return columns[1:columns.index(key)]


def point_totals(table: pd.DataFrame) -> pd.DataFrame:
    """One row per point of a :func:`sweep_parameters` table: ``point``, the varied fields,
    ``total_s``, ``mode``, ``sim_wall_s``, and for ops each op's ``duration_s`` as a column named
    ``"<op_index>: <name>"`` (the name's first word where the points name the op differently, as a
    workload sweep does), for a trace the breakdown's parts and the busy times per kind of op
    averaged over the simulated GPUs (a kind a point does not run counts 0), and for a generated
    transformer the busiest GPU's ``memory_bytes`` and whether every GPU ``fits`` (and
    ``expert_dropped`` where the rows have it); last, :data:`ENERGY_POINT_COLUMNS` where the table
    has them.

    Raises
    ------
    ConfigError
        ``table`` is not a :func:`sweep_parameters` table.
    """
    fields = varied_fields(table)
    points = table.drop_duplicates("point")[["point", *fields, *POINT_COLUMNS]].set_index("point")
    energy = table.drop_duplicates("point").set_index("point")[
        [column for column in ENERGY_POINT_COLUMNS if column in table.columns]]
    if "gpu" in table.columns:
        parts = [column for column in BREAKDOWN_COLUMNS if column not in ("gpu", "total_s")]
        parts += [column for column in table.columns if column.startswith(BUSY_PREFIX)]
        points = points.join(table.fillna({column: 0.0 for column in parts}).groupby("point")[parts].mean())
        if "memory_bytes" in table.columns:  # the busiest GPU's, and whether every GPU's fits
            points = points.join(table.groupby("point").agg(memory_bytes=("memory_bytes", "max"), fits=("fits", "all")))
        if "expert_dropped" in table.columns:
            points = points.join(table.groupby("point")["expert_dropped"].first())
        return points.join(energy).reset_index()
    names = table["name"].astype(str)
    varies = names.groupby(table["op_index"]).transform("nunique") > 1  # a workload sweep renames its ops
    labels = table["op_index"].astype(str) + ": " + names.where(~varies, names.str.split().str[0])
    durations = table.assign(op=labels).pivot(index="point", columns="op", values="duration_s")
    durations = durations[list(dict.fromkeys(labels))]  # in the ops' order
    durations.columns.name = None
    return points.join(durations).join(energy).reset_index()


def elasticities(table: pd.DataFrame) -> pd.DataFrame:
    """How strongly each numeric varied value moves the total time: the elasticity
    ``d ln(total_s) / d ln(value)`` between neighbouring values of the field, the other fields held
    (-1: the time is inversely proportional, as a compute-bound GEMM's to the CUs; 0: no effect).

    Parameters
    ----------
    table
        A :func:`sweep_parameters` table.

    Returns
    -------
    pandas.DataFrame
        One row per varied field with positive numeric values and at least two of them: ``field``,
        ``median``, ``min``, ``max`` (of the elasticities between neighbours) and ``pairs`` (how
        many neighbours).

    Raises
    ------
    ConfigError
        ``table`` is not a :func:`sweep_parameters` table.
    """
    points = point_totals(table)
    fields = varied_fields(table)
    rows = []
    for field in fields:
        values = pd.to_numeric(points[field], errors="coerce")
        if values.isna().any() or (values <= 0).any() or values.nunique() < 2:
            continue
        others = [other for other in fields if other != field]
        groups = points.assign(_value=values).groupby(others, dropna=False) if others else [(None, points.assign(_value=values))]
        slopes = []
        for _, group in groups:
            ordered = group.sort_values("_value")
            x, t = np.log(ordered["_value"].to_numpy(float)), np.log(ordered["total_s"].to_numpy(float))
            slopes.extend(np.diff(t) / np.diff(x))
        rows.append({"field": field, "median": float(np.median(slopes)), "min": float(np.min(slopes)),
                     "max": float(np.max(slopes)), "pairs": len(slopes)})
    return pd.DataFrame(rows, columns=["field", "median", "min", "max", "pairs"])


def elasticity_lines(table: pd.DataFrame) -> list[str]:
    """:func:`elasticities` of a :func:`sweep_parameters` table as lines to print (none when no
    varied field is numeric)."""
    frame = elasticities(table)
    if frame.empty:
        return []
    lines = ["elasticity of the total time, d ln(time) / d ln(value) with the other values held "
             "(-1: inversely proportional, 0: no effect):"]
    lines += [f"  {row.field}: {row.median:+.2f} (from {row.min:+.2f} to {row.max:+.2f} over {row.pairs} "
              f"step{'' if row.pairs == 1 else 's'})" for row in frame.itertuples()]
    return lines


def points_in_ms(points: pd.DataFrame) -> pd.DataFrame:
    """A :func:`point_totals` table to read: its times in milliseconds (rounded to 0.1 ns, each
    column's name saying ``(ms)``), a generated transformer's memory in GiB, its other numbers with
    at most 6 significant digits (as text), without ``sim_wall_s``."""
    parts = [column for column in BREAKDOWN_COLUMNS if column != "gpu"]
    times = [column for column in points.columns
             if column in parts or column.startswith(BUSY_PREFIX) or re.match(r"\d+: ", column)]
    shown = points.drop(columns="sim_wall_s")
    shown[times] = (shown[times] * 1e3).round(7)
    if "memory_bytes" in shown.columns:
        shown["memory_bytes"] = (shown["memory_bytes"] / 2**30).round(2)
        shown = shown.rename(columns={"memory_bytes": "memory (GiB)"})
    for column in shown.columns.difference(times):  # varied fields in base units: 7.5e+10, not 7.500000e+10
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda value: f"{value:g}")
    return shown.rename(columns={column: f"{column.removesuffix('_s')} (ms)" for column in times})
