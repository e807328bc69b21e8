"""Simulate at the clock a board's power limit allows.

A GPU whose work draws more than its limit (``gpu.power.tdp_watts``) lowers its clock until it
does not.  :func:`run_within_power_limit` does the same to a simulation: it runs the ops at the
configured clock and, where some GPU's average power (:func:`gpusim.energy.power`) is over the
limit, searches for the highest clock at which every GPU keeps within it, scaling the SM clock
(``gpu.clock_hz``) and the L2's (``gpu.l2.clock_hz``) together; the HBM keeps its clock.  The
configured clocks stay the GPU's rated ones (``rated_clock_hz``), for which its kernel library keeps
picking kernels, as cuBLAS does on a throttled board: a GPU that is configured with a lower clock
is another what-if, whose library picks for that clock.

What it inherits from the energy model (docs/energy.md): unless the power section says how the
voltage follows the clock (``voltage_scaling``, which no preset sets), the energy of an operation
does not depend on the clock, so a lower clock saves power only by spreading the same energy over
more time.  Real GPUs also lower the voltage with the clock and save more: without that section
the clock found here is a lower bound of the one a real board would settle at, and the run an
upper bound of its time.  The limit applies to the run's average, as boards enforce it over
milliseconds to seconds.

A preset whose efficiencies were fitted to times measured under its limit already runs that work
at its limited speed, and its prices make it draw the limit (the Hopper presets' large fp16
GEMMs): the search then keeps the configured clock for it and lowers the clock only for work, or
what-if hardware, that draws more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gpusim.checks import is_flag
from gpusim.config.node import SystemConfig
from gpusim.energy import power
from gpusim.errors import ConfigError, SimulationError
from gpusim.ops import Op
from gpusim.results import Result
from gpusim.simulate import run
from gpusim.system import System, load_system

LOWEST_SCALE = 0.3
"""The lowest clock tried, as a fraction of the configured one."""


def _over_limit(result: Result) -> bool:
    return bool(power(result)["over_tdp"].any())


def run_within_power_limit(
    system: System | str,
    ops: Op | Sequence[Op] | Any,
    *,
    tolerance: float = 0.01,
    progress: bool = False,
    **options: Any,
) -> Result:
    """Simulate ``ops`` at the highest clock at which every GPU's average power is within its limit.

    Parameters
    ----------
    system
        A :class:`gpusim.System` or a preset name; its GPU needs a ``power`` section.
    ops
        One op, a list of ops (run on one stream), or a :class:`gpusim.trace.Trace` (replayed
        with every row simulated, ``cache_layers=False``, so that its energy is exact).
    tolerance
        How close to the limiting clock the search gets, as a fraction of the configured clock.
    progress
        Show a progress bar of the search's runs, with the clock and power of the last one.
    **options
        Passed on to :func:`gpusim.run` (or :meth:`gpusim.trace.Trace.replay`): ``mode``,
        ``memory_policy``, ...

    Returns
    -------
    Result
        The run at the clock found; its ``stats`` gain ``clock_scale`` (the clock found over the
        configured one, 1 when the limit is not reached) and ``clock_hz``.

    Raises
    ------
    ConfigError
        The GPU has no power model, ``tolerance`` is not in (0, 0.5), or ``progress`` is not a
        bool.
    SimulationError
        Even at :data:`LOWEST_SCALE` of the clock some GPU draws more than its limit (its idle
        power and memory traffic alone exceed it).
    """
    from gpusim.trace.trace import Trace

    if isinstance(system, str):
        system = load_system(system)
    if system.config.gpu.power is None:
        raise ConfigError(f"{system.name}: its GPU has no 'power' section, so there is no power limit to keep "
                          "within (docs/energy.md)")
    if not 0 < tolerance < 0.5:
        raise ConfigError(f"tolerance must be a fraction of the clock in (0, 0.5), got {tolerance!r}")
    if not is_flag(progress):
        raise ConfigError(f"progress must be True or False, got {progress!r}")
    clock, l2_clock = system.config.gpu.clock_hz, system.config.gpu.l2.clock_hz
    bar = _search_bar(system.name, tolerance) if progress else None

    def at(scale: float) -> Result:
        point = system if scale == 1.0 else _at_clocks(system, clock * scale, l2_clock * scale)
        if isinstance(ops, Trace):
            result = ops.replay(point, cache_layers=False, **options)
        else:
            result = run(point, [op.copy() for op in ops] if isinstance(ops, Sequence) else ops.copy(), **options)
        result.stats.update(clock_scale=scale, clock_hz=clock * scale)
        if bar is not None:
            bar.set_postfix_str(f"{clock * scale / 1e9:.3f} GHz: {power(result)['average_w'].max():.0f} W")
            bar.update()
        return result

    try:
        return _search(system, at, tolerance)
    finally:
        if bar is not None:
            bar.total = bar.n  # the search may end before its most runs
            bar.close()


def describe_clock(result: Result) -> str:
    """One line on the clock a :func:`run_within_power_limit` run settled at, for the commands."""
    limit = result.config["gpu"]["power"]["tdp_watts"]
    return (f"within the {limit:.0f} W limit at {result.stats['clock_hz'] / 1e9:.3f} GHz "
            f"({result.stats['clock_scale']:.0%} of the configured clock)")


def _at_clocks(system: System, clock_hz: float, l2_clock_hz: float) -> System:
    """``system`` with its SM and L2 clocks set, changed in its resolved description (which a
    sweep's point has without the overrides that made it, so reloading would lose them); the
    clocks it had stay its rated ones, for which its kernel library picks kernels."""
    data = system.to_dict()
    gpu, l2 = data["gpu"], data["gpu"]["l2"]
    gpu["rated_clock_hz"] = gpu.get("rated_clock_hz") or gpu["clock_hz"]
    l2["rated_clock_hz"] = l2.get("rated_clock_hz") or l2["clock_hz"]
    gpu["clock_hz"] = clock_hz
    l2["clock_hz"] = l2_clock_hz
    return System(SystemConfig.model_validate(data), system.source, system.overrides)


def _search_bar(name: str, tolerance: float) -> Any:
    """A progress bar over the most runs the search can take."""
    from gpusim.progress import progress_bar

    most = 2 + math.ceil(math.log2((1.0 - LOWEST_SCALE) / tolerance))
    return progress_bar(most, f"{name} within its power limit", "run")


def _search(system: System, at: Callable[[float], Result], tolerance: float) -> Result:
    """Bisect the clock scale between :data:`LOWEST_SCALE` and 1 with ``at(scale)`` (a run)."""
    best = at(1.0)
    if not _over_limit(best):
        return best
    low, high = LOWEST_SCALE, 1.0
    best = at(low)
    if _over_limit(best):
        watts = power(best)["average_w"].max()
        raise SimulationError(
            f"{system.name}: at {LOWEST_SCALE:.0%} of its clock a GPU still draws {watts:.0f} W, over its "
            f"{system.config.gpu.power.tdp_watts:.0f} W limit: lowering the clock cannot bring it within"
        )
    while high - low > tolerance:
        middle = (low + high) / 2
        result = at(middle)
        if _over_limit(result):
            high = middle
        else:
            low, best = middle, result
    return best
