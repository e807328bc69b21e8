"""Near-memory optimizer offload (dissertation chapter 6): LAMB, Adam, Adan on near-bank ALUs versus the GPU.

Every number comes from simulations of :class:`gpusim.ops.Optimizer` (GPU kernels or near-memory
broadcasts, see :mod:`gpusim.kernels.optimizer` and :mod:`gpusim.hw.nmc`) or from the GPU
baselines the dissertation defines: an ideal GPU that reads and writes the minimum bytes of the
fused kernels at a fraction of the peak HBM bandwidth.  Reference numbers live only in
``validation/nmc_optimizer``.

Parameter lists are derived here from each model's hyperparameters (tensor by tensor, as the
Hugging Face / Megatron implementations define them), until the workloads' model definitions are
available.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.config.loader import load_gpu_config
from gpusim.hw.nmc import NearMemoryUnits
from gpusim.kernels.optimizer import ALGORITHMS
from gpusim.ops import Optimizer
from gpusim.simulate import run
from gpusim.sweep import sweep
from gpusim.system import System, load_system

BASELINES = {"gpu-peak": 1.0, "gpu-90": 0.9, "gpu-80": 0.8}
"""The ideal GPU at a fraction of the peak HBM bandwidth (dissertation section 6.4)."""


# -- parameter lists ------------------------------------------------------------------------------
def bert_parameter_sizes(
    layers: int,
    hidden: int,
    ffn: int,
    vocab: int = 30522,
    positions: int = 512,
    token_types: int = 2,
    head: str = "pretraining",
    labels: int = 2,
) -> list[int]:
    """Elements of every parameter tensor of BERT (Hugging Face ``BertForPreTraining`` or
    ``BertForSequenceClassification``), in registration order.

    Parameters
    ----------
    layers, hidden, ffn
        Transformer layers, model width, feed-forward width.
    vocab, positions, token_types
        Embedding tables.
    head
        ``"pretraining"`` (masked-LM transform and bias with tied decoder weights, next-sentence
        classifier) or ``"classifier"`` (pooler and a ``labels``-way classifier).
    labels
        Classes of the classifier head.
    """
    if head not in ("pretraining", "classifier"):
        raise ValueError(f"head must be 'pretraining' or 'classifier', got {head!r}")
    sizes = [vocab * hidden, positions * hidden, token_types * hidden, hidden, hidden]
    for _ in range(layers):
        sizes += [hidden * hidden, hidden] * 4  # query, key, value, attention output
        sizes += [hidden, hidden]  # attention layer norm
        sizes += [ffn * hidden, ffn, hidden * ffn, hidden]  # feed-forward
        sizes += [hidden, hidden]  # output layer norm
    sizes += [hidden * hidden, hidden]  # pooler
    if head == "classifier":
        sizes += [labels * hidden, labels]
    else:
        sizes += [hidden * hidden, hidden, hidden, hidden, vocab]  # MLM transform, its norm, decoder bias
        sizes += [2 * hidden, 2]  # next-sentence classifier
    return sizes


def gpt_parameter_sizes(layers: int, hidden: int, vocab: int = 50257, positions: int = 2048) -> list[int]:
    """Elements of every parameter tensor of a GPT-2/GPT-3 style decoder (tied output embedding)."""
    sizes = [vocab * hidden, positions * hidden]
    for _ in range(layers):
        sizes += [hidden, hidden, 3 * hidden * hidden, 3 * hidden, hidden * hidden, hidden]
        sizes += [hidden, hidden, 4 * hidden * hidden, 4 * hidden, 4 * hidden * hidden, hidden]
    sizes += [hidden, hidden]
    return sizes


MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base-classifier": ("bert", {"layers": 12, "hidden": 768, "ffn": 3072, "head": "classifier"}),
    "bert-base": ("bert", {"layers": 12, "hidden": 768, "ffn": 3072}),
    "bert-large": ("bert", {"layers": 24, "hidden": 1024, "ffn": 4096}),
    "gpt2-xl": ("gpt", {"layers": 48, "hidden": 1600, "positions": 1024}),
    "gpt3-2.7b": ("gpt", {"layers": 32, "hidden": 2560}),
    "gpt3-13b": ("gpt", {"layers": 40, "hidden": 5140}),
    "gpt3-175b": ("gpt", {"layers": 96, "hidden": 12288}),
}
"""Models by name: BERT (Devlin et al. 2019) and GPT-2/GPT-3 (Brown et al. 2020, Table 2.1)."""


def model_parameter_sizes(model: str) -> list[int]:
    """Parameter tensor sizes of a model in :data:`MODELS`."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    family, hyper = MODELS[model]
    return bert_parameter_sizes(**hyper) if family == "bert" else gpt_parameter_sizes(**hyper)


# -- baselines and one simulated step ---------------------------------------------------------
def min_gpu_bytes(algorithm: str, sizes: Sequence[int], dtype: str = "fp32") -> float:
    """Bytes an ideal GPU moves for one step: each array once per fused kernel."""
    return float(ALGORITHMS[algorithm].min_bytes_per_element(DTYPE_BYTES[dtype]) * sum(sizes))


def ideal_gpu_time_s(system: System, algorithm: str, sizes: Sequence[int], fraction: float = 1.0, dtype: str = "fp32") -> float:
    """Time of the ideal GPU: minimum bytes at ``fraction`` of the peak HBM bandwidth, s."""
    return min_gpu_bytes(algorithm, sizes, dtype) / (fraction * system.gpu.hbm.bandwidth_bytes_per_s)


def simulate_step(system: System, algorithm: str, sizes: Sequence[int], impl: str, **fields: Any) -> dict[str, Any]:
    """Simulate one optimizer step; return its time, kernels and DRAM traffic.

    Returns
    -------
    dict
        ``time_s``, ``kernels``, ``broadcasts``, ``dram_bytes_gpu`` (bytes between DRAM and the
        GPU), ``dram_bytes_nmc`` (bytes inside the banks for near-memory commands),
        ``activations``, ``events`` and ``wall_s`` (simulator cost).
    """
    start = time.perf_counter()
    result = run(system, Optimizer(algorithm, list(sizes), impl=impl, **fields))
    row = result.ops.iloc[0]
    counters = result.counters
    return {
        "time_s": result.time_s,
        "kernels": int(row["kernels"]),
        "broadcasts": int(row.get("broadcasts", 0) or 0),
        "dram_bytes_gpu": float(result.dram["bytes"].sum()),
        "dram_bytes_nmc": float(sum(counters.get(f"gpu0.nmc_bytes_{kind}", 0.0) for kind in ("read", "write", "update"))),
        "activations": float(result.counters.get("gpu0.dram_activations", 0.0)),
        "events": result.stats["events"],
        "wall_s": time.perf_counter() - start,
    }


def _system(name: str, overrides: dict[str, Any] | None) -> System:
    return load_system(name, overrides or None)


# -- LAMB on BERT-Large: the Figure 6.4 study ---------------------------------------------------
def lamb_speedups(
    system: str = "t3-table8.1",
    model: str = "bert-large",
    temp_storage_scales: Sequence[int] = (1, 4),
    grad_norm: str = "banks",
    overrides: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Speedup of LAMB on near-memory ALUs over the ideal GPU at 100, 90 and 80% of peak bandwidth.

    Parameters
    ----------
    system
        The GPU whose HBM (and near-memory ALUs) run the step.
    model
        A model of :data:`MODELS`.
    temp_storage_scales
        Multiples of the system's temporary storage per ALU.
    grad_norm
        LAMB's global gradient norm: ``banks`` or ``gpu`` (see :class:`gpusim.ops.Optimizer`).
    overrides
        More hardware overrides.

    Returns
    -------
    pandas.DataFrame
        One row per baseline and storage: baseline, fraction_of_peak, temp_storage,
        temp_storage_bytes, gpu_time_s, nmc_time_s, speedup, dram_bytes_gpu (ideal GPU),
        dram_bytes_nmc (between DRAM and GPU with NMC), data_reduction, activations, wall_s.
    """
    sizes = model_parameter_sizes(model)
    base = _system(system, overrides)
    storage = base.gpu.nmc.temp_storage_bytes
    rows = []
    for scale in temp_storage_scales:
        point = _system(system, {**(overrides or {}), "gpu.nmc.temp_storage_bytes": storage * scale})
        step = simulate_step(point, "lamb", sizes, "nmc", grad_norm=grad_norm)
        for baseline, fraction in BASELINES.items():
            gpu_time = ideal_gpu_time_s(point, "lamb", sizes, fraction)
            gpu_bytes = min_gpu_bytes("lamb", sizes)
            rows.append(
                {
                    "baseline": baseline,
                    "fraction_of_peak": fraction,
                    "temp_storage": f"{scale}x",
                    "temp_storage_bytes": storage * scale,
                    "grad_norm": grad_norm,
                    "gpu_time_s": gpu_time,
                    "nmc_time_s": step["time_s"],
                    "speedup": gpu_time / step["time_s"],
                    "dram_bytes_gpu": gpu_bytes,
                    "dram_bytes_nmc": step["dram_bytes_gpu"],
                    "data_reduction": _reduction(gpu_bytes, step["dram_bytes_gpu"]),
                    "activations": step["activations"],
                    "wall_s": step["wall_s"],
                }
            )
    return pd.DataFrame(rows)


def nmc_breakdown(
    system: str = "t3-table8.1",
    model: str = "bert-large",
    algorithm: str = "lamb",
    grad_norm: str = "banks",
    overrides: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Where a near-memory step's time goes: per program, column commands against waiting for row
    switches, and the GPU's synchronizations (from a simulated step).

    Returns
    -------
    pandas.DataFrame
        One row per part: part, time_s, column_s, row_switch_s, activations, tile_columns.
    """
    point = _system(system, overrides)
    sizes = model_parameter_sizes(model)
    units = NearMemoryUnits(point.gpu)
    elem = DTYPE_BYTES["fp32"]
    rows = []
    for program in ALGORITHMS[algorithm].nmc[grad_norm].programs:
        timings = [units.broadcast(program, size * elem) for size in sizes]
        duration = sum(t.duration_ns for t in timings) * 1e-9
        column = sum(t.column_ns for t in timings) * 1e-9
        rows.append(
            {
                "part": program.name,
                "time_s": duration,
                "column_s": column,
                "row_switch_s": duration - column,
                "activations": sum(t.activations for t in timings),
                "tile_columns": units.tile_columns(program),
            }
        )
    result = run(point, Optimizer(algorithm, sizes, impl="nmc", grad_norm=grad_norm))
    nmc = sum(span.end_ns - span.start_ns for span in result.spans if span.category == "nmc") * 1e-9
    rows.append({"part": "gpu (norm kernels, synchronizations, command issue)", "time_s": result.time_s - nmc})
    return pd.DataFrame(rows)


def end_to_end(speedup: float, lamb_shares: Sequence[float] = (0.10, 0.20)) -> pd.DataFrame:
    """Speedup of a whole training iteration when LAMB, a ``share`` of it, becomes ``speedup`` x faster (Amdahl)."""
    rows = []
    for share in lamb_shares:
        iteration = (1 - share) + share / speedup
        rows.append({"lamb_share": share, "lamb_speedup": speedup, "iteration_speedup": 1 / iteration})
    return pd.DataFrame(rows)


# -- the GPU baseline against measurements: Adan on a V100 -------------------------------------
ADAN_CASES = ("unfused", "fused", "multi_unfused", "multi_fused")
"""Seed 000 Table 4.3 cases: single-tensor unfused/fused, multi-tensor unfused/fused."""


def adan_point(system: str, model: str, impl: str) -> dict[str, Any]:
    """One Adan step of ``model`` on ``system`` (top-level, for :func:`gpusim.sweep.sweep`)."""
    return simulate_step(load_system(system), "adan", model_parameter_sizes(model), impl)


def adan_steps(
    system: str = "v100-sxm2",
    model: str = "bert-base-classifier",
    cases: Sequence[str] = ADAN_CASES,
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Simulated Adan steps (time and kernel count) of every implementation, in parallel processes."""
    points = [{"system": system, "model": model, "impl": impl} for impl in cases]
    frame = sweep(adan_point, points, workers=workers, cache=cache, progress=progress, description="adan")
    frame["simulated_ms"] = frame["time_s"] * 1e3
    return frame


# -- sweeps ------------------------------------------------------------------------------------------
def nmc_point(
    system: str = "t3-table8.1",
    model: str = "bert-large",
    algorithm: str = "lamb",
    grad_norm: str = "banks",
    overrides: dict[str, Any] | None = None,
    **labels: Any,
) -> dict[str, Any]:
    """One near-memory step and its ideal-GPU baseline (top-level, for :func:`gpusim.sweep.sweep`).

    ``labels`` are not used; they let a sweep carry extra columns (e.g. a storage multiple).
    """
    point = _system(system, overrides)
    sizes = model_parameter_sizes(model)
    step = simulate_step(point, algorithm, sizes, "nmc", grad_norm=grad_norm)
    gpu_time = ideal_gpu_time_s(point, algorithm, sizes)
    return {
        **step,
        "parameters": sum(sizes),
        "gpu_time_s": gpu_time,
        "nmc_time_s": step["time_s"],
        "speedup": gpu_time / step["time_s"],
        "data_reduction": _reduction(min_gpu_bytes(algorithm, sizes), step["dram_bytes_gpu"]),
    }


def _reduction(gpu_bytes: float, nmc_bytes: float) -> float:
    """How many times fewer bytes cross between DRAM and GPU (infinite when none do)."""
    return gpu_bytes / nmc_bytes if nmc_bytes > 0 else float("inf")


def _run_sweep(points: list[dict[str, Any]], description: str, workers: int | None, cache: str | None, progress: bool):
    return sweep(nmc_point, points, workers=workers, cache=cache, progress=progress, description=description)


def sweep_temp_storage(
    storage_bytes: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192),
    system: str = "t3-table8.1",
    model: str = "bert-large",
    grad_norms: Sequence[str] = ("banks", "gpu"),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup over the ideal GPU against temporary storage per ALU."""
    points = [
        {
            "system": system,
            "model": model,
            "grad_norm": grad_norm,
            "temp_storage_bytes": size,
            "overrides": {"gpu.nmc.temp_storage_bytes": size},
        }
        for grad_norm in grad_norms
        for size in storage_bytes
    ]
    return _run_sweep(points, "temp storage", workers, cache, progress)


def sweep_banks_per_alu(
    banks_per_alu: Sequence[int] = (1, 2, 4, 8, 16),
    system: str = "t3-table8.1",
    model: str = "bert-large",
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup against the banks that share an ALU, with the same temporary storage per bank
    (an ALU shared by ``k`` banks has ``k`` times the storage)."""
    storage = load_gpu_config(system).nmc.temp_storage_bytes
    points = [
        {
            "system": system,
            "model": model,
            "banks_per_alu": shared,
            "temp_storage": f"{scale}x",
            "overrides": {"gpu.nmc.banks_per_alu": shared, "gpu.nmc.temp_storage_bytes": storage * scale * shared},
        }
        for scale in temp_storage_scales
        for shared in banks_per_alu
    ]
    return _run_sweep(points, "banks per ALU", workers, cache, progress)


def sweep_models(
    models: Sequence[str] = ("bert-base", "bert-large", "gpt2-xl", "gpt3-2.7b", "gpt3-13b", "gpt3-175b"),
    system: str = "t3-table8.1",
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup against model size (the whole model's optimizer state on one GPU's memory)."""
    storage = load_gpu_config(system).nmc.temp_storage_bytes
    points = [
        {
            "system": system,
            "model": model,
            "temp_storage": f"{scale}x",
            "overrides": {"gpu.nmc.temp_storage_bytes": storage * scale},
        }
        for scale in temp_storage_scales
        for model in models
    ]
    return _run_sweep(points, "models", workers, cache, progress)


HBM_GENERATIONS = {"HBM2 (t3-table8.1)": "t3-table8.1", "HBM2 (v100-sxm2)": "v100-sxm2", "HBM2e (a100-sxm4)": "a100-sxm4",
                   "HBM2e (mi210)": "mi210", "HBM3 (h100-sxm5)": "h100-sxm5"}
"""HBM generations by the GPU preset that has them."""


def sweep_hbm(
    generations: dict[str, str] = HBM_GENERATIONS,
    system: str = "t3-table8.1",
    model: str = "bert-large",
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup with the HBM of other GPU presets (the near-memory ALUs of ``system``, as wide as
    the new column, with as many register entries)."""
    base = load_gpu_config(system)
    entries = base.nmc.temp_storage_bytes / base.hbm.burst_bytes  # register entries of a column each
    points = []
    for label, preset in generations.items():
        hbm = load_gpu_config(preset).hbm.model_dump()
        storage = entries * hbm["burst_bytes"]
        for scale in temp_storage_scales:
            points.append(
                {
                    "system": system,
                    "model": model,
                    "hbm": label,
                    "temp_storage": f"{scale}x",
                    "overrides": {
                        "gpu.hbm": hbm,
                        "gpu.nmc.simd_bytes": hbm["burst_bytes"],  # an ALU as wide as a column
                        "gpu.nmc.temp_storage_bytes": storage * scale,
                    },
                }
            )
    return _run_sweep(points, "HBM", workers, cache, progress)


def sweep_divide_cost(
    cycles: Sequence[float] = (1, 2, 4, 8, 16),
    system: str = "t3-table8.1",
    model: str = "bert-large",
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup against the ALU issue cycles of divide and square root (an assumption of the model)."""
    config = load_gpu_config(system)
    storage = config.nmc.temp_storage_bytes
    points = []
    for scale in temp_storage_scales:
        for cost in cycles:
            op_cycles = {**config.nmc.op_cycles, "div": cost, "sqrt": cost}
            points.append(
                {
                    "system": system,
                    "model": model,
                    "divide_cycles": cost,
                    "temp_storage": f"{scale}x",
                    "overrides": {"gpu.nmc.op_cycles": op_cycles, "gpu.nmc.temp_storage_bytes": storage * scale},
                }
            )
    return _run_sweep(points, "divide cost", workers, cache, progress)


def optimizers_on_nmc(
    algorithms: Sequence[str] = ("sgd", "adam", "adamw", "lamb", "adan"),
    system: str = "t3-table8.1",
    model: str = "bert-large",
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Every optimizer on near-memory ALUs against its ideal GPU."""
    points = [{"system": system, "model": model, "algorithm": algorithm} for algorithm in algorithms]
    return _run_sweep(points, "optimizers", workers, cache, progress)
