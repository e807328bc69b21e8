"""The T3 study (dissertation chapter 8): fused GEMM -> reduce-scatter against the sequential baseline.

Every number here comes out of simulations of the sub-layers' GEMMs and collectives on the
dissertation's Table 8.1 system; the "ideal" configurations combine isolated simulated times as
section 8.4.3 defines them.  The functions return DataFrames; ``validation/t3/reproduce.py`` puts the
dissertation's numbers beside them and ``notebooks/t3_explore.ipynb`` sweeps parameters.

Workloads (Table 8.2) are given by their hyperparameters; the sub-layer GEMMs follow from Megatron's
tensor slicing (:func:`sublayer_gemm`).  Configurations (section 8.4.3):

``sequential``
    the sliced GEMM, then a CU-driven ring reduce-scatter on all CUs, then the all-gather
    (the GPU's default memory-controller policy, FR-FCFS);
``t3``
    :class:`gpusim.ops.GemmReduceScatter` (track & trigger, DMA, near-memory updates, staggering)
    then the all-gather, with the naive round-robin memory-controller arbitration between streams;
``t3-mca``
    the same with T3's communication-aware arbitration (``memory_policy="t3-mca"``);
``ideal-overlap``
    ``max(GEMM, RS) + AG`` of the sequential run's isolated (non-overlapping) kernels;
``ideal-rs-nmc``
    ``max(GEMM, RS with NMC) + AG``, the reduce-scatter driven by DMA with near-memory updates.

Beside them, what software can do without T3's hardware (section 8.2.1): the GEMM decomposed into
one kernel per chunk with a CU-driven ring reduce-scatter on a few CUs of its own consuming the
chunks as they finish; and the same decomposition with the reduce-scatter on the DMA engines and
near-memory updates, T3 without its tracker (:func:`simulate_decomposed`, :func:`software_overlap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpusim import ops
from gpusim.checks import is_positive_int, known_name, positive_int, table_with
from gpusim.energy import power
from gpusim.errors import ConfigError
from gpusim.sched.executor import Stream
from gpusim.simulate import run
from gpusim.system import load_system

DTYPE = "fp16"
DTYPE_BYTES = 2


@dataclass(frozen=True)
class TransformerSetup:
    """A model of Table 8.2 and how it is deployed.

    Attributes
    ----------
    name
        Model name.
    hidden
        Hidden size H.
    layers
        Transformer layers L.
    seq_len, batch
        Input sequence length and batch size (tokens = seq_len x batch).
    tp
        Tensor-parallel degrees studied.
    """

    name: str
    hidden: int
    layers: int
    seq_len: int
    batch: int
    tp: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """Tokens per iteration (rows of the activations)."""
        return self.seq_len * self.batch


MODELS: dict[str, TransformerSetup] = {
    setup.name: setup
    for setup in (
        TransformerSetup("Mega-GPT-2", 3072, 74, 1024, 16, (8, 16)),
        TransformerSetup("T-NLG", 4256, 78, 1024, 8, (8, 16)),
        TransformerSetup("GPT-3", 12288, 96, 1024, 2, (32,)),
        TransformerSetup("PaLM", 18432, 118, 1024, 2, (32,)),
        TransformerSetup("MT-NLG", 20480, 105, 1024, 2, (32,)),
    )
}
"""Dissertation Table 8.2 (GPT-3 12K, PaLM 18K and MT-NLG 20K hidden sizes are the models' 12288,
18432 and 20480)."""

MAIN_MODELS = ("Mega-GPT-2", "T-NLG")
LARGE_MODELS = ("GPT-3", "PaLM", "MT-NLG")
SUBLAYERS = ("OP", "FC-2", "FC-1", "IP")
"""Sub-layers whose sliced GEMM is followed by an all-reduce: output projection and FC-2 in the
forward pass, FC-1 and input projection in the backward pass."""
PASSES = {"OP": "fwd", "FC-2": "fwd", "FC-1": "bwd", "IP": "bwd"}
CONFIGS = ("sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc")
SIMULATED = ("sequential", "t3", "t3-mca", "rs-nmc")
"""What :func:`simulate_case` runs; the ideal configurations are combined from these."""
POLICIES = {"sequential": None, "t3": "round-robin", "t3-mca": "t3-mca", "rs-nmc": None}
DRAM_CATEGORIES = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write")


def _model(name: str):
    """The setup of one of :data:`MODELS`, or a clear error listing them."""
    return MODELS[known_name("model", name, MODELS)]


def sublayer_gemm(model: str, sublayer: str, tp: int, tokens: int | None = None) -> dict[str, Any]:
    """The sliced GEMM of a sub-layer under Megatron tensor slicing over ``tp`` GPUs.

    Each GPU multiplies the activations (tokens x a 1/tp slice of the inner dimension) by its slice
    of the weights and produces a full-size partial output (tokens x H) that must be all-reduced:

    - OP (fwd): ``[T, H/tp] x [H/tp, H]``, weights transposed (``y = x W^T``);
    - FC-2 (fwd): ``[T, 4H/tp] x [4H/tp, H]``, weights transposed;
    - FC-1 (bwd, input gradient): ``[T, 4H/tp] x [4H/tp, H]``, not transposed;
    - IP (bwd, input gradient of the QKV projection): ``[T, 3H/tp] x [3H/tp, H]``, not transposed.

    ``tokens`` replaces the model's ``T = seq_len x batch`` (for smaller experiments).

    Returns
    -------
    dict
        ``m, n, k, trans_a, trans_b`` of :class:`gpusim.ops.Gemm`.
    """
    setup = _model(model)
    inner = {"OP": 1, "FC-2": 4, "FC-1": 4, "IP": 3}
    known_name("sub-layer", sublayer, SUBLAYERS)
    if not is_positive_int(tp):
        raise ConfigError(f"{model}: tp must be a positive number of GPUs, got {tp!r}")
    if tokens is not None:
        positive_int("tokens", tokens, model)
    if setup.hidden * inner[sublayer] % tp:
        raise ConfigError(f"{model}: {inner[sublayer]} x H = {setup.hidden * inner[sublayer]} does not split {tp} ways")
    return {
        "m": setup.tokens if tokens is None else tokens,
        "n": setup.hidden,
        "k": setup.hidden * inner[sublayer] // tp,
        "trans_a": False,
        "trans_b": PASSES[sublayer] == "fwd",
    }


RING_TPS = (8, 16, 32)
"""Tensor-parallel degrees with a ring node preset (``t3-ring8``, ``t3-ring16``, ``t3-ring32``)."""


def node_for(tp: int) -> str:
    """The ring node preset with ``tp`` GPUs (``t3-ring8``, ``t3-ring16``, ``t3-ring32``).

    Raises
    ------
    ConfigError
        ``tp`` is not one of :data:`RING_TPS`.
    """
    if not (is_positive_int(tp) and tp in RING_TPS):
        raise ConfigError(f"tp must be one of {', '.join(map(str, RING_TPS))} (the t3-ring node presets), got {tp!r}")
    return f"t3-ring{tp}"


def case_ops(model: str, sublayer: str, tp: int, simulated: str, tokens: int | None = None) -> list[ops.Op]:
    """The ops of one sub-layer in one simulated configuration (see :data:`SIMULATED`)."""
    shape = sublayer_gemm(model, sublayer, tp, tokens)
    nbytes = shape["m"] * shape["n"] * DTYPE_BYTES
    gather = ops.AllGather(nbytes, dtype=DTYPE, input="y", name="AG")
    if simulated == "sequential":
        return [
            ops.Gemm(**shape, dtype=DTYPE, out="y", name="GEMM"),
            ops.ReduceScatter(nbytes, dtype=DTYPE, input="y", name="RS"),
            gather,
        ]
    if simulated in ("t3", "t3-mca"):
        return [ops.GemmReduceScatter(**shape, dtype=DTYPE, out="y", name="GEMM+RS"), gather]
    if simulated == "rs-nmc":
        return [ops.ReduceScatter(nbytes, dtype=DTYPE, input="y", driver="dma", name="RS+NMC")]
    raise ConfigError(f"unknown simulated configuration {simulated!r}; known: {', '.join(SIMULATED)}")


def dram_categories(result) -> dict[str, float]:
    """DRAM bytes of GPU 0 split into GEMM, RS and AG reads and writes (Fig. 8.16).

    Compute-stream traffic is the GEMM's (its reads, and its output's writes, write-backs included);
    communication-stream traffic belongs to the reduce-scatter until the all-gather starts and to the
    all-gather after.  Updates count as writes.
    """
    dram = result.dram[result.dram["gpu"] == 0]
    gather_start = result.ops.loc[(result.ops["name"] == "AG") & (result.ops["gpu"] == 0), "start_s"]
    boundary = float(gather_start.iloc[0]) if len(gather_start) else math.inf
    write = dram["direction"] != "read"
    compute = dram["stream"] == "compute"
    before = dram["t_s"] + result.bin_s / 2 < boundary
    totals = {
        "gemm_read": dram.loc[compute & ~write, "bytes"].sum(),
        "gemm_write": dram.loc[compute & write, "bytes"].sum(),
        "rs_read": dram.loc[~compute & ~write & before, "bytes"].sum(),
        "rs_write": dram.loc[~compute & write & before, "bytes"].sum(),
        "ag_read": dram.loc[~compute & ~write & ~before, "bytes"].sum(),
        "ag_write": dram.loc[~compute & write & ~before, "bytes"].sum(),
    }
    return {f"dram_{name}": float(value) for name, value in totals.items()}


def simulate_case(
    model: str,
    tp: int,
    sublayer: str,
    config: str,
    mode: str = "symmetric",
    overrides: dict[str, Any] | None = None,
    bin_s: float = 2e-6,
    tokens: int | None = None,
) -> dict[str, Any]:
    """Simulate one sub-layer in one configuration of :data:`SIMULATED`; a top-level sweep function.

    ``overrides`` change the hardware (``{"gpu.num_cus": 160}``); ``tokens`` the activations' rows.

    Returns
    -------
    dict
        ``time_s`` (the sub-layer), ``gemm_s``, ``rs_s``, ``ag_s`` (the kernels' durations; for the
        fused configurations ``gemm_s`` is the fused GEMM kernel and ``rs_s`` the rest of the fused
        op), ``dram_*`` categories of GPU 0, GPU 0's ``energy_j`` and ``average_w``
        (:func:`gpusim.energy.power`), the MCA's threshold and simulator statistics.
    """
    known_name("configuration", config, SIMULATED, "simulate_case")
    system = load_system(node_for(tp), overrides or {})
    result = run(system, case_ops(model, sublayer, tp, config, tokens), mode=mode, memory_policy=POLICIES[config],
                 bin_s=bin_s)
    frame = result.ops[result.ops["gpu"] == 0].set_index("name")
    row: dict[str, Any] = {"time_s": result.time_s, "wall_s": result.stats["wall_s"], "events": result.stats["events"]}
    watts = power(result).set_index("gpu").loc[0]
    row.update(energy_j=float(watts["energy_j"]), average_w=float(watts["average_w"]))
    if config == "sequential":
        row.update(gemm_s=frame.at["GEMM", "duration_s"], rs_s=frame.at["RS", "duration_s"], ag_s=frame.at["AG", "duration_s"])
    elif config == "rs-nmc":
        row.update(rs_s=frame.at["RS+NMC", "duration_s"])
    else:
        kernels = result.kernels[(result.kernels["gpu"] == 0) & result.kernels["name"].str.startswith("gemm_rs")]
        gemm = float(kernels["duration_s"].iloc[0])
        fused = frame.at["GEMM+RS", "duration_s"]
        row.update(gemm_s=gemm, rs_s=fused - gemm, ag_s=frame.at["AG", "duration_s"])
        threshold = frame.get("mca_threshold")
        if threshold is not None and not pd.isna(threshold.get("GEMM+RS")):
            row.update(mca_threshold=float(threshold["GEMM+RS"]), mca_intensity=float(frame.at["GEMM+RS", "mca_intensity"]))
        for name in ("evictions", "max_entries"):
            row[f"tracker_{name}"] = result.counters.get(f"gpu0.tracker_{name}", 0.0)
    if config != "rs-nmc":
        row.update(dram_categories(result))
    return row


def geomean(values) -> float:
    """Geometric mean."""
    values = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(values).mean()))


def case_points(
    models=MAIN_MODELS, mode: str = "symmetric", overrides: dict[str, Any] | None = None, tps=None
) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_case`: every sub-layer of ``models`` at their TP degrees, every
    simulated configuration."""
    points = []
    for case in sublayer_cases(models, tps):
        for config in SIMULATED:
            point = {**case, "config": config, "mode": mode}
            if overrides:
                point["overrides"] = dict(overrides)
            points.append(point)
    return points


def sublayer_cases(models=MAIN_MODELS, tps=None) -> list[dict[str, Any]]:
    """``{model, tp, sublayer}`` of every sub-layer of ``models`` (one name or several) at their TP
    degrees, or at ``tps``."""
    names = [models] if isinstance(models, str) else models
    for tp in tps or ():
        node_for(tp)
    return [{"model": model, "tp": tp, "sublayer": sublayer}
            for model in names for tp in (_model(model).tp if tps is None else tps) for sublayer in SUBLAYERS]


CASE = ["model", "tp", "sublayer"]


def speedups(raw: pd.DataFrame) -> pd.DataFrame:
    """Sub-layer times and speedups over Sequential for every configuration (Fig. 8.14).

    Parameters
    ----------
    raw
        Rows of :func:`simulate_case` (with the point's ``model, tp, sublayer, config``).

    Returns
    -------
    pandas.DataFrame
        ``model, tp, sublayer, config, time_s, speedup, gemm_s, rs_s, ag_s`` for the configurations
        of :data:`CONFIGS` (ideal ones combined from the sequential run and the NMC reduce-scatter).
    """
    table_with("raw", raw, [*CASE, "config", "time_s", "gemm_s", "rs_s", "ag_s"], "speedups",
               "the rows of simulate_case with their points")
    by = {config: frame.set_index(CASE) for config, frame in raw.groupby("config")}
    absent = [config for config in ("sequential", "rs-nmc") if config not in by]
    if absent:
        raise ConfigError(f"speedups: raw has no rows of the configuration {' or '.join(absent)}; the ideal "
                          "configurations are combined from the sequential and rs-nmc runs")
    seq, nmc = by["sequential"], by["rs-nmc"]
    rows = []
    for case in seq.index:
        base = seq.loc[case]
        rs_nmc = nmc.loc[case, "rs_s"]
        times = {
            "sequential": (base["time_s"], base["gemm_s"], base["rs_s"], base["ag_s"]),
            "ideal-overlap": (max(base["gemm_s"], base["rs_s"]) + base["ag_s"], base["gemm_s"], base["rs_s"], base["ag_s"]),
            "ideal-rs-nmc": (max(base["gemm_s"], rs_nmc) + base["ag_s"], base["gemm_s"], rs_nmc, base["ag_s"]),
        }
        for config in ("t3", "t3-mca"):
            if config in by:
                fused = by[config].loc[case]
                times[config] = (fused["time_s"], fused["gemm_s"], fused["rs_s"], fused["ag_s"])
        for config in CONFIGS:
            if config in times:
                time_s, gemm_s, rs_s, ag_s = times[config]
                rows.append(dict(zip(CASE, case), config=config, time_s=time_s, speedup=base["time_s"] / time_s,
                                 gemm_s=gemm_s, rs_s=rs_s, ag_s=ag_s))
    return pd.DataFrame(rows)


def energy_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Energy and average power of one GPU per sub-layer in the simulated configurations, beside
    Sequential's (not in the dissertation, which names the effect in section 9.2; docs/energy.md).

    Parameters
    ----------
    raw
        Rows of :func:`simulate_case` (with the point's ``model, tp, sublayer, config``).

    Returns
    -------
    pandas.DataFrame
        ``model, tp, sublayer, config, time_s, energy_j, average_w, energy_ratio, power_ratio``
        (the last two over Sequential's) for Sequential, T3 and T3-MCA.
    """
    frame = raw[raw["config"].isin(["sequential", "t3", "t3-mca"])][[*CASE, "config", "time_s", "energy_j", "average_w"]]
    base = frame[frame["config"] == "sequential"].set_index(CASE)
    keys = pd.MultiIndex.from_frame(frame[CASE])
    frame = frame.assign(energy_ratio=frame["energy_j"].to_numpy() / base["energy_j"].reindex(keys).to_numpy(),
                         power_ratio=frame["average_w"].to_numpy() / base["average_w"].reindex(keys).to_numpy())
    return frame.reset_index(drop=True)


def dram_table(raw: pd.DataFrame) -> pd.DataFrame:
    """DRAM bytes of one GPU per sub-layer, configuration and category (Fig. 8.16): long format
    ``model, tp, sublayer, config, category, bytes`` (categories of :data:`DRAM_CATEGORIES`)."""
    frame = raw[raw["config"].isin(["sequential", "t3", "t3-mca"])]
    columns = [f"dram_{name}" for name in DRAM_CATEGORIES]
    long = frame.melt(id_vars=CASE + ["config"], value_vars=columns, var_name="category", value_name="bytes")
    long["category"] = long["category"].str.removeprefix("dram_")
    return long.sort_values(CASE + ["config", "category"]).reset_index(drop=True)


def dram_reductions(dram: pd.DataFrame, config: str = "t3-mca") -> pd.DataFrame:
    """Per case: total DRAM bytes of Sequential and ``config``, the fractional reduction, and the
    ratio of reduce-scatter reads (Sequential / ``config``)."""
    table = dram.pivot_table(index=CASE, columns=["config", "category"], values="bytes", aggfunc="sum")
    rows = []
    for case in table.index:
        seq = table.loc[case, "sequential"]
        new = table.loc[case, config]
        rows.append(dict(zip(CASE, case), sequential_bytes=seq.sum(), bytes=new.sum(), reduction=1 - new.sum() / seq.sum(),
                         rs_read_ratio=seq["rs_read"] / new["rs_read"], gemm_read_ratio=seq["gemm_read"] / new["gemm_read"],
                         write_ratio=(seq["gemm_write"] + seq["rs_write"]) / (new["gemm_write"] + new["rs_write"])))
    return pd.DataFrame(rows)


def nmc_reduce_scatter(raw: pd.DataFrame) -> pd.DataFrame:
    """Per TP degree: how much faster the DMA-driven reduce-scatter with near-memory updates is than
    the CU-driven one (geomean over the cases)."""
    seq = raw[raw["config"] == "sequential"].set_index(CASE)["rs_s"]
    nmc = raw[raw["config"] == "rs-nmc"].set_index(CASE)["rs_s"]
    ratio = (seq / nmc).rename("speedup").reset_index()
    return ratio.groupby("tp", as_index=False)["speedup"].agg(geomean)


# -- Fig. 8.4: sharing CUs between the GEMM and the all-reduce ---------------------------------------
CU_SPLITS = ((80, 80), (72, 8), (64, 16))
"""(GEMM CUs, all-reduce CUs); (80, 80) is each with the whole GPU in isolation."""


def _allreduce_on_last_cus(system, model: str, sublayer: str, tp: int, cus: int) -> tuple[ops.AllReduce, Stream]:
    """The sub-layer's all-reduce on ``cus`` channels and a stream masked to the GPU's last ``cus`` CUs."""
    shape = sublayer_gemm(model, sublayer, tp)
    total = system.gpu.num_cus
    if not (is_positive_int(cus) and cus <= total):
        raise ConfigError(f"{model} {sublayer}: the all-reduce's cus must be a number of CUs from 1 to {total}, got {cus!r}")
    return (ops.AllReduce(shape["m"] * shape["n"] * DTYPE_BYTES, dtype=DTYPE, channels=cus),
            Stream("allreduce", cu_mask=tuple(range(total - cus, total))))


def simulate_allreduce(model: str, sublayer: str, tp: int, cus: int, mode: str = "symmetric",
                       overrides: dict[str, Any] | None = None) -> float:
    """The sub-layer's all-reduce alone on the last ``cus`` CUs of every GPU, simulated seconds.

    ``overrides`` change the hardware (``{"collectives.channel_inflight_bytes": 16384}``).
    """
    system = load_system(node_for(tp), overrides or {})
    allreduce, stream = _allreduce_on_last_cus(system, model, sublayer, tp, cus)
    return run(system, [allreduce], streams=[stream], mode=mode).time_s


def simulate_cu_split(model: str, sublayer: str, tp: int, gemm_cus: int, ar_cus: int, mode: str = "symmetric") -> dict[str, Any]:
    """The sub-layer's GEMM and all-reduce with CU budgets (a top-level sweep function).

    Returns ``gemm_s`` (GEMM alone on its first ``gemm_cus`` CUs), ``ar_s`` (all-reduce alone on
    ``ar_cus`` CUs, as :func:`simulate_allreduce`) and, for a real split, ``concurrent_s`` (both at
    once on disjoint CUs, sharing the memory).
    """
    system = load_system(node_for(tp))
    shape = sublayer_gemm(model, sublayer, tp)
    allreduce, ar_stream = _allreduce_on_last_cus(system, model, sublayer, tp, ar_cus)
    if not (is_positive_int(gemm_cus) and gemm_cus <= system.gpu.num_cus):
        raise ConfigError(f"{model} {sublayer}: gemm_cus must be a number of CUs from 1 to {system.gpu.num_cus}, "
                          f"got {gemm_cus!r}")
    gemm_stream = Stream("gemm", cu_mask=tuple(range(gemm_cus)))
    gemm = run(system, [ops.Gemm(**shape, dtype=DTYPE)], streams=[gemm_stream], mode=mode)
    alone = run(system, [allreduce.copy()], streams=[ar_stream], mode=mode)
    row = {"gemm_s": gemm.time_s, "ar_s": alone.time_s}
    if gemm_cus + ar_cus <= system.gpu.num_cus:
        both = run(system, [ops.Gemm(**shape, dtype=DTYPE), allreduce.copy()], streams=[gemm_stream, ar_stream], mode=mode)
        row["concurrent_s"] = both.time_s
    return row


def cu_sharing_points(cases=(("Mega-GPT-2", "OP"), ("Mega-GPT-2", "FC-2"), ("T-NLG", "OP"), ("T-NLG", "FC-2")), tp: int = 8):
    """Sweep points of :func:`simulate_cu_split` for Fig. 8.4 (TP=8, attention output projection and FC-2)."""
    return [{"model": m, "sublayer": s, "tp": tp, "gemm_cus": g, "ar_cus": a} for m, s in cases for g, a in CU_SPLITS]


def cu_sharing(raw: pd.DataFrame) -> pd.DataFrame:
    """Fig. 8.4: per case and split, GEMM and all-reduce times normalised to their 80-CU times and the
    potential-overlap speedup ``(GEMM_80 + AR_80) / max(GEMM_A, AR_B)`` ("ideal": ``max(GEMM_80,
    AR_80)``, no sharing); ``concurrent_speedup`` runs both at once on the split."""
    rows = []
    for (model, sublayer, tp), frame in raw.groupby(["model", "sublayer", "tp"]):
        frame = frame.set_index(["gemm_cus", "ar_cus"])
        alone = frame.loc[(80, 80)]
        sequential = alone["gemm_s"] + alone["ar_s"]
        rows.append(dict(model=model, sublayer=sublayer, tp=tp, split="ideal", gemm_norm=1.0, ar_norm=1.0,
                         speedup=sequential / max(alone["gemm_s"], alone["ar_s"]), concurrent_speedup=np.nan))
        for gemm_cus, ar_cus in CU_SPLITS[1:]:
            split = frame.loc[(gemm_cus, ar_cus)]
            rows.append(dict(model=model, sublayer=sublayer, tp=tp, split=f"{gemm_cus}-{ar_cus}",
                             gemm_norm=split["gemm_s"] / alone["gemm_s"], ar_norm=split["ar_s"] / alone["ar_s"],
                             speedup=sequential / max(split["gemm_s"], split["ar_s"]),
                             concurrent_speedup=sequential / split["concurrent_s"]))
    return pd.DataFrame(rows)


# -- Software overlap by decomposition (section 8.2.1's alternative to T3) ---------------------------
DECOMPOSED_CHANNELS = (8, 16)
"""CUs the decomposed overlap's reduce-scatter may take (Fig. 8.4's 72-8 and 64-16 splits)."""
DECOMPOSED_SPLITS = (1, 2)
"""Kernels per chunk the study tries on the main models (one per rank, as Wang et al., or two)."""


def simulate_decomposed(model: str, tp: int, sublayer: str, channels: int | None = None, driver: str = "cu",
                        mode: str = "symmetric", tokens: int | None = None, splits: int = 1) -> dict[str, Any]:
    """The sub-layer with its GEMM decomposed beside its reduce-scatter (a top-level sweep function):
    :class:`gpusim.ops.DecomposedGemmReduceScatter` with the reduce-scatter on ``channels`` CUs
    (``driver="cu"``, software alone) or on the DMA engines with near-memory updates
    (``driver="dma"``: T3's hardware without its tracker), then the all-gather, on the default
    memory-controller policy; ``splits`` kernels per chunk
    (:class:`gpusim.ops.DecomposedGemmReduceScatter`).

    Returns
    -------
    dict
        ``time_s`` (the sub-layer), ``gemm_s`` (from the first GEMM chunk's start to the last one's
        end), ``exposed_rs_s`` (the rest of the overlapped op), ``ag_s`` and simulator statistics.
    """
    system = load_system(node_for(tp))
    shape = sublayer_gemm(model, sublayer, tp, tokens)
    nbytes = shape["m"] * shape["n"] * DTYPE_BYTES
    overlapped = ops.DecomposedGemmReduceScatter(**shape, dtype=DTYPE, out="y", channels=channels, driver=driver,
                                                 splits=splits, name="GEMM+RS")
    result = run(system, [overlapped, ops.AllGather(nbytes, dtype=DTYPE, input="y", name="AG")], mode=mode)
    frame = result.ops[result.ops["gpu"] == 0].set_index("name")
    chunks = result.kernels[(result.kernels["gpu"] == 0) & result.kernels["name"].str.startswith("gemm_chunk")]
    gemm_s = float(chunks["end_s"].max() - chunks["start_s"].min())
    return {"time_s": result.time_s, "gemm_s": gemm_s, "exposed_rs_s": float(frame.at["GEMM+RS", "duration_s"]) - gemm_s,
            "ag_s": float(frame.at["AG", "duration_s"]), "wall_s": result.stats["wall_s"], "events": result.stats["events"]}


def decomposed_points(models=MAIN_MODELS, channels=DECOMPOSED_CHANNELS, cases=None, splits=(1,)) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_decomposed`: every sub-layer of ``models`` at their TP degrees
    (or only ``cases``, ``(model, tp, sublayer)`` triples), on CUs for every number of ``channels``,
    and on the DMA engines, each with every number of kernels per chunk in ``splits``."""
    points = []
    for case in sublayer_cases(models):
        if cases is None or tuple(case.values()) in cases:
            for split in splits:
                extra = {} if split == 1 else {"splits": split}
                points += [{**case, "channels": c, "driver": "cu", **extra} for c in channels]
                points.append({**case, "driver": "dma", **extra})
    return points


def software_overlap(decomposed: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The decomposed overlap beside T3, per case and variant.

    Parameters
    ----------
    decomposed
        Rows of :func:`simulate_decomposed` with ``model, tp, sublayer, driver, channels`` and
        optionally ``splits`` (blank or missing: 1).
    table
        :func:`speedups` of the same cases.

    Returns
    -------
    pandas.DataFrame
        ``model, tp, sublayer, driver, channels`` (0 for the DMA engines), ``splits`` (kernels per
        chunk), ``time_s``, ``speedup`` (over Sequential), ``best`` (the fastest CU variant of the
        case, any CU split and kernels per chunk: software alone),
        ``gemm_slowdown`` (the chunked GEMM's span over Sequential's GEMM), ``exposed_rs_s``, and
        the case's ``t3_mca_speedup`` and ``ideal_overlap_speedup``.
    """
    wide = table.pivot_table(index=CASE, columns="config", values=["time_s", "speedup", "gemm_s"])
    rows = []
    if "splits" not in decomposed.columns:
        decomposed = decomposed.assign(splits=1)
    for row in decomposed.fillna({"splits": 1}).itertuples(index=False):
        case = (row.model, row.tp, row.sublayer)
        rows.append(dict(zip(CASE, case), driver=row.driver, channels=0 if row.driver == "dma" else int(row.channels),
                         splits=int(row.splits),
                         time_s=row.time_s, speedup=wide.at[case, ("time_s", "sequential")] / row.time_s,
                         gemm_slowdown=row.gemm_s / wide.at[case, ("gemm_s", "sequential")],
                         exposed_rs_s=row.exposed_rs_s,
                         t3_mca_speedup=wide.at[case, ("speedup", "t3-mca")],
                         ideal_overlap_speedup=wide.at[case, ("speedup", "ideal-overlap")]))
    frame = pd.DataFrame(rows)
    on_cus = frame["driver"] == "cu"
    fastest = frame[on_cus].groupby(CASE)["speedup"].transform("max")
    frame["best"] = on_cus & (frame["speedup"] == fastest.reindex(frame.index))
    return frame


def best_decomposed(software: pd.DataFrame) -> pd.DataFrame:
    """The best CU variant of every case of :func:`software_overlap` (``config="decomposed"``) and the
    DMA-driven one with a kernel per chunk (``config="decomposed-dma"``: T3's data path with a trigger
    per kernel) as rows of :func:`speedups`, for :func:`end_to_end`."""
    best = software[software["best"]].drop_duplicates(CASE).assign(config="decomposed")
    dma = software[(software["driver"] == "dma") & (software["splits"] == 1)].assign(config="decomposed-dma")
    return pd.concat([best, dma], ignore_index=True)[CASE + ["config", "time_s", "speedup", "channels", "splits"]]


# -- Fig. 8.15: DRAM traffic over time ---------------------------------------------------------------
def dram_timeline(model: str = "T-NLG", tp: int = 8, sublayer: str = "FC-2", bin_s: float = 10e-6,
                  mode: str = "symmetric") -> pd.DataFrame:
    """DRAM read and write bandwidth of GPU 0 over time for the isolated GEMM, T3 and T3-MCA (Fig. 8.15).

    Returns
    -------
    pandas.DataFrame
        ``config, t_s, category, gb_per_s`` with categories ``gemm_read``, ``gemm_write`` (local
        stores or updates), ``rs_read`` (DMA reads) and ``rs_write`` (incoming remote and DMA
        updates).
    """
    system = load_system(node_for(tp))
    shape = sublayer_gemm(model, sublayer, tp)
    runs = {
        "gemm": run(system, [ops.Gemm(**shape, dtype=DTYPE, out="y")], mode=mode, bin_s=bin_s),
        "t3": run(system, [ops.GemmReduceScatter(**shape, dtype=DTYPE, out="y")], mode=mode,
                  memory_policy=POLICIES["t3"], bin_s=bin_s),
        "t3-mca": run(system, [ops.GemmReduceScatter(**shape, dtype=DTYPE, out="y")], mode=mode,
                      memory_policy=POLICIES["t3-mca"], bin_s=bin_s),
    }
    frames = []
    for config, result in runs.items():
        dram = result.dram[result.dram["gpu"] == 0].copy()
        prefix = np.where(dram["stream"] == "compute", "gemm", "rs")
        dram["category"] = prefix + np.where(dram["direction"] == "read", "_read", "_write")
        table = dram.groupby(["t_s", "category"], as_index=False)["bytes"].sum()
        table["gb_per_s"] = table["bytes"] / bin_s / 1e9
        table.insert(0, "config", config)
        frames.append(table.drop(columns="bytes"))
    return pd.concat(frames, ignore_index=True)


# -- Fig. 8.17: end-to-end ---------------------------------------------------------------------------
TRACE_MODELS = {"Mega-GPT-2": "megatron-gpt2", "T-NLG": "t-nlg", "GPT-3": "gpt3", "PaLM": "palm", "MT-NLG": "mt-nlg"}
"""The workloads' model definitions (``workloads/models``) of the Table 8.2 models."""
SLICED_OPS = {
    "OP": ("attn_out", "attn_allreduce"),
    "FC-2": ("fc2", "mlp_allreduce"),
    "FC-1": ("fc1_dgrad", "mlp_allreduce_bwd"),
    "IP": ("qkv_dgrad", "attn_allreduce_bwd"),
}
"""The GEMM and all-reduce of each sliced sub-layer in a :func:`gpusim.trace.transformer` layer."""
SETTINGS = {"training": ("train", SUBLAYERS), "prompt": ("prompt", ("OP", "FC-2"))}
"""End-to-end settings: the generator's phase and the sliced sub-layers it contains."""


def _layer_trace(model: str, tp: int, setting: str):
    """``gpusim.trace.transformer(..., layers=1, head=False)`` for ``model`` at its Table 8.2 batch and
    sequence length in ``setting`` (training with its Adam step; the prompt phase without)."""
    from gpusim.trace import transformer

    setup = _model(model)
    phase = SETTINGS[known_name("setting", setting, SETTINGS)][0]
    return transformer(TRACE_MODELS[model], phase=phase, tp=tp, batch=setup.batch, seq_len=setup.seq_len,
                       layers=1, head=False, optimizer="adam" if phase == "train" else None)


def simulate_layer_rest(model: str, tp: int, setting: str, mode: str = "symmetric") -> dict[str, Any]:
    """One transformer layer of ``model`` from the workloads trace generator, simulated (a sweep function).

    The layer is ``gpusim.trace.transformer(..., layers=1, head=False)`` at the model's Table 8.2
    batch and sequence length (training with its Adam step; the prompt phase of inference without).

    Returns
    -------
    dict
        ``layer_rest_s``: the layer's operators other than its sliced sub-layers (their GEMMs and
        all-reduces); ``iteration_rest_s``: operators that run once per iteration (the embedding's
        optimizer step); ``layers``; ``trace_layer_s``: the whole simulated layer.
    """
    setup = _model(model)
    trace = _layer_trace(model, tp, setting)
    sublayers = SETTINGS[setting][1]
    result = run(load_system(node_for(tp)), trace, mode=mode)
    ops = result.ops[result.ops["gpu"] == 0]
    sliced = {f"L0.{name}" for sublayer in sublayers for name in SLICED_OPS[sublayer]}
    missing = sliced - set(ops["name"])
    if missing:
        raise ValueError(f"{model} {setting}: the trace generator's layer has no ops named {sorted(missing)}")
    in_layer = ops["name"].str.startswith("L0.")
    return {
        "layer_rest_s": float(ops.loc[in_layer & ~ops["name"].isin(sliced), "duration_s"].sum()),
        "iteration_rest_s": float(ops.loc[~in_layer, "duration_s"].sum()),
        "layers": setup.layers,
        "trace_layer_s": result.time_s,
        "wall_s": result.stats["wall_s"],
    }


def layer_points(models=MAIN_MODELS + LARGE_MODELS) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_layer_rest` for every model, TP degree and setting."""
    return [{"model": m, "tp": tp, "setting": setting} for m in models for tp in MODELS[m].tp for setting in SETTINGS]


def end_to_end(rest: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """End-to-end speedups of training and of the prompt phase (Fig. 8.17).

    An iteration is ``layers x (rest of the layer + its sliced sub-layers in the configuration) +
    once-per-iteration operators`` (the dissertation likewise scales the sliced sub-layers of a
    measured breakdown by their simulated speedups, section 8.4.1.2).  The embedding lookup and the
    output layer are left out.

    Parameters
    ----------
    rest
        Rows of :func:`simulate_layer_rest` with ``model, tp, setting``.
    table
        :func:`speedups` of the same models (``model, tp, sublayer, config, time_s``); configurations
        beyond :data:`CONFIGS` (such as :func:`best_decomposed`'s) follow them.
    """
    rows = []
    for row in rest.itertuples(index=False):
        subs = table[(table["model"] == row.model) & (table["tp"] == row.tp)].set_index(["sublayer", "config"])["time_s"]
        sublayers = SETTINGS[row.setting][1]

        def iteration(config: str, row=row, subs=subs, sublayers=sublayers) -> float:
            return row.layers * (row.layer_rest_s + sum(subs[(s, config)] for s in sublayers)) + row.iteration_rest_s

        base = iteration("sequential")
        configs = list(CONFIGS) + sorted(set(subs.index.get_level_values("config")) - set(CONFIGS))
        for config in configs:
            if all((s, config) in subs for s in sublayers):
                time_s = iteration(config)
                sliced_share = row.layers * sum(subs[(s, "sequential")] for s in sublayers) / base
                rows.append(dict(model=row.model, tp=row.tp, setting=row.setting, config=config, iteration_s=time_s,
                                 sliced_share=sliced_share, speedup=base / time_s))
    return pd.DataFrame(rows)


REPLAYED_CONFIGS: dict[str, tuple[str | None, int | None, str | None]] = {
    "sequential": (None, None, None),
    "t3": ("t3", None, None),
    "t3-mca": ("t3", None, "t3-mca"),
    "decomposed-8": ("decomposed", 8, None),
    "decomposed-dma": ("decomposed_dma", None, None),
}
"""Configurations of :func:`simulate_layer_replayed`: how
:func:`gpusim.trace.fusion.overlap_gemm_collectives` rewrites the layer (function, ring CUs) and the
memory-controller policy it is replayed with."""
GATHER_CONFIGS: dict[str, tuple[str, str]] = {
    "sequential+ag": ("sequential", "decomposed_dma"), "t3-mca+ag": ("t3-mca", "decomposed_dma"),
    "decomposed-dma+ag": ("decomposed-dma", "decomposed_dma"), "t3-mca+ag-t3": ("t3-mca", "t3"),
}
"""Configurations that also overlap each all-gather with the GEMM consuming it
(:func:`gpusim.trace.fusion.overlap_gather_gemms`), each with the :data:`REPLAYED_CONFIGS` entry it
adds this to and how: ``decomposed_dma`` (a GEMM kernel per chunk beside a DMA ring, as Transformer
Engine does for sequence parallelism) or ``t3`` (T3's tracker triggering the GEMM's workgroups as
their rows arrive, the extension of section 8.6.2).  Only a layout with such all-gathers (``sp``)
changes."""


def _replay_overlapped(trace, config: str, tp: int, mode: str, overrides: dict[str, Any] | None = None):
    """``trace`` rewritten as ``config`` says (:data:`REPLAYED_CONFIGS`, :data:`GATHER_CONFIGS`) and
    replayed on :func:`node_for` ``tp`` (with ``overrides``); returns the result and how many
    collectives the rewrites overlapped with a GEMM."""
    from gpusim.trace.fusion import overlap_gather_gemms, overlap_gemm_collectives, overlap_report

    known_name("configuration", config, {**REPLAYED_CONFIGS, **GATHER_CONFIGS})
    base = config
    if config in GATHER_CONFIGS:
        base, gathers = GATHER_CONFIGS[config]
        trace = overlap_gather_gemms(trace, gathers)
    function, channels, policy = REPLAYED_CONFIGS[base]
    if function is not None:
        trace = overlap_gemm_collectives(trace, function, channels)
    overlapped = int((overlap_report(trace)["status"] == "overlapped").sum())
    return trace.replay(load_system(node_for(tp), overrides or {}), mode=mode, memory_policy=policy), overlapped


def simulate_layer_replayed(model: str, tp: int, setting: str, config: str, mode: str = "symmetric") -> dict[str, Any]:
    """One generated layer of ``model`` with its GEMMs overlapped with their reductions, replayed (a sweep function).

    The layer is :func:`simulate_layer_rest`'s; for every configuration but ``sequential`` its
    tensor-parallel GEMMs and all-reduces are rewritten by
    :func:`gpusim.trace.fusion.overlap_gemm_collectives` (:data:`REPLAYED_CONFIGS`) and the whole
    trace is replayed, so the overlapped sub-layers run between the layer's other kernels rather than
    alone, as :func:`end_to_end` assumes.

    Returns
    -------
    dict
        ``layer_s`` (the layer on GPU 0, first start to last end), ``iteration_rest_s`` (operators
        outside the layer), ``layers``, ``overlapped`` (rewritten GEMM/collective pairs) and simulator
        statistics.
    """
    setup = _model(model)
    result, overlapped = _replay_overlapped(_layer_trace(model, tp, setting), config, tp, mode)
    ops = result.ops[result.ops["gpu"] == 0]
    in_layer = ops["name"].str.startswith("L0.")
    layer = ops[in_layer]
    return {
        "layer_s": float(layer["end_s"].max() - layer["start_s"].min()),
        "iteration_rest_s": float(ops.loc[~in_layer, "duration_s"].sum()),
        "layers": setup.layers,
        "overlapped": overlapped,
        "wall_s": result.stats["wall_s"],
        "events": result.stats["events"],
    }


def replayed_points(models=MAIN_MODELS) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_layer_replayed`: every model, TP degree, setting and configuration."""
    return [{**point, "config": config} for point in layer_points(models) for config in REPLAYED_CONFIGS]


def _over_sequential(frame: pd.DataFrame, keys: list[str], column: str) -> list[float]:
    """Per row of ``frame``: the ``column`` of the ``sequential`` row with the same ``keys``, over its own."""
    sequential = frame[frame["config"] == "sequential"].set_index(keys)[column]
    return [sequential[tuple(key)] / value for key, value in zip(frame[keys].values, frame[column])]


def end_to_end_replayed(replayed: pd.DataFrame, substituted: pd.DataFrame | None = None) -> pd.DataFrame:
    """End-to-end speedups from replayed layers, beside :func:`end_to_end`'s where it has the configuration.

    An iteration is ``layers x replayed layer + once-per-iteration operators``.

    Parameters
    ----------
    replayed
        Rows of :func:`simulate_layer_replayed` with ``model, tp, setting, config``.
    substituted
        :func:`end_to_end` of the same models (optional): its ``speedup`` becomes ``substituted_speedup``
        (its ``decomposed`` is each case's best CU split, not ``decomposed-8``).
    """
    frame = replayed.copy()
    frame["iteration_s"] = frame["layers"] * frame["layer_s"] + frame["iteration_rest_s"]
    keys = ["model", "tp", "setting"]
    frame["speedup"] = _over_sequential(frame, keys, "iteration_s")
    columns = [*keys, "config", "overlapped", "iteration_s", "speedup"]
    frame = frame[columns]
    if substituted is None:
        return frame
    known = substituted.set_index([*keys, "config"])["speedup"]
    frame["substituted_speedup"] = [known.get((*key, config)) for key, config in zip(frame[keys].values, frame["config"])]
    return frame


MEGATRON_LAYOUTS = {"tp": {}, "sp": {"sequence_parallel": True}, "async": {"async_tp_backward": True}}
"""How Megatron-LM lays out a tensor-parallel layer's communication: all-reduces after the GEMMs
(``tp``), sequence parallelism's reduce-scatters and all-gathers (``sp``), or the backward all-reduces
overlapping the weight gradients (``async``, ``--async-tensor-model-parallel-allreduce``)."""


def simulate_megatron_layout(model: str, phase: str, layout: str, config: str, tp: int = 8,
                             layers: int = 2) -> dict[str, Any]:
    """``layers`` generated layers of ``model`` (Table 8.2 batch and sequence length, no embedding or
    output layer; training with its Adam step) in a Megatron-LM ``layout`` (:data:`MEGATRON_LAYOUTS`),
    overlapped as ``config`` (:data:`REPLAYED_CONFIGS`) and replayed on :func:`node_for` ``tp`` in
    symmetric mode (a sweep function).

    Returns
    -------
    dict
        ``time_s`` (the iteration), ``overlapped`` (rewritten GEMM/collective pairs) and simulator statistics.
    """
    from gpusim.trace import transformer

    setup = _model(model)
    trace = transformer(TRACE_MODELS[model], phase=phase, tp=tp, batch=setup.batch, seq_len=setup.seq_len,
                        layers=layers, head=False, **MEGATRON_LAYOUTS[known_name("layout", layout, MEGATRON_LAYOUTS)])
    result, overlapped = _replay_overlapped(trace, config, tp, "symmetric")
    return {"time_s": result.time_s, "overlapped": overlapped, "wall_s": result.stats["wall_s"],
            "events": result.stats["events"]}


def megatron_layout_points(models=MAIN_MODELS, configs=("sequential", "t3-mca", "decomposed-dma"),
                           gather_configs=tuple(GATHER_CONFIGS)) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_megatron_layout`: the prompt phase in the ``tp`` and ``sp``
    layouts, training in all three, each in every configuration of ``configs``; the ``sp`` layout
    also in every one of ``gather_configs`` (:data:`GATHER_CONFIGS`, its all-gathers overlapped)."""
    layouts = {"prompt": ("tp", "sp"), "train": tuple(MEGATRON_LAYOUTS)}
    return [{"model": m, "phase": phase, "layout": layout, "config": config}
            for m in models for phase, names in layouts.items() for layout in names
            for config in (*configs, *(gather_configs if layout == "sp" else ()))]


def megatron_layouts(raw: pd.DataFrame) -> pd.DataFrame:
    """Speedups of :func:`simulate_megatron_layout` rows: ``speedup`` over the ``tp`` layout's
    sequential iteration and ``layout_speedup`` over the same layout's sequential one."""
    keys = ["model", "phase"]
    frame = raw[[*keys, "layout", "config", "overlapped", "time_s"]].copy()
    sequential = frame[frame["config"] == "sequential"].set_index([*keys, "layout"])["time_s"]
    frame["speedup"] = [sequential[(m, p, "tp")] / t for m, p, t in zip(frame["model"], frame["phase"], frame["time_s"])]
    frame["layout_speedup"] = _over_sequential(frame, [*keys, "layout"], "time_s")
    return frame


GENERATION_BATCHES = (1, 8, 64)
"""Sequences a generation step decodes at once (a token each): :func:`generation_points`' default."""
GENERATION_PROTOCOLS = {"sync": None, "nccl": "dgx1-v100"}
"""The ring collectives' protocols in :func:`simulate_generation`: the T3 nodes' own (``sync``: one
protocol whose every step costs ``collectives.sync_ns``, as in the rest of the study), or NCCL's LL,
LL128 and Simple with their ring-on-NVLink latencies from ``tuning.cc`` (``nccl``: those of the preset
named here), among which the tuner picks per collective, LL for small messages."""


def simulate_generation(model: str, tp: int, batch: int, config: str, protocols: str = "sync",
                        layers: int = 2) -> dict[str, Any]:
    """One generation step of ``model`` (section 8.6.3): ``layers`` generated layers decoding one token for
    each of ``batch`` sequences against a cache of the model's sequence length (no embedding or
    output layer), overlapped as ``config`` (:data:`REPLAYED_CONFIGS`) and replayed on
    :func:`node_for` ``tp`` in symmetric mode, its ring collectives with ``protocols``
    (:data:`GENERATION_PROTOCOLS`) (a sweep function).

    Returns
    -------
    dict
        ``time_s`` (the step), ``overlapped`` (rewritten GEMM/collective pairs) and simulator statistics.
    """
    from gpusim.trace import transformer

    setup = _model(model)
    source = GENERATION_PROTOCOLS[known_name("protocols", protocols, GENERATION_PROTOCOLS)]
    overrides = None if source is None else {
        "collectives.protocols": [protocol.model_dump() for protocol in load_system(source).config.collectives.protocols]}
    trace = transformer(TRACE_MODELS[model], phase="decode", tp=tp, batch=batch, seq_len=setup.seq_len,
                        layers=layers, head=False)
    result, overlapped = _replay_overlapped(trace, config, tp, "symmetric", overrides)
    return {"time_s": result.time_s, "overlapped": overlapped, "wall_s": result.stats["wall_s"],
            "events": result.stats["events"]}


def generation_points(models=MAIN_MODELS, tps=(8, 16), batches=GENERATION_BATCHES,
                      configs=("sequential", "t3", "t3-mca", "decomposed-dma"),
                      protocols=tuple(GENERATION_PROTOCOLS)) -> list[dict[str, Any]]:
    """Sweep points of :func:`simulate_generation`: every model, TP degree, batch, protocol set and configuration."""
    return [{"model": m, "tp": tp, "batch": batch, "protocols": protocol, "config": config}
            for m in models for tp in tps for batch in batches for protocol in protocols for config in configs]


def generation(raw: pd.DataFrame) -> pd.DataFrame:
    """:func:`simulate_generation` rows with ``speedup`` over the same step's sequential run (with
    the same protocols)."""
    keys = ["model", "tp", "batch", "protocols"]
    frame = raw[[*keys, "config", "overlapped", "time_s"]].copy()
    frame["speedup"] = _over_sequential(frame, keys, "time_s")
    return frame


# -- one sweep for everything ------------------------------------------------------------------------
def run_point(study: str, variant: str = "base", **params: Any):
    """Run one point of any part of the study (a top-level function for :func:`gpusim.sweep.sweep`).

    ``study`` is ``case`` (:func:`simulate_case`), ``cu_split`` (:func:`simulate_cu_split`),
    ``layer`` (:func:`simulate_layer_rest`), ``decomposed`` (:func:`simulate_decomposed`),
    ``replayed`` (:func:`simulate_layer_replayed`), ``layout`` (:func:`simulate_megatron_layout`),
    ``generation`` (:func:`simulate_generation`) or ``timeline`` (:func:`dram_timeline`, many rows);
    ``variant`` only labels the rows (e.g. ``"2x-cus"``).
    """
    functions = {"case": simulate_case, "cu_split": simulate_cu_split, "layer": simulate_layer_rest,
                 "decomposed": simulate_decomposed, "replayed": simulate_layer_replayed,
                 "layout": simulate_megatron_layout, "generation": simulate_generation, "timeline": dram_timeline}
    return functions[known_name("study part", study, functions)](**params)


def tagged(study: str, points: list[dict[str, Any]], variant: str = "base") -> list[dict[str, Any]]:
    """``points`` labelled with ``study`` and ``variant``, for :func:`run_point`."""
    return [{"study": study, "variant": variant, **point} for point in points]
