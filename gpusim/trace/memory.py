"""The memory a generated transformer iteration holds on each GPU: weights, gradients, optimizer state,
the activations saved for the backward pass, and the key/value cache.

Training keeps, per rank, the parameters and their gradients in the trace's ``dtype``, and the
optimizer's fp32 state: its state arrays (the ones its fused kernels read and write besides the
parameters and gradients: Adam's two moments, LAMB's moments and update, Adan's three moments and
previous gradient, SGD's momentum) and, with a 16-bit ``dtype``, an fp32 master copy of the
parameters; the distributed optimizer keeps ``1/dp`` of that state (ZeRO stage 1, Rajbhandari et al.
2020: 2 + 2 + 12 bytes per parameter for mixed-precision Adam, ``4 + 12 / dp`` sharded).

The activations a layer saves for its backward pass follow Korthikanti et al. 2022 (section 4.1),
term by term, with the widths of the model's attention and MLP instead of ``h`` and ``4h``:
``s b h (34 + 5 a s / h)`` bytes for a GPT layer in fp16, ``s b h (10 + 24 / t + 5 a s / (h t))`` with
tensor parallelism, ``s b h / t (34 + 5 a s / h)`` with sequence parallelism; selective
recomputation drops the ``5 a s^2 b`` of the attention scores, FlashAttention keeps its fp32
log-sum-exp instead of them (its output is the output projection's input, counted already), and
full recomputation keeps each layer's input plus one layer's activations while that layer's
backward pass runs.  A mixture of experts keeps the router's fp32
scores, its expert buffers (the permuted tokens, those received for the rank's experts, the
combined results) and its experts' activations in place of the MLP's (an estimate: Korthikanti et
al. count dense layers only; under uneven routing, those of the rank whose experts receive the most).  A stage holds them for the microbatches its
schedule has in flight at once (the schedule's own order: ``pp - stage`` for 1F1B, all of them for
GPipe, ``1 + (pp - 1) / (pp v)`` of a stage's layers per microbatch on the first stage of the
interleaved schedule).  The last stage also keeps the output layer's input and the fp32 logits
that the cross-entropy reads back.

Inference (``prompt``, ``decode``) keeps the weights and the key/value cache of every sequence of
the rank (``2 x layers x kv heads x d_head`` values per token; ``seq_len + decode_tokens`` tokens when
decoding, and a chunked prompt's tokens up to its last chunk).

Not counted: temporary buffers of single ops (a GEMM's workspace, the logits of inference), the
framework's and the communication library's own buffers, the CUDA context, and the allocator's
fragmentation; real runs need some GiB more.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from gpusim.errors import TraceError
from gpusim.kernels.optimizer import ALGORITHMS
from gpusim.trace.schedules import interleaved_order, stage_order

if TYPE_CHECKING:
    from gpusim.system import System
    from gpusim.trace.generator import _Transformer
    from gpusim.trace.trace import Trace

MEMORY_PARTS = ["weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "kv_cache_bytes"]
"""The parts of a GPU's memory that :func:`memory_footprint` counts; ``total_bytes`` is their sum."""
MEMORY_COLUMNS = ["stage", "gpus", "parameters", *MEMORY_PARTS, "total_bytes"]
"""Columns of :func:`memory_footprint` (with a system, also ``capacity_bytes`` and ``fits``)."""
FP32_BYTES = 4
MASK_BYTES = 1
"""Bytes per element of a dropout mask (PyTorch keeps it as bool)."""


def optimizer_state_arrays(algorithm: str) -> int:
    """fp32 arrays the optimizer keeps per parameter: the arrays its fused kernels read or write
    besides the parameters (``p``) and gradients (``g``)."""
    arrays = {name for passes in ALGORITHMS[algorithm].fused for step in passes for name in (*step.reads, *step.writes)}
    return len(arrays - {"p", "g"})


def in_flight(builder: _Transformer, stage: int, chunk: int | None = None) -> int:
    """Most forward passes (of a microbatch through one of the stage's model chunks, or through
    ``chunk`` only) whose activations the stage holds at once: forwards run minus backwards run, at
    its peak, in the order its schedule gives it."""
    par = builder.par
    if builder.v > 1:
        order = [action for action, at, _ in interleaved_order(stage, par.pp, builder.m, builder.v, backward=True)
                 if chunk is None or at == chunk]
    else:
        order = [action for action, _ in stage_order(builder.schedule, stage, par.pp, builder.m, backward=True)]
    held = peak = 0
    for action in order:
        held += 1 if action == "F" else -1
        peak = max(peak, held)
    return peak


def layer_activations(builder: _Transformer, full: bool = False) -> int:
    """Bytes one layer saves for its backward pass, for one microbatch on one rank.  Under full
    recomputation that is only its input, unless ``full``: then what it saves without
    recomputation, which a recomputed layer holds while its own backward pass runs."""
    model, size = builder.model, builder.size
    h, tokens = model.hidden, builder.b * builder.s
    sliced = builder.tokens_per_rank(tokens)  # the norms' and dropouts' tokens (a slice with SP)
    if builder.recompute and not full:
        return size * sliced * h
    heads, q, kv = builder.heads_t, builder.q_width, builder.kv_t * builder.hd
    norms = 2 * size * sliced * h  # the two norms' inputs
    inputs = 2 * size * sliced * h  # QKV's and FC-1's inputs (the norms' outputs)
    masks = 2 * MASK_BYTES * sliced * h  # the two residual dropouts
    attention = size * tokens * (q + kv) + size * tokens * kv + size * tokens * q  # Q and K; V; the projection's input
    scores = builder.b * heads * builder.s * builder.s
    if builder.flash:
        attention += FP32_BYTES * builder.b * heads * builder.s  # the log-sum-exp (its output is the projection's input)
    elif not builder.recompute_attention:
        attention += (2 * size + MASK_BYTES) * scores  # softmax output, dropout mask, dropout output
    if model.experts:
        ep = builder.par.ep
        layers = range(len(builder.expert_load)) if builder.expert_load else [0]
        # the busiest layer's plan, and the rows of its busiest rank's experts
        busiest, plan = max(((max(plan.received(place) for place in range(ep)), plan)
                             for plan in (builder.expert_plan(tokens, layer) for layer in layers)), key=lambda item: item[0])
        received = 0 if builder.par.ep == 1 else plan.sent if plan.uniform else busiest  # the tokens received
        mlp = (FP32_BYTES * tokens * model.experts + size * h * (2 * plan.sent + received)  # router; buffers; combined
               + size * busiest * (builder.ff_in + builder.ff_t)
               + size * tokens * (builder.shared_in + builder.shared_t))  # the shared expert's, if any
    else:
        mlp = size * tokens * (builder.ff_in + builder.ff_t)  # the activation's input and output
    return norms + inputs + masks + attention + mlp


def stage_memory(builder: _Transformer) -> list[dict[str, object]]:
    """The memory of one rank of each pipeline stage of the builder's iteration (see the module),
    with the stage's ``ranks``."""
    par, model, size = builder.par, builder.model, builder.size
    rows = []
    for stage in range(par.pp):
        parameters = sum(sum(sizes) for _, sizes in builder.parameter_groups(stage))
        ranks = par.stage_ranks(stage)
        row = {"stage": stage, "ranks": ranks, "gpus": len(ranks), "parameters": parameters,
               "weights_bytes": size * parameters, "gradients_bytes": 0, "optimizer_bytes": 0,
               "activations_bytes": 0, "kv_cache_bytes": 0}
        layers = len(builder.stage_layers[stage])
        if builder.train:
            row["gradients_bytes"] = size * parameters
            if builder.optimizer:
                arrays = optimizer_state_arrays(builder.optimizer) + (builder.dtype != "fp32")  # the master copy
                shard = math.ceil(parameters / par.dp) if builder.sharded else parameters
                row["optimizer_bytes"] = FP32_BYTES * arrays * shard
            chunks = in_flight(builder, stage)
            chunk_layers = max(len(chunk) for chunk in builder.chunk_layers[stage])
            activations = chunks * chunk_layers * layer_activations(builder)
            if builder.recompute:
                activations += layer_activations(builder, full=True)
            if stage == par.pp - 1 and builder.head:  # the output layer follows the stage's last chunk
                tokens = builder.b * builder.s
                head = size * builder.tokens_per_rank(tokens) * model.hidden + size * tokens * model.hidden
                activations += in_flight(builder, stage, builder.v - 1) * (head + FP32_BYTES * tokens * builder.vocab_t)
            row["activations_bytes"] = activations
        else:
            decoding = builder.phase == "decode"
            cached = builder.b * builder.m * (builder.s + (builder.decode_tokens if decoding else 0))
            if decoding and builder.prefill_tokens:  # each microbatch's chunked prompt, as far as its last chunk
                cached += builder.m * (builder.prefill_context + builder.decode_tokens * builder.prefill_tokens)
            row["kv_cache_bytes"] = 2 * layers * builder.kv_t * builder.hd * size * cached
        row["total_bytes"] = sum(row[part] for part in MEMORY_PARTS)
        rows.append(row)
    return rows


def memory_footprint(trace: Trace, system: System | None = None, whole_model: bool = False) -> pd.DataFrame:
    """Per pipeline stage, the memory one of its GPUs holds at the iteration's peak (see the module).

    Parameters
    ----------
    trace
        A trace from :func:`gpusim.trace.transformer`.
    system
        With a system, the table also has each GPU's ``capacity_bytes`` (``gpu.hbm.capacity_bytes``)
        and whether the stage ``fits`` in it.
    whole_model
        For a trace generated with ``layers`` (fewer layers than the model has, to simulate
        quickly), the footprint of the whole model in the same layout instead of the trace's.

    Returns
    -------
    pandas.DataFrame
        :data:`MEMORY_COLUMNS`, one row per stage, bytes.

    Raises
    ------
    TraceError
        The trace was not generated by :func:`gpusim.trace.transformer` (an imported trace does
        not say what it keeps in memory).
    """
    stages = trace.metadata.get("memory")
    if whole_model and trace.metadata.get("memory_whole_model"):
        stages = trace.metadata["memory_whole_model"]
    if trace.metadata.get("generator") != "gpusim.trace.transformer" or stages is None:
        raise TraceError(f"{trace.source}: memory_footprint needs a trace from gpusim.trace.transformer(), which "
                         f"records what each GPU keeps in memory; this trace does not say")
    table = pd.DataFrame(stages, columns=MEMORY_COLUMNS).astype("int64")
    if system is not None:
        table["capacity_bytes"] = int(system.config.gpu.hbm.capacity_bytes)
        table["fits"] = table["total_bytes"] <= table["capacity_bytes"]
    return table


def memory_per_gpu(trace: Trace, system: System) -> pd.DataFrame | None:
    """``gpu``, ``memory_bytes`` (its stage's ``total_bytes``) and ``fits`` for every GPU of a trace
    from :func:`gpusim.trace.transformer`; None for another trace."""
    if trace.metadata.get("generator") != "gpusim.trace.transformer" or "memory" not in trace.metadata:
        return None
    table = memory_footprint(trace, system)
    stage_of = {gpu: row["stage"] for row in trace.metadata["memory"] for gpu in row["ranks"]}
    rows = table.set_index("stage").loc[[stage_of[gpu] for gpu in trace.gpus]]
    return pd.DataFrame({"gpu": trace.gpus, "memory_bytes": rows["total_bytes"].to_numpy(),
                         "fits": rows["fits"].to_numpy()})
