"""Transformer traces from hyperparameters: training and inference, with tensor, data and pipeline
parallelism.

GEMM shapes follow seeds/002 Table 4.3 in the cuBLAS convention ``M x N x K`` with ``M`` the output
features, ``N`` the tokens and ``K`` the input features (forward ``d_model x n*B x d_model`` for a
linear layer; activation gradient ``in x n*B x out``; weight gradient ``in x out x n*B``), and
attention as batched GEMMs over ``B * heads`` (score ``n x n x d_head``, output ``d_head x n x n``).

Tensor parallelism slices as Megatron-LM does (Shoeybi et al. 2019; seeds/002 Fig. 2.4): QKV and
FC-1 by columns, the attention output projection and FC-2 by rows, heads split over ranks, and an
all-reduce of the ``B * SL * H`` activations after the attention and the MLP in the forward pass and
of their input gradients in the backward pass: four per layer per iteration (seeds/002 eq. 5.5).
These all-reduces are on the critical path (the ``compute`` stream); ``async_tp_backward`` overlaps
the backward ones of the column-parallel layers with their weight gradients on a ``tp_comm`` stream,
as Megatron-LM does.  When ``tp`` does not divide
the heads (T-NLG's 28 heads over 8 GPUs), every rank is given the busiest rank's work: attention
over ``ceil(heads / tp)`` heads, with the query, key and value columns and the output projection's
rows of those heads, and an MLP of ``ceil(d_ff / tp)`` columns; key/value heads fewer than ``tp``
(multi-query or grouped-query attention) are replicated.  ``tp`` may not exceed the heads.
Sequence parallelism (Korthikanti et al. 2022) turns each all-reduce into a reduce-scatter into the
ranks' slices of the tokens, on which the norms, dropouts and residual additions run, followed by
an all-gather before the next column-parallel GEMM (see :func:`transformer`).

Data parallelism all-reduces the gradients in buckets (``bucket_bytes``, PyTorch DDP's 25 MiB by
default; seeds/001) on a separate ``comm`` stream, each bucket as soon as the weight-gradient GEMMs
that fill it are done, so it overlaps the rest of the backward pass.  Buckets do not span layers
(a simplification that keeps layers identical for caching).  With several microbatches the
gradients are reduced during the last microbatch's backward pass.  The distributed optimizer
(ZeRO-1) reduce-scatters the buckets instead, updates each rank's shard and all-gathers the
parameters.

Pipeline parallelism splits the layers evenly over stages; microbatches flow through them by the
GPipe, 1F1B or interleaved 1F1B schedule (:mod:`gpusim.trace.schedules`), activations and
gradients move by send/receive on ``send_fwd``/``recv_fwd``/``send_bwd``/``recv_bwd`` streams, and
a tied embedding's two copies all-reduce their gradients.  In the decode phase the microbatches
pass through the stages one generated token at a time.

A mixture-of-experts model (``experts`` in its file, e.g. Mixtral) replaces each layer's MLP by
a router, whose scores' softmax picks ``experts_per_token`` experts per token, and the experts:
the routed copies of the tokens are gathered by expert, sent to the ranks that hold their experts
by an all-to-all over the expert-parallel group (``ep`` data-parallel replicas, GShard's and
Megatron-LM's expert parallelism), run through the rank's experts as batched GEMMs, sent back and
summed with their weights; the experts' gradients are reduced over the ``dp / ep`` replicas that
hold the same experts.  Routing is balanced: every expert gets the same share of the tokens (when
there are fewer routed copies than experts, as in decoding, only as many experts as copies run),
padded to ``expert_capacity_factor`` times it (GShard's capacity), which also stands for the busiest
expert's load under imbalance.  Or routing is uneven (``expert_load``: each expert's share
of the routed copies, alike on every rank or given for each place of an expert-parallel group, in
every layer or for each layer, as MegaBlocks and Megatron-LM's dropless experts run it; with a
capacity factor, the copies beyond an expert's capacity are dropped):
the all-to-alls carry each rank's own sizes (all-to-allv), each rank's experts run as grouped GEMMs
on their rows (one kernel over experts of different rows), and the ranks holding the busiest experts
hold up the rest.

Mixed precision: forward and backward in ``dtype`` (fp16 or bf16), the optimizer step
(:class:`gpusim.ops.Optimizer`: Adam by default, multi-tensor fused kernels, or near-memory ALUs)
on fp32 master weights, one op per layer over that layer's parameter tensors.  Activation
recomputation re-runs a layer's forward pass (with its collectives) before its backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from gpusim.checks import as_real, as_sequence
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import TraceError
from gpusim.kernels.attention import ATTENTION_DTYPES
from gpusim.ops import OPTIMIZER_ALGORITHMS, OPTIMIZER_IMPLS
from gpusim.trace.memory import stage_memory
from gpusim.trace.models import ModelConfig, load_model
from gpusim.trace.schedules import SCHEDULES, interleaved_order, stage_order
from gpusim.trace.schema import format_ints
from gpusim.trace.trace import Trace

PHASES = ("train", "prompt", "decode")
DTYPES = ("fp16", "bf16", "fp32")
"""Data types of a generated trace's activations and weights."""
ATTENTION_IMPLS = ("unfused", "flash")
"""How generated layers compute attention (see :func:`transformer`)."""
EXPERT_GEMMS = ("grouped", "sequential")
"""How a mixture of experts runs its experts' GEMMs (see :func:`transformer`)."""
RECOMPUTE = (False, True, "full", "selective")
"""Activation recomputation choices (see :func:`transformer`)."""
DEFAULT_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default gradient bucket (seeds/001 section 1.2.2)."""


@dataclass(frozen=True)
class Parallelism:
    """Degrees of tensor (tp), data (dp) and pipeline (pp) parallelism and the rank layout.

    Ranks are numbered with tensor parallelism innermost, then data, then pipeline stage
    (``rank = stage * dp * tp + replica * tp + tp_index``), so a tensor-parallel group sits on
    neighbouring GPUs of a node.  Expert parallelism (ep) divides the data-parallel replicas: each
    ``ep`` neighbouring replicas share a mixture of experts's experts out (:meth:`expert_groups`),
    and the replicas holding the same experts reduce their gradients (:meth:`expert_dp_groups`).
    """

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        """GPUs in all."""
        return self.tp * self.dp * self.pp

    def rank(self, stage: int, replica: int, tp_index: int) -> int:
        """Global rank of a position in the grid."""
        return (stage * self.dp + replica) * self.tp + tp_index

    def stage_ranks(self, stage: int) -> list[int]:
        """Ranks of a pipeline stage."""
        return [self.rank(stage, r, t) for r in range(self.dp) for t in range(self.tp)]

    def tp_groups(self, stage: int) -> list[list[int]]:
        """Tensor-parallel groups of a stage (one per data-parallel replica)."""
        return [[self.rank(stage, r, t) for t in range(self.tp)] for r in range(self.dp)]

    def dp_groups(self, stage: int) -> list[list[int]]:
        """Data-parallel groups of a stage (one per tensor-parallel index)."""
        return [[self.rank(stage, r, t) for r in range(self.dp)] for t in range(self.tp)]

    def expert_groups(self, stage: int) -> list[list[int]]:
        """Expert-parallel groups of a stage: ``ep`` neighbouring replicas at each tensor-parallel
        index, among which the tokens go to their experts and back (all-to-all)."""
        return [[self.rank(stage, first + r, t) for r in range(self.ep)]
                for first in range(0, self.dp, self.ep) for t in range(self.tp)]

    def expert_dp_groups(self, stage: int) -> list[list[int]]:
        """Groups of a stage's ranks that hold the same experts (the same place in their
        expert-parallel groups), ``dp / ep`` each, which reduce the experts' gradients."""
        return [[self.rank(stage, r, t) for r in range(place, self.dp, self.ep)]
                for place in range(self.ep) for t in range(self.tp)]

    def embedding_groups(self) -> list[list[int]]:
        """The first and the last stage's ranks at each data- and tensor-parallel position (the
        holders of a tied embedding's two copies)."""
        return [[self.rank(0, r, t), self.rank(self.pp - 1, r, t)] for r in range(self.dp) for t in range(self.tp)]


Handle = dict[int, int]
"""gpu -> op_id of one logical op (an op may have a different op_id per group)."""


EP_STREAM = "ep_comm"
"""The stream of a mixture of experts' all-to-alls when they overlap the experts' GEMMs
(``expert_overlap_chunks``)."""


@dataclass(frozen=True)
class ExpertPlan:
    """Where one rank's routed tokens go and what every rank's experts process, in rows of
    ``hidden`` values (:meth:`_Transformer.expert_plan`).

    Attributes
    ----------
    sent
        Rows of every rank's expert buffer (its routed copies, padded to the capacity).
    sends
        ``sends[i][j]``: rows the rank at place ``i`` of an expert-parallel group sends to the rank
        at place ``j`` (the diagonal stays); ``None``: an even split of the buffer (balanced
        routing).
    rows
        For each place, the rows of each of its experts: those that receive tokens under balanced
        routing, every one of them (some perhaps none) under uneven routing.
    dropped
        Routed copies the ranks of an expert-parallel group drop, all together, because an expert
        already has its capacity of a rank's copies (uneven routing with a capacity factor).
    routed
        Under uneven routing, the copies the rank at each place sends each expert of the layer
        (what the other fields are made of); ``None`` under balanced routing.
    """

    sent: int
    sends: tuple[tuple[int, ...], ...] | None
    rows: tuple[tuple[int, ...], ...]
    dropped: int = 0
    routed: tuple[tuple[int, ...], ...] | None = None

    @property
    def uniform(self) -> bool:
        """Whether every place's experts process the same rows (one batched GEMM everywhere)."""
        return self.sends is None

    def received(self, place: int) -> int:
        """Rows the experts at ``place`` process."""
        return sum(self.rows[place])

    def chunks(self, count: int) -> list[ExpertPlan]:
        """The plan split into ``count`` chunks of the tokens (fewer where there are too few rows
        for them): every count of rows split as evenly as whole rows allow (:func:`apportion`),
        so that the chunks add up to the plan."""
        if self.routed is None:
            active = len(self.rows[0])
            count = max(1, min(count, self.rows[0][0]))
            return [ExpertPlan(sent, None, ((rows,) * active,) * len(self.rows))
                    for sent, rows in zip(apportion(self.sent, [1] * count), apportion(self.rows[0][0], [1] * count))]
        count = max(1, min(count, max(max(place) for place in self.routed)))
        parts = [[apportion(rows, [1] * count) for rows in place] for place in self.routed]
        plans = [routed_plan(sent, [[split[chunk] for split in place] for place in parts], len(self.rows[0]))
                 for chunk, sent in enumerate(apportion(self.sent, [1] * count))]
        return [plan for plan in plans if any(map(any, plan.rows))]


def routed_plan(sent: int, routed: Sequence[Sequence[int]], local: int) -> ExpertPlan:
    """The :class:`ExpertPlan` of uneven routing in which the rank at each place of an
    expert-parallel group sends each expert ``routed[place][expert]`` copies, from a buffer of
    ``sent`` rows (``local`` experts a place)."""
    ep = len(routed)
    received = [sum(rows) for rows in zip(*routed)]  # by expert
    sends = tuple(tuple(sum(rows[place * local:(place + 1) * local]) for place in range(ep)) for rows in routed)
    return ExpertPlan(sent, sends, tuple(tuple(received[place * local:(place + 1) * local]) for place in range(ep)),
                      ep * sent - sum(received), tuple(map(tuple, routed)))


def apportion(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` whole items split in proportion to ``shares`` (largest remainders; ties to the
    first), in exact arithmetic."""
    weight = sum(Fraction(share) for share in shares)
    exact = [total * Fraction(share) / weight for share in shares]
    counts = [math.floor(value) for value in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


class _Builder:
    """Accumulates trace rows."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.next_id = 0
        self.last_compute: dict[int, int] = {}
        """gpu -> op_id of the latest op on its compute stream."""

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    @staticmethod
    def _deps(after: list[Handle | None], gpu: int) -> str:
        ids = []
        for handle in after:
            if handle and gpu in handle and handle[gpu] not in ids:
                ids.append(handle[gpu])
        return format_ints(ids)

    def compute(self, gpus: list[int], kind: str, after: list[Handle | None], labels: dict, **fields) -> Handle:
        """One op with a row on each of ``gpus`` (the same work everywhere) on the compute stream."""
        op_id = self._new_id()
        for gpu in gpus:
            self.rows.append({"op_id": op_id, "gpu": gpu, "stream": "compute", "kind": kind,
                              "deps": self._deps(after, gpu), **labels, **fields})
            self.last_compute[gpu] = op_id
        return dict.fromkeys(gpus, op_id)

    def collective(self, groups: list[list[int]], stream: str, after: list[Handle | None], labels: dict,
                   per_place: list[dict] | None = None, **fields) -> Handle:
        """One collective per group (each with its own op_id); ``per_place`` adds fields to the row of
        the rank at each place of its group."""
        handle: Handle = {}
        for group in groups:
            op_id = self._new_id()
            for place, gpu in enumerate(group):
                own = per_place[place] if per_place else {}
                self.rows.append({"op_id": op_id, "gpu": gpu, "stream": stream, "kind": "collective",
                                  "group": format_ints(group), "deps": self._deps(after, gpu), **labels, **fields,
                                  **own})
                handle[gpu] = op_id
                if stream == "compute":
                    self.last_compute[gpu] = op_id
        return handle

    def sendrecv(self, pairs: list[tuple[int, int]], direction: str, after: list[Handle | None], labels: dict,
                 nbytes: int) -> Handle:
        """One send/receive per ``(src, dst)`` pair, on ``send_DIR`` / ``recv_DIR`` streams."""
        handle: Handle = {}
        for src, dst in pairs:
            op_id = self._new_id()
            for gpu, stream in ((src, f"send_{direction}"), (dst, f"recv_{direction}")):
                self.rows.append({"op_id": op_id, "gpu": gpu, "stream": stream, "kind": "sendrecv", "bytes": nbytes,
                                  "group": f"{src} {dst}", "deps": self._deps(after, gpu), **labels})
                handle[gpu] = op_id
        return handle


class _Transformer:
    """Generates the rows of one trace (see :func:`transformer`)."""

    def __init__(self, model: ModelConfig, phase: str, par: Parallelism, micro_batch: int, seq_len: int,
                 microbatches: int, schedule: str, dtype: str, recompute: bool | str, bucket_bytes: int,
                 optimizer: str | None, optimizer_impl: str, decode_tokens: int, head: bool, attention: str,
                 sequence_parallel: bool, vocab_divisible_by: int, async_tp_backward: bool,
                 distributed_optimizer: bool, virtual_stages: int, overlap_param_gather: bool,
                 expert_capacity_factor: float | None, prefill_tokens: int, prefill_context: int,
                 expert_load: tuple[tuple[tuple[float, ...], ...], ...] | None, expert_gemm: str,
                 expert_overlap_chunks: int, shared_expert_overlap: bool):
        self.model = model
        self.phase = phase
        self.par = par
        self.b = micro_batch
        self.s = seq_len
        self.m = microbatches
        self.schedule = schedule
        self.dtype = dtype
        self.size = DTYPE_BYTES[dtype]
        self.recompute = recompute in (True, "full")
        self.bucket_bytes = bucket_bytes
        self.optimizer = optimizer
        self.optimizer_impl = optimizer_impl
        self.decode_tokens = decode_tokens
        self.prefill_tokens = prefill_tokens
        self.prefill_context = prefill_context
        self.head = head
        self.flash = attention == "flash"
        self.recompute_attention = recompute == "selective" and not self.flash  # FlashAttention recomputes inside
        self.train = phase == "train"
        self.out = _Builder()
        tp = par.tp
        self.sp = sequence_parallel and tp > 1
        self.async_tp = async_tp_backward and tp > 1
        self.sharded = distributed_optimizer and par.dp > 1 and optimizer is not None  # shards of its state
        self.prefetch = overlap_param_gather and self.sharded and self.train
        self.parameter_gathers: dict[tuple[int, int], Handle] = {}
        """(stage, layer) -> the all-gather of its parameters that its first forward pass waits for
        (layer -1: the embedding and output layer); see :meth:`gather_parameters`."""
        self.heads_t = math.ceil(model.heads / tp)
        self.kv_t = math.ceil(model.key_value_heads / tp)
        self.hd = model.head_dim
        self.q_width = self.heads_t * self.hd
        self.qkv_out = self.q_width + 2 * self.kv_t * self.hd
        self.ff_t = math.ceil(model.intermediate / tp)
        self.capacity_factor = expert_capacity_factor
        self.expert_load = expert_load
        self.expert_gemm = expert_gemm
        self.expert_chunks = expert_overlap_chunks
        self.shared_overlap = shared_expert_overlap
        self.shared_t = math.ceil((model.shared_expert_ffn or 0) / tp)
        """This rank's slice of the shared expert's intermediate features (0: none)."""
        self.shared_in = self.shared_t * (2 if model.activation == "swiglu" else 1)
        self.local_experts = (model.experts or 0) // par.ep
        self.expert_drops: dict[int, float] = {}
        """layer -> the share of the routed copies its forward pass drops at the experts' capacity."""
        self.expert_gradients: dict[tuple[int, int], Handle] = {}
        """(stage, layer) -> the reduction of its experts' gradients over the replicas that hold them."""
        multiple = vocab_divisible_by * tp
        self.vocab_t = math.ceil(model.vocab / multiple) * multiple // tp  # Megatron's padded vocabulary, sliced
        layers = model.layers
        self.v = virtual_stages
        slots = par.pp * virtual_stages  # virtual stage c * pp + s is chunk c of stage s
        self.chunk_layers = [[list(range((c * par.pp + s) * layers // slots, (c * par.pp + s + 1) * layers // slots))
                              for c in range(virtual_stages)] for s in range(par.pp)]
        self.stage_layers = [[layer for chunk in chunks for layer in chunk] for chunks in self.chunk_layers]
        self.gradient_buckets: dict[tuple[int, int], Handle] = {}
        self.embedding_gradients: list[Handle | None] = []
        """The ops after which a tied embedding's two copies hold their gradients (see :meth:`tied_embedding_gradients`)."""
        self.tied_sync: Handle | None = None
        self._reduce_now = False
        self._bucket = 0

    # -- helpers ------------------------------------------------------------------------------
    def _labels(self, name: str, phase: str, layer: int, step: int) -> dict:
        return {"name": name, "phase": phase, "layer": layer, "step": step}

    def _gemm(self, gpus, after, labels, m, n, k, batch=1, trans_a=False, trans_b=False) -> Handle:
        """A GEMM given in seeds/002 Table 4.3's cuBLAS (column-major) convention, ``M`` the output
        features and ``N`` the tokens, written as the trace's row-major ``C[m,n] = A[m,k] B[k,n]``
        of the tensors PyTorch holds: ``C^T = op(B)^T op(A)^T``, so ``m`` the tokens, ``n`` the
        output features and the operands swapped (each row then as long as the real tensor's, so
        the kernels' row alignment is the real one whatever the token count)."""
        return self.out.compute(gpus, "gemm", after, labels, m=n, n=m, k=k, batch=batch, trans_a=trans_b,
                                trans_b=trans_a, dtype=self.dtype)

    def _elementwise(self, gpus, after, labels, function, elements, dtype=None, rows=None) -> Handle:
        shape = {"rows": rows} if rows else {}
        return self.out.compute(gpus, "elementwise", after, labels, function=function, elements=elements,
                                dtype=dtype or self.dtype, **shape)

    def _rotary(self, gpus, labels, tokens: int) -> None:
        """The rotary embedding of this rank's query and key heads (a row per token), where the
        model has one: forward, and in the backward pass the same rotation of their gradients."""
        if self.model.position == "rope":
            self._elementwise(gpus, [], labels, "rope", tokens * (self.heads_t + self.kv_t) * self.hd, rows=tokens)

    def _reduction(self, gpus, after, labels, function, rows, cols) -> Handle:
        return self.out.compute(gpus, "reduction", after, labels, function=function, rows=rows, cols=cols,
                                dtype=self.dtype)

    def _attention(self, gpus, labels, direction, queries, keys, batch: int | None = None) -> Handle:
        """Fused attention of this rank's heads over ``batch`` sequences (default: the microbatch's)
        (FlashAttention-2; dropout, where training has it, inside)."""
        return self.out.compute(gpus, "attention", [], labels, batch=batch or self.b, heads=self.heads_t,
                                kv_heads=self.kv_t, q_len=queries, kv_len=keys, head_dim=self.hd,
                                causal=self.model.causal, function=direction, dtype=self.dtype)

    def _core_attention(self, gpus, labels, queries: int, keys: int, batch: int | None = None) -> None:
        """Unfused attention of this rank's heads between the projections, over ``batch`` sequences
        (default: the microbatch's): the scores, their scaling and mask, the softmax, (training) its
        dropout, and the context; ``labels`` makes an op's labels from its name."""
        bh, hd = (batch or self.b) * self.heads_t, self.hd
        # PyTorch's Q K^T, which cuBLAS sees as keys x queries (a decoding step's rows are the keys)
        self._gemm(gpus, [], labels("attn_score"), keys, queries, hd, batch=bh, trans_a=True)
        self._elementwise(gpus, [], labels("attn_scale_mask"), "scale", bh * queries * keys)
        self._reduction(gpus, [], labels("softmax"), "softmax", bh * queries, keys)
        if self.train:
            self._elementwise(gpus, [], labels("attn_dropout"), "dropout", bh * queries * keys)
        self._gemm(gpus, [], labels("attn_context"), hd, queries, keys, batch=bh)

    def _forward_attention(self, gpus, at: Callable[[str], dict], queries: int, keys: int, batch: int | None = None,
                           prefix: str = "") -> None:
        """A layer's forward attention, fused or unfused as the trace runs it, with ``prefix`` before
        its ops' names (``at`` makes an op's labels from its name)."""
        if self.flash:
            self._attention(gpus, at(f"{prefix}attention"), "forward", queries, keys, batch)
        else:
            self._core_attention(gpus, lambda op: at(f"{prefix}{op}"), queries, keys, batch)

    def _tp_collective(self, stage, after, labels, nbytes, collective="allreduce", dtype=None,
                       stream="compute") -> Handle | None:
        """A collective over each tensor-parallel group of ``stage`` on ``stream`` (none when tp is 1)."""
        if self.par.tp == 1:
            return None
        return self.out.collective(self.par.tp_groups(stage), stream, after, labels, collective=collective,
                                   bytes=nbytes, dtype=dtype or self.dtype)

    def _tp_reduce(self, stage, labels, name, nbytes, after=(), stream="compute") -> Handle | None:
        """The sum of the ranks' partial ``nbytes`` of activations (or gradients): an all-reduce, or with
        sequence parallelism a reduce-scatter into each rank's slice of the tokens; ``name`` is a
        template for the collective (``"attn_{}"``: ``attn_allreduce`` or ``attn_reducescatter``),
        ``labels`` makes a name's labels."""
        collective = "reducescatter" if self.sp else "allreduce"
        return self._tp_collective(stage, list(after), labels(name.format(collective)), nbytes, collective,
                                   stream=stream)

    def _tp_gather(self, stage, labels, nbytes, after=(), stream="compute") -> Handle | None:
        """With sequence parallelism, the all-gather of the ranks' token slices into all ``nbytes``
        (the gathered size); nothing without."""
        if not self.sp:
            return None
        return self._tp_collective(stage, list(after), labels, nbytes, "allgather", stream=stream)

    def _column_parallel_backward(self, stage, labels, gather: str, parts, reduce: str,
                                  gradient: tuple[int, int] | None = None) -> tuple[Handle | None, Handle]:
        """The backward pass of a column-parallel linear layer (QKV, FC-1, the output layer) over all
        the tokens: for each ``(name, in_features, out_features)`` of ``parts`` the activation
        gradient ``{name}_dgrad`` and the weight gradient ``{name}_wgrad``; with sequence parallelism
        first the all-gather ``gather`` of the layer's input, which the weight gradients read; then
        the sum of the ranks' activation gradients (``reduce``, a template as in :meth:`_tp_reduce`).
        ``gradient`` (layer, bytes) adds the weight gradients to the data-parallel bucket.

        By default every op is on the compute stream, one after the other.  With
        ``async_tp_backward`` they are scheduled as Megatron-LM's
        ``LinearWithGradAccumulationAndAsyncCommunication`` does: the all-gather is launched on the
        ``tp_comm`` stream (after the work already queued on the compute stream, as NCCL's stream
        waits for it) and overlaps the activation gradients; the sum is launched on ``tp_comm`` as
        soon as they are done and overlaps the weight gradients, which wait for the all-gather.

        Returns
        -------
        tuple
            What the layer's next op must wait for besides its stream (the sum on ``tp_comm``, or
            ``None``), and the last weight-gradient GEMM.
        """
        gpus, t, size = self.par.stage_ranks(stage), self.b * self.s, self.size
        nbytes = t * self.model.hidden * size
        dgrads = [(labels(f"{name}_dgrad"), n_in, t, n_out) for name, n_in, n_out in parts]
        wgrads = [(labels(f"{name}_wgrad"), n_in, n_out, t) for name, n_in, n_out in parts]
        if not self.async_tp:
            self._tp_gather(stage, labels(gather), nbytes)
            for dgrad, wgrad in zip(dgrads, wgrads):
                self._gemm(gpus, [], *dgrad)
                last_wgrad = self._gemm(gpus, [], *wgrad, trans_b=True)
            if gradient:
                self._gradient(stage, *gradient, last_wgrad, labels, False)
            self._tp_reduce(stage, labels, reduce, nbytes)
            return None, last_wgrad
        gathered = self._tp_gather(stage, labels(gather), nbytes, [dict(self.out.last_compute)], stream="tp_comm")
        for dgrad in dgrads:
            last_dgrad = self._gemm(gpus, [], *dgrad)
        summed = self._tp_reduce(stage, labels, reduce, nbytes, [last_dgrad], stream="tp_comm")
        for position, wgrad in enumerate(wgrads):
            last_wgrad = self._gemm(gpus, [gathered] if position == 0 else [], *wgrad, trans_b=True)
        if gradient:
            self._gradient(stage, *gradient, last_wgrad, labels, False)
        return summed, last_wgrad

    def tokens_per_rank(self, tokens: int) -> int:
        """Tokens a rank's norms, dropouts and residual additions see: ``ceil(tokens / tp)`` with
        sequence parallelism (the busiest rank's where tp does not divide them), else all."""
        return math.ceil(tokens / self.par.tp) if self.sp else tokens

    # -- the MLP and the mixture of experts --------------------------------------------------------
    @property
    def ff_in(self) -> int:
        """Output features of this rank's slice of FC-1 (of one expert's): a gated MLP's gate and up
        projections together."""
        return self.ff_t * (2 if self.model.activation == "swiglu" else 1)

    def _activation(self, gpus, at, prefix: str, elements: int) -> None:
        """The MLP's activation (``{prefix}swiglu`` or ``{prefix}gelu``) over ``elements`` values."""
        swiglu = self.model.activation == "swiglu"
        self._elementwise(gpus, [], at(f"{prefix}{'swiglu' if swiglu else 'gelu'}"), "mul" if swiglu else "gelu",
                          elements)

    def _activation_backward(self, gpus, at, prefix: str, elements: int) -> None:
        """The gradient of :meth:`_activation`: two products for a gated MLP, GeLU's derivative otherwise."""
        if self.model.activation == "swiglu":
            self._elementwise(gpus, [], at(f"{prefix}swiglu_bwd_gate"), "mul", elements)
            self._elementwise(gpus, [], at(f"{prefix}swiglu_bwd_up"), "mul", elements)
        else:
            self._elementwise(gpus, [], at(f"{prefix}gelu_bwd"), "bias_gelu", elements)

    def expert_plan(self, tokens: int, layer: int) -> ExpertPlan:
        """How a rank's ``tokens`` meet the experts of ``layer``.

        Balanced routing: the expert buffer holds the ``tokens x experts_per_token`` routed copies
        times the capacity factor (rounded up), split evenly over the expert-parallel group; every
        rank receives as many copies as it sends, so all of its experts receive tokens when the
        copies outnumber them, else one copy each (a decoding step reads only the experts its
        tokens chose), each the capacity factor's share (rounded up).

        Uneven routing (``expert_load``): the rank at each place of an expert-parallel group gives
        each expert its share of its copies (:func:`apportion`; the layer's shares for the place,
        or for every place alike), with no padding; the expert at a place processes what all
        ``ep`` ranks of the group send it.  With a capacity factor ``c`` (any number, 1 included;
        ``None``: dropless) each rank sends an expert at most ``ceil(c x copies / experts)`` of its
        copies and drops the rest (Megatron-LM's ``--moe-expert-capacity-factor`` without padding);
        the buffer keeps room for all copies.
        """
        copies = tokens * self.model.top_k
        ep, local = self.par.ep, self.local_experts
        if self.expert_load is None:
            padding = 1.0 if self.capacity_factor is None else self.capacity_factor
            active = min(local, copies)
            per_expert = math.ceil(padding * copies / active)
            return ExpertPlan(math.ceil(padding * copies), None, ((per_expert,) * active,) * ep)
        routed = [apportion(copies, shares) for shares in self.expert_load[layer]]  # by sending place
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * copies / self.model.experts)
            routed = [[min(rows, capacity) for rows in place] for place in routed]
        return routed_plan(copies, routed, local)

    def _expert_all_to_all(self, stage: int, labels: dict, plan: ExpertPlan, back: bool = False,
                           after: list[Handle | None] | None = None, stream: str = "compute") -> Handle | None:
        """The exchange of every rank's expert buffer over its expert-parallel group (on ``stream``,
        after ``after``), to the experts or (``back``) from them (none when ``ep`` is 1); uneven
        routing sends each rank's own sizes (``send_bytes``)."""
        if self.par.ep == 1:
            return None
        row = self.model.hidden * self.size
        if plan.sends is None:
            return self.out.collective(self.par.expert_groups(stage), stream, after or [], labels,
                                       collective="alltoall", bytes=plan.sent * row, dtype=self.dtype)
        sends = list(zip(*plan.sends)) if back else plan.sends  # back: each place returns what it was sent
        nbytes = max(plan.sent, *map(sum, zip(*plan.sends))) * row
        per_place = [{"send_bytes": format_ints(rows * row for rows in sent)} for sent in sends]
        return self.out.collective(self.par.expert_groups(stage), stream, after or [], labels, per_place,
                                   collective="alltoall", bytes=nbytes, dtype=self.dtype)

    def _place_ranks(self, stage: int) -> list[list[int]]:
        """A stage's ranks by their place in their expert-parallel groups."""
        groups = self.par.expert_groups(stage)
        return [[group[place] for group in groups] for place in range(self.par.ep)]

    def _expert_gemms(self, stage: int, plan: ExpertPlan, at: Callable[[str], dict], name: str,
                      shape: Callable[[int], tuple[int, int, int]], after: list[Handle | None] | None = None,
                      **transposes) -> Handle:
        """A GEMM for every expert that receives tokens, ``shape(rows)`` its ``(M, N, K)`` (as
        :meth:`_gemm`'s): with ``expert_gemm="grouped"`` in one kernel, batched over the experts
        when routing is balanced, else a grouped GEMM of each place's experts on its ranks
        (CUTLASS's grouped GEMM, as Megatron-LM's grouped experts and MegaBlocks run them); with
        ``"sequential"`` one kernel per expert, one after another (Megatron-LM's sequential
        experts; ``expert{i}_`` ops, ``i`` the expert's index in the layer, or under balanced
        routing among the rank's experts, whose ops all ranks share).  The first kernel on each rank
        runs after ``after``."""
        after = after or []
        if self.expert_gemm == "sequential":
            places = ([(self.par.stage_ranks(stage), 0, plan.rows[0])] if plan.uniform else
                      [(gpus, place * self.local_experts, rows)
                       for place, (gpus, rows) in enumerate(zip(self._place_ranks(stage), plan.rows))])
            handle: Handle = {}
            for gpus, first, rows in places:
                for index, count in enumerate(rows):
                    if count:
                        expert = f"expert{first + index}_"
                        handle.update(self._gemm(gpus, after if not handle.keys() & set(gpus) else [],
                                                 at(name.replace("expert_", expert)), *shape(count), **transposes))
            return handle
        if plan.uniform:
            rows = plan.rows[0]
            return self._gemm(self.par.stage_ranks(stage), after, at(name), *shape(rows[0]), batch=len(rows),
                              **transposes)
        trans_a, trans_b = transposes.get("trans_a", False), transposes.get("trans_b", False)
        handle = {}
        for gpus, rows in zip(self._place_ranks(stage), plan.rows):
            shapes = [shape(count) for count in rows if count]
            if shapes:  # row-major, as _gemm turns them: (N, M, K), the transposes swapped
                handle.update(self.out.compute(gpus, "grouped_gemm", after, at(name), dtype=self.dtype,
                                               shapes=format_ints(dim for m, n, k in shapes for dim in (n, m, k)),
                                               trans_a=trans_b, trans_b=trans_a))
        return handle

    def _expert_activation(self, stage: int, plan: ExpertPlan, at: Callable[[str], dict], backward: bool) -> None:
        """The experts' activation (or its backward) on every place's rows."""
        act = self._activation_backward if backward else self._activation
        if plan.uniform:
            act(self.par.stage_ranks(stage), at, "expert_", plan.received(0) * self.ff_t)
            return
        for place, gpus in enumerate(self._place_ranks(stage)):
            if plan.received(place):
                act(gpus, at, "expert_", plan.received(place) * self.ff_t)

    def _experts_forward(self, stage: int, layer: int, at: Callable[[str], dict], tokens: int) -> Handle:
        """The mixture of experts in place of the MLP, on ``tokens`` tokens: the router's scores and
        their softmax (the top-k choice), the routed copies gathered into the expert buffer
        (``moe_permute``), sent to the ranks of their experts (``moe_dispatch``), each local
        expert that receives tokens running its MLP on them (:meth:`expert_plan`), sent back
        (``moe_combine``) and summed with their weights (``moe_unpermute``); returns the last op."""
        model, gpus, h = self.model, self.par.stage_ranks(stage), self.model.hidden
        plan = self.expert_plan(tokens, layer)
        self.expert_drops[layer] = plan.dropped / (self.par.ep * plan.sent)
        buffer = plan.sent * h
        self._gemm(gpus, [], at("router"), model.experts, tokens, h, trans_a=True)
        self._reduction(gpus, [], at("router_softmax"), "softmax", tokens, model.experts)
        permute = self._elementwise(gpus, [], at("moe_permute"), "copy", buffer)
        chunks = plan.chunks(self.expert_chunks) if self.expert_chunks > 1 else [plan]
        if len(chunks) == 1 and not self.shared_overlap:
            self._expert_all_to_all(stage, at("moe_dispatch"), plan)
            self._expert_gemms(stage, plan, at, "expert_fc1", lambda rows: (self.ff_in, rows, h), trans_a=True)
            self._expert_activation(stage, plan, at, backward=False)
            self._expert_gemms(stage, plan, at, "expert_fc2", lambda rows: (h, rows, self.ff_t), trans_a=True)
            self._expert_all_to_all(stage, at("moe_combine"), plan, back=True)
            unpermute = self._elementwise(gpus, [], at("moe_unpermute"), "mul", buffer)
            return self._shared_expert_forward(gpus, at, tokens) or unpermute
        labels = self._chunk_labels(at, len(chunks))
        dispatches = [self._expert_all_to_all(stage, label("moe_dispatch"), part, after=[permute], stream=EP_STREAM)
                      for part, label in zip(chunks, labels)]
        shared = self._shared_expert_forward(gpus, at, tokens, add=False)  # beside the dispatches
        combines = []
        for part, label, dispatch in zip(chunks, labels, dispatches):
            self._expert_gemms(stage, part, label, "expert_fc1", lambda rows: (self.ff_in, rows, h), after=[dispatch],
                               trans_a=True)
            self._expert_activation(stage, part, label, backward=False)
            fc2 = self._expert_gemms(stage, part, label, "expert_fc2", lambda rows: (h, rows, self.ff_t), trans_a=True)
            combines.append(self._expert_all_to_all(stage, label("moe_combine"), part, back=True, after=[fc2],
                                                    stream=EP_STREAM))
        unpermute = self._elementwise(gpus, combines, at("moe_unpermute"), "mul", buffer)
        if shared is None:
            return unpermute
        return self._elementwise(gpus, [], at("shared_expert_add"), "add", tokens * h)

    def _shared_expert_forward(self, gpus: list[int], at: Callable[[str], dict], tokens: int,
                               add: bool = True) -> Handle | None:
        """The shared expert's MLP on all ``tokens`` (``shared_fc1``, its activation, ``shared_fc2``,
        tensor-parallel as a dense MLP) and, with ``add``, its output added to the routed experts'
        (``shared_expert_add``); returns the last op, ``None`` when the model has no shared expert."""
        if not self.shared_t:
            return None
        last = self._mlp_forward(gpus, at, "shared_", tokens, self.shared_in, self.shared_t)
        return self._elementwise(gpus, [], at("shared_expert_add"), "add", tokens * self.model.hidden) if add else last

    def _mlp_forward(self, gpus: list[int], at: Callable[[str], dict], prefix: str, tokens: int, inner: int,
                     width: int) -> Handle:
        """A dense MLP's forward GEMMs on ``tokens`` (``{prefix}fc1`` of ``inner`` outputs, the
        activation over ``width`` features, ``{prefix}fc2``); returns the second GEMM."""
        h = self.model.hidden
        self._gemm(gpus, [], at(f"{prefix}fc1"), inner, tokens, h, trans_a=True)
        self._activation(gpus, at, prefix, tokens * width)
        return self._gemm(gpus, [], at(f"{prefix}fc2"), h, tokens, width, trans_a=True)

    def _shared_expert_backward(self, gpus: list[int], at: Callable[[str], dict], tokens: int) -> None:
        """The backward pass of :meth:`_shared_expert_forward`'s MLP (none without a shared expert);
        its weight gradients are reduced with the layer's data-parallel ones."""
        if not self.shared_t:
            return
        h = self.model.hidden
        self._gemm(gpus, [], at("shared_fc2_dgrad"), self.shared_t, tokens, h)
        self._gemm(gpus, [], at("shared_fc2_wgrad"), self.shared_t, h, tokens, trans_b=True)
        self._activation_backward(gpus, at, "shared_", tokens * self.shared_t)
        self._gemm(gpus, [], at("shared_fc1_dgrad"), h, tokens, self.shared_in)
        self._gemm(gpus, [], at("shared_fc1_wgrad"), h, self.shared_in, tokens, trans_b=True)

    @staticmethod
    def _chunk_labels(at: Callable[[str], dict], count: int) -> list[Callable[[str], dict]]:
        """``at`` for the ops of each of ``count`` chunks of an overlapped mixture of experts
        (``name.chunk``; ``at`` itself for a single one)."""
        if count == 1:
            return [at]
        return [lambda op, chunk=chunk: at(f"{op}.{chunk}") for chunk in range(count)]

    def _experts_backward(self, stage: int, layer: int, at: Callable[[str], dict], tokens: int) -> None:
        """The backward pass of :meth:`_experts_forward`: the buffer's gradient back to the experts,
        their activation and weight gradients (the weight gradients' reduction over the replicas
        holding the same experts, :meth:`_expert_gradients`), the tokens' gradients back, the
        router's."""
        model, gpus, h = self.model, self.par.stage_ranks(stage), self.model.hidden
        plan = self.expert_plan(tokens, layer)
        buffer = plan.sent * h
        unpermute = self._elementwise(gpus, [], at("moe_unpermute_bwd"), "mul", buffer)
        chunks = plan.chunks(self.expert_chunks) if self.expert_chunks > 1 else [plan]
        if len(chunks) == 1 and not self.shared_overlap:
            self._shared_expert_backward(gpus, at, tokens)
            self._expert_all_to_all(stage, at("moe_combine_bwd"), plan)
            self._expert_gemms(stage, plan, at, "expert_fc2_dgrad", lambda rows: (self.ff_t, rows, h))
            self._expert_gemms(stage, plan, at, "expert_fc2_wgrad", lambda rows: (self.ff_t, h, rows), trans_b=True)
            self._expert_activation(stage, plan, at, backward=True)
            self._expert_gemms(stage, plan, at, "expert_fc1_dgrad", lambda rows: (h, rows, self.ff_in))
            wgrad = self._expert_gemms(stage, plan, at, "expert_fc1_wgrad", lambda rows: (h, self.ff_in, rows),
                                       trans_b=True)
            self._expert_gradients(stage, layer, wgrad, at)
            self._expert_all_to_all(stage, at("moe_dispatch_bwd"), plan, back=True)
            dispatches = []  # on the compute stream, before the permutation's gradient
        else:  # each chunk's data gradients between its exchanges, then the weight gradients of all rows
            labels = self._chunk_labels(at, len(chunks))
            combines = [self._expert_all_to_all(stage, label("moe_combine_bwd"), part, after=[unpermute],
                                                stream=EP_STREAM) for part, label in zip(chunks, labels)]
            self._shared_expert_backward(gpus, at, tokens)  # beside the exchanges
            dispatches = []
            for part, label, combine in zip(chunks, labels, combines):
                self._expert_gemms(stage, part, label, "expert_fc2_dgrad", lambda rows: (self.ff_t, rows, h),
                                   after=[combine])
                self._expert_activation(stage, part, label, backward=True)
                dgrad = self._expert_gemms(stage, part, label, "expert_fc1_dgrad", lambda rows: (h, rows, self.ff_in))
                dispatches.append(self._expert_all_to_all(stage, label("moe_dispatch_bwd"), part, back=True,
                                                          after=[dgrad], stream=EP_STREAM))
            self._expert_gemms(stage, plan, at, "expert_fc2_wgrad", lambda rows: (self.ff_t, h, rows), trans_b=True)
            wgrad = self._expert_gemms(stage, plan, at, "expert_fc1_wgrad", lambda rows: (h, self.ff_in, rows),
                                       trans_b=True)
            self._expert_gradients(stage, layer, wgrad, at)
        self._elementwise(gpus, dispatches, at("moe_permute_bwd"), "add", buffer)
        if self.shared_t:  # the input's gradients through the shared expert and the routed ones, summed
            self._elementwise(gpus, [], at("shared_expert_add_bwd"), "add", tokens * h)
        self._reduction(gpus, [], at("router_softmax_bwd"), "softmax_backward", tokens, model.experts)
        self._gemm(gpus, [], at("router_dgrad"), h, tokens, model.experts)
        self._gemm(gpus, [], at("router_wgrad"), h, model.experts, tokens, trans_b=True)

    def _expert_gradients(self, stage: int, layer: int, producer: Handle, at: Callable[[str], dict]) -> None:
        """In the microbatch that reduces gradients, the reduction of the layer's expert weight
        gradients over the ranks that hold the same experts (``expert_grad_allreduce``, or with the
        distributed optimizer ``expert_grad_reducescatter``) on the ``comm`` stream; none when each
        expert has one holder (``ep == dp``)."""
        if not self._reduce_now or self.par.dp == self.par.ep:
            return
        collective = "reducescatter" if self.sharded else "allreduce"
        self.expert_gradients[(stage, layer)] = self.out.collective(
            self.par.expert_dp_groups(stage), "comm", [producer], at(f"expert_grad_{collective}"),
            collective=collective, bytes=sum(self.expert_tensors()) * self.size, dtype=self.dtype)

    # -- transformer layer --------------------------------------------------------------------
    def layer_forward(self, stage: int, layer: int, step: int, phase: str, after: list, prefix: str = "",
                      tokens: int | None = None, context: int | None = None,
                      prefill: tuple[int, int] | None = None) -> Handle:
        """The forward ops of one layer on a stage; returns the handle of the last op.  A decoding
        step gives its ``tokens`` (one a sequence) and their ``context``; ``prefill`` (chunk tokens,
        tokens of its prompt before it) adds a chunk of a new prompt to the step's tokens, with an
        attention of its own (``prefill_`` ops)."""
        model, gpus = self.model, self.par.stage_ranks(stage)
        s = context or self.s
        queries = 1 if context else self.s
        t = (tokens or self.b * self.s) + (prefill[0] if prefill else 0)
        t_rank = self.tokens_per_rank(t)
        h, hd = model.hidden, self.hd
        nbytes = t * h * self.size

        def at(op: str) -> dict:
            return self._labels(f"{prefix}L{layer}.{op}", phase, layer, step)

        last = self._reduction(gpus, after, at("ln1"), model.norm, t_rank, h)
        self._tp_gather(stage, at("ln1_allgather"), nbytes)
        if model.fused_qkv:
            last = self._gemm(gpus, [], at("qkv"), self.qkv_out, t, h, trans_a=True)
        else:
            for part, width in (("q", self.q_width), ("k", self.kv_t * hd), ("v", self.kv_t * hd)):
                last = self._gemm(gpus, [], at(part), width, t, h, trans_a=True)
        self._rotary(gpus, at("rope"), t)
        if not self.train:
            self._elementwise(gpus, [], at("kv_cache_write"), "copy", 2 * self.kv_t * hd * t)
        self._forward_attention(gpus, at, queries, s)
        if prefill:
            chunk, before = prefill
            self._forward_attention(gpus, at, chunk, before + chunk, batch=1, prefix="prefill_")
        last = self._gemm(gpus, [], at("attn_out"), h, t, self.q_width, trans_a=True)
        last = self._tp_reduce(stage, at, "attn_{}", nbytes) or last
        residual = "residual_dropout" if self.train else "add"
        self._elementwise(gpus, [], at("attn_residual"), residual, t_rank * h)
        self._reduction(gpus, [], at("ln2"), model.norm, t_rank, h)
        self._tp_gather(stage, at("ln2_allgather"), nbytes)
        if model.experts:
            last = self._experts_forward(stage, layer, at, t)
        else:
            last = self._mlp_forward(gpus, at, "", t, self.ff_in, self.ff_t)
        last = self._tp_reduce(stage, at, "mlp_{}", nbytes) or last
        return self._elementwise(gpus, [], at("mlp_residual"), residual, t_rank * h)

    def _gradient(self, stage: int, layer: int, nbytes: int, producer: Handle, labels: Callable[[str], dict],
                  flush: bool) -> None:
        """Add a weight gradient to the current bucket; all-reduce it when full (or at ``flush``), or
        with the distributed optimizer reduce-scatter it into the ranks' shards (``grad_allreduce`` or
        ``grad_reducescatter``; ``labels`` makes a name's labels)."""
        if not self._reduce_now or self.par.dp == 1:
            return
        self._bucket += nbytes
        if self._bucket >= self.bucket_bytes or (flush and self._bucket):
            collective = "reducescatter" if self.sharded else "allreduce"
            handle = self.out.collective(self.par.dp_groups(stage), "comm", [producer], labels(f"grad_{collective}"),
                                         collective=collective, bytes=self._bucket, dtype=self.dtype)
            self.gradient_buckets[(stage, layer)] = handle
            self._bucket = 0

    def layer_backward(self, stage: int, layer: int, step: int, after: list, reduce_gradients: bool) -> Handle:
        """The backward ops of one layer (recomputing its forward pass first when asked)."""
        model, gpus = self.model, self.par.stage_ranks(stage)
        t = self.b * self.s
        t_rank = self.tokens_per_rank(t)
        h, hd, heads, s = model.hidden, self.hd, self.heads_t, self.s
        bh = self.b * heads
        size = self.size
        nbytes = t * h * size
        self._reduce_now = reduce_gradients
        self._bucket = 0

        def at(op: str) -> dict:
            return self._labels(f"L{layer}.{op}", "bwd", layer, step)

        if self.recompute:
            after = [self.layer_forward(stage, layer, step, "bwd", after, prefix="recompute.")]
        last = self._elementwise(gpus, after, at("mlp_residual_bwd"), "dropout_backward", t_rank * h)
        self._tp_gather(stage, at("mlp_allgather_bwd"), nbytes)
        if model.experts:
            self._experts_backward(stage, layer, at, t)
            summed = None
            self._tp_reduce(stage, at, "mlp_{}_bwd", nbytes)
            mlp_reduced = sum(self.expert_tensors())  # reduced apart, over the replicas holding the experts
        else:
            self._gemm(gpus, [], at("fc2_dgrad"), self.ff_t, t, h)
            wgrad = self._gemm(gpus, [], at("fc2_wgrad"), self.ff_t, h, t, trans_b=True)
            self._gradient(stage, layer, self.ff_t * h * size, wgrad, at, False)
            self._activation_backward(gpus, at, "", t * self.ff_t)
            summed, _ = self._column_parallel_backward(stage, at, "ln2_allgather_wgrad", [("fc1", h, self.ff_in)],
                                                       "mlp_{}_bwd", (layer, h * self.ff_in * size))
            mlp_reduced = self.ff_t * h + h * self.ff_in
        self._reduction(gpus, [summed], at("ln2_bwd"), f"{model.norm}_backward", t_rank, h)
        self._elementwise(gpus, [], at("attn_residual_bwd"), "add", t_rank * h)
        self._tp_gather(stage, at("attn_allgather_bwd"), nbytes)
        self._gemm(gpus, [], at("attn_out_dgrad"), self.q_width, t, h)
        wgrad = self._gemm(gpus, [], at("attn_out_wgrad"), self.q_width, h, t, trans_b=True)
        self._gradient(stage, layer, self.q_width * h * size, wgrad, at, False)
        if self.flash:
            self._attention(gpus, at("attention_bwd"), "backward", s, s)
        else:
            if self.recompute_attention:  # Megatron-LM's selective recomputation: the core attention only
                self._core_attention(gpus, lambda op: self._labels(f"recompute.L{layer}.{op}", "bwd", layer, step), s, s)
            self._gemm(gpus, [], at("attn_context_dgrad"), hd, s, s, batch=bh)
            self._gemm(gpus, [], at("attn_context_wgrad"), s, s, hd, batch=bh)
            self._elementwise(gpus, [], at("attn_dropout_bwd"), "dropout_backward", bh * s * s)
            self._reduction(gpus, [], at("softmax_bwd"), "softmax_backward", bh * s, s)
            self._elementwise(gpus, [], at("attn_scale_bwd"), "scale", bh * s * s)
            self._gemm(gpus, [], at("attn_score_dgrad"), s, hd, s, batch=bh)
            self._gemm(gpus, [], at("attn_score_wgrad"), hd, s, s, batch=bh)
        self._rotary(gpus, at("rope_bwd"), t)
        if model.fused_qkv:
            parts = [("qkv", h, self.qkv_out)]
        else:
            parts = [(part, h, width) for part, width in (("q", self.q_width), ("k", self.kv_t * hd),
                                                          ("v", self.kv_t * hd))]
        summed, _ = self._column_parallel_backward(stage, at, "ln1_allgather_wgrad", parts, "attn_{}_bwd")
        self._reduction(gpus, [summed], at("ln1_bwd"), f"{model.norm}_backward", t_rank, h)
        last = self._elementwise(gpus, [], at("residual_bwd"), "add", t_rank * h)
        rest = sum(self.layer_tensors()) - mlp_reduced - self.q_width * h  # QKV, biases, norms (and a router)
        self._gradient(stage, layer, rest * size, last, at, True)
        return last

    # -- embedding and output layer -----------------------------------------------------------
    def embedding_forward(self, step: int, phase: str, after: list, tokens: int) -> Handle:
        """Token embedding lookup on the first stage (vocabulary-parallel: an all-reduce under TP, a
        reduce-scatter into the ranks' token slices with sequence parallelism)."""
        gpus = self.par.stage_ranks(0)
        labels = self._labels("embedding", phase, -1, step)
        last = self._elementwise(gpus, after, labels, "copy", tokens * self.model.hidden)
        return self._tp_reduce(0, lambda name: self._labels(name, phase, -1, step), "embedding_{}",
                               tokens * self.model.hidden * self.size) or last

    def head_forward(self, step: int, phase: str, tokens: int, after: list | None = None,
                     logits: int | None = None) -> Handle:
        """Final norm (and with sequence parallelism the all-gather of its tokens), output projection
        of ``logits`` rows (default: every token in training, a row a sequence in inference) and
        (training) cross-entropy on the last stage; the norm also waits for ``after``."""
        stage = self.par.pp - 1
        gpus = self.par.stage_ranks(stage)
        h = self.model.hidden
        self._reduction(gpus, after or [], self._labels("final_norm", phase, -1, step), self.model.norm,
                        self.tokens_per_rank(tokens), h)
        self._tp_gather(stage, self._labels("final_norm_allgather", phase, -1, step), tokens * h * self.size)
        logits = logits or (tokens if self.train else self.b)
        last = self._gemm(gpus, [], self._labels("lm_head", phase, -1, step), self.vocab_t, logits, h, trans_a=True)
        if self.train:
            last = self._reduction(gpus, [], self._labels("cross_entropy", phase, -1, step), "softmax", tokens,
                                   self.vocab_t)
            last = self._tp_collective(stage, [], self._labels("cross_entropy_allreduce", phase, -1, step),
                                       3 * tokens * 4, dtype="fp32") or last
        return last

    def head_backward(self, step: int, reduce_gradients: bool) -> Handle:
        """Backward of the output layer and the final norm."""
        stage = self.par.pp - 1
        gpus = self.par.stage_ranks(stage)
        h, t, size = self.model.hidden, self.b * self.s, self.size
        def at(name: str) -> dict:
            return self._labels(name, "bwd", -1, step)

        self._elementwise(gpus, [], at("cross_entropy_bwd"), "mul", t * self.vocab_t)
        summed, wgrad = self._column_parallel_backward(stage, at, "final_norm_allgather_wgrad",
                                                       [("lm_head", h, self.vocab_t)], "lm_head_{}_bwd")
        last = self._reduction(gpus, [summed], at("final_norm_bwd"), f"{self.model.norm}_backward",
                               self.tokens_per_rank(t), h)
        if reduce_gradients and (self.par.pp > 1 or not self.model.tied_embeddings):
            self._reduce_now, self._bucket = True, 0
            nbytes = (self.vocab_t * h + self.model.norm_parameters()) * size  # its own table or the tied copy
            self._gradient(stage, -1, nbytes, wgrad, at, True)
            self.embedding_gradients += [wgrad, self.gradient_buckets.get((stage, -1))]
        return last

    def embedding_backward(self, step: int, after: list, reduce_gradients: bool) -> Handle:
        """Gradient of the embedding table (scatter-add) on the first stage, of every token's gradient
        (with sequence parallelism all-gathered from the ranks' token slices first)."""
        gpus = self.par.stage_ranks(0)
        tokens = self.b * self.s
        gathered = self._tp_gather(0, self._labels("embedding_allgather_bwd", "bwd", -1, step),
                                   tokens * self.model.hidden * self.size, after)
        labels = self._labels("embedding_bwd", "bwd", -1, step)
        last = self._elementwise(gpus, [gathered] if gathered else after, labels, "add", tokens * self.model.hidden)
        if reduce_gradients:
            self._reduce_now, self._bucket = True, 0
            elements = self.vocab_t * self.model.hidden
            if self.par.pp == 1 and self.model.tied_embeddings:  # the final norm's, with the one table
                elements += self.model.norm_parameters()
            self._gradient(0, -1, elements * self.size, last, lambda name: self._labels(name, "bwd", -1, step), True)
            self.embedding_gradients += [last, self.gradient_buckets.get((0, -1))]
        return last

    def _linear(self, weights: int, bias: int) -> list[int]:
        """Elements of a linear layer's weight tensor and, where the model has biases, its bias."""
        return [weights, bias] if self.model.bias else [weights]

    def _mlp_tensors(self, inner: int | None = None, width: int | None = None) -> list[int]:
        """Elements of this rank's slice of one MLP's (or one expert's) tensors: FC-1 of ``inner``
        outputs and FC-2 of ``width`` inputs (default: the model's MLP)."""
        h, inner, width = self.model.hidden, inner or self.ff_in, width or self.ff_t
        return [*self._linear(h * inner, inner), *self._linear(width * h, h)]

    def expert_tensors(self) -> list[int]:
        """Elements of the tensors of this rank's experts (none for a dense MLP)."""
        return self._mlp_tensors() * self.local_experts

    def layer_tensors(self) -> list[int]:
        """Elements of every parameter tensor of one layer on one rank (column-parallel biases sliced,
        row-parallel biases and norms replicated; a mixture's router replicated, ``experts / ep``
        experts and its shared expert sliced as a dense MLP)."""
        h = self.model.hidden
        norm = self.model.norm_tensors()
        mlp = [h * self.model.experts, *self.expert_tensors()] if self.model.experts else self._mlp_tensors()
        if self.shared_t:
            mlp += self._mlp_tensors(self.shared_in, self.shared_t)
        return [*norm, *self._linear(h * self.qkv_out, self.qkv_out), *self._linear(self.q_width * h, h), *norm, *mlp]

    def embedding_tensors(self, stage: int) -> list[int]:
        """Elements of the embedding, output layer and final norm tensors on one rank of ``stage``
        (the first stage holds the embedding, the last the output layer -- the embedding's tied copy
        where the stages differ -- and the final norm)."""
        table = self.vocab_t * self.model.hidden
        sizes = [table] if stage == 0 else []
        if stage == self.par.pp - 1:
            if self.par.pp > 1 or not self.model.tied_embeddings:
                sizes.append(table)
            sizes += self.model.norm_tensors()
        return sizes

    def parameter_groups(self, stage: int) -> list[tuple[int, list[int]]]:
        """``(layer, tensor sizes)`` of every parameter group a stage's optimizer steps, in the order
        of the forward pass (layer -1: the embedding's and output layer's tensors)."""
        groups = [(layer, self.layer_tensors()) for layer in self.stage_layers[stage]]
        if stage in (0, self.par.pp - 1):  # the embedding's parameters exist even without its passes
            embedding = (-1, self.embedding_tensors(stage))
            groups = [embedding, *groups] if stage == 0 else [*groups, embedding]
        return groups

    @staticmethod
    def _group_prefix(layer: int) -> str:
        """How the ops of a parameter group's update are named: ``L{layer}`` or ``embedding`` (layer -1)."""
        return f"L{layer}" if layer >= 0 else "embedding"

    def _gather_parameters(self, stage: int, layer: int, sizes: list[int], after: list) -> Handle:
        """The all-gather of a parameter group's updated ``dtype`` shards over the stage's
        data-parallel groups (``param_allgather`` on the ``comm`` stream)."""
        return self.out.collective(self.par.dp_groups(stage), "comm", after,
                                   self._labels(f"{self._group_prefix(layer)}.param_allgather", "opt", layer, 0),
                                   collective="allgather", bytes=sum(sizes) * self.size, dtype=self.dtype)

    def gather_parameters(self) -> None:
        """Megatron-LM's ``--overlap-param-gather``: the parameter all-gathers of the previous
        iteration's optimizer step run at the start of this one, in the order of the forward pass
        on the ``comm`` stream, and each layer's first forward pass waits for its own."""
        for stage in range(self.par.pp):
            for layer, sizes in self.parameter_groups(stage):
                self.parameter_gathers[(stage, layer)] = self._gather_parameters(stage, layer, sizes, [])

    def optimizer_step(self) -> None:
        """The optimizer on fp32 master weights, one layer at a time, after its gradients are reduced.

        With the distributed optimizer each data-parallel rank updates ``ceil(1/dp)`` of every
        tensor (its shard) and then all-gathers the layer's updated ``dtype`` parameters from the
        other ranks of its data-parallel group (``param_allgather`` on the ``comm`` stream)."""
        for stage in range(self.par.pp):
            gpus = self.par.stage_ranks(stage)
            # the layers before the embedding's group, whose gradients the backward pass reduces last
            for layer, sizes in sorted(self.parameter_groups(stage), key=lambda group: group[0] < 0):
                after = [self.gradient_buckets.get((stage, layer)), self.expert_gradients.get((stage, layer)),
                         self.tied_sync if layer < 0 else None]
                shard = [math.ceil(size / self.par.dp) for size in sizes] if self.sharded else sizes
                labels = self._labels(f"{self._group_prefix(layer)}.{self.optimizer}", "opt", layer, 0)
                step = self.out.compute(gpus, "optimizer", after, labels,
                                        function=self.optimizer, tensor_sizes=format_ints(shard),
                                        optimizer_impl=self.optimizer_impl, dtype="fp32")
                if self.sharded and not self.prefetch:
                    self._gather_parameters(stage, layer, sizes, [step])

    # -- whole iteration ------------------------------------------------------------------------
    def _pairs(self, stage: int, nxt: int) -> list[tuple[int, int]]:
        return [(self.par.rank(stage, r, t), self.par.rank(nxt, r, t)) for r in range(self.par.dp)
                for t in range(self.par.tp)]

    def build(self) -> list[dict]:
        """All rows of the trace."""
        if self.phase == "decode":
            self._build_decode()
            return self.out.rows
        par = self.par
        if self.v > 1:
            orders = [interleaved_order(stage, par.pp, self.m, self.v, backward=self.train) for stage in range(par.pp)]
        else:
            orders = [[(action, 0, mb) for action, mb in stage_order(self.schedule, stage, par.pp, self.m,
                                                                     backward=self.train)] for stage in range(par.pp)]
        if self.prefetch:
            self.gather_parameters()
        cursor = [0] * par.pp
        received: dict[tuple[str, int, int, int], Handle] = {}
        while any(cursor[stage] < len(orders[stage]) for stage in range(par.pp)):
            progressed = False
            for stage in range(par.pp):
                while cursor[stage] < len(orders[stage]):
                    action, chunk, mb = orders[stage][cursor[stage]]
                    if not self._at_end(action, stage, chunk) and (action, chunk, stage, mb) not in received:
                        break  # waits for its neighbour's activations or gradients
                    self._run_action(stage, action, chunk, mb, received)
                    cursor[stage] += 1
                    progressed = True
            if not progressed:
                raise TraceError(f"transformer(): the {self.schedule} schedule deadlocks")  # a bug if ever raised
        if self.train:
            self.tied_embedding_gradients()
        if self.train and self.optimizer:
            self.optimizer_step()
        return self.out.rows

    def tied_embedding_gradients(self) -> None:
        """With the embedding tied to the output layer and the two on different stages, the
        all-reduce of the word embedding's gradients between each pair of copies
        (``embedding_grad_allreduce``, Megatron-LM's ``_allreduce_word_embedding_grads``), once both
        stages' gradients are data-parallel reduced; the two copies' optimizer steps wait for it."""
        if self.par.pp == 1 or not self.model.tied_embeddings or not self.head:
            return
        labels = self._labels("embedding_grad_allreduce", "bwd", -1, self.m - 1)
        self.tied_sync = self.out.collective(self.par.embedding_groups(), "comm", self.embedding_gradients, labels,
                                             collective="allreduce", bytes=self.vocab_t * self.model.hidden * self.size,
                                             dtype=self.dtype)

    def _at_end(self, action: str, stage: int, chunk: int) -> bool:
        """Whether a pass starts the model's pipeline: a forward of the first virtual stage or a
        backward of the last (the others wait for a neighbour)."""
        if action == "F":
            return stage == 0 and chunk == 0
        return stage == self.par.pp - 1 and chunk == self.v - 1

    def _neighbour(self, stage: int, chunk: int, step: int) -> tuple[int, int]:
        """``(stage, chunk)`` of the virtual stage ``step`` (+1 or -1) away: the next chunk of the
        first stage after the last stage's, and back."""
        stage += step
        if stage == self.par.pp:
            return 0, chunk + 1
        if stage < 0:
            return self.par.pp - 1, chunk - 1
        return stage, chunk

    def _run_action(self, stage: int, action: str, chunk: int, mb: int, received: dict) -> None:
        """Emit one forward or backward pass of microbatch ``mb`` through model chunk ``chunk`` of ``stage``."""
        first, last = self._at_end("F", stage, chunk), self._at_end("B", stage, chunk)
        tokens = self.b * self.s
        nbytes = self.tokens_per_rank(tokens) * self.model.hidden * self.size  # each rank's slice with SP
        after = [received.get((action, chunk, stage, mb))]
        layers = self.chunk_layers[stage][chunk]
        if action == "F":
            phase = "fwd" if self.train else "prompt"

            def parameters(layer: int) -> list[Handle | None]:  # with prefetched parameters, a layer's first pass waits
                return [self.parameter_gathers.get((stage, layer))] if mb == 0 else []

            if first and self.head:
                after = [self.embedding_forward(mb, phase, after + parameters(-1), tokens)]
            for layer in layers:
                after = [self.layer_forward(stage, layer, mb, phase, after + parameters(layer))]
            if last and self.head:
                self.head_forward(mb, phase, tokens, parameters(-1))
            elif not last:
                nxt, nxt_chunk = self._neighbour(stage, chunk, 1)
                labels = self._labels("send_activations", phase, -1, mb)
                received[("F", nxt_chunk, nxt, mb)] = self.out.sendrecv(self._pairs(stage, nxt), "fwd", after,
                                                                        labels, nbytes)
            return
        reduce_now = mb == self.m - 1
        if last and self.head:
            after = [self.head_backward(mb, reduce_now)]
        for layer in reversed(layers):
            after = [self.layer_backward(stage, layer, mb, after, reduce_now)]
        if first and self.head:
            self.embedding_backward(mb, after, reduce_now)
        elif not first:
            previous, previous_chunk = self._neighbour(stage, chunk, -1)
            labels = self._labels("send_gradients", "bwd", -1, mb)
            received[("B", previous_chunk, previous, mb)] = self.out.sendrecv(self._pairs(stage, previous), "bwd",
                                                                              after, labels, nbytes)
        if reduce_now and self.sp and chunk == 0:  # the stage's last backward pass
            self.sequence_parallel_gradients(stage, mb)

    def sequence_parallel_gradients(self, stage: int, step: int) -> None:
        """With sequence parallelism, the all-reduce over each tensor-parallel group of the gradients
        that each rank computes from its own tokens only: the norms' scales and shifts and the biases
        added after a reduce-scatter (the attention output projection's and FC-2's), of every layer
        of ``stage`` and, where its backward pass runs, the final norm on the last stage.  One per
        stage per iteration, after the stage's last backward pass, as Megatron-LM reduces them all at
        once before the optimizer step."""
        model = self.model
        per_layer = 2 * model.norm_parameters() + (2 * model.hidden if model.bias else 0)
        elements = per_layer * len(self.stage_layers[stage])
        if stage == self.par.pp - 1 and self.head:
            elements += model.norm_parameters()
        self._tp_collective(stage, [], self._labels("sequence_parallel_grad_allreduce", "bwd", -1, step),
                            elements * self.size)

    def _build_decode(self) -> None:
        """Generated tokens one after another; each is a forward pass of every microbatch with a growing KV cache.

        With ``prefill_tokens``, every step of every microbatch also carries the next chunk of a new
        prompt (Sarathi-Serve's chunked prefill): its tokens join the step's GEMMs and element-wise
        ops, and it attends causally to its prompt's tokens so far; the output layer computes one more
        row, the chunk's last token's.

        Microbatches flow through the stages token by token (the forward-only order of both schedules):
        a stage runs token ``t`` of every microbatch before token ``t + 1``, and a microbatch's next
        token starts on the first stage once the last stage has sent back its sampled token.  The
        ``step`` label is ``token * microbatches + microbatch``.
        """
        par, last_stage = self.par, self.par.pp - 1
        token_ready: dict[tuple[int, int], Handle] = {}
        chunk = self.prefill_tokens
        tokens = self.b + chunk  # the step's own token of each sequence, and a prompt's chunk
        for token in range(self.decode_tokens):
            context = self.s + token + 1  # the prompt, the tokens generated before, and this step's own
            prefill = (chunk, self.prefill_context + token * chunk) if chunk else None
            for mb in range(self.m):
                step = token * self.m + mb
                after: list[Handle | None] = [token_ready.get((token, mb))]
                for stage in range(par.pp):
                    if stage == 0 and self.head:
                        after = [self.embedding_forward(step, "decode", after, tokens)]
                    for layer in self.stage_layers[stage]:
                        after = [self.layer_forward(stage, layer, step, "decode", after, tokens=self.b, context=context,
                                                    prefill=prefill)]
                    if stage < last_stage:
                        labels = self._labels("send_activations", "decode", -1, step)
                        after = [self.out.sendrecv(self._pairs(stage, stage + 1), "fwd", after, labels,
                                                   tokens * self.model.hidden * self.size)]
                last = self.head_forward(step, "decode", tokens, logits=self.b + bool(chunk)) if self.head else after[0]
                if par.pp > 1 and token + 1 < self.decode_tokens:
                    labels = self._labels("send_token", "decode", -1, step)
                    token_ready[(token + 1, mb)] = self.out.sendrecv(self._pairs(last_stage, 0), "fwd", [last], labels,
                                                                     self.b * 8)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TraceError(f"transformer(): '{name}' must be a positive integer, got {value!r}")
    return value


def _check_prefill(phase: str, prefill_tokens: object, prefill_context: object) -> None:
    """Check the chunked-prefill options.

    Raises
    ------
    TraceError
        Not whole numbers of at least 0, a context without a chunk, or a chunk outside the
        ``decode`` phase.
    """
    for name, value in (("prefill_tokens", prefill_tokens), ("prefill_context", prefill_context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceError(f"transformer(): '{name}' must be a whole number of tokens, at least 0, got {value!r}")
    if prefill_context and not prefill_tokens:
        raise TraceError("transformer(): 'prefill_context' is the tokens of a chunked prompt before its first chunk; "
                         "it needs prefill_tokens")
    if prefill_tokens and phase != "decode":
        raise TraceError(f"transformer(): 'prefill_tokens' adds a prompt's chunk to each decoding step; it applies to "
                         f"phase='decode', not {phase!r} (phase='prompt' prefills a whole prompt)")


def _check_experts(model: ModelConfig, par: Parallelism, capacity_factor: object, sequence_parallel: bool,
                   distributed_optimizer: bool) -> None:
    """Check the expert-parallel options against the model and the other parallelism.

    Raises
    ------
    TraceError
        Expert options for a dense model, an ``ep`` that divides neither ``dp`` nor the experts, a
        capacity factor that is neither a positive number nor ``None``, or a combination not modelled.
    """
    if capacity_factor is not None and (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float)
                                        or not math.isfinite(capacity_factor) or capacity_factor <= 0):
        raise TraceError("transformer(): 'expert_capacity_factor' must be a positive number or None (dropless), "
                         f"got {capacity_factor!r}")
    if model.experts is None:
        if par.ep > 1 or capacity_factor is not None:
            option = f"ep={par.ep}" if par.ep > 1 else f"expert_capacity_factor={capacity_factor}"
            raise TraceError(f"transformer(): {option} applies to a mixture-of-experts model ('experts' in its "
                             f"file); {model.name} has a dense MLP")
        return
    if par.dp % par.ep:
        raise TraceError(f"transformer(): ep={par.ep} must divide dp={par.dp} (expert parallelism splits the "
                         f"data-parallel replicas)")
    if model.experts % par.ep:
        raise TraceError(f"transformer(): ep={par.ep} must divide the {model.experts} experts of {model.name}")
    if sequence_parallel and par.tp > 1:
        raise TraceError("transformer(): 'sequence_parallel' with a mixture of experts is not modelled")
    if distributed_optimizer and par.ep > 1:
        raise TraceError("transformer(): 'distributed_optimizer' with ep > 1 is not modelled (the experts' state "
                         "would be sharded over dp / ep replicas, the rest over dp)")


def _place_shares(model: ModelConfig, ep: int, load: object, where: str) -> tuple[tuple[float, ...], ...]:
    """One layer's ``expert_load`` (one non-negative share per expert, not all zero; or one such row,
    or ``ep``, one per place of an expert-parallel group) as one tuple of floats per place
    (``where`` names it in errors).

    Raises
    ------
    TraceError
        Shares of the wrong shape or value.
    """
    rows = as_sequence(load)
    if rows and all(as_sequence(row) is not None for row in rows):
        if len(rows) not in (1, ep):
            raise TraceError(f"transformer(): 'expert_load'{where} as rows must give one row of shares, or one per "
                             f"place of an expert-parallel group, ep={ep}, got {len(rows)} rows")
        rows = rows * (ep // len(rows))
    else:
        rows = [load] * ep
    for row in rows:
        shares = as_sequence(row)
        if shares is None or len(shares) != model.experts or any(as_real(share) is None or share < 0
                                                                 for share in shares) or not any(shares):
            raise TraceError(f"transformer(): 'expert_load'{where} must give {model.experts} non-negative shares, one "
                             f"per expert of {model.name}, not all zero (or ep such rows), got {row!r}")
    return tuple(tuple(float(share) for share in as_sequence(row)) for row in rows)


def _nesting(value: object) -> int:
    """How deeply ``value``'s first items are lists (0: not a list; a list of numbers: 1)."""
    items = as_sequence(value)
    return 0 if items is None else 1 + (_nesting(items[0]) if items else 0)


def _expert_load(model: ModelConfig, ep: int, expert_load: object) -> tuple[tuple[tuple[float, ...], ...], ...] | None:
    """``expert_load`` checked against the model and ``ep`` (:func:`_place_shares`), as each
    layer's shares of each place; ``None`` for balanced routing.  One layer's
    shares apply to every layer; a list of them (three levels deep: layer, place, expert) gives
    each of the model's layers its own.

    Raises
    ------
    TraceError
        Shares for a dense model, of the wrong shape or value, or not one set per layer.
    """
    if expert_load is None:
        return None
    if model.experts is None:
        raise TraceError(f"transformer(): 'expert_load' applies to a mixture-of-experts model ('experts' in its "
                         f"file); {model.name} has a dense MLP")
    if isinstance(expert_load, np.ndarray):
        expert_load = expert_load.tolist()
    if _nesting(expert_load) < 3:
        return (_place_shares(model, ep, expert_load, ""),) * model.layers
    layers = as_sequence(expert_load)
    if len(layers) != model.layers:
        raise TraceError(f"transformer(): 'expert_load' by layer must give one set of rows for each of the "
                         f"{model.layers} layers generated, got {len(layers)}")
    return tuple(_place_shares(model, ep, layer, f" of layer {index}") for index, layer in enumerate(layers))


def _load_metadata(load: tuple[tuple[tuple[float, ...], ...], ...] | None) -> list | None:
    """``expert_load`` in a trace's metadata: each place's shares, or each layer's where layers differ."""
    if load is None:
        return None
    layers = [[list(shares) for shares in places] for places in load]
    return layers[0] if all(places == layers[0] for places in layers) else layers


def transformer(
    model: str | ModelConfig,
    phase: str = "train",
    tp: int = 1,
    dp: int = 1,
    pp: int = 1,
    batch: int | None = None,
    seq_len: int | None = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    dtype: str = "fp16",
    recompute: bool | str = False,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    optimizer: str | None = "adam",
    optimizer_impl: str = "multi_fused",
    decode_tokens: int = 1,
    layers: int | None = None,
    head: bool = True,
    attention: str = "unfused",
    sequence_parallel: bool = False,
    vocab_divisible_by: int = 1,
    async_tp_backward: bool = False,
    distributed_optimizer: bool = False,
    virtual_stages: int = 1,
    overlap_param_gather: bool = False,
    ep: int = 1,
    expert_capacity_factor: float | None = None,
    expert_load: Sequence[float] | Sequence[Sequence[float]] | None = None,
    expert_gemm: str = "grouped",
    expert_overlap_chunks: int = 1,
    shared_expert_overlap: bool = False,
    prefill_tokens: int = 0,
    prefill_context: int = 0,
) -> Trace:
    """The operator trace of one iteration of a transformer.

    Parameters
    ----------
    model
        A model name (``gpusim.trace.list_models()``), a YAML file, or a :class:`ModelConfig`.
    phase
        ``"train"`` (forward, backward with activation and weight gradients, optimizer step),
        ``"prompt"`` (inference prefill of ``seq_len`` tokens) or ``"decode"`` (generation of
        ``decode_tokens`` tokens after a prompt of ``seq_len``).
    tp, dp, pp
        Tensor-, data- and pipeline-parallel degrees; the trace has ``tp * dp * pp`` ranks.
    ep
        Expert-parallel degree of a mixture-of-experts model: each ``ep`` neighbouring
        data-parallel replicas split the experts of every layer between them (``experts / ep``
        each) and exchange the routed tokens by all-to-all.  Must divide ``dp`` and the experts;
        above 1 it needs a mixture-of-experts model and excludes the distributed optimizer (not
        modelled: the experts' state would be sharded differently).  A mixture-of-experts model
        excludes ``sequence_parallel`` with ``tp > 1`` whatever ``ep`` is, and
        ``async_tp_backward`` overlaps only its attention's communication.
    expert_capacity_factor
        A mixture of experts's expert capacity (GShard, Switch Transformer): under balanced routing
        every expert processes, and the all-to-all moves, this many times the balanced share of the
        routed tokens (``None``, the default, or 1: the balanced share; 1.25: Switch Transformer's
        padding, or the busiest expert's load under imbalance).  With ``expert_load``, each rank
        sends an expert at most this many times its balanced share of the rank's copies and drops
        the rest, without padding (Megatron-LM's ``--moe-expert-capacity-factor``: 1 drops all
        beyond the balanced share); ``None`` is dropless.  The trace's
        ``metadata["expert_dropped"]`` gives the share dropped in each layer.  A positive number or
        ``None``; a number only for mixture-of-experts models.
    expert_load
        Uneven, dropless routing: each expert's relative share of the routed copies (one
        non-negative number per expert, not all zero; normalised), the same on every rank and in
        every layer; or ``ep`` such rows, the shares of the rank at each place of an
        expert-parallel group (the same in every group); or, three levels deep, one of these (one
        row or ``ep``) for each generated layer, in order (a NumPy array of shape
        ``(layers, 1 or ep, experts)`` too).  The all-to-alls then carry each rank's own sizes,
        each rank's experts run as grouped GEMMs on their rows, and the rank holding the busiest
        experts sets the pace.  Layers that route differently are each simulated (layer caching
        reuses only alike layers).  ``None`` (default): balanced routing.  Dropless unless
        ``expert_capacity_factor`` is given.
    expert_gemm
        How each rank runs its experts' GEMMs: ``"grouped"`` (default), one kernel for all of them
        (a batched GEMM under balanced routing, a grouped GEMM under uneven routing: Megatron-LM's
        grouped experts, MegaBlocks), or ``"sequential"``, a GEMM per expert one after another
        (Megatron-LM's sequential experts).  Only for mixture-of-experts models.
    expert_overlap_chunks
        Overlap a mixture of experts' all-to-alls with its experts' GEMMs by splitting each rank's
        routed copies into this many chunks (Tutel's pipelining of the all-to-all and the experts):
        every chunk's dispatch is issued at once on an ``ep_comm`` stream, each chunk's GEMMs wait
        for its dispatch and its combine for them; the backward pass likewise for the data
        gradients, then the weight gradients of all rows.  Fewer chunks where there are fewer
        rows.  1 (default): the exchanges on the compute stream, in turn with the GEMMs.  Above 1
        it needs ``ep > 1``.
    shared_expert_overlap
        Run a mixture of experts' shared expert (``shared_expert_ffn`` in the model) beside the
        all-to-alls, as Megatron-LM's ``--moe-shared-expert-overlap`` does: the exchanges go to
        the ``ep_comm`` stream and the shared expert's MLP runs while the dispatches (backward:
        the combines' gradients) travel.  ``False`` (default): the shared expert after the routed
        experts, in turn (backward: before them).  Needs a shared expert and ``ep > 1``.
    batch
        Global batch in sequences (default: the model's); split over ``dp`` replicas and
        ``microbatches``.
    seq_len
        Sequence (prompt) length (default: the model's).
    microbatches
        Microbatches per replica (default: ``pp``); more than one without pipelining means
        gradient accumulation.
    schedule
        Pipeline schedule: ``"1f1b"`` or ``"gpipe"``.
    virtual_stages
        Model chunks per pipeline stage (Megatron-LM's virtual pipeline stages; its
        ``--num-layers-per-virtual-pipeline-stage`` is ``layers / (pp * virtual_stages)``): above 1
        the interleaved 1F1B schedule (:func:`gpusim.trace.schedules.interleaved_order`), in which
        stage ``s`` holds the layers of virtual stages ``s, s + pp, ...``.  Needs ``pp > 1``, the
        ``1f1b`` schedule, microbatches a multiple of ``pp``, at least one layer a chunk, and the
        ``train`` or ``prompt`` phase.
    dtype
        Forward/backward precision: ``fp16`` or ``bf16`` (mixed precision with an fp32 optimizer),
        or ``fp32``.
    recompute
        Activation recomputation: ``False``; ``True`` or ``"full"``, each layer's forward pass again
        before its backward pass; ``"selective"``, Megatron-LM's selective recomputation
        (Korthikanti et al. 2022): only the core attention (scores, softmax, dropout, context)
        again, right before its backward ops (with ``attention="flash"`` nothing: the fused
        kernel recomputes inside).
    bucket_bytes
        Data-parallel gradient bucket size, bytes.
    optimizer
        Optimizer algorithm (``"adam"``, ``"adamw"``, ``"lamb"``, ``"adan"``, ``"sgd"``) or ``None``
        (no optimizer step).
    optimizer_impl
        How it runs (:class:`gpusim.ops.Optimizer`): ``"multi_fused"`` (apex-style multi-tensor
        kernels), ``"fused"``, ``"unfused"``, ``"multi_unfused"``, or ``"nmc"`` (near-memory ALUs).
    decode_tokens
        Tokens generated in the ``decode`` phase.
    prefill_tokens, prefill_context
        Chunked prefill in the ``decode`` phase (Sarathi-Serve, Agrawal et al. 2024): every decoding
        step also processes ``prefill_tokens`` tokens of a new prompt (one per microbatch), of which
        ``prefill_context`` tokens were processed before the first step (each step's chunk follows
        the last).  The chunk's tokens go through the step's GEMMs, norms and element-wise ops with
        the decoding tokens, it attends causally to its prompt's keys so far, and it adds a row to
        the output layer.  0 (the default): decoding only.
    layers
        Use only this many layers (a shorter model with the same layer shape).
    head
        Include the forward and backward passes of the embedding and the output layer.  Their
        parameters (the tied embedding table and the final norm) are updated by the optimizer step
        either way, so ``head=False`` is the transformer layers' compute with a whole model's
        optimizer step (what the T3 and concurrency studies' iterations assume).
    attention
        ``"unfused"``: the scores as batched GEMMs with a softmax (and dropout) between them, as
        the dissertation's models run; ``"flash"``: one fused attention op per layer and pass
        (:class:`gpusim.ops.Attention`, FlashAttention-2; ``fp16`` or ``bf16``).
    sequence_parallel
        Megatron-LM's sequence parallelism (not with a mixture of experts) (Korthikanti et al. 2022) in the ``train`` and ``prompt``
        phases: the norms, dropouts and residual additions run on ``ceil(tokens / tp)`` tokens per
        rank, the forward pass's tensor-parallel all-reduces become reduce-scatters (of the same
        bytes) with an all-gather before QKV and FC-1 (and the output layer), and the backward pass
        has their conjugates, all-gathers of the norms' outputs again for the weight gradients, and
        one all-reduce of the norms' and row-parallel biases' gradients per stage.  With ``tp=1`` it
        changes nothing (as Megatron-LM, which turns it off there).
    vocab_divisible_by
        Megatron-LM's ``make_vocab_size_divisible_by`` (128 there by default): the vocabulary is
        padded to a multiple of ``vocab_divisible_by * tp`` and each rank holds ``1/tp`` of the padded
        rows; 1 (the default) gives each rank ``ceil(vocab / tp)`` rows.
    async_tp_backward
        Overlap the tensor-parallel communication of the column-parallel layers' backward pass
        (QKV, FC-1 and the output layer) with their GEMMs, as Megatron-LM does by default
        (``--async-tensor-model-parallel-allreduce``, and with sequence parallelism its overlapped
        all-gather and reduce-scatter): the sum of the activation gradients runs on a ``tp_comm``
        stream beside the weight-gradient GEMMs, and with sequence parallelism the all-gather of
        the layer's input beside the activation-gradient GEMMs.  ``False`` (the default; the
        dissertation's baseline) puts them on the compute stream in sequence.  Only the ``train``
        phase has a backward pass; elsewhere, and with ``tp=1``, it changes nothing.
    distributed_optimizer
        Megatron-LM's distributed optimizer (``--use-distributed-optimizer``; ZeRO stage 1): the
        gradient buckets are reduce-scattered instead of all-reduced, each data-parallel rank
        updates its ``1/dp`` shard of every tensor, and the updated parameters are all-gathered
        after each layer's optimizer step (on the ``comm`` stream).  With ``dp=1``, or without an
        optimizer step, it changes nothing.
    overlap_param_gather
        Megatron-LM's ``--overlap-param-gather`` (needs ``distributed_optimizer``): the parameter
        all-gathers move from after the optimizer step to the start of the iteration (they gather
        the previous step's update, as in the steady state), in the order of the forward pass on
        the ``comm`` stream, and each layer's first forward pass waits for its own, so the gathers
        hide behind the forward pass.  Only the ``train`` phase has an optimizer step.

    Returns
    -------
    Trace
        With ``layer``, ``phase`` and ``step`` labels that layer caching uses, and metadata
        describing the setup and each GPU's memory (:func:`gpusim.trace.memory_footprint`; with
        ``layers``, also the whole model's).

    Raises
    ------
    TraceError
        Parameters that do not divide (batch by ``dp * microbatches``, ``dp`` or the experts by
        ``ep``...), ``tp`` above the heads, ``sequence_parallel`` in the ``decode`` phase, or expert
        options for a dense model.  Heads that ``tp`` does not divide are not an error: every rank
        gets the busiest rank's ``ceil(heads / tp)`` (the module's description; T-NLG's 28 heads
        over 8 GPUs in the dissertation's chapter 8).
    """
    config = whole = load_model(model)
    _check_prefill(phase, prefill_tokens, prefill_context)
    if layers is not None:
        if _positive("layers", layers) > config.layers:
            raise TraceError(f"transformer(): 'layers' ({layers}) exceeds the {config.layers} layers of {config.name}")
        config = load_model(config, layers=layers)
    if phase not in PHASES:
        raise TraceError(f"transformer(): 'phase' must be one of {', '.join(PHASES)}, got {phase!r}")
    if schedule not in SCHEDULES:
        raise TraceError(f"transformer(): 'schedule' must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if dtype not in DTYPES:
        raise TraceError(f"transformer(): 'dtype' must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(recompute, bool | str) or recompute not in RECOMPUTE:
        raise TraceError(f"transformer(): 'recompute' must be one of {', '.join(map(repr, RECOMPUTE))}, got {recompute!r}")
    if attention not in ATTENTION_IMPLS:
        raise TraceError(f"transformer(): 'attention' must be one of {', '.join(ATTENTION_IMPLS)}, got {attention!r}")
    if attention == "flash" and dtype not in ATTENTION_DTYPES:
        raise TraceError(f"transformer(): attention='flash' needs dtype {' or '.join(ATTENTION_DTYPES)} "
                         f"(FlashAttention-2's inputs), got {dtype!r}")
    if optimizer is not None and optimizer not in OPTIMIZER_ALGORITHMS:
        raise TraceError(f"transformer(): 'optimizer' must be one of {', '.join(OPTIMIZER_ALGORITHMS)} or None, "
                         f"got {optimizer!r}")
    if optimizer_impl not in OPTIMIZER_IMPLS:
        raise TraceError(f"transformer(): 'optimizer_impl' must be one of {', '.join(OPTIMIZER_IMPLS)}, "
                         f"got {optimizer_impl!r}")
    par = Parallelism(_positive("tp", tp), _positive("dp", dp), _positive("pp", pp), _positive("ep", ep))
    _check_experts(config, par, expert_capacity_factor, sequence_parallel, distributed_optimizer)
    load = _expert_load(config, ep, expert_load)
    if expert_gemm not in EXPERT_GEMMS:
        raise TraceError(f"transformer(): 'expert_gemm' must be one of {', '.join(EXPERT_GEMMS)}, got {expert_gemm!r}")
    if expert_gemm != "grouped" and config.experts is None:
        raise TraceError(f"transformer(): expert_gemm={expert_gemm!r} applies to a mixture-of-experts model "
                         f"('experts' in its file); {config.name} has a dense MLP")
    if not isinstance(shared_expert_overlap, bool):
        raise TraceError(f"transformer(): 'shared_expert_overlap' must be True or False, got {shared_expert_overlap!r}")
    if shared_expert_overlap and (not config.shared_expert_ffn or ep == 1):
        raise TraceError(f"transformer(): shared_expert_overlap runs a shared expert beside the all-to-alls of expert "
                         f"parallelism; it needs a model with a shared expert ('shared_expert_ffn'; {config.name} "
                         f"has {config.shared_expert_ffn or 'none'}) and ep > 1 (got {ep})")
    if _positive("expert_overlap_chunks", expert_overlap_chunks) > 1 and ep == 1:
        raise TraceError(f"transformer(): expert_overlap_chunks={expert_overlap_chunks} overlaps the all-to-alls "
                         f"of expert parallelism with the experts' GEMMs; it needs ep > 1")
    batch = _positive("batch", batch if batch is not None else config.batch)
    seq_len = _positive("seq_len", seq_len if seq_len is not None else config.seq_len)
    microbatches = _positive("microbatches", microbatches if microbatches is not None else pp)
    _positive("bucket_bytes", bucket_bytes)
    _positive("decode_tokens", decode_tokens)
    _positive("vocab_divisible_by", vocab_divisible_by)
    if _positive("virtual_stages", virtual_stages) > 1:
        needs = {"pp > 1": pp > 1, "schedule='1f1b'": schedule == "1f1b", "phase 'train' or 'prompt'": phase != "decode",
                 f"microbatches ({microbatches}) a multiple of pp ({pp})": microbatches % pp == 0,
                 f"at least one of the {config.layers} layers for each of pp x virtual_stages = "
                 f"{pp * virtual_stages} chunks": config.layers >= pp * virtual_stages}
        missing = [need for need, met in needs.items() if not met]
        if missing:
            raise TraceError(f"transformer(): virtual_stages={virtual_stages} (the interleaved 1F1B schedule) needs "
                             f"{'; '.join(missing)}")
    for name, flag in (("sequence_parallel", sequence_parallel), ("async_tp_backward", async_tp_backward),
                       ("distributed_optimizer", distributed_optimizer), ("overlap_param_gather", overlap_param_gather)):
        if not isinstance(flag, bool):
            raise TraceError(f"transformer(): '{name}' must be True or False, got {flag!r}")
    if overlap_param_gather and not distributed_optimizer:
        raise TraceError("transformer(): 'overlap_param_gather' overlaps the distributed optimizer's parameter "
                         "all-gathers; it needs distributed_optimizer=True")
    if sequence_parallel and phase == "decode":
        raise TraceError("transformer(): 'sequence_parallel' applies to phase='train' and 'prompt' (it slices the "
                         "tokens of a sequence), not to phase='decode'")
    if config.layers < pp:
        raise TraceError(f"transformer(): {config.layers} layers cannot fill pp={pp} stages")
    if tp > config.heads:
        raise TraceError(f"transformer(): tp={tp} exceeds the {config.heads} attention heads of {config.name} "
                         f"(tensor parallelism splits the heads over the ranks)")
    if phase == "decode" and not config.causal:
        raise TraceError(f"transformer(): phase='decode' generates tokens one at a time, which needs a causal "
                         f"model; {config.name} is an encoder (causal: false)")
    if batch % (dp * microbatches):
        raise TraceError(f"transformer(): batch {batch} does not divide into dp={dp} x microbatches={microbatches}")
    micro_batch = batch // (dp * microbatches)

    capacity = None if expert_capacity_factor is None else float(expert_capacity_factor)

    def builder_of(model_config: ModelConfig) -> _Transformer:
        return _Transformer(model_config, phase, par, micro_batch, seq_len, microbatches, schedule, dtype, recompute,
                            bucket_bytes, optimizer, optimizer_impl, decode_tokens, head, attention, sequence_parallel,
                            vocab_divisible_by, async_tp_backward, distributed_optimizer, virtual_stages,
                            overlap_param_gather, capacity, prefill_tokens, prefill_context,
                            load, expert_gemm, expert_overlap_chunks, shared_expert_overlap)

    builder = builder_of(config)
    frame = pd.DataFrame(builder.build())
    metadata = {
        "memory": stage_memory(builder),
        "memory_whole_model": stage_memory(builder_of(whole)) if whole.layers != config.layers else None,
        "generator": "gpusim.trace.transformer",
        "model": config.model_dump(),
        "phase": phase, "tp": tp, "dp": dp, "pp": pp, "batch": batch, "micro_batch": micro_batch,
        "seq_len": seq_len, "microbatches": microbatches, "schedule": schedule, "dtype": dtype,
        "recompute": recompute, "bucket_bytes": bucket_bytes, "optimizer": optimizer, "optimizer_impl": optimizer_impl,
        "decode_tokens": decode_tokens, "head": head, "attention": attention,
        "sequence_parallel": sequence_parallel, "vocab_divisible_by": vocab_divisible_by,
        "async_tp_backward": async_tp_backward, "distributed_optimizer": distributed_optimizer,
        "virtual_stages": virtual_stages, "overlap_param_gather": overlap_param_gather,
        "ep": ep, "expert_capacity_factor": capacity,
        "expert_load": _load_metadata(load), "expert_gemm": expert_gemm, "expert_overlap_chunks": expert_overlap_chunks,
        "shared_expert_overlap": shared_expert_overlap,
        "expert_dropped": None if load is None else [builder.expert_drops[layer] for layer in sorted(builder.expert_drops)],
        "prefill_tokens": prefill_tokens, "prefill_context": prefill_context,
    }  # fmt: skip
    name = f"{config.name}-{phase}-tp{tp}-dp{dp}-pp{pp}" + (f"-ep{ep}" if ep > 1 else "")
    return Trace(frame, source=name, metadata=metadata)
