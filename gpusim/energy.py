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
``dram_activate``     physical row activations for the GPU's requests (``dram_activations``
                      less the near-bank ones: a simulated row is ``lockstep_channels`` physical
                      rows; ``dram_run_activations`` are physical already)
``dram_array``        bytes read or written in the banks for the GPU (``Result.dram``; an
                      op-and-store reads and writes: twice)
``dram_io``           bytes between the DRAM stacks and the GPU (``Result.dram``)
``nmc_activate``      the near-bank ALUs' row activations (``nmc_activations``, physical)
``nmc_bank``          bytes the near-bank ALUs read and write in their banks (``nmc_bytes_*``)
``nmc_alu``           bytes of operands the near-bank ALUs and op-and-stores combine
``links``             bytes the GPU sends over links, switch and network (``Result.links``)
====================  ==========================================================================

:func:`power_timeline` spreads the same energies over the run's time bins: each kernel's
arithmetic evenly over the kernel, the L2's, DRAM's and links' over the bins their bytes moved in
(the GPU's row activations with its DRAM bytes), the near-bank ALUs' over their commands' spans
(:func:`_parts` describes each component once for both).

The clocks do not react to power (the simulator keeps the configured clock); :func:`power`
flags a GPU whose average power exceeds its limit, where real hardware would run slower.  The
voltage is held at every clock unless the power section's ``voltage_scaling`` says how it follows
the SM clock: then the matrix, vector and L2 prices scale with its square.  In
symmetric mode only GPU 0 is simulated, and only its rows appear: every GPU does the same work.
Kernels that count no FLOPs (collectives' reductions, row reductions' instructions, near-bank
commands' issue) cost only their data movement and the idle power.

A trace replayed with layer caching simulates one representative of each run of identical layers
(:mod:`gpusim.trace.caching`).  The kernels of the layers it stands for are in ``Result.kernels``,
so their arithmetic is counted; their DRAM, L2 and link bytes are those of one layer's span on the
same GPU (``Result.stats["replica_windows"]``, :func:`gpusim.trace.caching.replica_windows`), once
per left-out layer, and the row activations and near-bank counters grow with the DRAM bytes.
Those bytes lie in the simulated timeline, not in the re-timed one, so such a result has energies
but no :func:`power_timeline` (replay with ``cache_layers=False``, ``gpusim simulate --no-cache``,
for one).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    """
    gpu = result.config.get("gpu", {})
    section = gpu.get("power")
    if section is None:
        raise ConfigError(
            f"system {result.config.get('name', '?')!r}: its GPU {gpu.get('name', '?')!r} has no 'power' section, "
            "so its energy cannot be estimated; add one to the GPU's YAML (fields: see gpusim.config.gpu.PowerConfig; "
            "hwconfigs/gpus/h100-sxm5.yaml has one) or override it (gpu.power.tdp_watts=..., every field)"
        )
    return PowerConfig.model_validate(section)


def _check_timeline(result: Result) -> None:
    """Raise :class:`SimulationError` where ``result``'s traffic is not in its ops' timeline (layer caching)."""
    if not result.traffic_on_timeline:
        rows, simulated = result.stats["trace_rows"], result.stats["simulated_rows"]
        raise SimulationError(
            f"layer caching simulated {simulated} of the trace's {rows} rows, so its traffic lies in the simulated "
            "rows' timeline, not in the re-timed one, and it has no power timeline (its energy() is estimated); "
            "replay with cache_layers=False (gpusim simulate --no-cache)"
        )


def _replicated(table: pd.DataFrame, windows: list[dict], bin_s: float) -> float:
    """Bytes of ``table`` (rows of ``t_s``, the start of a time bin, and ``bytes``) inside each of
    ``windows`` (:func:`gpusim.trace.caching.replica_windows`), times its ``copies``, summed; a bin
    on a window's edge counts by its overlap."""
    if table.empty or not windows:
        return 0.0
    starts = table["t_s"].to_numpy(dtype=float)
    moved = table["bytes"].to_numpy(dtype=float)
    total = 0.0
    for window in windows:
        inside = np.minimum(starts + bin_s, window["end_s"]) - np.maximum(starts, window["start_s"])
        total += window["copies"] * float(np.clip(inside, 0.0, None) @ moved) / bin_s
    return total


def _gpus(result: Result) -> list[int]:
    """The simulated GPUs: those with an op, a counter or DRAM traffic."""
    ranks = set(int(g) for g in result.ops["gpu"]) if not result.ops.empty else set()
    ranks.update(int(key[3:key.index(".")]) for key in result.counters if key.startswith("gpu") and "." in key)
    if not result.dram.empty:
        ranks.update(int(g) for g in result.dram["gpu"].unique())
    return sorted(ranks)


@dataclass(frozen=True)
class _Part:
    """Some of a component's activity on one GPU: ``amount`` in ``unit`` at ``price`` J each,
    spread over time as ``shape`` says (:func:`power_timeline`).

    ``shape`` is ``("idle",)``, ``("kernels", units)`` (the kernels on those units, each in
    proportion to its CU-cycles), ``("l2",)``, ``("links",)``, ``("dram", weights)`` (the GPU's DRAM
    bins, each direction's bytes weighted) or ``("nmc",)`` (the near-bank commands' spans).
    """

    component: str
    amount: float
    unit: str
    price: float
    shape: tuple


TIMELINE_OF = {"idle": "idle_w", "matrix": "compute_w", "vector": "compute_w", "l2": "l2_w", "dram_activate": "dram_w",
               "dram_array": "dram_w", "dram_io": "dram_w", "nmc_activate": "nmc_w", "nmc_bank": "nmc_w",
               "nmc_alu": "nmc_w", "links": "links_w"}
"""The :func:`power_timeline` column of each component of :func:`energy`."""


def _parts(result: Result, gpu: int, config: PowerConfig) -> list[_Part]:
    """Every component's activity on ``gpu``, priced (the module's table)."""
    counters = result.counters

    def counted(name: str) -> float:
        return float(counters.get(f"gpu{gpu}.{name}", 0.0))

    kernels = result.kernels
    cycles = dict.fromkeys(("matrix", "vector"), 0.0)
    if "math_units" in kernels.columns:
        mine = kernels[kernels["gpu"] == gpu]
        cycles.update(mine.groupby("math_units")["math_cu_cycles"].sum().to_dict())
    windows = [window for window in result.stats.get("replica_windows", []) if window["gpu"] == gpu]

    def moved(table: pd.DataFrame) -> float:
        """Bytes of a traffic table, with the layers that layer caching left out (module doc)."""
        return float(table["bytes"].sum()) + _replicated(table, windows, result.bin_s)

    traffic = result.dram[result.dram["gpu"] == gpu]
    read, write, update = (moved(traffic[traffic["direction"] == direction]) for direction in ("read", "write", "update"))
    simulated_bytes = float(traffic["bytes"].sum())
    grown = (read + write + update) / simulated_bytes if simulated_bytes > 0 else 1.0
    nmc_read, nmc_write, nmc_update = (grown * counted(f"nmc_bytes_{kind}") for kind in ("read", "write", "update"))
    lockstep = int(result.config["gpu"]["hbm"].get("lockstep_channels", 1))
    runs, nmc_activations = grown * counted("dram_run_activations"), grown * counted("nmc_activations")
    activations = (grown * counted("dram_activations") - runs - nmc_activations) * lockstep + runs
    all_bytes = {"read": 1.0, "write": 1.0, "update": 1.0}
    scaling = config.voltage_scaling
    core = PJ * (1.0 if scaling is None else scaling.factor(float(result.config["gpu"]["clock_hz"])))
    return [
        _Part("idle", result.time_s, "s", config.idle_watts, ("idle",)),
        _Part("matrix", cycles["matrix"], "CU-cycles at peak", config.matrix_pj_per_cu_cycle * core, ("kernels", "matrix")),
        _Part("vector", cycles["vector"], "CU-cycles at peak", config.vector_pj_per_cu_cycle * core, ("kernels", "vector")),
        _Part("l2", moved(result.l2[result.l2["gpu"] == gpu]), "bytes", config.l2_pj_per_byte * core, ("l2",)),
        _Part("dram_activate", activations, "activations", config.dram_activate_nj * NJ, ("dram", all_bytes)),
        _Part("dram_array", read + write + 2 * update, "bytes", config.dram_array_pj_per_byte * PJ,
              ("dram", {**all_bytes, "update": 2.0})),
        _Part("dram_io", read + write + update, "bytes", config.dram_io_pj_per_byte * PJ, ("dram", all_bytes)),
        _Part("nmc_activate", nmc_activations, "activations", config.dram_activate_nj * NJ, ("nmc",)),
        _Part("nmc_bank", nmc_read + nmc_write + 2 * nmc_update, "bytes", config.nmc_bank_pj_per_byte * PJ, ("nmc",)),
        _Part("nmc_alu", nmc_read + nmc_update, "bytes", config.nmc_alu_pj_per_byte * PJ, ("nmc",)),
        _Part("nmc_alu", update, "bytes", config.nmc_alu_pj_per_byte * PJ, ("dram", {"update": 1.0})),  # op-and-store
        _Part("links", moved(result.links[result.links["src"] == gpu]), "bytes", config.link_pj_per_byte * PJ,
              ("links",)),
    ]


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
    rows: dict[tuple[int, str], list] = {}
    for gpu in _gpus(result):
        for part in _parts(result, gpu, config):
            row = rows.setdefault((gpu, part.component), [gpu, part.component, 0.0, part.unit, 0.0])
            row[2] += part.amount
            row[4] += part.amount * part.price
    return pd.DataFrame(list(rows.values()), columns=ENERGY_COLUMNS)


def _spread(intervals: list[tuple[float, float, float]], bins: np.ndarray, bin_s: float) -> np.ndarray:
    """Weight per bin of ``(start_s, end_s, weight)`` intervals, each spread evenly over its time."""
    spent = np.zeros(len(bins))
    if not len(bins):
        return spent
    first = int(bins[0])
    for start, end, weight in intervals:
        if weight == 0:
            continue
        if end <= start:
            spent[min(max(int(start // bin_s) - first, 0), len(bins) - 1)] += weight
            continue
        for index in range(int(start // bin_s), int(np.ceil(end / bin_s))):
            overlap = min(end, (index + 1) * bin_s) - max(start, index * bin_s)
            if overlap > 0 and 0 <= index - first < len(bins):
                spent[index - first] += weight * overlap / (end - start)
    return spent


def _per_bin(table: pd.DataFrame, result: Result, bins: np.ndarray) -> np.ndarray:
    """Bytes per bin of traffic rows (their ``t_s`` and ``bytes``)."""
    moved = np.zeros(len(bins))
    if table.empty or not len(bins):
        return moved
    index = result.bin_of(table["t_s"]) - int(bins[0])
    inside = (index >= 0) & (index < len(bins))
    np.add.at(moved, index[inside], table["bytes"].to_numpy(dtype=float)[inside])
    return moved


def _shape(result: Result, gpu: int, shape: tuple, bins: np.ndarray, traffic: dict[str, np.ndarray]) -> np.ndarray:
    """How a part's energy falls on ``bins`` (:class:`_Part`): weights per bin (not normalised).
    ``traffic`` holds the GPU's bytes per bin: ``"l2"``, ``"links"`` and each DRAM direction."""
    kind = shape[0]
    if kind == "kernels":
        kernels = result.kernels
        if "math_units" not in kernels.columns:
            return np.zeros(len(bins))
        mine = kernels[(kernels["gpu"] == gpu) & (kernels["math_units"].to_numpy(dtype=object) == shape[1])]
        return _spread(list(zip(mine["start_s"], mine["end_s"], mine["math_cu_cycles"])), bins, result.bin_s)
    if kind == "nmc":
        commands = [(span.start_ns * 1e-9, span.end_ns * 1e-9, (span.end_ns - span.start_ns) * 1e-9)
                    for span in result.spans if span.category == "nmc" and span.gpu == gpu]
        return _spread(commands, bins, result.bin_s)
    if kind == "dram":
        return sum((weight * traffic[direction] for direction, weight in shape[1].items()), np.zeros(len(bins)))
    return traffic[kind]


def power_timeline(result: Result, gpu: int = 0) -> pd.DataFrame:
    """Power of ``gpu`` per time bin of the run, W, by kind of activity (:data:`TIMELINE_COLUMNS`).

    ``compute_w`` is the matrix and vector units' (each kernel's energy spread evenly over it);
    ``l2_w``, ``dram_w`` (with the row activations of the GPU's requests) and ``links_w`` follow the
    bytes of their time bins; ``nmc_w`` is the near-bank ALUs' (their commands' bank accesses,
    arithmetic and activations, spread over the commands' spans, and the op-and-stores'
    arithmetic, with their DRAM bytes).  Summed over the bins and multiplied by the bin width,
    each column gives the energy of its components in :func:`energy` (idle: over whole bins).  The
    L2's bytes are booked in the bin in which they were requested, and a workgroup requests a
    chunk's data at once, so single bins can show several times the power the L2 draws over a few
    microseconds; power limits act over milliseconds, so judge the timeline over many bins
    (``Result.bin_s`` wide, 5 us by default).

    Raises
    ------
    ConfigError
        If the system's GPU has no ``power`` section.
    SimulationError
        If ``result`` is a trace replayed with layer caching (module doc).
    """
    config = power_config(result)
    _check_timeline(result)
    bins = result.time_bins()
    dram = result.dram[result.dram["gpu"] == gpu]
    traffic = {direction: _per_bin(dram[dram["direction"] == direction], result, bins)
               for direction in ("read", "write", "update")}
    traffic["l2"] = _per_bin(result.l2[result.l2["gpu"] == gpu], result, bins)
    traffic["links"] = _per_bin(result.links[result.links["src"] == gpu], result, bins)
    table = pd.DataFrame({"t_s": bins * result.bin_s, **{column: np.zeros(len(bins)) for column in TIMELINE_COLUMNS[1:]}})
    for part in _parts(result, gpu, config):
        column = TIMELINE_OF[part.component]
        if part.shape[0] == "idle":
            table[column] += part.price
            continue
        joules = part.amount * part.price
        weights = _shape(result, gpu, part.shape, bins, traffic)
        if joules and weights.sum() > 0:
            table[column] += joules * weights / weights.sum() / result.bin_s
    table["total_w"] = table[TIMELINE_COLUMNS[1:-1]].sum(axis=1)
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
    """Whether :func:`energy` can price ``result``: its GPU has a power model."""
    try:
        power_config(result)
    except ConfigError:
        return False
    return True


def has_power_timeline(result: Result) -> bool:
    """Whether :func:`power_timeline` can draw ``result``: it has energy, and its traffic lies in its
    ops' timeline (no layer caching left rows out)."""
    try:
        _check_timeline(result)
    except SimulationError:
        return False
    return has_energy(result)


def describe(result: Result) -> str | None:
    """One line on the run's energy and average power per GPU, or ``None`` where the GPU has no
    power model."""
    try:
        table = power(result)
    except ConfigError:
        return None
    if not table["average_w"].notna().any():  # nothing ran, or it took no time
        return None
    worst = table.loc[table["average_w"].idxmax()]
    idle = len(table) - result.ops["gpu"].nunique()
    idling = f", {idle} of them idle (priced at idle power)" if idle > 0 else ""
    line = (f"energy {table['energy_j'].sum():.4g} J over {len(table)} simulated GPU(s){idling}; average power up to "
            f"{worst['average_w']:.0f} W (GPU {int(worst['gpu'])}; limit {worst['tdp_w']:.0f} W)")
    if result.stats.get("replica_windows"):
        line += "; the layers that layer caching left out are priced as their representatives"
    if bool(table["over_tdp"].any()):
        line += ": over the limit, where real hardware would lower its clock and run longer"
    return line
