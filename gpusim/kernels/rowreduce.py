"""Row kernels: reductions (softmax, layernorm, rmsnorm, row sums) as the framework's kernels run
them, and vLLM's element-wise kernels that give each row a workgroup (:func:`vllm_row_kernel`).

A row-reduction kernel gives each workgroup one row (a short row may share a workgroup with a few
others).  The workgroup works through its row in *passes* -- the statistics, then the output --
and each pass is a loop whose iterations load one vector per thread and use it before the next
load: the loop does not prefetch, so a pass takes its iterations times the memory latency (an L2
hit or a DRAM miss), on top of its instructions.  That latency is the loaded one: an iteration's
loads queue behind those of every resident workgroup, so an iteration takes the unloaded latency
or the time the L2 or the DRAM takes to move one iteration of all of them, whichever is longer (a
closed loop).  A pass that gathers a statistic ends in a reduction across the workgroup's lanes: a
tree of cross-lane exchanges (within a wavefront) and, for a block-wide one, workgroup barriers
and the local data share between the trees.  Rows short enough for the loads of all their
iterations to be in flight at once, rows cached in the local data share, and rows re-read through
the L2 all come out of the same accounting.

Throughput is then the workgroups' occupancy (how many of their threads fit on a CU) over the time
of that chain, unless the memory or the CUs' instruction issue saturates first.  This is what
makes PyTorch's eager softmax and layernorm reach only a half or a third of the bandwidth of a copy
(``docs/validation.md``).

Which kernel runs is the library's choice, made as the framework makes it (:func:`row_kernel`);
each kernel records its threads, rows per workgroup, load width and passes (:class:`RowKernelSpec`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpusim.config.gpu import DTYPE_BYTES, GpuConfig
from gpusim.engine.primitives import Join
from gpusim.hw.compute import ComputeUnit, Kernel, WorkgroupShape, issue_lanes, issue_slots, occupancy
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.hw.request import COMPUTE
from gpusim.kernels.elementwise import write_ranges

MAX_ROW_CHUNKS = 64
"""Most chunks per simulated workgroup slot; a chunk stands for the real workgroups the slot runs
one after another (simulation granularity: an event per pass of a chunk)."""
MAX_REWALK_ROW_CHUNKS = 256
"""The same for a kernel that walks its rows in memory more than once: a chunk of several real
workgroups walks all their rows before re-reading the first, so its rows would have to stay in the
L2 that many times longer than the hardware's (one row per workgroup at a time) need to; one real
workgroup per chunk up to this many chunks keeps the reuse distance."""
SHARED_MEMORY_PER_BLOCK = {"nvidia": 48 * 1024, "amd": 64 * 1024}
"""Shared memory a kernel may use without opting in, by vendor (``sharedMemPerBlock``: CUDA's 48 KiB,
HIP's 64 KiB), bytes: PyTorch's block softmax caches the row there when it fits."""
SOFTMAX_WARP_MAX = {"pytorch": (2048, 8192), "pytorch-2.0": (1024, 4096)}
"""Longest row, elements and bytes, PyTorch's softmax gives one wavefront (``dispatch_softmax_forward``),
by library: 2048 values of at most 4 bytes in the releases we measured (2.11 on the H200: rows of
2048 half-precision values run ``softmax_warp_forward<..., 11>``), 1024 in 2.0."""
SOFTMAX_PASS_OPS = {
    "softmax_warp_forward": ((7.0, 0.0), (11.0, 1.0), (20.0, 1.0)),
    "cunn_SoftMaxForwardReg": ((12.0, 0.0), (15.0, 1.0), (31.0, 2.0)),
    "cunn_SoftMaxForwardSmem": ((3.5, 0.0), (11.0, 1.0), (22.0, 2.0)),
    "cunn_SoftMaxForward": ((3.5, 0.0), (11.0, 1.0), (22.0, 2.0)),
}
"""Vector and special-function instructions per element of each pass of PyTorch's softmax kernels
(maximum; sum of exponentials; normalised output), counted in their SASS on the H200 (PyTorch 2.11,
``validation/measured/h200/reduction_sass.csv.gz``; per-thread set-up and the reductions apart).

Every kernel computes ``expf`` without fast math (about 10 instructions beside the ``ex2``: the
subtraction of the maximum, a range reduction, a rounding and a two-term correction) and divides
by the sum with a precise division (about 7 beside the reciprocal estimate).  The warp kernel keeps
each exponential in a register, so its output pass divides only; the block kernels compute the
exponential again in the output pass.  The register kernel loads and stores one element per
instruction, each behind its own bounds test (about 10 instructions of 64-bit addressing and a
branch per element and pass); the shared-memory kernel moves 16-byte vectors.  The global-memory
kernel is taken to cost what the shared-memory kernel does, with its vectors read from the L2
instead of the local data share (profiled later, ``compiled_sass.csv.gz``: 43.3 per element with its
set-up and reductions over 4096 x 32768, against the model's 41.6)."""
NORM_VECTOR_ELEMENTS = 4
"""Elements each thread of PyTorch's vectorized layer norm loads per iteration (``vec_size``)."""
REDUCE_MAX_THREADS = 512
"""Most threads of a ``reduce_kernel`` block (``mnt_wrapper::MAX_NUM_THREADS``; its launch bounds ask
for four such blocks per SM, so 32 registers per thread)."""
REDUCE_UNROLL = 4
"""Loads each thread of ``reduce_kernel`` issues together when it does not load vectors (``vt0``)."""
REDUCE_VECTOR_MIN_COLS = 128
"""Shortest contiguous row ``setReduceConfig`` loads in vectors (``dim0 >= 128``)."""
REDUCE_WARP_SPLIT_VALUES = 16
"""Values per thread and row of the block from which the block's wavefronts share one row."""
REDUCE_SPLIT_VALUES = 256
"""Values per thread from which ``setReduceConfig`` spreads one row over several blocks
(``max_values_per_thread``)."""
REDUCE_MIN_SPLIT_VALUES = {"nvidia": 16, "amd": 128}
"""Fewest values per thread it leaves each of those blocks (``min_values_per_thread``: 128 in
PyTorch's ROCm build, which also spreads a row over at least 64 blocks once it spreads it)."""
INDUCTOR_PERSISTENT_MAX_COLS = 1024
"""Longest row Inductor reduces in one persistent block (the whole row loaded at once)."""
INDUCTOR_RBLOCK = 2048
"""Elements per iteration of Inductor's looped reductions."""
SOFTMAX_MAX_REGISTERS = 10
"""PyTorch's block softmax keeps a row in registers when each thread holds fewer of its elements
than this (``potential_register_count``)."""
SOFTMAX_WARP_REGISTERS = 16
"""Registers per thread of PyTorch's warp softmax beside the row's values it holds (one 32-bit float
each): 48 at 1024 half-precision values per row, 80 at 2048, on the H200."""
SOFTMAX_REG_REGISTERS = (23, 1.75)
"""Registers per thread of PyTorch's register softmax: a base and a cost per element held (30 with
4 elements per thread, 37 with 8, on the H200; so 2048 threads of 4 elements fit on an SM, and
only one block of 1024 threads of 8)."""
SUM_COMBINE_OPS = 2.0
"""Instructions of one step of a sum's (or a maximum's) reduction in a wavefront: a shuffle and an add."""
WELFORD_COMBINE_OPS = 28.0
"""Instructions of one step of a Welford reduction in a wavefront (``cuWelfordCombine`` after three
shuffles): two adds, the count's test, a precise reciprocal (about six), the two weights, the mean
(a multiply and a multiply-add) and the variance (four), and the branches around the empty-partner
and slow-division cases (28 in ``vectorized_layer_norm_kernel``'s SASS on the H200)."""
MAX_COMBINE_OPS = 3.0
"""Instructions of one step of a maximum's reduction in a wavefront: a shuffle, a compare and a select
(``fmaxf`` keeps NaNs; the softmax kernels' SASS on the H200)."""
BLOCK_EXCHANGE_OPS = 10.0
"""Instructions each wavefront of a block-wide reduction runs beside its own tree: its lane and
wavefront tests, the store of its partial result to the local data share, two barriers and the
read of the block's result (the softmax and norm kernels' SASS on the H200: 8-12)."""
FMA_PIPE_SHARE = {
    "softmax_warp_forward": 0.40, "cunn_SoftMaxForwardReg": 0.43, "cunn_SoftMaxForwardSmem": 0.58,
    "cunn_SoftMaxForward": 0.60, "vectorized_layer_norm_kernel": 0.52, "reduce_kernel": 0.54,
    "triton_per": 0.77, "triton_red": 0.60, "rms_norm_kernel": 0.45,
    "act_and_mul_kernel": 0.5, "rotary_embedding_kernel": 0.4,
}
"""Share of each kernel's executed instructions that run on the FP32 (FMA) pipe: FFMA, FADD, FMUL,
half-precision arithmetic, IMAD (counted in the kernels' SASS on the H200, ``reduction_sass.csv.gz``
and ``compiled_sass.csv.gz``; Inductor's persistent kernels 0.74-0.80, its looped ones 0.50-0.73;
vLLM's kernels are estimates from their source, not measured).
Where that pipe has fewer lanes than the CU issues (the A100's and the V100's 16 per scheduler), it
bounds the kernel's issue rate (:class:`RowReduceKernel`)."""
NORM_FINISH_OPS = 60.0
"""Instructions each wavefront of PyTorch's layer and RMS norm runs per row after its block
reduction: combining the wavefronts' partial results through the local data share, the mean and
the reciprocal root (a precise division and ``rsqrt``), storing them, and setting up the output
loop (53 for the layer norm and 66 for the RMS norm per warp beyond the model's exchange, in their
SASS on the H200)."""
THREAD_SETUP_OPS = 20.0
"""Instructions each thread of a row-reduction workgroup runs once, outside its loops: reading the
kernel's arguments and its indices, the row's base address and the loop bounds (the PyTorch
kernels' SASS on the H200: about 20)."""


@dataclass(frozen=True)
class RowPass:
    """One loop of a workgroup over its rows.

    Attributes
    ----------
    source
        Where the loop reads the row: ``"memory"`` (global loads through the L2), ``"lds"`` (the copy
        cached in the local data share) or ``"registers"`` (held since an earlier pass).
    ops_per_element
        Vector instructions per element (conversions, arithmetic, address and loop overhead).
    transcendentals_per_element
        Special-function instructions per element (exp, reciprocal), which run on the CU's narrower
        transcendental units: beside the other instructions, or in their issue slots where the
        GPU runs them on its vector ALUs (``cu.transcendentals_on_vector_alu``).
    reduction
        The reduction that ends the pass: ``"block"`` (across the workgroup), ``"wave"`` (within each
        wavefront) or ``None``.
    combine_cycles
        Extra latency of one step of that reduction beyond an add, cycles (Welford's combination of
        means and variances divides by the counts).
    combine_ops
        Instructions of one step of that reduction in each wavefront: the exchanges and the
        combination (a shuffle and an add for a sum or a maximum).
    writes
        Whether the pass writes the output.
    finish_ops
        Instructions each wavefront runs after the pass's reduction to make the row's statistic of
        it and set up the next loop, per row (:data:`NORM_FINISH_OPS`).
    """

    source: str
    ops_per_element: float
    transcendentals_per_element: float = 0.0
    reduction: str | None = None
    combine_cycles: float = 0.0
    combine_ops: float = SUM_COMBINE_OPS
    writes: bool = False
    finish_ops: float = 0.0


@dataclass(frozen=True)
class RowKernelSpec:
    """A library's row-reduction kernel.

    Attributes
    ----------
    name
        Kernel name, as the framework's.
    threads
        Threads per workgroup.
    rows_per_workgroup
        Rows one workgroup reduces (columns, for a column reduction).
    vector_bytes
        Bytes of its rows each thread loads per loop iteration (all of them in flight at once).
    registers_per_thread
        32-bit registers per thread (with the threads, the occupancy).
    passes
        The workgroup's loops over its rows, in order.
    split
        Workgroups that share one row (each reduces a slice of it; their partial results are
        combined through global memory).
    columns
        A column reduction: each workgroup reads a strip of its columns across the rows.
    combine_loads
        Dependent loads with which the last of the workgroups sharing a line reads their partial
        results (when ``split`` > 1).
    inputs
        Row-sized tensors each pass from memory reads side by side (a backward kernel reads the
        incoming gradient beside the forward pass's input or output).
    fma_share
        Share of its instructions that run on the FP32 (FMA) pipe (:data:`FMA_PIPE_SHARE`).
    reduction_lanes
        Lanes that reduce one row together in a ``"wave"`` reduction (a narrow row's kernel packs
        several rows into a wavefront, each reduced over fewer exchange steps); ``None``: the whole
        wavefront.
    """

    name: str
    threads: int
    rows_per_workgroup: int
    vector_bytes: int
    registers_per_thread: int
    passes: tuple[RowPass, ...]
    split: int = 1
    columns: bool = False
    combine_loads: int = 0
    inputs: int = 1
    fma_share: float = field(kw_only=True)
    reduction_lanes: int | None = field(default=None, kw_only=True)


def _softmax_passes(first: str, later: str, reduction: str, load_ops: float) -> tuple[RowPass, ...]:
    """Maximum, sum of exponentials, normalised exponentials (one ``expf`` per element in each of
    the last two: a range reduction and a special-function ``ex2``); ``load_ops`` are the load
    (and store) instructions per element of a pass that touches memory or shared memory.  Inductor's
    Triton softmax; PyTorch's kernels count their instructions from SASS (:func:`_pytorch_softmax`)."""
    extra = 0.0 if later == "registers" else load_ops
    return (
        RowPass(first, ops_per_element=2.0 + load_ops, reduction=reduction),
        RowPass(later, ops_per_element=8.0 + extra, transcendentals_per_element=1.0, reduction=reduction),
        RowPass(later, ops_per_element=9.0 + extra + load_ops, transcendentals_per_element=1.0, writes=True),
    )


def _pytorch_softmax(name: str, threads: int, rows_per_workgroup: int, vector_bytes: int, registers: int,
                     later: str, reduction: str, lanes: int | None = None) -> RowKernelSpec:
    """PyTorch's softmax kernel ``name`` in the given geometry: its three passes with their counts
    (:data:`SOFTMAX_PASS_OPS`), the last two reading the row from ``later``, each ending in a
    ``reduction`` but the last (over ``lanes`` per row, :attr:`RowKernelSpec.reduction_lanes`), and
    its FMA-pipe share (:data:`FMA_PIPE_SHARE`)."""
    (first_ops, _), (sum_ops, sum_special), (out_ops, out_special) = SOFTMAX_PASS_OPS[name]
    passes = (
        RowPass("memory", ops_per_element=first_ops, reduction=reduction, combine_ops=MAX_COMBINE_OPS),
        RowPass(later, ops_per_element=sum_ops, transcendentals_per_element=sum_special, reduction=reduction),
        RowPass(later, ops_per_element=out_ops, transcendentals_per_element=out_special, writes=True),
    )
    return RowKernelSpec(name, threads, rows_per_workgroup, vector_bytes, registers, passes,
                         fma_share=FMA_PIPE_SHARE[name], reduction_lanes=lanes)


LIBRARIES = ("pytorch", "pytorch-2.0", "inductor", "inductor-2.0", "vllm")
"""Row-reduction kernel libraries: PyTorch's eager CUDA/HIP kernels (2.5 and later; ``pytorch-2.0``
for the release before the register-cached softmax and the new block sizes), the Triton kernels
``torch.compile`` generates (``inductor``; ``inductor-2.0`` for PyTorch 2.0's, which sized the
programs' warps by the block and took a variance as two sums) and vLLM's CUDA kernels (``vllm``:
the RMS norm only, as vLLM 0.2 and sarathi-serve run it)."""
VLLM_NORM_MAX_THREADS = 1024
"""Most threads of vLLM's ``rms_norm_kernel`` (``dim3 block(std::min(hidden_size, 1024))``)."""


def row_kernel(kind: str, rows: int, cols: int, dtype: str, gpu: GpuConfig, library: str = "pytorch") -> RowKernelSpec:
    """The kernel a library launches for a row reduction.

    Parameters
    ----------
    kind
        ``softmax``, ``layernorm``, ``rmsnorm``, ``sum`` (of each row) or ``colsum`` (of each column;
        PyTorch's eager kernel only).
    rows, cols
        Matrix shape, elements.
    dtype
        Element dtype.
    gpu
        The GPU (its wavefront size and CUs).
    library
        One of :data:`LIBRARIES`.

    Returns
    -------
    RowKernelSpec
        Its geometry and passes (:func:`_softmax_kernel`, :func:`_norm_kernel`,
        :func:`_reduce_kernel`, :func:`_inductor_kernel`).
    """
    if library not in LIBRARIES:
        raise ValueError(f"RowReduce: field 'library' must be one of {', '.join(LIBRARIES)}, got {library!r}")
    if kind not in ("softmax", "layernorm", "rmsnorm", "sum", "colsum", "softmax_backward", "layernorm_backward",
                    "rmsnorm_backward"):
        raise ValueError(f"unknown row-reduction kind {kind!r}")
    if library == "vllm" and kind != "rmsnorm":
        raise ValueError(f"RowReduce: library 'vllm' runs kind 'rmsnorm' only, not {kind!r}")
    size = DTYPE_BYTES[dtype]
    if kind.endswith("_backward"):
        forward = row_kernel(kind.removesuffix("_backward"), rows, cols, dtype, gpu, library)
        return _backward_kernel(forward, statistics=2 if kind == "layernorm_backward" else 1)
    if kind == "colsum":
        if library.startswith("inductor"):
            raise ValueError("RowReduce: kind 'colsum' is modelled for PyTorch's eager kernels only")
        return _reduce_kernel(cols, rows, False, size, gpu)
    if library.startswith("inductor"):
        return _inductor_kernel(kind, cols, size, gpu, pytorch_2_0=library == "inductor-2.0")
    if library == "vllm":
        return _vllm_rms_norm_kernel(cols, size)
    if kind == "softmax":
        return _softmax_kernel(cols, size, gpu, library)
    if kind == "sum":
        return _reduce_kernel(rows, cols, True, size, gpu)
    return _norm_kernel(kind, cols, size)


def _norm_passes(kind: str, later: str) -> tuple[RowPass, RowPass]:
    """Statistics (from memory, ending in a block reduction) and output (read from ``later``) of a
    layer norm (Welford) or an RMS norm (a sum of squares).

    PyTorch builds without fast math, so Welford's ``1.f / count`` (once per element, and once per
    combination of two partial results) is a precise reciprocal: the special-function estimate, two
    Newton-Raphson fused multiply-adds and a test for the slow path, about 6 vector instructions
    beside the 10 of the update (16 per element).  A combination step waits for that reciprocal
    (about 45 cycles) and for the scaled means and variances that follow it (about 45 more: 90
    cycles beyond the exchange).  Measured on the H200 (``reduction_grid.csv``), the layer norm's
    cost over the RMS norm's grows by about 60 ns an SM per row and 0.35 ns per 1000 elements
    (docs/validation-log.md, stop 25).  The output pass reads the weight (and bias) beside the row and
    converts and scales each value: 11 instructions per element for the layer norm, 7.5 for the RMS
    norm, in ``vectorized_layer_norm_kernel``'s SASS on the H200 (``reduction_sass.csv.gz``; its
    statistics loops 16.5 and 3.25)."""
    if kind == "layernorm":
        return (RowPass("memory", ops_per_element=16.0, transcendentals_per_element=1.0, reduction="block",
                        combine_cycles=90.0, combine_ops=WELFORD_COMBINE_OPS, finish_ops=NORM_FINISH_OPS),
                RowPass(later, ops_per_element=11.0, writes=True))
    return (RowPass("memory", ops_per_element=3.0, reduction="block", finish_ops=NORM_FINISH_OPS),
            RowPass(later, ops_per_element=7.5, writes=True))


def _norm_kernel(kind: str, cols: int, size: int) -> RowKernelSpec:
    """``vectorized_layer_norm_kernel``: 128 threads per row, 4 elements per thread and iteration,
    two passes over the row in global memory (statistics, then output); RMS norm runs the same
    kernel.  Rows whose length is not a multiple of 4 load one element at a time."""
    vector = NORM_VECTOR_ELEMENTS if cols % NORM_VECTOR_ELEMENTS == 0 else 1
    return RowKernelSpec("vectorized_layer_norm_kernel", 128, 1, vector * size, 32, _norm_passes(kind, "memory"),
                         fma_share=FMA_PIPE_SHARE["vectorized_layer_norm_kernel"])


def _vllm_rms_norm_kernel(cols: int, size: int) -> RowKernelSpec:
    """vLLM's ``rms_norm_kernel``: one row per workgroup of ``min(cols, 1024)`` threads, each
    striding over the row one value at a time, twice from memory (the sum of squares, then the
    scaled output with the weight). Instructions per value estimated from its source (not
    measured): a scalar load, its conversion, a multiply-add and the loop's 64-bit addressing, step
    and test (6); then the load and the weight's, conversions, two multiplies and the store (12)."""
    passes = (RowPass("memory", ops_per_element=6.0, reduction="block", finish_ops=NORM_FINISH_OPS),
              RowPass("memory", ops_per_element=12.0, writes=True))
    return RowKernelSpec("rms_norm_kernel", min(cols, VLLM_NORM_MAX_THREADS), 1, size, 32, passes,
                         fma_share=FMA_PIPE_SHARE["rms_norm_kernel"])


VLLM_ROW_KINDS = {"silu_and_mul": 1024, "rope": 512}
"""The element-wise kinds vLLM runs one workgroup per row, with the most threads its launch gives a
row (``csrc/activation_kernels.cu``: a thread per value of the gate, at most 1024;
``csrc/pos_encoding_kernels.cu``: a thread per rotated pair of the query heads, at most 512; the
model counts the key heads' pairs too, which gives the same 512 wherever the query heads have 512
pairs or more: Llama-2-7B's layer up to four-way tensor parallelism, 70B's up to eight-way; beyond,
the model gives the block more threads than vLLM does)."""
VLLM_ACT_AND_MUL_OPS = (34.0, 2.0)
"""Instructions and special functions per value of ``act_and_mul_kernel<silu>``, estimated from its
source (not measured): the gate's and the up projection's scalar half-precision loads and their
conversions, ``x / (1 + expf(-x))`` without fast math (an ``ex2`` and a precise division's
reciprocal, about 17 instructions around them), the product, its conversion and store, 64-bit
addressing and the strided loop's step and test."""
VLLM_ROPE_OPS = 24.0
"""Instructions per value of ``rotary_embedding_kernel``, estimated from its source (not measured):
for each rotated pair a run-time integer division with remainder (the head and the offset in it),
the cosine's and sine's loads from the position's cache row, the two values' loads and
conversions, two multiplies and two fused multiply-adds, the stores, addressing and the loop's
step: about 48 a pair."""


def vllm_row_kernel(kind: str, cols: int, size: int) -> RowKernelSpec:
    """vLLM's per-row element-wise kernel for rows of ``cols`` values of ``size`` bytes: each
    thread strides over its row one value (a rotation: one pair) per loop iteration, loading before
    it computes and stores, with no prefetch of the next iteration; one pass from memory that
    writes. ``silu_and_mul`` reads two row-sized tensors (the gate and the up projection)."""
    if kind not in VLLM_ROW_KINDS:
        raise ValueError(f"vllm_row_kernel: kind must be one of {', '.join(VLLM_ROW_KINDS)}, got {kind!r}")
    if kind == "silu_and_mul":
        ops, special = VLLM_ACT_AND_MUL_OPS
        threads = max(1, min(VLLM_ROW_KINDS[kind], cols))
        return RowKernelSpec("act_and_mul_kernel", threads, 1, size, 32,
                             (RowPass("memory", ops_per_element=ops, transcendentals_per_element=special, writes=True),),
                             inputs=2, fma_share=FMA_PIPE_SHARE["act_and_mul_kernel"])
    threads = max(1, min(VLLM_ROW_KINDS[kind], cols // 2))
    return RowKernelSpec("rotary_embedding_kernel", threads, 1, 2 * size, 32,
                         (RowPass("memory", ops_per_element=VLLM_ROPE_OPS, writes=True),),
                         fma_share=FMA_PIPE_SHARE["rotary_embedding_kernel"])


def _softmax_kernel(cols: int, size: int, gpu: GpuConfig, library: str) -> RowKernelSpec:
    """PyTorch's softmax kernels.

    - ``softmax_warp_forward``: rows of at most 2048 elements (1024 in 2.0; :data:`SOFTMAX_WARP_MAX`),
      one wavefront (or part of one) per row, the whole row loaded at once into registers, one
      element per load;
    - ``cunn_SoftMaxForwardReg`` (2.5 and later): a block of ``min(cols, 1024)`` threads per row
      when each thread holds fewer than 10 of its elements, one element per load instruction;
    - ``cunn_SoftMaxForwardSmem`` (2.5 and later): longer rows that fit in a block's default shared memory,
      loaded once with 16-byte loads;
    - ``cunn_SoftMaxForward``: the row re-read from global memory by each of the three passes; in
      2.0 every row longer than 1024 elements, with a block of the power of two at or above half
      the row's 16-byte vectors (at most 1024 threads).

    Registers per thread are the H200's (``reduction_counters.csv.gz``): the warp kernel holds its
    row's values as 32-bit floats beside 16 others (48 at 1024 elements, 80 at 2048), the register
    kernel 30 with 4 elements per thread and 37 with 8 (:data:`SOFTMAX_REG_REGISTERS`).
    """
    warp = gpu.cu.wavefront_size
    row_bytes = cols * size
    most_cols, most_bytes = SOFTMAX_WARP_MAX["pytorch-2.0" if library == "pytorch-2.0" else "pytorch"]
    if cols <= most_cols and row_bytes <= most_bytes:
        width = 1 << (cols - 1).bit_length()
        lanes = min(width, warp)
        batch = 2 if width <= 128 else 1
        per_block = (128 // lanes) * batch
        registers = SOFTMAX_WARP_REGISTERS + batch * (width // lanes)
        return _pytorch_softmax("softmax_warp_forward", 128, per_block, -(-per_block * row_bytes // 128), registers,
                                "registers", "wave", lanes)
    if library == "pytorch-2.0":
        most = max(1, min(row_bytes // 16, 1024) // 2)
        threads = max(warp, 1 << (most - 1).bit_length())
        return _pytorch_softmax("cunn_SoftMaxForward", threads, 1, 16, 32, "memory", "block")
    threads = min(1024, -(-cols // warp) * warp)
    held = -(-cols // threads)
    if held < SOFTMAX_MAX_REGISTERS:
        base, per_element = SOFTMAX_REG_REGISTERS
        return _pytorch_softmax("cunn_SoftMaxForwardReg", threads, 1, held * size, base + math.ceil(per_element * held),
                                "registers", "block")
    shared = min(int(gpu.cu.lds_bytes), SHARED_MEMORY_PER_BLOCK.get(gpu.vendor, SHARED_MEMORY_PER_BLOCK["nvidia"]))
    if row_bytes + threads // warp * 4 <= shared:
        return _pytorch_softmax("cunn_SoftMaxForwardSmem", threads, 1, 16, 32, "lds", "block")
    return _pytorch_softmax("cunn_SoftMaxForward", threads, 1, 16, 32, "memory", "block")


BACKWARD_NAMES = {"vectorized_layer_norm_kernel": "layer_norm_grad_input_kernel_vectorized"}
"""Backward kernels whose names do not follow from the forward's (``Forward`` -> ``Backward``)."""


def _backward_kernel(forward: RowKernelSpec, statistics: int) -> RowKernelSpec:
    """The backward kernel of a softmax or a layer norm, shaped as its forward kernel.

    The library's backward kernels keep the forward's geometry (a wavefront or a block per row, the
    same vectors) and read the incoming gradient beside the forward's output (softmax) or input
    (layer norm) wherever the forward reads its row: a first pass reduces ``statistics`` sums per
    row (``sum(dy * y)``; the layer norm's two, without Welford's divisions, nor the forward's mean
    and reciprocal root after them), the forward's last pass writes the gradient (no exponentials).
    """
    first, last = forward.passes[0], forward.passes[-1]
    passes = (replace(first, transcendentals_per_element=0.0, combine_cycles=0.0,
                      combine_ops=statistics * SUM_COMBINE_OPS, finish_ops=0.0),
              replace(last, transcendentals_per_element=0.0))
    name = BACKWARD_NAMES.get(forward.name, forward.name.replace("Forward", "Backward").replace("forward", "backward"))
    return replace(forward, name=name, passes=passes, inputs=2)


def _pow2_floor(value: int) -> int:
    """Largest power of two at or below ``value`` (at least 1)."""
    return 1 << max(0, int(value).bit_length() - 1)


def _reduce_kernel(outputs: int, inputs: int, contiguous: bool, size: int, gpu: GpuConfig) -> RowKernelSpec:
    """``reduce_kernel`` as PyTorch's ``setReduceConfig`` shapes it for ``outputs`` sums of
    ``inputs`` values each: of contiguous rows (``contiguous``) or of columns.

    Row sums: rows of at least 128 elements are loaded in 16-byte vectors (8 elements of 16 bits, 4
    wider ones), one per thread and loop iteration, shorter rows 4 elements at a time; a block is a
    wavefront's width of lanes along the row by as many rows as fit in 512 threads.  Column sums:
    each lane owns 4 neighbouring columns (fewer if the row length is not a multiple of 4) and loads
    them as one vector per row, 4 rows per loop iteration, in blocks of up to 128 threads.  Either way
    the block's wavefronts share its lines (rows, or the columns of a lane) once a thread would sum at
    least 16 values per wavefront of the block (or 256), and when a thread would still sum 256 values
    and the blocks do not fill the GPU, several blocks share a line and combine their partial sums
    through global memory.  Each thread runs through its values one dependent iteration after
    another: a row of 4096 half-precision values summed by 32 lanes waits for 16 memory latencies.
    """
    warp = gpu.cu.wavefront_size
    if contiguous:
        output_vector = 1
        input_vector = (8 if size == 2 else 4) if inputs >= REDUCE_VECTOR_MIN_COLS else 1
        lanes_wanted, across = -(-inputs // input_vector), outputs
    else:
        output_vector = next(v for v in (4, 2, 1) if outputs % v == 0)
        input_vector = 1
        lanes_wanted, across = outputs // output_vector, inputs
    most = REDUCE_MAX_THREADS // output_vector
    dim0 = _pow2_floor(lanes_wanted) if lanes_wanted < most else most
    dim1 = _pow2_floor(across) if across < most else most
    height = min(dim1, most // min(dim0, warp))
    width = min(dim0, most // height)
    threads = width * height
    lanes_per_line = width if contiguous else 1
    per_thread = -(-inputs // lanes_per_line)
    shared = per_thread >= min(height * REDUCE_WARP_SPLIT_VALUES, REDUCE_SPLIT_VALUES)
    if shared:
        per_thread = -(-inputs // (lanes_per_line * height))
    if contiguous:  # rows per block: the block's, or each wavefront row's own
        per_block = 1 if shared else height
    else:  # columns per block: a lane's vector across the block's width, or across all its threads
        per_block = (width if shared else threads) * output_vector
    grid = -(-outputs // per_block)
    split = 1
    target = gpu.num_cus * (gpu.cu.max_threads // threads)
    if shared and per_thread >= REDUCE_SPLIT_VALUES and grid <= target:
        fewest = REDUCE_MIN_SPLIT_VALUES.get(gpu.vendor, REDUCE_MIN_SPLIT_VALUES["nvidia"])
        split = max(min(-(-target // grid), -(-per_thread // fewest)), -(-per_thread // REDUCE_SPLIT_VALUES))
        if split > 1 and gpu.vendor == "amd":
            split = max(split, 64)
    if contiguous:
        load_bytes = input_vector * size if input_vector > 1 else REDUCE_UNROLL * size
        reduction = "block" if shared and height > 1 or width > warp else "wave"
    else:
        load_bytes = REDUCE_UNROLL * output_vector * size
        reduction = "block" if shared and height > 1 else None
    passes = (RowPass("memory", ops_per_element=2.0, reduction=reduction, writes=True),)
    registers = 32 if contiguous else 48
    # the last block reads the partials with all its threads (row sums) or one wavefront row at a time
    combine_loads = -(-split // (threads if contiguous else height)) if split > 1 else 0
    return RowKernelSpec("reduce_kernel", threads, per_block, load_bytes, registers, passes, split=split,
                         fma_share=FMA_PIPE_SHARE["reduce_kernel"], columns=not contiguous,
                         combine_loads=combine_loads, reduction_lanes=width if reduction == "wave" else None)


def _inductor_kernel(kind: str, cols: int, size: int, gpu: GpuConfig, pytorch_2_0: bool = False) -> RowKernelSpec:
    """The Triton kernel ``torch.compile`` generates: one row per program; a *persistent*
    reduction (the whole row loaded at once and kept in registers) for rows of at most 1024
    elements, a *looped* one (chunks of 2048 elements; the statistics loop, then a loop that
    re-reads the row) for longer rows.

    The later releases run programs of 4 wavefronts with 16-byte loads in the loops.  A persistent
    layer norm takes its variance as a second sum, of the squared deviations from the mean
    (Inductor's ``welford_reduce_fallback``: with the row in registers Welford's updates buy
    nothing); a looped one runs Welford's updates and combinations.

    PyTorch 2.0 (``pytorch_2_0``) sizes the warps by the block (``triton_config_reduction``: a warp
    per 128 elements of it, 2 to 8, so 8 for every looped kernel) and always takes the mean and
    then the variance as two plain sums (``var_mean_sum_``), so a looped layer norm walks its row
    three times: the sum, the squared deviations, the normalised output."""
    persistent = cols <= INDUCTOR_PERSISTENT_MAX_COLS
    later = "registers" if persistent else "memory"
    if pytorch_2_0:
        block = 1 << (cols - 1).bit_length() if persistent else INDUCTOR_RBLOCK
        threads = min(max(block // 128, 2), 8) * gpu.cu.wavefront_size
        vector = -(-block * size // threads)
    else:
        threads = 4 * gpu.cu.wavefront_size
        vector = -(-cols * size // threads) if persistent else min(16, -(-INDUCTOR_RBLOCK * size // threads))
    if kind == "softmax":
        passes = _softmax_passes("memory", later, "block", load_ops=1.0 / max(1, vector // size))
    elif kind == "sum":
        passes = (RowPass("memory", ops_per_element=2.0, reduction="block", writes=True),)
    elif kind == "layernorm" and (persistent or pytorch_2_0):
        passes = (RowPass("memory", ops_per_element=3.0, reduction="block"),
                  RowPass(later, ops_per_element=3.0, reduction="block"),
                  RowPass(later, ops_per_element=4.0, writes=True))
    else:
        passes = _norm_passes(kind, later)
    name = f"triton_{'per' if persistent else 'red'}"
    return RowKernelSpec(f"{name}_fused_{kind}", threads, 1, vector, 32, passes, fma_share=FMA_PIPE_SHARE[name])


def reduction_cycles(kind: str | None, threads: int, gpu: GpuConfig, combine_cycles: float = 0.0,
                     lanes: int | None = None) -> float:
    """Latency of a reduction across ``threads`` lanes, cycles.

    A wavefront reduces in ``log2(wavefront)`` dependent exchange steps (``log2(lanes)`` where
    ``lanes`` of it share a row, :attr:`RowKernelSpec.reduction_lanes`); a block-wide reduction adds
    a barrier, one exchange through the local data share, ``log2(wavefronts)`` more steps in one
    wavefront, and a barrier to broadcast the result.
    """
    if kind is None:
        return 0.0
    cu = gpu.cu
    step = cu.shuffle_cycles + combine_cycles
    if kind == "wave":
        return math.log2(min(threads, lanes or cu.wavefront_size, cu.wavefront_size)) * step
    wave_steps = math.log2(min(threads, cu.wavefront_size))
    waves = max(1, -(-threads // cu.wavefront_size))
    return (wave_steps + 1 + math.log2(waves)) * step + 2 * cu.barrier_cycles


def reduction_ops(kind: str | None, threads: int, rows: int, gpu: GpuConfig, combine_ops: float,
                  lanes: int | None = None) -> float:
    """Lane-instructions a workgroup of ``threads`` issues for the reductions of its ``rows``: every
    wavefront runs ``log2(wavefront)`` steps of ``combine_ops`` instructions for each row it reduces
    (a wavefront reduction; where ``lanes`` of it share a row, ``log2(lanes)`` steps for each of its
    rows, the wavefront's rows side by side in one instruction) or for the row (a block-wide one,
    which adds the exchange through the local data share in every wavefront,
    :data:`BLOCK_EXCHANGE_OPS`, and ``log2(wavefronts)`` steps of one wavefront).  They take the
    CU's issue slots (:meth:`ComputeUnit.compute`) beside the steps' latency
    (:func:`reduction_cycles`): with many workgroups resident, the instructions bound a
    reduction-heavy kernel, not the latency."""
    if kind is None:
        return 0.0
    wave = gpu.cu.wavefront_size
    waves = max(1, -(-threads // wave))
    if kind == "block":
        steps = waves * math.log2(min(threads, wave)) * combine_ops
        return rows * (steps + waves * BLOCK_EXCHANGE_OPS + math.log2(waves) * combine_ops) * wave
    lanes = min(threads, lanes or wave, wave)
    rounds = max(1, -(-rows * lanes // wave))  # one per wavefront's worth of rows
    return rounds * math.log2(lanes) * combine_ops * wave


def _rounds_ns(iterations: int, latency_ns: float, transfer_ns: float) -> float:
    """Time of ``iterations`` dependent loads by every resident thread, ns.

    A closed loop: each round waits for the memory's latency or for the memory to move the round's
    bytes of all resident threads, whichever is longer, and the first round for both.  Once the bytes
    in flight cover the latency the rounds stream at the memory's bandwidth (mean-value analysis of
    thousands of wavefronts sharing one memory gives the same to within a percent or two).
    """
    return iterations * max(latency_ns, transfer_ns) + min(latency_ns, transfer_ns)


class RowReduceKernel:
    """A row-reduction kernel on one GPU (see the module docstring).

    The simulation runs at most one workgroup per resident slot; each stands for the real
    workgroups that slot runs one after another, in up to :data:`MAX_ROW_CHUNKS` chunks.

    Parameters
    ----------
    gpu
        The GPU.
    spec
        The library kernel.
    src, dst
        Input rows and output (rows x cols; one value per row for ``sum``, per column for ``colsum``).
    rows, cols
        Matrix shape.
    dtype
        Element dtype.
    out_bytes
        Bytes written.
    extra
        The other row-sized inputs of a kernel that reads several (``spec.inputs``).
    cus
        CUs the kernel may use (its stream's CU mask; default: all of the GPU's).
    """

    def __init__(self, gpu: Gpu, spec: RowKernelSpec, src: Buffer, dst: Buffer, rows: int, cols: int, dtype: str,
                 out_bytes: int, extra: tuple[Buffer, ...] = (), cus: int | None = None):
        config = gpu.config
        self.gpu = gpu
        self.spec = spec
        self.dst = dst
        self.sources = (src, *extra)
        self.size = DTYPE_BYTES[dtype]
        self.in_bytes = rows * cols * self.size
        self.out_bytes = out_bytes
        shape = WorkgroupShape(spec.threads, 0, spec.registers_per_thread)
        lines, line_elements = (cols, rows) if spec.columns else (rows, cols)
        self.real = -(-lines // spec.rows_per_workgroup) * spec.split
        self.wg_bytes = spec.rows_per_workgroup * line_elements * self.size / spec.split
        # a column reduction's workgroup reads a strip of its columns from every row
        self.run_bytes = spec.rows_per_workgroup * self.size if spec.columns else None
        slots = (cus or config.num_cus) * max(1, occupancy(shape, config.cu))
        self.workgroups = min(self.real, slots)
        rewalks = sum(row_pass.source == "memory" for row_pass in spec.passes) > 1
        most = MAX_REWALK_ROW_CHUNKS if rewalks else MAX_ROW_CHUNKS
        self.chunks = max(1, min(most, -(-self.real // self.workgroups)))
        self.iterations = max(1, math.ceil(self.wg_bytes / (spec.threads * spec.vector_bytes)))
        self.wavefronts = shape.wavefronts(config.cu.wavefront_size)
        # the counts are instructions: they issue at the CU's issue rate (or the FP32 pipe's, where it
        # has fewer lanes and carries the kernel's share of them), without the FLOP efficiency of
        # element-wise code (gpu.vector_efficiency)
        lanes = issue_lanes(config.cu, spec.fma_share)
        self.issue_per_ns = lanes * config.clock_hz * 1e-9
        # instructions per element of each pass, special functions at their units' rate
        self.element_ops = [issue_slots(config.cu, lanes, p.ops_per_element, p.transcendentals_per_element)
                            for p in spec.passes]
        self.setup_ops = spec.threads * THREAD_SETUP_OPS
        # a wavefront issues one instruction in every cu.dependent_issue_cycles slots of its SIMD
        self.issuing = self.wavefronts / config.cu.dependent_issue_cycles
        clock_ns = 1e9 / config.clock_hz
        self.reduction_ns = [reduction_cycles(p.reduction, spec.threads, config, p.combine_cycles,
                                              spec.reduction_lanes) * clock_ns for p in spec.passes]
        # each pass's reduction tree and, after a norm's, each wavefront's finishing of its rows
        # (RowPass.finish_ops); a column reduction's lanes each combine their own columns' partial
        # sums: no row's tree
        rows_here = min(spec.rows_per_workgroup, lines)  # a grid of one workgroup may have fewer
        self.reduction_ops = [0.0 if spec.columns else
                              reduction_ops(p.reduction, spec.threads, rows_here, config, p.combine_ops,
                                            spec.reduction_lanes)
                              + p.finish_ops * rows_here * self.wavefronts * config.cu.wavefront_size
                              for p in spec.passes]
        # a loop iteration queues behind those of every workgroup resident with it (_rounds_ns): a
        # slot's n-th chunk runs beside the n-th chunks of the other slots, and a grid that overflows
        # its slots by a few workgroups leaves a tail that runs with the memory to itself; a
        # workgroup loads no more in an iteration than its rows hold (a row of 32 values gives 8 of
        # a layer norm's 128 threads a vector)
        workgroup_bytes = min(spec.threads * spec.vector_bytes, self.wg_bytes) * spec.inputs
        self.round_bytes = [slots * workgroup_bytes for slots in self._concurrent_slots()]
        self.miss_latency_ns = gpu.unloaded_memory_latency_ns
        self.hit_latency_ns = config.l2.hit_latency_ns
        self.miss_bandwidth = config.hbm.sustained_bandwidth_bytes_per_s * 1e-9
        self.hit_bandwidth = config.l2.sustained_bandwidth_bytes_per_s * 1e-9
        # blocks sharing a line write their partial results, fence them and count themselves on a
        # semaphore (a memory round trip); the last one reads the partials back from the L2
        self.combine_ns = (gpu.unloaded_memory_latency_ns + spec.combine_loads * config.l2.hit_latency_ns
                           if spec.split > 1 else 0.0)
        self.kernel = Kernel(
            name=spec.name,
            num_wgs=self.workgroups,
            shape=shape,
            body=self._workgroup,
            info={"bytes": self.in_bytes + self.out_bytes},
        )

    def _concurrent_slots(self) -> list[int]:
        """Slots that run an ``n``-th non-empty chunk, for each ``n`` (the workgroups resident
        together during it)."""
        counts = [0] * self.chunks
        for wg in range(self.workgroups):
            runs = sum(1 for chunk in range(self.chunks) if self._blocks(wg, chunk))
            for n in range(runs):
                counts[n] += 1
        return counts

    def _blocks(self, wg: int, chunk: int) -> int:
        """Real workgroups in chunk ``chunk`` of slot ``wg`` that have rows to read."""
        first, stop = self._range(wg, chunk)
        if stop <= first or min(self.in_bytes, int(stop * self.wg_bytes)) <= int(first * self.wg_bytes):
            return 0
        return stop - first

    def _range(self, wg: int, chunk: int) -> tuple[int, int]:
        """Real workgroups ``[first, stop)`` that chunk ``chunk`` of slot ``wg`` stands for.

        The chunks are dealt out round by round, as the hardware dispatches workgroups in order:
        the ``chunk``-th chunks of all slots cover one contiguous run of rows, so the workgroups
        resident together read neighbouring rows (and DRAM rows), and a grid that overflows its
        slots leaves its last workgroups to a partial round (the tail)."""
        per_piece = -(-self.real // (self.workgroups * self.chunks))
        piece = chunk * self.workgroups + wg
        return min(self.real, piece * per_piece), min(self.real, (piece + 1) * per_piece)

    def _workgroup(self, wg: int, cu: ComputeUnit):
        gpu = self.gpu
        env = gpu.env
        spec = self.spec
        written = Join(env)
        run = 0
        for chunk in range(self.chunks):
            blocks = self._blocks(wg, chunk)
            if not blocks:
                continue
            first, stop = self._range(wg, chunk)
            lo = int(first * self.wg_bytes)
            hi = min(self.in_bytes, int(stop * self.wg_bytes))
            elements = (hi - lo) // self.size
            round_bytes = self.round_bytes[run]
            run += 1
            for index, row_pass in enumerate(spec.passes):
                if row_pass.source == "memory":
                    yield self._load(cu, lo, hi - lo, blocks * self.iterations, round_bytes).close()
                ops = self.element_ops[index] * elements + blocks * self.reduction_ops[index]
                if index == 0:
                    ops += blocks * self.setup_ops
                done = cu.compute(env.now, ops, self.issue_per_ns, self.issuing)
                stall = blocks * self.reduction_ns[index]
                if row_pass.writes:
                    stall += blocks * self.combine_ns
                yield env.timeout(max(0.0, done - env.now) + stall)
                if row_pass.writes:
                    out_lo = lo * self.out_bytes // self.in_bytes
                    out_hi = hi * self.out_bytes // self.in_bytes
                    write_ranges(gpu, cu, [(self.dst, out_lo, max(1, out_hi - out_lo))], written)
        yield written.close()

    def _load(self, cu: ComputeUnit, offset: int, nbytes: int, iterations: int, round_bytes: float) -> Join:
        """Load ``nbytes`` of the rows in ``iterations`` dependent loop iterations: done when the
        data has arrived, and no sooner than one loaded memory latency per iteration (an L2 hit's
        or a miss's, in the proportion of the bytes; ``round_bytes`` is what one iteration of all
        the workgroups resident together loads), nor than the CU's own memory-level parallelism
        allows."""
        gpu = self.gpu
        now = gpu.env.now
        join = Join(gpu.env)
        missed = sum(gpu.memory.read(source.addr + offset, nbytes, join, COMPUTE, source.cached,
                                     run_bytes=self.run_bytes) for source in self.sources)
        nbytes *= len(self.sources)
        share = missed / nbytes
        miss_rounds = _rounds_ns(iterations, self.miss_latency_ns, round_bytes / self.miss_bandwidth)
        hit_rounds = _rounds_ns(iterations, self.hit_latency_ns, round_bytes / self.hit_bandwidth)
        join.extend_to(now + share * miss_rounds + (1.0 - share) * hit_rounds)
        join.extend_to(cu.memory(now, nbytes, missed))
        return join


def execute_row_reduce(ctx, op):
    """Run a :class:`gpusim.ops.RowReduce` on ``ctx``'s rank."""
    from gpusim.ops import ROW_REDUCE_KINDS

    size = DTYPE_BYTES[op.dtype]
    nbytes = op.rows * op.cols * size
    out_bytes = {"sum": op.rows * size, "colsum": op.cols * size}.get(op.kind, nbytes)
    spec = row_kernel(op.kind, op.rows, op.cols, op.dtype, ctx.gpu.config, op.library)
    src = ctx.tensor(op.input, nbytes)
    dst = ctx.tensor(op.out, out_bytes)
    extra = tuple(ctx.tensor(None, nbytes) for _ in range(spec.inputs - 1))
    kernel = RowReduceKernel(ctx.gpu, spec, src, dst, op.rows, op.cols, op.dtype, out_bytes, extra, cus=ctx.cus)
    yield from ctx.launch(kernel.kernel)
    flops = ROW_REDUCE_KINDS[op.kind] * op.rows * op.cols
    ctx.info.update(impl=spec.name, flops=flops, bytes=spec.inputs * nbytes + out_bytes, passes=len(spec.passes))
