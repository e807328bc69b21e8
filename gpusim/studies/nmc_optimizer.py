"""Near-memory optimizer offload (dissertation chapter 6): LAMB, Adam, Adan on near-bank ALUs versus the GPU.

Every number comes from simulations of :class:`gpusim.ops.Optimizer` (GPU kernels or near-memory
broadcasts, see :mod:`gpusim.kernels.optimizer` and :mod:`gpusim.hw.nmc`) or from the GPU
baselines the dissertation defines: an ideal GPU that reads and writes the minimum bytes of the
fused kernels at a fraction of the peak HBM bandwidth.  Reference numbers live only in
``validation/nmc_optimizer``.

Parameter lists are built tensor by tensor (as the Hugging Face / Megatron / Llama implementations
register them) from the model definitions in ``workloads/models``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gpusim.checks import as_real, is_positive_int, items, names, one_of, positive_int, positive_ints
from gpusim.config.gpu import DTYPE_BYTES, GpuConfig
from gpusim.config.loader import load_gpu_config
from gpusim.energy import energy
from gpusim.errors import ConfigError
from gpusim.hw.nmc import NearMemoryUnits
from gpusim.kernels.optimizer import ALGORITHMS
from gpusim.ops import OPTIMIZER_IMPLS, Optimizer
from gpusim.simulate import run
from gpusim.sweep import sweep
from gpusim.system import System, load_system
from gpusim.trace.models import ModelConfig, list_models, load_model

BASELINES = {"gpu-peak": 1.0, "gpu-90": 0.9, "gpu-80": 0.8}
"""The ideal GPU at a fraction of the peak HBM bandwidth (dissertation section 6.4)."""
GRAD_NORMS = ("banks", "gpu")
"""Where LAMB's global gradient norm is computed (see :class:`gpusim.ops.Optimizer`)."""


# -- argument checks: a bad argument is a ConfigError naming it, its value and what was expected ---
def _gpu(system: object, argument: str = "system") -> GpuConfig:
    """The GPU of the hardware preset ``system`` (an unknown name lists the known presets)."""
    if not isinstance(system, str):
        raise ConfigError(f"{argument} must be the name of a hardware preset, got {system!r}")
    return load_gpu_config(system)


# -- parameter lists ------------------------------------------------------------------------------
def parameter_sizes(
    model: ModelConfig,
    style: str = "decoder",
    head: str = "pretraining",
    positions: int | None = None,
    token_types: int = 2,
    labels: int = 2,
    tied_output: bool | None = None,
) -> list[int]:
    """Elements of every parameter tensor of a transformer, in registration order.

    The hyperparameters come from a model definition (``workloads/models``); what such a
    definition does not describe (learned position embeddings, BERT's token types and heads,
    a model's output layer tied or not where it differs from the definition) is given here.

    Parameters
    ----------
    model
        The model's hyperparameters.
    style
        ``"bert"`` (Hugging Face ``BertFor...``: embedding norm, Q, K and V per ``fused_qkv``,
        post-norms, pooler and ``head``) or ``"decoder"`` (GPT / Megatron / Llama: pre-norms and a
        final norm).  Biases and two-parameter layer norms exist where the model has ``bias``
        (BERT, GPT; not Llama, PaLM).
    head
        BERT only: ``"pretraining"`` (masked-LM transform, norm and bias with tied decoder
        weights; next-sentence classifier) or ``"classifier"`` (a ``labels``-way classifier).
    positions
        Rows of a learned position embedding (``None``: rotary or none).
    token_types
        BERT's token-type embedding rows.
    labels
        Classes of the classifier head.
    tied_output
        Whether the output layer reuses the input embedding (default: the model's ``tied_embeddings``).

    Raises
    ------
    gpusim.ConfigError
        An argument of the wrong kind or out of range.
    """
    if not isinstance(model, ModelConfig):
        raise ConfigError(f"model must be a ModelConfig (gpusim.trace.load_model(name)), got {model!r}")
    one_of("style", style, ("bert", "decoder"))
    one_of("head", head, ("pretraining", "classifier"))
    if positions is not None and not is_positive_int(positions):
        raise ConfigError(f"positions must be a positive number of embedding rows or None, got {positions!r}")
    positive_int("token_types", token_types)
    positive_int("labels", labels)
    if tied_output is None:
        tied_output = model.tied_embeddings
    if not isinstance(tied_output, bool):
        raise ConfigError(f"tied_output must be True, False or None, got {tied_output!r}")
    h, f, q = model.hidden, model.intermediate, model.attention_width
    kv = model.key_value_heads * model.head_dim
    biased = model.bias

    def linear(rows: int, cols: int) -> list[int]:
        return [rows * cols, rows] if biased else [rows * cols]

    norm = model.norm_tensors()
    qkv = linear(q + 2 * kv, h) if model.fused_qkv else linear(q, h) + linear(kv, h) + linear(kv, h)
    mlp = linear(f, h) + linear(h, f) if model.activation == "gelu" else linear(f, h) + linear(f, h) + linear(h, f)
    sizes = [model.vocab * h] + ([positions * h] if positions else [])
    if style == "bert":
        sizes += [token_types * h] + norm
        for _ in range(model.layers):
            sizes += qkv + linear(h, q) + norm + mlp + norm
        sizes += linear(h, h)  # pooler
        if head == "classifier":
            return sizes + linear(labels, h)
        return sizes + linear(h, h) + norm + [model.vocab] + linear(2, h)  # MLM transform, decoder bias, NSP
    for _ in range(model.layers):
        sizes += norm + qkv + linear(h, q) + norm + mlp
    sizes += norm
    return sizes if tied_output else sizes + [model.vocab * h]


MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base-classifier": ("bert-base", {"style": "bert", "head": "classifier", "positions": 512}),
    "bert-base": ("bert-base", {"style": "bert", "positions": 512}),
    "bert-large": ("bert-large", {"style": "bert", "positions": 512}),
    "megatron-gpt2": ("megatron-gpt2", {"positions": 1024}),
    "t-nlg": ("t-nlg", {"positions": 1024}),
    "gpt3": ("gpt3", {"positions": 2048}),
    "llama2-7b": ("llama2-7b", {}),
    "llama2-70b": ("llama2-70b", {}),
}
"""Models by name: the ``workloads/models`` definition and what it does not describe.  Positions:
BERT's ``max_position_embeddings`` (google-research/bert configs), GPT-2's and Megatron's 1024,
GPT-3's context of 2048 (Brown et al. 2020, Table 2.1); Llama-2 has rotary positions (Touvron et
al. 2023).  ``bert-base-classifier`` is the Hugging Face
``BertForSequenceClassification`` that seeds/000 fine-tunes on IMDb."""


def model_parameter_sizes(model: str) -> list[int]:
    """Parameter tensor sizes of a model in :data:`MODELS`."""
    definition, options = MODELS[one_of("model", model, MODELS)]
    return parameter_sizes(load_model(definition), **options)


# -- baselines and one simulated step ---------------------------------------------------------
def min_gpu_bytes(algorithm: str, sizes: Sequence[int], dtype: str = "fp32") -> float:
    """Bytes an ideal GPU moves for one step: each array once per fused kernel.

    Parameters
    ----------
    algorithm
        An optimizer of :data:`gpusim.kernels.optimizer.ALGORITHMS`.
    sizes
        Elements of every parameter tensor.
    dtype
        The parameters' data type.
    """
    one_of("algorithm", algorithm, ALGORITHMS)
    elements = sum(positive_ints("sizes", sizes, " (elements per tensor)"))
    return float(ALGORITHMS[algorithm].min_bytes_per_element(DTYPE_BYTES[one_of("dtype", dtype, DTYPE_BYTES)]) * elements)


def ideal_gpu_time_s(system: System, algorithm: str, sizes: Sequence[int], fraction: float = 1.0, dtype: str = "fp32") -> float:
    """Time of the ideal GPU: minimum bytes at ``fraction`` (above 0, at most 1) of the peak HBM
    bandwidth, s."""
    value = as_real(fraction)
    if value is None or not 0 < value <= 1:
        raise ConfigError(f"fraction must be a share of the peak bandwidth above 0 and at most 1, got {fraction!r}")
    return min_gpu_bytes(algorithm, sizes, dtype) / (value * system.gpu.hbm.bandwidth_bytes_per_s)


def simulate_step(system: System, algorithm: str, sizes: Sequence[int], impl: str, **fields: Any) -> dict[str, Any]:
    """Simulate one optimizer step; return its time, kernels and DRAM traffic.

    ``algorithm``, ``impl`` and ``fields`` are those of :class:`gpusim.ops.Optimizer`; ``sizes``
    the elements of every parameter tensor.

    Returns
    -------
    dict
        ``time_s``, ``kernels``, ``broadcasts``, ``dram_traffic_bytes`` (bytes between DRAM and
        the GPU, over the channels' data bus), ``bank_internal_bytes`` (bytes the near-memory
        ALUs read, write and update inside the banks; they never cross the bus),
        ``activations``, ``events``, ``kernel_busy_s`` (the kernels' summed durations, as a profiler
        adds them up) and ``wall_s`` (simulator cost).
    """
    one_of("algorithm", algorithm, ALGORITHMS)
    one_of("impl", impl, OPTIMIZER_IMPLS)
    sizes = positive_ints("sizes", sizes, " (elements per tensor)")
    start = time.perf_counter()
    result = run(system, Optimizer(algorithm, sizes, impl=impl, **fields))
    row = result.ops.iloc[0]
    counters = result.counters
    kernels = result.kernels
    return {
        "time_s": result.time_s,
        "kernel_busy_s": float((kernels["end_s"] - kernels["start_s"]).sum()) if len(kernels) else 0.0,
        "kernels": int(row["kernels"]),
        "broadcasts": int(row.get("broadcasts", 0) or 0),
        "dram_traffic_bytes": float(result.dram["bytes"].sum()),
        "bank_internal_bytes": float(sum(counters.get(f"gpu0.nmc_bytes_{kind}", 0.0) for kind in ("read", "write", "update"))),
        "activations": float(result.counters.get("gpu0.dram_activations", 0.0)),
        "events": result.stats["events"],
        "wall_s": time.perf_counter() - start,
    }


def _versus_ideal_gpu(
    step: dict[str, Any], system: System, algorithm: str, sizes: Sequence[int], fraction: float = 1.0
) -> dict[str, float]:
    """A simulated near-memory step beside the ideal GPU at ``fraction`` of the peak HBM bandwidth.

    Parameters
    ----------
    step
        The near-memory step (:func:`simulate_step` with ``impl="nmc"``).
    system, algorithm, sizes
        What the step ran: the system, the optimizer and the parameter tensors' elements.
    fraction
        The ideal GPU's share of the peak HBM bandwidth.

    Returns
    -------
    dict
        ``gpu_time_s`` (the ideal GPU, s), ``nmc_time_s`` (the near-memory step, s), ``speedup``
        (``gpu_time_s / nmc_time_s``), ``dram_bytes_gpu`` (bytes the ideal GPU moves
        between DRAM and the GPU), ``dram_bytes_nmc`` (bytes between DRAM and the GPU in the
        near-memory step: partial sums, and the gradients if a GPU kernel computes their norm),
        ``nmc_bank_internal_bytes`` (bytes the near-memory ALUs read, write and update inside the
        banks) and ``data_reduction`` (``dram_bytes_gpu / dram_bytes_nmc``,
        infinite when nothing crosses).
    """
    gpu_time = ideal_gpu_time_s(system, algorithm, sizes, fraction)
    gpu_bytes = min_gpu_bytes(algorithm, sizes)
    nmc_bytes = step["dram_traffic_bytes"]
    return {
        "gpu_time_s": gpu_time,
        "nmc_time_s": step["time_s"],
        "speedup": gpu_time / step["time_s"],
        "dram_bytes_gpu": gpu_bytes,
        "dram_bytes_nmc": nmc_bytes,
        "nmc_bank_internal_bytes": step["bank_internal_bytes"],
        "data_reduction": gpu_bytes / nmc_bytes if nmc_bytes > 0 else float("inf"),
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
        Multiples of the system's temporary storage per ALU (positive integers).
    grad_norm
        LAMB's global gradient norm: ``banks`` or ``gpu`` (see :class:`gpusim.ops.Optimizer`).
    overrides
        More hardware overrides.

    Returns
    -------
    pandas.DataFrame
        One row per baseline and storage: system, model, baseline, fraction_of_peak, temp_storage,
        temp_storage_bytes, grad_norm, gpu_time_s (the ideal GPU, s), nmc_time_s (s), speedup,
        dram_bytes_gpu (bytes the ideal GPU moves between DRAM and the GPU),
        dram_bytes_nmc (bytes between DRAM and the GPU with NMC), nmc_bank_internal_bytes
        (bytes the ALUs move inside the banks), data_reduction (the ideal GPU's DRAM traffic over
        NMC's), activations, wall_s.
    """
    sizes = model_parameter_sizes(model)
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    one_of("grad_norm", grad_norm, GRAD_NORMS)
    base = _system(system, overrides)
    storage = base.gpu.nmc.temp_storage_bytes
    rows = []
    for scale in scales:
        point = _system(system, {**(overrides or {}), "gpu.nmc.temp_storage_bytes": storage * scale})
        step = simulate_step(point, "lamb", sizes, "nmc", grad_norm=grad_norm)
        for baseline, fraction in BASELINES.items():
            rows.append(
                {
                    "system": system,
                    "model": model,
                    "baseline": baseline,
                    "fraction_of_peak": fraction,
                    "temp_storage": f"{scale}x",
                    "temp_storage_bytes": storage * scale,
                    "grad_norm": grad_norm,
                    **_versus_ideal_gpu(step, point, "lamb", sizes, fraction),
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
        One row per part: system, model, algorithm, grad_norm, part, time_s, column_s,
        row_switch_s (s), activations, tile_columns.
    """
    sizes = model_parameter_sizes(model)
    plans = ALGORITHMS[one_of("algorithm", algorithm, ALGORITHMS)].nmc
    programs = plans[one_of("grad_norm", grad_norm, plans)].programs
    point = _system(system, overrides)
    units = NearMemoryUnits(point.gpu)
    elem = DTYPE_BYTES["fp32"]
    rows = []
    for program in programs:
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
    frame = pd.DataFrame(rows)
    frame.insert(0, "grad_norm", grad_norm)
    frame.insert(0, "algorithm", algorithm)
    frame.insert(0, "model", model)
    frame.insert(0, "system", system)
    return frame


def lamb_energy(
    system: str = "t3-table8.1",
    model: str = "bert-large",
    temp_storage_scales: Sequence[int] = (1, 4),
    gpu_impls: Sequence[str] = ("multi_fused",),
) -> pd.DataFrame:
    """Energy of a LAMB step on the GPU's kernels and on the near-bank ALUs, by component
    (:mod:`gpusim.energy`; the dissertation names the saving but does not evaluate it, section 9.2).

    Returns
    -------
    pandas.DataFrame
        One row per run: system, model, impl, temp_storage (``"-"`` for the GPU's kernels),
        time_s, energy_j, average_w, dynamic_j (above idle), then one ``*_j`` column per
        component of :func:`gpusim.energy.energy`.
    """
    sizes = model_parameter_sizes(model)
    positive_ints("temp_storage_scales", temp_storage_scales, " (multiples of the preset's temporary storage)",
                  "lamb_energy")
    base = _system(system, None)
    storage = base.gpu.nmc.temp_storage_bytes
    runs = [(impl, "-", base) for impl in gpu_impls]
    runs += [("nmc", f"{scale}x", _system(system, {"gpu.nmc.temp_storage_bytes": storage * scale}))
             for scale in temp_storage_scales]
    rows = []
    for impl, scale, point in runs:
        result = run(point, Optimizer("lamb", sizes, impl=impl))
        parts = energy(result).set_index("component")["energy_j"]
        total = float(parts.sum())
        rows.append({"system": system, "model": model, "impl": impl, "temp_storage": scale, "time_s": result.time_s,
                     "energy_j": total, "average_w": total / result.time_s, "dynamic_j": total - float(parts["idle"]),
                     **{f"{name}_j": float(value) for name, value in parts.items()}})
    return pd.DataFrame(rows)


def end_to_end(speedup: float, lamb_shares: Sequence[float] = (0.10, 0.20)) -> pd.DataFrame:
    """Speedup of a whole training iteration when LAMB, a ``share`` of it, becomes ``speedup`` x faster (Amdahl)."""
    value = as_real(speedup)
    if value is None or value <= 0:
        raise ConfigError(f"end_to_end: speedup must be a positive finite number, got {speedup!r}")
    shares = items("lamb_shares", lamb_shares, lambda share: as_real(share) is not None and 0 <= share <= 1,
                    "fractions between 0 and 1")
    rows = []
    for share in shares:
        iteration = (1 - share) + share / speedup
        rows.append({"lamb_share": share, "lamb_speedup": speedup, "iteration_speedup": 1 / iteration})
    return pd.DataFrame(rows)


# -- simulated BERT iterations with LAMB on the GPU or on NMC ---------------------------------------
BERT_ITERATIONS: dict[str, tuple[int, int, str]] = {
    "Ph1-B32-FP16": (32, 128, "fp16"),
    "Ph2-B4-FP16": (4, 512, "fp16"),
    "Ph1-B32-FP32": (32, 128, "fp32"),
    "Ph1-B4-FP32": (4, 128, "fp32"),
}
"""BERT-Large pre-training iterations of chapter 4 (Figure 4.1: phase, mini-batch, precision) as
``(batch in sequences, sequence length, forward/backward precision)``; LAMB always updates fp32
master weights.  Chapter 4 measures LAMB at 7-10% of the fp32 iterations at B=32, 25% at B=4 and
16-19% with mixed precision."""


def iteration_point(system: str, model: str, batch: int, seq_len: int, dtype: str, impl: str,
                    overrides: dict[str, Any] | None = None, **labels: Any) -> dict[str, Any]:
    """One simulated training iteration of ``model`` whose LAMB step runs as ``impl`` (a sweep point).

    The iteration is the transformer trace generator's (:func:`gpusim.trace.transformer`: forward,
    backward, then LAMB layer by layer on one GPU); ``labels`` are carried as columns.

    Returns
    -------
    dict
        ``iteration_s`` (simulated iteration), ``lamb_s`` (its LAMB ops), ``wall_s`` (simulator).
    """
    from gpusim.trace import transformer

    start = time.perf_counter()
    trace = transformer(model, batch=batch, seq_len=seq_len, dtype=dtype, optimizer="lamb", optimizer_impl=impl)
    result = run(_system(system, overrides), trace)
    lamb = result.ops[result.ops["kind"] == "optimizer"]
    return {"iteration_s": result.time_s, "lamb_s": float(lamb["duration_s"].sum()),
            "wall_s": time.perf_counter() - start}


def bert_iterations(
    system: str = "t3-table8.1",
    model: str = "bert-large",
    configs: Sequence[str] = tuple(BERT_ITERATIONS),
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Whole training iterations with LAMB on the GPU (multi-tensor fused kernels) and on NMC.

    The end-to-end claim of section 6.4 (LAMB at 10-20% of a BERT iteration, BERT 9-20% faster)
    with the LAMB share taken from the simulated iteration instead of assumed.

    Parameters
    ----------
    system
        A hardware preset with near-memory ALUs.
    model
        A model of the trace generator (:func:`gpusim.trace.list_models`).
    configs
        Keys of :data:`BERT_ITERATIONS`.
    temp_storage_scales
        Multiples of the system's temporary storage per near-memory ALU (positive integers).

    Returns
    -------
    pandas.DataFrame
        One row per configuration and storage: system, model, config, batch, seq_len, dtype,
        temp_storage, iteration_gpu_s, lamb_gpu_s, lamb_share (of the GPU iteration), iteration_nmc_s,
        lamb_nmc_s, lamb_speedup, iteration_speedup.
    """
    one_of("model", model, list_models())
    configs = names("configs", configs, BERT_ITERATIONS)
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    storage = _system(system, None).gpu.nmc.temp_storage_bytes
    points = []
    for config in configs:
        batch, seq_len, dtype = BERT_ITERATIONS[config]
        common = {"system": system, "model": model, "batch": batch, "seq_len": seq_len, "dtype": dtype, "config": config}
        points.append({**common, "impl": "multi_fused", "temp_storage": "gpu"})
        points.extend({**common, "impl": "nmc", "temp_storage": f"{scale}x",
                       "overrides": {"gpu.nmc.temp_storage_bytes": storage * scale}} for scale in scales)
    frame = sweep(iteration_point, points, workers=workers, cache=cache, progress=progress, description="BERT iterations")
    gpu = frame[frame["impl"] == "multi_fused"].set_index("config")
    nmc = frame[frame["impl"] == "nmc"].copy()
    nmc["iteration_gpu_s"] = nmc["config"].map(gpu["iteration_s"])
    nmc["lamb_gpu_s"] = nmc["config"].map(gpu["lamb_s"])
    nmc = nmc.rename(columns={"iteration_s": "iteration_nmc_s", "lamb_s": "lamb_nmc_s"})
    nmc["lamb_share"] = nmc["lamb_gpu_s"] / nmc["iteration_gpu_s"]
    nmc["lamb_speedup"] = nmc["lamb_gpu_s"] / nmc["lamb_nmc_s"]
    nmc["iteration_speedup"] = nmc["iteration_gpu_s"] / nmc["iteration_nmc_s"]
    columns = ["system", "model", "config", "batch", "seq_len", "dtype", "temp_storage", "iteration_gpu_s", "lamb_gpu_s",
               "lamb_share", "iteration_nmc_s", "lamb_nmc_s", "lamb_speedup", "iteration_speedup"]
    return nmc[columns].reset_index(drop=True)


# -- the GPU baseline against measurements: Adan on a V100, Adam on an H200 ----------------------
IMPLEMENTATIONS = ("unfused", "fused", "multi_unfused", "multi_fused")
"""Seed 000 Table 4.3's cases: single-tensor unfused/fused, multi-tensor unfused/fused."""


def gpu_step_point(system: str, model: str, algorithm: str, impl: str) -> dict[str, Any]:
    """One GPU step of ``algorithm`` over ``model`` on ``system`` (top-level, for :func:`gpusim.sweep.sweep`)."""
    return simulate_step(load_system(system), algorithm, model_parameter_sizes(model), impl)


def gpu_steps(
    system: str,
    model: str,
    algorithm: str,
    cases: Sequence[str] = IMPLEMENTATIONS,
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Simulated GPU steps (time, kernel count, kernels' busy time) of every implementation, in parallel processes.

    ``cases`` are implementations of :data:`IMPLEMENTATIONS`; ``model`` one of :data:`MODELS`.
    """
    _gpu(system)
    one_of("model", model, MODELS)
    one_of("algorithm", algorithm, ALGORITHMS)
    cases = names("cases", cases, IMPLEMENTATIONS)
    points = [{"system": system, "model": model, "algorithm": algorithm, "impl": impl} for impl in cases]
    frame = sweep(gpu_step_point, points, workers=workers, cache=cache, progress=progress, description=algorithm)
    frame["simulated_ms"] = frame["time_s"] * 1e3
    frame["simulated_busy_ms"] = frame["kernel_busy_s"] * 1e3
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
    """One near-memory step and its ideal-GPU baseline at peak bandwidth (top-level, for
    :func:`gpusim.sweep.sweep`).

    ``labels`` are not used; they let a sweep carry extra columns (e.g. a storage multiple).

    Returns
    -------
    dict
        ``time_s``, ``kernels``, ``broadcasts``, ``activations``, ``events``, ``kernel_busy_s`` and
        ``wall_s`` of :func:`simulate_step`, ``parameters`` and the comparison with the ideal GPU
        under the names of :func:`lamb_speedups` (``gpu_time_s``, ``nmc_time_s``, ``speedup``,
        ``dram_bytes_gpu``, ``dram_bytes_nmc``, ``nmc_bank_internal_bytes``,
        ``data_reduction``).
    """
    sizes = model_parameter_sizes(model)
    one_of("grad_norm", grad_norm, GRAD_NORMS)
    point = _system(system, overrides)
    step = simulate_step(point, algorithm, sizes, "nmc", grad_norm=grad_norm)
    moved = ("dram_traffic_bytes", "bank_internal_bytes")
    return {
        **{key: value for key, value in step.items() if key not in moved},
        "parameters": sum(sizes),
        **_versus_ideal_gpu(step, point, algorithm, sizes),
    }


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
    """LAMB speedup over the ideal GPU against temporary storage per ALU (``storage_bytes``, B),
    for each placement of the gradient norm in ``grad_norms``."""
    _gpu(system)
    one_of("model", model, MODELS)
    storage_bytes = positive_ints("storage_bytes", storage_bytes, " (bytes)")
    grad_norms = names("grad_norms", grad_norms, GRAD_NORMS)
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
    (an ALU shared by ``k`` banks has ``k`` times the storage).

    ``banks_per_alu`` must divide the banks of a channel; ``temp_storage_scales`` are positive
    multiples of the system's temporary storage per bank.
    """
    gpu = _gpu(system)
    one_of("model", model, MODELS)
    banks = gpu.hbm.banks_per_channel
    banks_per_alu = items("banks_per_alu", banks_per_alu, lambda shared: is_positive_int(shared) and banks % shared == 0,
                           f"divisors of the {banks} banks of a channel")
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    storage = gpu.nmc.temp_storage_bytes
    points = [
        {
            "system": system,
            "model": model,
            "banks_per_alu": shared,
            "temp_storage": f"{scale}x",
            "overrides": {"gpu.nmc.banks_per_alu": shared, "gpu.nmc.temp_storage_bytes": storage * scale * shared},
        }
        for scale in scales
        for shared in banks_per_alu
    ]
    return _run_sweep(points, "banks per ALU", workers, cache, progress)


def sweep_models(
    models: Sequence[str] = ("bert-base", "bert-large", "megatron-gpt2", "t-nlg", "gpt3"),
    system: str = "t3-table8.1",
    temp_storage_scales: Sequence[int] = (1, 4),
    workers: int | None = None,
    cache: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """LAMB speedup against model size (the whole model's optimizer state on one GPU's memory).

    ``models`` are names of :data:`MODELS`; ``temp_storage_scales`` positive multiples of the
    system's temporary storage per ALU.
    """
    models = names("models", models, MODELS)
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    storage = _gpu(system).nmc.temp_storage_bytes
    points = [
        {
            "system": system,
            "model": model,
            "temp_storage": f"{scale}x",
            "overrides": {"gpu.nmc.temp_storage_bytes": storage * scale},
        }
        for scale in scales
        for model in models
    ]
    return _run_sweep(points, "models", workers, cache, progress)


HBM_GENERATIONS = {"HBM2 (t3-table8.1)": "t3-table8.1", "HBM2 (v100-sxm2)": "v100-sxm2", "HBM2e (a100-sxm4)": "a100-sxm4",
                   "HBM2e (mi210)": "mi210", "HBM3 (h100-sxm5)": "h100-sxm5",
                   "HBM3e (h200-sxm)": "h200-sxm"}
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
    the new column, with as many register entries).

    ``generations`` maps a label to the preset whose HBM it is (see :data:`HBM_GENERATIONS`);
    ``temp_storage_scales`` are positive multiples of the temporary storage per ALU.
    """
    if not isinstance(generations, Mapping) or not generations or not all(isinstance(label, str) for label in generations):
        raise ConfigError(f"generations must be a non-empty mapping of labels to hardware presets, got {generations!r}")
    base = _gpu(system)
    one_of("model", model, MODELS)
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    entries = base.nmc.temp_storage_bytes / base.hbm.burst_bytes  # register entries of a column each
    points = []
    for label, preset in generations.items():
        hbm = _gpu(preset, f"generations[{label!r}]").hbm.model_dump()
        storage = entries * hbm["burst_bytes"]
        for scale in scales:
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
    """LAMB speedup against the ALU issue cycles of divide and square root (an assumption of the model).

    ``cycles`` are positive ALU issue cycles per SIMD word (DRAM command clock);
    ``temp_storage_scales`` positive multiples of the temporary storage per ALU.
    """
    config = _gpu(system)
    one_of("model", model, MODELS)
    cycles = items("cycles", cycles, lambda cost: as_real(cost) is not None and cost > 0,
                    "positive numbers of ALU cycles per SIMD word")
    scales = positive_ints("temp_storage_scales", temp_storage_scales)
    storage = config.nmc.temp_storage_bytes
    points = []
    for scale in scales:
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
    """Every optimizer of ``algorithms`` (names of :data:`gpusim.kernels.optimizer.ALGORITHMS`) on
    near-memory ALUs against its ideal GPU."""
    _gpu(system)
    one_of("model", model, MODELS)
    algorithms = names("algorithms", algorithms, ALGORITHMS)
    points = [{"system": system, "model": model, "algorithm": algorithm} for algorithm in algorithms]
    return _run_sweep(points, "optimizers", workers, cache, progress)
