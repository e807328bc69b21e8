"""Energy and power of a finished run, from the activity the simulation recorded.

Every GPU's energy is its idle power over the run's duration plus a price per unit of each
activity the components recorded (:class:`gpusim.config.gpu.PowerConfig`):

====================  ==========================================================================
component             activity (where the run recorded it)
====================  ==========================================================================
``idle``              the run's duration (``Result.time_s``)
``matrix``            FLOPs on the matrix units, as CU-cycles at their peak rate (``Result.kernels``:
                      ``math_cu_cycles`` of the kernels whose ``math_units`` are ``matrix``)
``vector``            FLOPs on the vector units, the same way
``l2``                bytes read from and written to the L2 (``Result.l2``)
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

:func:`power_timeline` spreads the same energies over the run's time bins: each kernel's
arithmetic evenly over the kernel, the L2's, DRAM's and links' over the bins their bytes moved in
(the GPU's row activations with its DRAM bytes), the near-bank ALUs' over their commands' spans.

The clocks do not react to power (the simulator keeps the configured clock); :func:`power`
flags a GPU whose average power exceeds its limit, where real hardware would run slower.  In
symmetric mode only GPU 0 is simulated, and only its rows appear: every GPU does the same work.
Kernels that count no FLOPs (collectives' reductions, row reductions' instructions, near-bank
commands' issue) cost only their data movement and the idle power.  A trace replayed with layer
caching simulates only some of its rows, so its activity is incomplete: :func:`energy` refuses it
(replay with ``cache_layers=False``, ``gpusim simulate --no-cache``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from gpusim.config.gpu import PowerConfig
from gpusim.errors import ConfigError, SimulationError

if TYPE_CHECKING:
    from gpusim.results import Result

ENERGY_COLUMNS = ["gpu", "component", "amount", "unit", "energy_j"]
"""Columns of :func:`energy`: one row per GPU and component; ``amount`` of the activity in ``unit``."""

POWER_COLUMNS = ["gpu", "time_s", "energy_j", "average_w", "tdp_w", "over_tdp"]
"""Columns of :func:`power`: one row per simulated GPU."""

TIMELINE_COLUMNS = ["t_s", "idle_w", "compute_w", "l2_w", "dram_w", "nmc_w", "links_w", "total_w"]
"""Columns of :func:`power_timeline`: one row per time bin of the run."""

PJ = 1e-12
NJ = 1e-9


def power_config(result: Result) -> PowerConfig:
    """The power model of the GPU that ``result`` ran on.

    Raises
    ------
    ConfigError
        If the system's GPU has no ``power`` section.
    SimulationError
        If ``result`` is a trace replayed with layer caching (its activity is incomplete).
    """
    gpu = result.config.get("gpu", {})
    section = gpu.get("power")
    if section is None:
        raise ConfigError(
            f"system {result.config.get('name', '?')!r}: its GPU {gpu.get('name', '?')!r} has no 'power' section, "
            "so its energy cannot be estimated; add one to the GPU's YAML (fields: see gpusim.config.gpu.PowerConfig; "
            "hwconfigs/gpus/h100-sxm5.yaml has one) or override it (gpu.power.tdp_watts=..., every field)"
        )
    rows, simulated = result.stats.get("trace_rows"), result.stats.get("simulated_rows")
    if rows is not None and simulated is not None and simulated < rows:
        raise SimulationError(
            f"layer caching simulated {simulated} of the trace's {rows} rows, so the run's activity is incomplete "
            "and its energy unknown; replay with cache_layers=False (gpusim simulate --no-cache)"
        )
    return PowerConfig.model_validate(section)


def _gpus(result: Result) -> list[int]:
    """The simulated GPUs: those with an op, a counter or DRAM traffic."""
    ranks = set(int(g) for g in result.ops["gpu"]) if not result.ops.empty else set()
    ranks.update(int(key[3:key.index(".")]) for key in result.counters if key.startswith("gpu") and "." in key)
    if not result.dram.empty:
        ranks.update(int(g) for g in result.dram["gpu"].unique())
    return sorted(ranks)


def _math_cu_cycles(result: Result, gpu: int, units: str) -> float:
    """CU-cycles at full rate the kernels of ``gpu`` kept ``units`` busy."""
    kernels = result.kernels
    if "math_units" not in kernels.columns:
        return 0.0
    mine = kernels[(kernels["gpu"] == gpu) & (kernels["math_units"] == units)]
    return float(mine["math_cu_cycles"].sum())


def _activations(result: Result, gpu: int) -> tuple[float, float]:
    """Physical row activations of ``gpu``: for the GPU's requests, and for near-bank commands."""
    lockstep = int(result.config["gpu"]["hbm"].get("lockstep_channels", 1))
    counters = result.counters
    counted = counters.get(f"gpu{gpu}.dram_activations", 0.0)
    runs = counters.get(f"gpu{gpu}.dram_run_activations", 0.0)
    nmc = counters.get(f"gpu{gpu}.nmc_activations", 0.0)
    return (counted - runs - nmc) * lockstep + runs, nmc


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
    counters = result.counters
    dram = result.dram.groupby(["gpu", "direction"])["bytes"].sum() if not result.dram.empty else pd.Series(dtype=float)
    l2 = result.l2.groupby("gpu")["bytes"].sum() if not result.l2.empty else pd.Series(dtype=float)
    sent = result.links.groupby("src")["bytes"].sum() if not result.links.empty else pd.Series(dtype=float)
    rows = []
    for gpu in _gpus(result):
        read, write, update = (float(dram.get((gpu, direction), 0.0)) for direction in ("read", "write", "update"))
        nmc_read, nmc_write, nmc_update = (float(counters.get(f"gpu{gpu}.nmc_bytes_{kind}", 0.0))
                                           for kind in ("read", "write", "update"))
        activations = sum(_activations(result, gpu))
        activity = [
            ("idle", result.time_s, "s", config.idle_watts),
            ("matrix", _math_cu_cycles(result, gpu, "matrix"), "CU-cycles at peak", config.matrix_pj_per_cu_cycle * PJ),
            ("vector", _math_cu_cycles(result, gpu, "vector"), "CU-cycles at peak", config.vector_pj_per_cu_cycle * PJ),
            ("l2", float(l2.get(gpu, 0.0)), "bytes", config.l2_pj_per_byte * PJ),
            ("dram_activate", activations, "activations", config.dram_activate_nj * NJ),
            ("dram_array", read + write + 2 * update, "bytes", config.dram_array_pj_per_byte * PJ),
            ("dram_io", read + write + update, "bytes", config.dram_io_pj_per_byte * PJ),
            ("nmc_bank", nmc_read + nmc_write + 2 * nmc_update, "bytes", config.nmc_bank_pj_per_byte * PJ),
            ("nmc_alu", nmc_read + nmc_update + update, "bytes", config.nmc_alu_pj_per_byte * PJ),
            ("links", float(sent.get(gpu, 0.0)), "bytes", config.link_pj_per_byte * PJ),
        ]
        rows.extend((gpu, name, amount, unit, amount * price) for name, amount, unit, price in activity)
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)


def _spread(intervals: list[tuple[float, float, float]], bins: np.ndarray, bin_s: float) -> np.ndarray:
    """Energy per bin, J, of ``(start_s, end_s, joules)`` intervals, each spread evenly over its time."""
    spent = np.zeros(len(bins))
    if not len(bins):
        return spent
    first = int(bins[0])
    for start, end, joules in intervals:
        if joules == 0:
            continue
        if end <= start:
            spent[min(max(int(start // bin_s) - first, 0), len(bins) - 1)] += joules
            continue
        for index in range(int(start // bin_s), int(np.ceil(end / bin_s))):
            overlap = min(end, (index + 1) * bin_s) - max(start, index * bin_s)
            if overlap > 0 and 0 <= index - first < len(bins):
                spent[index - first] += joules * overlap / (end - start)
    return spent


def _per_bin(table: pd.DataFrame, joules_per_byte: np.ndarray | float, result: Result, bins: np.ndarray) -> np.ndarray:
    """Energy per bin, J, of traffic rows (their ``t_s`` and ``bytes``) at ``joules_per_byte``."""
    spent = np.zeros(len(bins))
    if table.empty or not len(bins):
        return spent
    index = result._bin_of(table["t_s"]) - int(bins[0])
    inside = (index >= 0) & (index < len(bins))
    joules = table["bytes"].to_numpy(dtype=float) * joules_per_byte
    np.add.at(spent, index[inside], joules[inside])
    return spent


def power_timeline(result: Result, gpu: int = 0) -> pd.DataFrame:
    """Power of ``gpu`` per time bin of the run, W, by kind of activity (:data:`TIMELINE_COLUMNS`).

    ``compute_w`` is the matrix and vector units'; ``dram_w`` the GPU's DRAM traffic with its row
    activations; ``nmc_w`` the near-bank ALUs' (their bank accesses, arithmetic and activations).
    Summed over the bins and multiplied by the bin width, each column gives the energy of its
    components in :func:`energy` (idle: over whole bins).  The L2's bytes are booked in the bin in
    which they were requested, and a workgroup requests a chunk's data at once, so single bins
    can show several times the power the L2 draws over a few microseconds; power limits act over
    milliseconds, so judge the timeline over many bins (``Result.bin_s`` wide, 5 us by default).
    """
    config = power_config(result)
    bins = result._bins()
    bin_s = result.bin_s
    kernels = result.kernels
    compute: list[tuple[float, float, float]] = []
    if "math_units" in kernels.columns:
        mine = kernels[kernels["gpu"] == gpu]
        units = mine["math_units"].to_numpy(dtype=object)
        price = np.where(units == "matrix", config.matrix_pj_per_cu_cycle,
                         np.where(units == "vector", config.vector_pj_per_cu_cycle, 0.0)) * PJ
        cycles = np.nan_to_num(mine["math_cu_cycles"].to_numpy(dtype=float))
        compute = list(zip(mine["start_s"].to_numpy(dtype=float), mine["end_s"].to_numpy(dtype=float), cycles * price))
    l2 = result.l2[result.l2["gpu"] == gpu]
    dram = result.dram[result.dram["gpu"] == gpu]
    update = dram["direction"].to_numpy(dtype=object) == "update"
    array, io, alu = config.dram_array_pj_per_byte, config.dram_io_pj_per_byte, config.nmc_alu_pj_per_byte
    dram_j = _per_bin(dram, np.where(update, 2 * array + io + alu, array + io) * PJ, result, bins)
    activations, nmc_activations = _activations(result, gpu)
    if dram_j.sum() > 0:
        dram_j += activations * config.dram_activate_nj * NJ * dram_j / dram_j.sum()
    counters = result.counters
    nmc_total = (config.nmc_bank_pj_per_byte * PJ * sum(
        counters.get(f"gpu{gpu}.nmc_bytes_{kind}", 0.0) * (2 if kind == "update" else 1)
        for kind in ("read", "write", "update"))
        + config.nmc_alu_pj_per_byte * PJ * (counters.get(f"gpu{gpu}.nmc_bytes_read", 0.0)
                                              + counters.get(f"gpu{gpu}.nmc_bytes_update", 0.0))
        + nmc_activations * config.dram_activate_nj * NJ)
    commands = [(span.start_ns * 1e-9, span.end_ns * 1e-9) for span in result.spans
                if span.category == "nmc" and span.gpu == gpu]
    busy = sum(end - start for start, end in commands)
    nmc_j = _spread([(start, end, nmc_total * (end - start) / busy) for start, end in commands], bins, bin_s) \
        if busy > 0 else np.zeros(len(bins))
    links = result.links[result.links["src"] == gpu]
    parts = {
        "idle_w": np.full(len(bins), config.idle_watts),
        "compute_w": _spread(compute, bins, bin_s) / bin_s,
        "l2_w": _per_bin(l2, config.l2_pj_per_byte * PJ, result, bins) / bin_s,
        "dram_w": dram_j / bin_s,
        "nmc_w": nmc_j / bin_s,
        "links_w": _per_bin(links, config.link_pj_per_byte * PJ, result, bins) / bin_s,
    }
    table = pd.DataFrame({"t_s": bins * bin_s, **parts})
    table["total_w"] = table[list(parts)].sum(axis=1)
    return table[TIMELINE_COLUMNS]


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


def has_energy(result: Result) -> bool:
    """Whether :func:`energy` can price ``result``: its GPU has a power model and every row of a
    replayed trace was simulated."""
    try:
        power_config(result)
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
