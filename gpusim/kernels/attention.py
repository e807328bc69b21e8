"""Fused attention: FlashAttention-2's forward and backward kernels (Dao, 2023).

``softmax(Q K^T / sqrt(d)) V`` over ``batch x heads`` independent problems, without writing the
``q_len x kv_len`` scores to memory.  The forward kernel gives each workgroup ``block_m`` query
rows of one head: it loads their Q tile once, then walks the keys ``block_n`` at a time, loading a
K and a V tile per step (the next step's tiles while it computes the current one), and per step it
runs two matrix products on the tensor cores (``S = Q K^T`` and ``O += P V``: ``4 block_m block_n
d`` FLOPs) and the online softmax on the vector units (per score: a max, a scaled subtraction, an
``exp2`` on the special-function units, a sum and a conversion; per output element, the rescale
of the running output).  At the end it writes its O tile and the rows' log-sum-exp.  A causal mask
(aligned at the bottom right, as FlashAttention-2 aligns it when ``q_len != kv_len``) stops each
row block at its last attended key, so the tiles past the diagonal are never loaded.  The K and V
tiles of one head are read by all its row blocks, which the grid runs next to each other: after the
first, they come from the L2.

When the grid has too few workgroups to fill the GPU (decoding: a few query rows per head), the
keys are split over workgroups (``flash_fwd_splitkv_kernel``, "Flash-Decoding"): each writes an
fp32 partial output and log-sum-exp, and a second kernel combines them.

The backward kernel gives each workgroup ``block_n`` keys of one head: it loads their K and V once
and walks the query rows that attend to them, ``block_m`` at a time, loading Q, dO, the
log-sum-exp and ``D = rowsum(dO * O)``; per step it recomputes ``P`` and runs five products
(``S``, ``dP = dO V^T``, ``dV += P^T dO``, ``dK += dS^T Q``, ``dQ += dS K``: 2.5 times the
forward's FLOPs) and adds its ``dQ`` contribution to an fp32 accumulator with atomic adds in the
L2.  A pre-processing kernel computes ``D`` (and clears the accumulator), a post-processing kernel
converts it to ``dQ``; with grouped-query attention a last kernel sums each group's key and value
gradients.

Matrix instructions: FlashAttention-2 issues warp-level ``mma.sync``, the main matrix path of
Ampere and earlier; on a GPU whose BLAS reaches its peak only with warpgroup instructions and TMA
(Hopper: ``gpu.gemm_tma``), they run at ``gemm_fallback.mma_fraction``, the rate of that legacy
path (fitted on cuBLAS's fallback GEMMs and FlashAttention-2's published H100 benchmarks together).  The matrix and vector work of a step share the CU's issue
time (one math pipe per CU), so the softmax is not hidden behind the matrix products.  Every
product reads its operands from shared memory (:func:`shared_memory_bytes`); where a CU holds a
single workgroup of the kernel (the backward kernels: one 8-warp workgroup per SM), part of that
traffic's time adds to the step (``cu.lone_workgroup_lds_exposure``), which is why
FlashAttention-2's backward runs at a lower share of the peak than its forward.

Simplifications (docs/model.md): the tile sizes are FlashAttention-2's for Ampere without dropout,
on every GPU (AMD's Composable Kernel and Hopper's FlashAttention-3 tile and pipeline differently);
head dimensions are padded to FlashAttention-2's kernel sizes (multiples of 32); a causal diagonal
tile costs as much as a full one; a tile of the ``[batch, seq, heads, head_dim]`` tensors, strided
by the other heads' values, is laid out contiguously beside the other heads' tiles of the same rows
(:meth:`_AttentionKernel.offset`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpusim.config.gpu import DTYPE_BYTES, GpuConfig
from gpusim.engine.primitives import Join
from gpusim.errors import OpError
from gpusim.hw.compute import (
    ComputeUnit,
    InflightLimit,
    Kernel,
    WorkgroupShape,
    issue_lanes,
    issue_slots,
    occupancy,
)
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.kernels.elementwise import StreamingKernel, pipelined, read_ranges

ATTENTION_DTYPES = ("fp16", "bf16")
"""Input dtypes of FlashAttention-2's kernels (the accumulation is fp32)."""
HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
"""Head dimensions FlashAttention-2 has kernels for; a head dimension runs in the smallest that holds it."""
REGISTERS_PER_THREAD = 255
"""Registers per thread of FlashAttention-2's kernels (their accumulators and fragments fill the
register file: two 4-warp forward workgroups, or one 8-warp backward workgroup, per SM)."""
ACCUMULATOR_BYTES = 4
"""Bytes per value of the fp32 partial outputs, log-sum-exps, ``D`` and the ``dQ`` accumulator."""
FORWARD_SCORE_OPS = 3.5
"""Vector instructions per score of the forward step, beside its ``exp2``: the row maximum, the
scaled subtraction (one FMA), the row sum, and half a conversion (two probabilities per pack)."""
BACKWARD_SCORE_OPS = 4.5
"""Vector instructions per score of the backward step, beside its ``exp2`` and its ``dQ`` atomic
adds: the scaled subtraction of the log-sum-exp, ``dS = P (dP - D)`` (a subtraction and a
product), two half conversions (``P`` and ``dS`` to 16 bits) and their stores to shared memory
(two packed scores a store), which the ``dV`` and ``dK`` products read transposed."""
PRODUCT_WARP_ROWS = 32
"""Output rows of one warp's share of a backward product: FlashAttention-2's warp layouts give
each warp 32 rows of the product's output (``AtomLayoutMSdP``, ``AtomLayoutNdKV`` and
``AtomLayoutMdQ`` of its Ampere tiles), the other warps splitting the columns."""
SOFTMAX_FMA_SHARE = 0.75
"""Share of those instructions that run on the FP32 FMA pipe (the rest: maxima and conversions)."""
SPLIT_BLOCK_M = 64
"""Query rows per workgroup of the split-KV kernel."""
FILL_FRACTION = 0.8
"""A grid with at least this fraction of a workgroup per resident slot is not split (FlashAttention-2)."""
SPLIT_EFFICIENCY = 0.85
"""The split-KV heuristic takes the fewest splits whose last wave is at least this fraction as
full as the best split's."""
MAX_SPLITS = 128
"""Most splits of the keys."""
MAX_PIECES = 16
"""Most pieces a workgroup's steps are simulated in: a piece of several steps loads their tiles
together and computes them as one stretch (a long row block's hundreds of steps would otherwise
cost as many simulation events; the workgroup's in-flight limit still paces its loads)."""
ROW_PADDING = 256
"""Rows of a tensor's layout are padded to this many, a multiple of every kernel's tile."""


def padded_rows(rows: int) -> int:
    """``rows`` rounded up to :data:`ROW_PADDING`."""
    return -(-rows // ROW_PADDING) * ROW_PADDING


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call: ``batch x heads`` products of ``q_len`` queries with ``kv_len`` keys.

    Attributes
    ----------
    batch, heads, kv_heads
        Sequences, query heads and key/value heads (``heads`` a multiple of ``kv_heads``).
    q_len, kv_len
        Query and key lengths, tokens.
    head_dim
        Values per head.
    dtype
        ``fp16`` or ``bf16``.
    causal
        Whether query row ``i`` attends only to the first ``i + 1 + kv_len - q_len`` keys.
    """

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str
    causal: bool

    @property
    def dtype_bytes(self) -> int:
        """Bytes per input value."""
        return DTYPE_BYTES[self.dtype]

    @property
    def padded_dim(self) -> int:
        """Head dimension of the kernel that runs it."""
        return next(dim for dim in HEAD_DIMS if dim >= self.head_dim)

    def keys_of(self, row: int) -> int:
        """Keys query row ``row`` attends to."""
        if not self.causal:
            return self.kv_len
        return max(0, min(self.kv_len, row + 1 + self.kv_len - self.q_len))

    @property
    def scores(self) -> float:
        """Attended (query, key) pairs over all heads and sequences."""
        q, kv = self.q_len, self.kv_len
        if not self.causal:
            per_head = q * kv
        elif kv >= q:
            per_head = q * (kv - q) + q * (q + 1) / 2
        else:
            per_head = kv * (kv + 1) / 2
        return float(self.batch * self.heads * per_head)

    def flops(self, backward: bool = False) -> float:
        """Matrix FLOPs of the attended scores: 4 per score and head value forward, 10 backward."""
        return (10.0 if backward else 4.0) * self.scores * self.head_dim

    def tensor_bytes(self, rows: int, heads: int, size: int | None = None) -> int:
        """Bytes of a ``[batch, rows, heads, head_dim]`` tensor of ``size``-byte values (default: the inputs')."""
        return self.batch * rows * heads * self.head_dim * (size or self.dtype_bytes)

    def allocation_bytes(self, rows: int, heads: int, size: int | None = None) -> int:
        """Bytes the kernels address in such a tensor: ``rows`` padded to :data:`ROW_PADDING`."""
        return self.tensor_bytes(padded_rows(rows), heads, size)


@dataclass(frozen=True)
class AttentionTiling:
    """A kernel's tile: ``block_m`` query rows by ``block_n`` keys, ``warps`` warps, ``splits`` of the keys."""

    block_m: int
    block_n: int
    warps: int
    splits: int = 1

    def name(self, kind: str) -> str:
        """Implementation name, e.g. ``flash_fwd_128x64_w4``."""
        split = f"_split{self.splits}" if self.splits > 1 else ""
        return f"flash_{kind}_{self.block_m}x{self.block_n}_w{self.warps}{split}"


FORWARD_TILES = ((64, AttentionTiling(128, 128, 4)), (128, AttentionTiling(128, 64, 4)), (256, AttentionTiling(128, 64, 8)))
"""FlashAttention-2's forward tiles on Ampere without dropout, by the largest head dimension each serves."""
BACKWARD_TILES = ((64, AttentionTiling(128, 128, 8)), (128, AttentionTiling(64, 128, 8)), (256, AttentionTiling(64, 64, 8)))
"""FlashAttention-2's backward tiles on Ampere, likewise."""


def tiling_for(tiles: tuple[tuple[int, AttentionTiling], ...], problem: AttentionProblem) -> AttentionTiling:
    """The tile of ``tiles`` (:data:`FORWARD_TILES` or :data:`BACKWARD_TILES`) for the problem's head dimension."""
    return next(tiling for largest, tiling in tiles if problem.padded_dim <= largest)


def split_tiling(problem: AttentionProblem) -> AttentionTiling:
    """The split-KV kernel's tile (without its split count)."""
    dim = problem.padded_dim
    return AttentionTiling(SPLIT_BLOCK_M, 256 if dim <= 64 else 128 if dim <= 128 else 64, 4)


def choose_splits(workgroups: int, key_blocks: int, slots: int) -> int:
    """How many ways to split the keys of a grid of ``workgroups`` (one per row block and head)
    over ``key_blocks`` key tiles, on a GPU with ``slots`` resident workgroups.

    One (no split) when the grid already has :data:`FILL_FRACTION` of a workgroup per slot.  Otherwise each
    split count up to :data:`MAX_SPLITS` (and the key tiles) gives ``workgroups x splits``
    workgroups in waves of ``slots``; its efficiency is how full the waves are on average.  The
    fewest splits within :data:`SPLIT_EFFICIENCY` of the best efficiency win; a split count that
    gives each split as many tiles as the next smaller count is skipped.
    """
    if workgroups >= FILL_FRACTION * slots:
        return 1
    most = min(MAX_SPLITS, slots, key_blocks)

    def useful(splits: int) -> bool:
        return splits == 1 or math.ceil(key_blocks / splits) != math.ceil(key_blocks / (splits - 1))

    def efficiency(splits: int) -> float:
        waves = workgroups * splits / slots
        return waves / math.ceil(waves)

    counts = [splits for splits in range(1, most + 1) if useful(splits)]
    best = max(efficiency(splits) for splits in counts)
    return next(splits for splits in counts if efficiency(splits) >= SPLIT_EFFICIENCY * best)


def workgroup_shape(tiling: AttentionTiling, problem: AttentionProblem, backward: bool) -> WorkgroupShape:
    """A workgroup's threads, registers and shared memory: its Q tile (backward: Q and dO) and a K and
    a V tile."""
    tiles = (2 * tiling.block_n + (2 if backward else 1) * tiling.block_m) * problem.padded_dim
    return WorkgroupShape(tiling.warps * 32, tiles * problem.dtype_bytes, REGISTERS_PER_THREAD)


def fitted(tiling: AttentionTiling, problem: AttentionProblem, gpu: GpuConfig, backward: bool,
           label: str) -> AttentionTiling:
    """``tiling``, or where its workgroup fits on no CU of ``gpu`` (less shared memory than the
    A100's, on which FlashAttention-2's tiles are chosen; it takes smaller tiles on such GPUs), the
    first of its halvings, keys first and then queries, down to 32, that fits.

    Raises
    ------
    OpError
        No such tile fits, naming the op ``label``, the GPU and its resources.
    """
    candidate = tiling
    while occupancy(workgroup_shape(candidate, problem, backward), gpu.cu) == 0:
        if candidate.block_n > 32:
            candidate = replace(candidate, block_n=candidate.block_n // 2)
        elif candidate.block_m > 32:
            candidate = replace(candidate, block_m=candidate.block_m // 2)
        else:
            raise OpError(f"{label}: no FlashAttention tile at head dimension {problem.padded_dim} fits on a CU of "
                          f"{gpu.name} ({int(gpu.cu.lds_bytes)} bytes of shared memory, "
                          f"{int(gpu.cu.register_file_bytes)} of registers, {gpu.cu.max_threads} threads)")
    return candidate


def warp_mma_flops_per_ns(gpu: Gpu, dtype: str) -> float:
    """Sustained FLOPs per ns of one CU for warp-level matrix instructions (``mma.sync``): the
    GEMM rate, times ``gemm_fallback.mma_fraction`` on a GPU whose library GEMMs use TMA."""
    config = gpu.config
    rate = gpu.matrix_flops_per_ns(dtype)
    if config.gemm_tma is not None and config.gemm_fallback is not None and config.cu.matrix_flops_per_cycle.get(dtype):
        rate *= config.gemm_fallback.mma_fraction
    return rate


def product_operand_values(rows: int, columns: int, depth: int, warps: int) -> int:
    """Values the warps of a workgroup read from shared memory for one product of a ``rows x
    columns`` output and ``depth``: each warp owns :data:`PRODUCT_WARP_ROWS` rows (fewer warps
    along the rows where the output has fewer) and a share of the columns, and reads its rows of
    the left operand and its columns of the right one."""
    row_warps = max(1, min(warps, rows // PRODUCT_WARP_ROWS))
    return depth * (rows * (warps // row_warps) + columns * row_warps)


def shared_memory_bytes(tiling: AttentionTiling, problem: AttentionProblem, backward: bool) -> int:
    """Bytes a step moves through the CU's shared memory: its tiles' stores and its products'
    operand reads.

    Forward: the warps split the query rows; for ``S = Q K^T`` each reads its rows of ``Q`` and
    the whole ``K`` tile, for ``O += P V`` (``P`` in registers) the whole ``V`` tile; the ``K`` and
    ``V`` tiles are stored once.  Backward: the five products by :func:`product_operand_values`,
    the stores of ``P`` and ``dS`` that ``dV`` and ``dK`` read transposed, and the stores of the
    ``Q`` and ``dO`` tiles.
    """
    rows, keys, dim, warps = tiling.block_m, tiling.block_n, problem.padded_dim, tiling.warps
    if backward:
        values = (2 * product_operand_values(rows, keys, dim, warps)  # S = Q K^T, dP = dO V^T
                  + 2 * product_operand_values(keys, dim, rows, warps)  # dV += P^T dO, dK += dS^T Q
                  + product_operand_values(rows, dim, keys, warps)  # dQ = dS K
                  + 2 * rows * keys + 2 * rows * dim)
    else:
        values = dim * (rows + warps * keys) + warps * keys * dim + 2 * keys * dim
    return values * problem.dtype_bytes


def step_flops(gpu: Gpu, tiling: AttentionTiling, problem: AttentionProblem, backward: bool, mma_per_ns: float,
               lone: bool) -> float:
    """A step's work in matrix FLOPs: its products over the whole (padded) tile, and its vector and
    special-function instructions as the matrix FLOPs that take as long on the CU; where the CU
    holds one workgroup of the kernel (``lone``), also the exposed share of its shared-memory
    traffic (``cu.lone_workgroup_lds_exposure``)."""
    cu = gpu.config.cu
    scores = tiling.block_m * tiling.block_n
    dim = problem.padded_dim
    matrix = (10.0 if backward else 4.0) * scores * dim
    # per step, forward rescales the running output (block_m x dim values), backward adds its dQ
    # (block_m x dim fp32 values) to the accumulator, one atomic instruction per value
    ops = (BACKWARD_SCORE_OPS if backward else FORWARD_SCORE_OPS) + dim / tiling.block_n
    lanes = issue_lanes(cu, SOFTMAX_FMA_SHARE)
    cycles = scores * issue_slots(cu, lanes, ops, 1.0) / lanes
    if lone:
        cycles += cu.lone_workgroup_lds_exposure * shared_memory_bytes(tiling, problem, backward) / cu.lds_bytes_per_cycle
    return matrix + cycles / gpu.config.clock_hz * 1e9 * mma_per_ns


class _AttentionKernel:
    """What the forward and backward kernels share: geometry, rates and the tensors' layout."""

    def __init__(self, gpu: Gpu, problem: AttentionProblem, tiling: AttentionTiling, backward: bool):
        self.gpu = gpu
        self.problem = problem
        self.tiling = tiling
        self.group = problem.heads // problem.kv_heads
        self.row_bytes = problem.head_dim * problem.dtype_bytes
        self.mma_per_ns = warp_mma_flops_per_ns(gpu, problem.dtype)
        self.shape = workgroup_shape(tiling, problem, backward)
        lone = occupancy(self.shape, gpu.config.cu) == 1
        self.step_flops = step_flops(gpu, tiling, problem, backward, self.mma_per_ns, lone)
        self.miss_latency_ns = gpu.unloaded_memory_latency_ns
        self.wavefronts = self.shape.wavefronts(gpu.config.cu.wavefront_size)

    def offset(self, batch: int, head: int, heads: int, row: int, seq_len: int, block: int, size: int | None = None) -> int:
        """Byte offset of ``row`` of ``head`` (of ``heads``) in sequence ``batch`` (of ``seq_len``
        rows), in a tensor that kernels read ``block`` rows at a time.

        The tensors are ``[batch, seq, heads, head_dim]``: a tile of one head's rows is strided by
        the other heads' values, and the tiles of all heads for the same rows share their stretch
        of memory (and DRAM rows).  The model lays each tile out contiguously, the tiles of one
        stretch of rows next to each other (``[batch, seq / block, heads, block, head_dim]``), so
        the workgroups that read them together touch the same addresses a real layout's would.
        """
        tiles = padded_rows(seq_len) // block
        tile, within = divmod(row, block)
        return (((batch * tiles + tile) * heads + head) * block + within) * self.problem.head_dim * (
            size or self.problem.dtype_bytes)

    @staticmethod
    def pieces(steps: int) -> list[range]:
        """The steps ``0 .. steps - 1`` in at most :data:`MAX_PIECES` consecutive pieces."""
        count = min(steps, MAX_PIECES)
        return [range(piece * steps // count, (piece + 1) * steps // count) for piece in range(count)]


class FlashForwardKernel(_AttentionKernel):
    """The forward kernel (split or not) on one GPU.

    Parameters
    ----------
    gpu
        The GPU.
    problem
        The attention call.
    tiling
        Tile and split count.
    q, k, v
        Input buffers, ``[batch, len, heads, head_dim]``.
    out, lse
        The output and log-sum-exp buffers; with splits, the fp32 partial outputs and their log-sum-exps.
    """

    def __init__(self, gpu: Gpu, problem: AttentionProblem, tiling: AttentionTiling, q: Buffer, k: Buffer, v: Buffer,
                 out: Buffer, lse: Buffer):
        super().__init__(gpu, problem, tiling, backward=False)
        self.q, self.k, self.v, self.out, self.lse = q, k, v, out, lse
        self.row_blocks = math.ceil(problem.q_len / tiling.block_m)
        self.key_blocks = math.ceil(problem.kv_len / tiling.block_n)
        self.blocks_per_split = math.ceil(self.key_blocks / tiling.splits)
        # one K and one V tile in flight while the current ones are used
        self.inflight_bytes = 2 * tiling.block_n * self.row_bytes
        num_wgs = self.row_blocks * tiling.splits * problem.batch * problem.heads
        self.kernel = Kernel(name=tiling.name("fwd"), num_wgs=num_wgs, shape=self.shape, body=self._workgroup,
                             info={"impl": tiling.name("fwd"), "flops": problem.flops(), "workgroups": num_wgs})
        self.kernel.math_units, self.kernel.peak_flops_per_cu_cycle = gpu.config.gemm_math(problem.dtype)

    def key_range(self, row_block: int, split: int) -> tuple[int, int]:
        """Key tiles ``[first, stop)`` that ``row_block`` visits in ``split``."""
        p, t = self.problem, self.tiling
        last_row = min(p.q_len, (row_block + 1) * t.block_m) - 1
        needed = math.ceil(p.keys_of(last_row) / t.block_n)
        first = split * self.blocks_per_split
        return first, max(first, min(needed, first + self.blocks_per_split))

    def _workgroup(self, wg: int, cu: ComputeUnit):
        p, t = self.problem, self.tiling
        row_block, rest = wg % self.row_blocks, wg // self.row_blocks
        split, rest = rest % t.splits, rest // t.splits
        batch, head = divmod(rest, p.heads)
        kv_head = head // self.group
        rows = min(t.block_m, p.q_len - row_block * t.block_m)
        first, stop = self.key_range(row_block, split)
        limit = InflightLimit(cu, self.inflight_bytes, self.miss_latency_ns)
        steps = stop - first
        pieces = self.pieces(steps)

        def fetch(piece: int) -> Join:
            tiles = []
            for step in pieces[piece]:
                key = (first + step) * t.block_n
                keys = min(t.block_n, p.kv_len - key)
                at = self.offset(batch, kv_head, p.kv_heads, key, p.kv_len, t.block_n)
                tiles += [(self.k, at, keys * self.row_bytes), (self.v, at, keys * self.row_bytes)]
            if piece == 0:
                tiles.append((self.q, self.offset(batch, head, p.heads, row_block * t.block_m, p.q_len, t.block_m),
                              rows * self.row_bytes))
            return read_ranges(self.gpu, limit, tiles)

        def writes(piece: int) -> list[tuple[Buffer, int, int]]:
            if piece + 1 < max(1, len(pieces)):
                return []
            size = ACCUMULATOR_BYTES if t.splits > 1 else p.dtype_bytes
            slot = split * p.batch + batch
            row = row_block * t.block_m
            return [(self.out, self.offset(slot, head, p.heads, row, p.q_len, t.block_m, size), rows * p.head_dim * size),
                    (self.lse, ((slot * p.heads + head) * p.q_len + row) * ACCUMULATOR_BYTES, rows * ACCUMULATOR_BYTES)]

        if steps == 0:  # a causal row block whose split holds none of its keys: it writes an empty partial
            yield from pipelined(self.gpu, cu, 1, None, lambda piece: 0.0, writes, self.mma_per_ns, self.wavefronts)
            return
        yield from pipelined(self.gpu, cu, len(pieces), fetch, lambda piece: len(pieces[piece]) * self.step_flops,
                             writes, self.mma_per_ns, self.wavefronts)


class FlashBackwardKernel(_AttentionKernel):
    """The backward kernel on one GPU: a workgroup per ``block_n`` keys of one head.

    Parameters
    ----------
    gpu, problem, tiling
        As for :class:`FlashForwardKernel`.
    q, k, v, grad_out
        Inputs, ``[batch, len, heads, head_dim]``.
    lse, delta
        The forward's log-sum-exp and ``rowsum(dO * O)``, fp32 per query row.
    grad_q_accum
        The fp32 ``dQ`` accumulator.
    grad_k, grad_v
        Key and value gradients, one per query head (summed over the group afterwards where
        ``kv_heads < heads``).
    """

    def __init__(self, gpu: Gpu, problem: AttentionProblem, tiling: AttentionTiling, q: Buffer, k: Buffer, v: Buffer,
                 grad_out: Buffer, lse: Buffer, delta: Buffer, grad_q_accum: Buffer, grad_k: Buffer, grad_v: Buffer):
        super().__init__(gpu, problem, tiling, backward=True)
        self.q, self.k, self.v, self.grad_out = q, k, v, grad_out
        self.lse, self.delta, self.grad_q_accum, self.grad_k, self.grad_v = lse, delta, grad_q_accum, grad_k, grad_v
        self.row_blocks = math.ceil(problem.q_len / tiling.block_m)
        self.key_blocks = math.ceil(problem.kv_len / tiling.block_n)
        # the next Q and dO tiles in flight while the current ones are used
        self.inflight_bytes = 2 * tiling.block_m * self.row_bytes
        num_wgs = self.key_blocks * problem.batch * problem.heads
        self.kernel = Kernel(name=tiling.name("bwd"), num_wgs=num_wgs, shape=self.shape, body=self._workgroup,
                             info={"impl": tiling.name("bwd"), "flops": problem.flops(backward=True),
                                   "workgroups": num_wgs})
        self.kernel.math_units, self.kernel.peak_flops_per_cu_cycle = gpu.config.gemm_math(problem.dtype)

    def first_row_block(self, key_block: int) -> int:
        """The first query row block that attends to a key of ``key_block``."""
        p, t = self.problem, self.tiling
        if not p.causal:
            return 0
        first_key = key_block * t.block_n
        # row i attends to key j when j < i + 1 + kv_len - q_len
        first_row = max(0, first_key - p.kv_len + p.q_len)
        return min(self.row_blocks, first_row // t.block_m)

    def _workgroup(self, wg: int, cu: ComputeUnit):
        p, t = self.problem, self.tiling
        key_block, rest = wg % self.key_blocks, wg // self.key_blocks
        batch, head = divmod(rest, p.heads)
        kv_head = head // self.group
        keys = min(t.block_n, p.kv_len - key_block * t.block_n)
        first = self.first_row_block(key_block)
        limit = InflightLimit(cu, self.inflight_bytes, self.miss_latency_ns)
        steps = self.row_blocks - first
        pieces = self.pieces(steps)

        def stats(buffer: Buffer, row: int, rows: int) -> tuple[Buffer, int, int]:
            return buffer, ((batch * p.heads + head) * p.q_len + row) * ACCUMULATOR_BYTES, rows * ACCUMULATOR_BYTES

        def fetch(piece: int) -> Join:
            tiles = []
            for step in pieces[piece]:
                row = (first + step) * t.block_m
                rows = min(t.block_m, p.q_len - row)
                at = self.offset(batch, head, p.heads, row, p.q_len, t.block_m)
                tiles += [(self.q, at, rows * self.row_bytes), (self.grad_out, at, rows * self.row_bytes),
                          stats(self.lse, row, rows), stats(self.delta, row, rows)]
            if piece == 0:
                kv_at = self.offset(batch, kv_head, p.kv_heads, key_block * t.block_n, p.kv_len, t.block_n)
                tiles += [(self.k, kv_at, keys * self.row_bytes), (self.v, kv_at, keys * self.row_bytes)]
            return read_ranges(self.gpu, limit, tiles)

        def writes(piece: int) -> list[tuple[Buffer, int, int]]:
            ranges = []
            for step in pieces[piece]:  # each step's dQ contribution, added to the fp32 accumulator in the L2
                row = (first + step) * t.block_m
                rows = min(t.block_m, p.q_len - row)
                ranges.append((self.grad_q_accum, self.offset(batch, head, p.heads, row, p.q_len, t.block_m,
                                                              ACCUMULATOR_BYTES), rows * p.head_dim * ACCUMULATOR_BYTES))
            if piece + 1 == len(pieces):
                at = self.offset(batch, head, p.heads, key_block * t.block_n, p.kv_len, t.block_n)
                ranges += [(self.grad_k, at, keys * self.row_bytes), (self.grad_v, at, keys * self.row_bytes)]
            return ranges

        if steps == 0:  # keys no query attends to: their gradients are zero
            at = self.offset(batch, head, p.heads, key_block * t.block_n, p.kv_len, t.block_n)
            zero = [(self.grad_k, at, keys * self.row_bytes), (self.grad_v, at, keys * self.row_bytes)]
            yield from pipelined(self.gpu, cu, 1, None, lambda piece: 0.0, lambda piece: zero, self.mma_per_ns,
                                 self.wavefronts)
            return
        yield from pipelined(self.gpu, cu, len(pieces), fetch, lambda piece: len(pieces[piece]) * self.step_flops,
                             writes, self.mma_per_ns, self.wavefronts)


def problem_of(op) -> AttentionProblem:
    """The :class:`AttentionProblem` a :class:`gpusim.ops.Attention` runs as.

    A one-query forward pass with grouped keys and values runs, as FlashAttention-2 runs it, with
    each group's queries as the rows of one key/value head (``q_len`` the group, ``heads`` the
    key/value heads, no mask), so one tile of keys serves the whole group.
    """
    kv_heads = op.kv_heads or op.heads
    if op.direction == "forward" and op.q_len == 1 and kv_heads < op.heads:
        return AttentionProblem(op.batch, kv_heads, kv_heads, op.heads // kv_heads, op.kv_len, op.head_dim, op.dtype,
                                False)
    return AttentionProblem(op.batch, op.heads, kv_heads, op.q_len, op.kv_len, op.head_dim, op.dtype, op.causal)


def forward_plan(problem: AttentionProblem, gpu: GpuConfig, label: str = "attention") -> AttentionTiling:
    """The forward kernel FlashAttention-2 runs ``problem`` with on ``gpu``: the plain kernel, or
    the split-KV kernel with its split count where a grid of its row blocks would not fill the
    GPU's workgroup slots (tiles :func:`fitted` to the GPU)."""
    split = fitted(split_tiling(problem), problem, gpu, False, label)
    row_blocks = math.ceil(problem.q_len / split.block_m)
    slots = gpu.num_cus * occupancy(workgroup_shape(split, problem, False), gpu.cu)
    splits = choose_splits(row_blocks * problem.batch * problem.heads, math.ceil(problem.kv_len / split.block_n),
                           slots)
    if splits == 1:
        return fitted(tiling_for(FORWARD_TILES, problem), problem, gpu, False, label)
    return replace(split, splits=splits)


def execute_attention(ctx, op):
    """Run a :class:`gpusim.ops.Attention` on ``ctx``'s rank (a generator for the op's stream)."""
    p = problem_of(op)
    if op.direction == "backward":
        yield from _execute_backward(ctx, op, p)
        return
    gpu = ctx.gpu
    tiling = forward_plan(p, gpu.config, op.label)
    q_bytes, kv_bytes = p.tensor_bytes(p.q_len, p.heads), p.tensor_bytes(p.kv_len, p.kv_heads)
    q, out = (ctx.tensor(name, p.allocation_bytes(p.q_len, p.heads)) for name in (op.q, op.out))
    k, v = (ctx.tensor(name, p.allocation_bytes(p.kv_len, p.kv_heads)) for name in (op.k, op.v))
    lse_bytes = p.batch * p.heads * p.q_len * ACCUMULATOR_BYTES
    lse = ctx.tensor(op.lse, lse_bytes)
    if tiling.splits > 1:
        partial_bytes = tiling.splits * p.tensor_bytes(p.q_len, p.heads, ACCUMULATOR_BYTES)
        partial = ctx.tensor(None, tiling.splits * p.allocation_bytes(p.q_len, p.heads, ACCUMULATOR_BYTES))
        partial_lse = ctx.tensor(None, tiling.splits * lse_bytes)
        kernel = FlashForwardKernel(gpu, p, tiling, q, k, v, partial, partial_lse)
        yield from ctx.launch(kernel.kernel)
        # the combine kernel weighs each split's partial output by its log-sum-exp
        combine = StreamingKernel(gpu, name="flash_fwd_splitkv_combine",
                                  reads=[(partial, partial_bytes), (partial_lse, tiling.splits * lse_bytes)],
                                  writes=[(out, q_bytes), (lse, lse_bytes)],
                                  flops=3.0 * tiling.splits * p.batch * p.q_len * p.heads * p.head_dim, cus=ctx.cus)
        yield from ctx.launch(combine.kernel, host_ns=0.0)
    else:
        kernel = FlashForwardKernel(gpu, p, tiling, q, k, v, out, lse)
        yield from ctx.launch(kernel.kernel)
    ctx.info.update(impl=tiling.name("fwd"), flops=p.flops(), workgroups=kernel.kernel.num_wgs,
                    bytes=2 * q_bytes + 2 * kv_bytes + lse_bytes)


def _execute_backward(ctx, op, p: AttentionProblem):
    gpu = ctx.gpu
    tiling = fitted(tiling_for(BACKWARD_TILES, p), p, gpu.config, True, op.label)
    q_bytes, kv_bytes = p.tensor_bytes(p.q_len, p.heads), p.tensor_bytes(p.kv_len, p.kv_heads)
    q_alloc, kv_alloc = p.allocation_bytes(p.q_len, p.heads), p.allocation_bytes(p.kv_len, p.kv_heads)
    accum_bytes = p.tensor_bytes(p.q_len, p.heads, ACCUMULATOR_BYTES)
    stat_bytes = p.batch * p.heads * p.q_len * ACCUMULATOR_BYTES
    q, out, grad_out, grad_q = (ctx.tensor(name, q_alloc) for name in (op.q, op.out, op.grad_out, op.grad_q))
    k, v, grad_k, grad_v = (ctx.tensor(name, kv_alloc) for name in (op.k, op.v, op.grad_k, op.grad_v))
    lse = ctx.tensor(op.lse, stat_bytes)
    delta = ctx.tensor(None, stat_bytes)
    accum = ctx.tensor(None, p.allocation_bytes(p.q_len, p.heads, ACCUMULATOR_BYTES))
    grouped = p.kv_heads < p.heads
    expanded = p.tensor_bytes(p.kv_len, p.heads)
    if grouped:
        head_k, head_v = (ctx.tensor(None, p.allocation_bytes(p.kv_len, p.heads)) for _ in range(2))
    else:
        head_k, head_v = grad_k, grad_v
    # D = rowsum(dO * O), and the dQ accumulator cleared
    prologue = StreamingKernel(gpu, name="flash_bwd_dot_do_o", reads=[(grad_out, q_bytes), (out, q_bytes)],
                               writes=[(delta, stat_bytes), (accum, accum_bytes)],
                               flops=2.0 * p.batch * p.q_len * p.heads * p.head_dim, cus=ctx.cus)
    yield from ctx.launch(prologue.kernel)
    kernel = FlashBackwardKernel(gpu, p, tiling, q, k, v, grad_out, lse, delta, accum, head_k, head_v)
    yield from ctx.launch(kernel.kernel, host_ns=0.0)
    convert = StreamingKernel(gpu, name="flash_bwd_convert_dq", reads=[(accum, accum_bytes)],
                              writes=[(grad_q, q_bytes)], flops=float(p.batch * p.q_len * p.heads * p.head_dim),
                              cus=ctx.cus)
    yield from ctx.launch(convert.kernel, host_ns=0.0)
    if grouped:  # each key/value head's gradient is the sum of its query heads'
        reduce = StreamingKernel(gpu, name="flash_bwd_sum_groups", reads=[(head_k, expanded), (head_v, expanded)],
                                 writes=[(grad_k, kv_bytes), (grad_v, kv_bytes)],
                                 flops=2.0 * p.batch * p.kv_len * p.heads * p.head_dim, cus=ctx.cus)
        yield from ctx.launch(reduce.kernel)
    ctx.info.update(impl=tiling.name("bwd"), flops=p.flops(backward=True), workgroups=kernel.kernel.num_wgs,
                    bytes=4 * q_bytes + 4 * kv_bytes + stat_bytes)
