"""Energy and average power of a finished run, from the activity the simulation counted.

Every GPU's energy is the sum of its idle power over the run's duration and a price per unit of
each activity the components counted (:class:`gpusim.config.gpu.PowerConfig`):

====================  ==========================================================================
component             activity (the counter or table it comes from)
====================  ==========================================================================
``idle``              the run's duration (``Result.time_s``)
``matrix``            FLOPs on the matrix units, as time at their peak rate (``matrix_busy_ns``)
``vector``            FLOPs on the vector units, the same way (``vector_busy_ns``)
``l2``                bytes read from and written to the L2 (``l2_bytes_read``, ``l2_bytes_written``)
``dram_activate``     physical row activations, the GPU's and the near-bank ALUs'
                      (``dram_activations``: a simulated row is ``lockstep_channels`` physical
                      ones; ``dram_run_activations`` and ``nmc_activations`` are physical)
``dram_array``        bytes read or written in the banks for the GPU (``Result.dram``; an
                      op-and-store reads and writes: twice)
``dram_io``           bytes between the DRAM stacks and the GPU (``Result.dram``)
``nmc_bank``          bytes the near-bank ALUs read and write in their banks (``nmc_bytes_*``)
``nmc_alu``           bytes of operands the near-bank ALUs and op-and-stores combine
``links``             bytes the GPU sends over links, switch and network (``Result.links``)
====================  ==========================================================================

The clocks do not react to power (the simulator keeps the configured clock); :func:`power`
flags a GPU whose average power exceeds its limit, where real hardware would run slower.  In
symmetric mode only GPU 0 is simulated, and only its row appears: every GPU does the same work.
Kernels that count no FLOPs (collectives' reductions, row reductions' instructions, near-bank
commands' issue) cost only their data movement and the idle power.  A trace replayed with layer
caching simulates only some of its rows, so its activity is incomplete: :func:`energy` refuses it
(replay with ``cache_layers=False``, ``gpusim simulate --no-cache``).
"""

from __future__ import annotations

import pandas as pd

from gpusim.config.gpu import PowerConfig
from gpusim.errors import ConfigError, SimulationError
from gpusim.results import Result

ENERGY_COLUMNS = ["gpu", "component", "amount", "unit", "energy_j"]
"""Columns of :func:`energy`: one row per GPU and component; ``amount`` of the activity in ``unit``."""

POWER_COLUMNS = ["gpu", "time_s", "energy_j", "average_w", "tdp_w", "over_tdp"]
"""Columns of :func:`power`: one row per simulated GPU."""

PJ = 1e-12
NJ = 1e-9


def power_config(result: Result) -> PowerConfig:
    """The power model of the GPU that ``result`` ran on.

    Raises
    ------
    ConfigError
        If the system's GPU has no ``power`` section.
    """
    gpu = result.config.get("gpu", {})
    section = gpu.get("power")
    if section is None:
        raise ConfigError(
            f"system {result.config.get('name', '?')!r}: its GPU {gpu.get('name', '?')!r} has no 'power' section, "
            "so its energy cannot be estimated; add one to the GPU's YAML (fields: see gpusim.config.gpu.PowerConfig; "
            "hwconfigs/gpus/h200-sxm.yaml has one) or override it (gpu.power.tdp_watts=..., every field)"
        )
    return PowerConfig.model_validate(section)


def _gpus(result: Result) -> list[int]:
    """The simulated GPUs: those with an op, a counter or DRAM traffic."""
    ranks = set(int(g) for g in result.ops["gpu"]) if not result.ops.empty else set()
    ranks.update(int(key[3:key.index(".")]) for key in result.counters if key.startswith("gpu") and "." in key)
    if not result.dram.empty:
        ranks.update(int(g) for g in result.dram["gpu"].unique())
    return sorted(ranks)


def energy(result: Result) -> pd.DataFrame:
    """Energy of every simulated GPU by component, J (:data:`ENERGY_COLUMNS`).

    Parameters
    ----------
    result
        A finished run on a system whose GPU has a ``power`` section.

    Returns
    -------
    pandas.DataFrame
        One row per GPU and component (the module's table), in GPU order.
    """
    config = power_config(result)
    rows, simulated = result.stats.get("trace_rows"), result.stats.get("simulated_rows")
    if rows is not None and simulated is not None and simulated < rows:
        raise SimulationError(
            f"layer caching simulated {simulated} of the trace's {rows} rows, so the run's activity is incomplete "
            "and its energy unknown; replay with cache_layers=False (gpusim simulate --no-cache)"
        )
    lockstep = int(result.config["gpu"]["hbm"].get("lockstep_channels", 1))
    counters = result.counters
    dram = result.dram.groupby(["gpu", "direction"])["bytes"].sum() if not result.dram.empty else pd.Series(dtype=float)
    sent = result.links.groupby("src")["bytes"].sum() if not result.links.empty else pd.Series(dtype=float)
    rows = []
    for gpu in _gpus(result):
        def counted(name: str, rank: int = gpu) -> float:
            return float(counters.get(f"gpu{rank}.{name}", 0.0))

        def moved(direction: str, rank: int = gpu) -> float:
            return float(dram.get((rank, direction), 0.0))

        read, write, update = moved("read"), moved("write"), moved("update")
        nmc_read, nmc_write, nmc_update = (counted(f"nmc_bytes_{kind}") for kind in ("read", "write", "update"))
        physical = counted("dram_run_activations") + counted("nmc_activations")
        activations = (counted("dram_activations") - physical) * lockstep + physical
        activity = [
            ("idle", result.time_s, "s", config.idle_watts),
            ("matrix", counted("matrix_busy_ns") * 1e-9, "s at peak", config.matrix_watts),
            ("vector", counted("vector_busy_ns") * 1e-9, "s at peak", config.vector_watts),
            ("l2", counted("l2_bytes_read") + counted("l2_bytes_written"), "bytes", config.l2_pj_per_byte * PJ),
            ("dram_activate", activations, "activations", config.dram_activate_nj * NJ),
            ("dram_array", read + write + 2 * update, "bytes", config.dram_array_pj_per_byte * PJ),
            ("dram_io", read + write + update, "bytes", config.dram_io_pj_per_byte * PJ),
            ("nmc_bank", nmc_read + nmc_write + 2 * nmc_update, "bytes", config.nmc_bank_pj_per_byte * PJ),
            ("nmc_alu", nmc_read + nmc_update + update, "bytes", config.nmc_alu_pj_per_byte * PJ),
            ("links", float(sent.get(gpu, 0.0)), "bytes", config.link_pj_per_byte * PJ),
        ]
        rows.extend((gpu, name, amount, unit, amount * price) for name, amount, unit, price in activity)
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)


def has_energy(result: Result) -> bool:
    """Whether :func:`energy` can price ``result``: its GPU has a power model and every row of a
    replayed trace was simulated."""
    try:
        energy(result)
    except (ConfigError, SimulationError):
        return False
    return True


def describe(result: Result) -> str | None:
    """One line on the run's energy and average power per GPU, why they are unknown where the
    run's activity is incomplete, or ``None`` where the GPU has no power model."""
    try:
        table = power(result)
    except ConfigError:
        return None
    except SimulationError as error:
        return f"energy not estimated: {error}"
    worst = table.loc[table["average_w"].idxmax()]
    line = (f"energy {table['energy_j'].sum():.4g} J over {len(table)} simulated GPU(s); average power up to "
            f"{worst['average_w']:.0f} W (GPU {int(worst['gpu'])}; limit {worst['tdp_w']:.0f} W)")
    if bool(table["over_tdp"].any()):
        line += ": over the limit, where real hardware would lower its clock and run longer"
    return line


def power(result: Result) -> pd.DataFrame:
    """Energy, average power and the power limit of every simulated GPU (:data:`POWER_COLUMNS`).

    ``average_w`` is the GPU's energy over the run's duration, W; ``over_tdp`` says that it
    exceeds ``tdp_w``, the board's limit, so that real hardware would lower its clock and take
    longer than simulated.
    """
    config = power_config(result)
    table = energy(result).groupby("gpu", as_index=False)["energy_j"].sum()
    table["time_s"] = result.time_s
    table["average_w"] = table["energy_j"] / result.time_s if result.time_s > 0 else float("nan")
    table["tdp_w"] = config.tdp_watts
    table["over_tdp"] = table["average_w"] > config.tdp_watts
    return table[POWER_COLUMNS]
