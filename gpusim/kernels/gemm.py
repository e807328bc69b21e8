"""Tiled GEMM: a kernel library, a BLAS-like selection heuristic, and the workgroup model.

Each workgroup computes one ``tile_m x tile_n`` output tile (of one batch entry, and of one K
split).  It loops over K in simulation steps: it requests its A and B slices for the next step
through the L2 (double buffering) while it computes the current step's FLOPs on its CU, then writes
its output tile.  Tile and wave quantization, L2 reuse between the workgroups resident together and
the read-then-write bursts of each stage come out of this and of the dispatcher, not out of a
formula.  On a GPU whose library kernels load by TMA (Hopper, ``gpu.gemm_tma``) a workgroup keeps
its stages' bytes in flight without the CU's per-thread limit (:class:`TmaInflight`), and the
workgroups of a thread-block cluster each request their share of the panel they share, which the
L2 serves once per cluster (:func:`multicast`).

Memory layout (a simplification documented in docs/model.md): A and B are stored as contiguous
*slices* (``tile x k_step`` panels), ordered by K step and then by tile so that the slices the
resident workgroups read at one step are adjacent and spread over the channels, and C as contiguous
tiles in row-major tile order.  Workgroups are dispatched in the grouped rasterization order of BLAS
libraries (:func:`grouped_order`) unless the caller gives an order (T3 dispatches chunk by chunk, so
that a stage's output is a contiguous address range).
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from simpy.events import Event

from gpusim.config.gpu import DTYPE_BYTES, GpuConfig
from gpusim.engine.primitives import Join
from gpusim.errors import OpError
from gpusim.hw.compute import SIMDS_PER_CU, ComputeUnit, InflightLimit, Kernel, StallClock, WorkgroupShape, occupancy
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.hw.request import COMPUTE

ACCUMULATOR_BYTES = 4
TARGET_K_STEPS = 16
"""Simulation steps per workgroup aimed at: the K loop is simulated in about this many steps."""

ALIGNED_ROW_BYTES = 16
"""Row alignment, bytes, that the library's kernels need on a GPU with a fallback family
(:attr:`gpusim.config.GpuConfig.gemm_fallback`): Hopper's TMA needs global strides that are
multiples of 16 bytes, Ampere's multi-stage ``cp.async`` copies 16 bytes.  It is also the vector
width of those kernels' loads."""

FALLBACK_WIDTHS = (1, 2, 4, 8)
"""Vector widths, bytes, of the fallback kernels: the alignments below :data:`ALIGNED_ROW_BYTES`."""

STAGING_REGISTER_BYTES = 4
"""A fallback kernel holds the next K-tile in registers between its global loads and its LDS
stores, each access in whole 32-bit registers."""


@dataclass(frozen=True)
class GemmKernelSpec:
    """One GEMM kernel implementation of the library.

    Attributes
    ----------
    tile_m, tile_n
        Output tile (macro tile) of one workgroup.
    tile_k
        K depth staged in LDS per iteration.
    threads
        Threads per workgroup.
    split_k
        Number of workgroups sharing one output tile along K (partials reduced afterwards).
    lds_buffers
        LDS copies of the A and B panels: 2 = double buffering (the next K step is fetched while
        the current one is computed); 1 = single buffering (half the LDS, so possibly higher
        occupancy, but each K step is fetched only after the previous one was computed).
    vector_bytes
        Bytes each thread moves per global access: :data:`ALIGNED_ROW_BYTES` for the library's
        kernels; 1, 2, 4 or 8 for the *fallback* kernels that operands whose rows are aligned only
        that far run in (:func:`for_operands`).  A fallback kernel stages its loads through
        registers (no asynchronous copies, so :func:`pipelined` keeps its two LDS stages), holds
        the staged K-tile in registers, and on a GPU with a fallback family issues one access per
        ``vector_bytes`` (:func:`fallback_costs`).
    """

    tile_m: int
    tile_n: int
    tile_k: int = 32
    threads: int = 256
    split_k: int = 1
    lds_buffers: int = 2
    vector_bytes: int = ALIGNED_ROW_BYTES

    @property
    def name(self) -> str:
        """Kernel name in the style of Tensile's macro-tile names (``_V2``: a fallback kernel with 2-byte accesses)."""
        split = f"_SK{self.split_k}" if self.split_k > 1 else ""
        buffers = f"_LB{self.lds_buffers}" if self.lds_buffers != 2 else ""
        vector = f"_V{self.vector_bytes}" if self.fallback else ""
        return f"MT{self.tile_m}x{self.tile_n}x{self.tile_k}_T{self.threads}{buffers}{vector}{split}"

    @property
    def fallback(self) -> bool:
        """Whether this is a fallback kernel (narrower accesses than :data:`ALIGNED_ROW_BYTES`)."""
        return self.vector_bytes < ALIGNED_ROW_BYTES

    def accesses(self, nbytes: float) -> float:
        """Accesses (one thread's load or store each) that move ``nbytes``: one per ``vector_bytes``."""
        return nbytes / self.vector_bytes

    def shape(self, dtype: str) -> WorkgroupShape:
        """Per-workgroup resources for inputs of ``dtype``.

        Registers per thread: the fp32 accumulators of the tile, 40 for addresses and fragments,
        and, in a fallback kernel, the next K-tile staged between its global loads and its LDS
        stores (each access in whole 32-bit registers: 48 for a 256 x 128 x 32 fp16 tile loaded
        2 bytes at a time, so 216 in all; the trace's ``cutlass_75_..._256x128_..._align1``
        kernels have 226-236).
        """
        size = DTYPE_BYTES[dtype]
        lds = (self.tile_m + self.tile_n) * self.tile_k * size * self.lds_buffers
        registers = self.tile_m * self.tile_n * ACCUMULATOR_BYTES // self.threads // 4 + 40
        if self.fallback:
            per_thread = math.ceil(self.accesses((self.tile_m + self.tile_n) * self.tile_k * size) / self.threads)
            registers += per_thread * math.ceil(self.vector_bytes / STAGING_REGISTER_BYTES)
        return WorkgroupShape(self.threads, lds, registers)

    def inflight_bytes(self, dtype: str) -> int:
        """Bytes one workgroup keeps in flight: the A and B panels of the K-tiles it prefetches
        while computing the current one (``lds_buffers - 1`` of them)."""
        return (self.tile_m + self.tile_n) * self.tile_k * DTYPE_BYTES[dtype] * max(1, self.lds_buffers - 1)

    def with_split(self, split_k: int) -> GemmKernelSpec:
        """The same tile with ``split_k`` K splits."""
        return replace(self, split_k=split_k)


LIBRARY: tuple[GemmKernelSpec, ...] = (
    GemmKernelSpec(256, 256, 32, 256),
    GemmKernelSpec(256, 128, 32, 256),
    GemmKernelSpec(128, 256, 32, 256),
    GemmKernelSpec(128, 128, 32, 256),
    GemmKernelSpec(128, 128, 64, 256),
    GemmKernelSpec(128, 64, 32, 256),
    GemmKernelSpec(64, 128, 32, 256),
    GemmKernelSpec(128, 64, 64, 128),
    GemmKernelSpec(64, 64, 32, 256),
    GemmKernelSpec(64, 64, 64, 128),
    GemmKernelSpec(64, 32, 32, 128),
    GemmKernelSpec(32, 64, 32, 128),
    GemmKernelSpec(32, 32, 32, 64),
    GemmKernelSpec(16, 64, 64, 64),
    GemmKernelSpec(64, 16, 64, 64),
)
"""The kernel library: macro tiles from large (high reuse, few workgroups) to small."""

TMA_TILES: tuple[GemmKernelSpec, ...] = tuple(
    GemmKernelSpec(tile_m, tile_n, 64, 256)
    for tile_m, tile_n in ((128, 320), (192, 192), (128, 192), (96, 192), (64, 192), (160, 128), (128, 96), (64, 96),
                           (96, 64))
)
"""The other macro tiles of cuBLAS's sm90 kernels, for GPUs whose library loads by TMA: the ``nvjet``
tiles that the H200 and H100 measurements and traces name beyond :data:`LIBRARY`'s, in the row-major
orientation they ran in (a column-major ``a x b`` is ``b x a`` here).  Their widths of 96, 160, 192
and 320 let the heuristic fill the SMs where a power of two leaves some idle (cuBLAS runs
128 x 12288 x 4096 as 128 CTAs of 64 x 192)."""

KNOWN_TILES = LIBRARY + TMA_TILES
"""Every macro tile a kernel may be named by (:func:`find_spec`, and a measured trace's kernels)."""

SPLIT_K_FACTORS = (1, 2, 4, 8, 16)

K_TILE_DEPTHS = (16, 32, 64, 128)
"""K depths a kernel named by hand may have: the library's macro tiles at the depths GPUs'
``gemm_k_tile_bytes`` give them (:func:`library_for`)."""


@dataclass(frozen=True)
class GemmProblem:
    """The shape of one (batched) GEMM: C[m, n] = A[m, k] B[k, n], ``batch`` times.

    Attributes
    ----------
    m, n, k
        Dimensions.
    dtype
        Input dtype (C is written in the same dtype; accumulation is fp32).
    trans_a, trans_b
        Whether A / B are stored transposed.  Matrices are row-major (PyTorch/NumPy convention):
        A is ``[m, k]`` (K contiguous), or ``[k, m]`` when ``trans_a``; B is ``[k, n]`` (N
        contiguous), or ``[n, k]`` when ``trans_b``.  A column-major BLAS call (cuBLAS) with
        ``op(A) = N`` is a row-major ``trans_a=True``.  The layout decides the contiguous runs of the
        panels a workgroup loads (:func:`panel_runs`).
    batch
        Independent GEMMs of the same shape (strided batched GEMM).
    """

    m: int
    n: int
    k: int
    dtype: str = "fp16"
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1

    @property
    def flops(self) -> float:
        """Useful floating-point operations, 2 m n k per batch entry."""
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def min_bytes(self) -> float:
        """Compulsory DRAM traffic: read A and B once, write C once."""
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.dtype_bytes * self.batch

    @property
    def row_alignment(self) -> int:
        """Alignment of every operand row, bytes: the largest power of two up to
        :data:`ALIGNED_ROW_BYTES` that divides the length of A's rows (``k``, or ``m`` when
        transposed), B's (``n``, or ``k`` when transposed) and C's (``n``).  The matrices are packed
        and start aligned, so each row starts at a multiple of its length."""
        row_a = self.m if self.trans_a else self.k
        row_b = self.k if self.trans_b else self.n
        return math.gcd(row_a * self.dtype_bytes, row_b * self.dtype_bytes, self.n * self.dtype_bytes,
                        ALIGNED_ROW_BYTES)


def panel_runs(problem: GemmProblem, spec: GemmKernelSpec, rows: int = 1, cols: int = 1) -> tuple[int, int]:
    """Contiguous run length in bytes of the A and B panels a workgroup loads per K-tile, as the
    DRAM rows see them when ``rows`` adjacent tile rows and ``cols`` adjacent tile columns load the
    same K-tile at about the same time.

    Matrices are row-major (:class:`GemmProblem`): A ``[m, k]`` is contiguous along K, so a
    workgroup's ``tile_m x tile_k`` panel is ``tile_m`` runs of ``tile_k`` elements; transposed
    (stored ``[k, m]``) it is ``tile_k`` runs of ``tile_m``, and the workgroups of ``rows`` adjacent
    tile rows read ``rows`` such runs that adjoin in each of those K rows, so a DRAM row opened for
    one serves its neighbours (:meth:`GemmKernel.neighbours`).  Likewise B ``[k, n]`` gives runs of
    ``tile_n`` (``cols`` of them adjoining), transposed (stored ``[n, k]``) runs of ``tile_k``.  A
    run never extends past the matrix's row; where the neighbours cover whole rows, the K-tile's
    rows are one run.
    """
    size = problem.dtype_bytes

    def along(extent: int, tile: int, neighbours: int) -> int:
        covered = min(tile * neighbours, extent)
        return (extent * spec.tile_k if covered == extent else covered) * size

    run_a = along(problem.m, spec.tile_m, rows) if problem.trans_a else spec.tile_k * size
    run_b = spec.tile_k * size if problem.trans_b else along(problem.n, spec.tile_n, cols)
    return run_a, run_b


def tiles(problem: GemmProblem, spec: GemmKernelSpec) -> tuple[int, int]:
    """Tiles along M and N."""
    return math.ceil(problem.m / spec.tile_m), math.ceil(problem.n / spec.tile_n)


def dense_tile_range(problem: GemmProblem, spec: GemmKernelSpec, batch: int, row: int, col: int, split: int,
                     value_bytes: int) -> tuple[int, int]:
    """Byte offset and length of output tile ``(row, col)`` of batch entry ``batch`` in a dense C,
    stored tile by tile in row-major tile order (every tile before it in its tile row is as wide
    as a tile, every tile row before it as high), or, with split-K, of its partial tile ``split``
    in the workspace, which holds each tile's ``split_k`` partials one after another.

    Parameters
    ----------
    problem, spec
        The GEMM and its kernel.
    batch, row, col, split
        The tile (:meth:`GemmKernel.tile_of`).
    value_bytes
        Bytes per value: the data type's in C, the accumulator's in the workspace.

    Returns
    -------
    tuple[int, int]
        Offset and length, bytes; the tiles of all workgroups cover ``batch x m x n x split_k``
        values exactly once.
    """
    rows = min(spec.tile_m, problem.m - row * spec.tile_m)
    cols = min(spec.tile_n, problem.n - col * spec.tile_n)
    first = (batch * problem.m + row * spec.tile_m) * problem.n + col * rows * spec.tile_n  # values before it
    if spec.split_k > 1:
        first = first * spec.split_k + split * rows * cols
    return first * value_bytes, rows * cols * value_bytes


def dense_panel_offset(extent: int, k: int, tile: int, batch: int, index: int, k0: int, depth: int) -> int:
    """Offset, in values, of the slice that tile ``index`` of a dense operand (A: ``extent`` = m, B:
    ``extent`` = n, ``batch x extent x k`` values) reads at K step ``[k0, k0 + depth)``: the operand
    is stored K-tile by K-tile (the panels of one K step adjacent, as a matrix's are) and each K-tile
    tile by tile, so a short last tile or K-tile takes only its own values."""
    return batch * extent * k + k0 * extent + index * tile * depth


def num_workgroups(problem: GemmProblem, spec: GemmKernelSpec) -> int:
    """Workgroups of the grid."""
    tm, tn = tiles(problem, spec)
    return tm * tn * problem.batch * spec.split_k


def loads_by_tma(spec: GemmKernelSpec, gpu: GpuConfig) -> bool:
    """Whether ``spec`` loads its operands by TMA on ``gpu``: the library's kernels on a GPU with
    :attr:`GpuConfig.gemm_tma`; fallback kernels stage their loads through registers."""
    return gpu.gemm_tma is not None and not spec.fallback


PRODUCER_THREADS = 128
"""Threads of a warp-specialized (TMA) kernel's producer warpgroup, which issues the TMA copies
while the consumer warpgroups (:attr:`GemmKernelSpec.threads`) compute."""
PRODUCER_REGISTERS = 24
"""Registers per thread the producer warpgroup keeps once it has given the rest to the consumers
(``setmaxnreg``'s least)."""
REGISTER_ALLOCATION = 8
"""Registers per thread are allocated in multiples of this."""


def workgroup_shape(spec: GemmKernelSpec, dtype: str, gpu: GpuConfig) -> WorkgroupShape:
    """Resources one workgroup of ``spec`` holds on its CU of ``gpu`` while it runs.

    A kernel that loads by TMA is warp-specialized, as cuBLAS's sm90 ``nvjet`` kernels are: a
    producer warpgroup beside the consumers, and every thread launched with the most registers
    that let the workgroup fit the register file.  So it holds a whole CU: 384 threads x 168
    registers, as the profiler reports for every ``nvjet`` kernel of the H200's GPT-2 traces, and
    no other kernel's workgroup can run beside it (``validation/measured/h200/interference.csv``: a
    GEMM beside programs that hold a few SMs runs as if it had lost those SMs).  After the launch
    ``setmaxnreg`` moves registers from the producer (down to :data:`PRODUCER_REGISTERS`) to the
    consumers, so a tile fits if its consumers' registers fit what that leaves (240 each on a
    Hopper SM); a larger one is returned with its consumers' count, which fits no CU.
    """
    shape = spec.shape(dtype)
    if not loads_by_tma(spec, gpu):
        return shape
    registers = int(gpu.cu.register_file_bytes) // 4
    threads = shape.threads + PRODUCER_THREADS
    launched = registers // threads // REGISTER_ALLOCATION * REGISTER_ALLOCATION
    consumers_most = ((registers - PRODUCER_REGISTERS * PRODUCER_THREADS) // shape.threads
                      // REGISTER_ALLOCATION * REGISTER_ALLOCATION)
    fits = shape.registers_per_thread <= consumers_most
    return WorkgroupShape(threads, shape.lds_bytes, launched if fits else shape.registers_per_thread)


def resident_workgroups(spec: GemmKernelSpec, dtype: str, gpu: GpuConfig) -> int:
    """Workgroups of ``spec`` (for ``dtype`` inputs) that one CU of ``gpu`` holds at once, with the
    resources they really hold (:func:`workgroup_shape`); 0 if none fits."""
    return occupancy(workgroup_shape(spec, dtype, gpu), gpu.cu)


class TmaInflight(InflightLimit):
    """The memory-level parallelism of a workgroup whose loads are TMA bulk copies: bounded by the
    stages its kernel keeps in flight, not by the CU's per-thread load slots
    (:class:`gpusim.config.gpu.GemmTmaConfig`)."""

    __slots__ = ()

    def memory(self, now: float, nbytes: float, missed: float | None = None) -> float:
        """Earliest time the WG can have moved ``nbytes``, ``missed`` of them from DRAM, ns."""
        return self.pipe.reserve(now, self.cu.miss_equivalent(nbytes, missed))


@dataclass(frozen=True)
class Multicast:
    """How a kernel's thread-block clusters share an operand (:class:`gpusim.config.gpu.GemmTmaConfig`).

    A cluster is ``size`` neighbouring output tiles along M (they share B's panel) or along N
    (they share A's); its workgroups each request their share of the shared panel from the L2 and
    receive all of it (TMA multicast), so the L2 serves that panel once per cluster.

    Attributes
    ----------
    operand
        ``"a"``, ``"b"``, or ``None`` (no clusters).
    size
        Workgroups per cluster along the clustered dimension (1: no clusters).
    """

    operand: Literal["a", "b"] | None = None
    size: int = 1

    def members(self, row: int, col: int, tiles_m: int, tiles_n: int) -> int:
        """Workgroups of the cluster of tile ``(row, col)`` that exist (the last cluster along a
        dimension whose tiles it does not divide has fewer)."""
        if self.operand is None:
            return 1
        index, count = (row, tiles_m) if self.operand == "b" else (col, tiles_n)
        return min(self.size, count - index // self.size * self.size)


def multicast(problem: GemmProblem, spec: GemmKernelSpec, gpu: GpuConfig) -> Multicast:
    """The clusters ``spec`` runs in on ``gpu``: along the dimension whose tiles share the larger
    panel (along M, sharing B, where ``tile_n >= tile_m``; along N, sharing A, otherwise; on square
    tiles along the dimension with more tiles), or along the other where the first has a single
    tile; none on GPUs without clusters, for fallback kernels, and where neither dimension has two
    tiles.  As cuBLAS's Hopper kernels in the H200 trace: ``nvjet_..._256x128_64x4_1x2_...`` on a
    row-major 4096 x 3072 output is, in cuBLAS's column-major terms, a 256 x 128 tile with a cluster
    of two along cuBLAS's N: row-major 128 x 256 tiles, a cluster along M sharing B's 256 columns."""
    size = 1 if gpu.gemm_tma is None else gpu.gemm_tma.cluster_size
    tiles_m, tiles_n = tiles(problem, spec)
    if size == 1 or spec.fallback or max(tiles_m, tiles_n) < 2:
        return Multicast()
    if spec.tile_n != spec.tile_m:
        shared = "b" if spec.tile_n > spec.tile_m else "a"
    else:
        shared = "b" if tiles_m >= tiles_n else "a"
    if (tiles_m if shared == "b" else tiles_n) < 2:
        shared = "a" if shared == "b" else "b"
    return Multicast(shared, size)


def l2_read_bytes(problem: GemmProblem, spec: GemmKernelSpec, gpu: GpuConfig) -> float:
    """Bytes the L2 serves for all workgroups' A and B panels, with each cluster's shared panel
    read once (:func:`multicast`)."""
    tiles_m, tiles_n = tiles(problem, spec)
    depth = math.ceil(problem.k / spec.split_k) * spec.split_k * problem.batch * problem.dtype_bytes
    a_reads = tiles_m * tiles_n
    b_reads = tiles_m * tiles_n
    shared = multicast(problem, spec, gpu)
    if shared.operand == "b":
        b_reads = math.ceil(tiles_m / shared.size) * tiles_n
    elif shared.operand == "a":
        a_reads = tiles_m * math.ceil(tiles_n / shared.size)
    return (a_reads * spec.tile_m + b_reads * spec.tile_n) * depth


def estimate_ns(problem: GemmProblem, spec: GemmKernelSpec, gpu: GpuConfig, cus: int | None = None) -> float:
    """A BLAS-heuristic estimate of a kernel's time: wave-quantized compute versus memory, ns.

    This is what a library heuristic knows without running: it picks the kernel; the simulation
    then decides how long it really takes.  Each CU reads the L2 through its own port, taken as its
    share of the L2's sustained bandwidth: a grid that leaves CUs idle leaves their shares unused,
    so it cannot read its panels as fast as one that fills the GPU.
    """
    cus = cus or gpu.num_cus
    spec = pipelined(spec, gpu, problem.dtype)
    shape = spec.shape(problem.dtype)
    resident = resident_workgroups(spec, problem.dtype, gpu)
    if resident == 0:
        return math.inf
    groups = num_workgroups(problem, spec)
    peak = gpu.cu.gemm_peak(problem.dtype)
    rate, access_ns = fallback_costs(spec, gpu, problem.dtype)
    per_cu_flops_per_ns = peak * gpu.clock_hz * 1e-9 * rate
    share = min(1.0, shape.wavefronts(gpu.cu.wavefront_size) / SIMDS_PER_CU)
    k_per_split = math.ceil(problem.k / spec.split_k)
    tile_flops = 2.0 * spec.tile_m * spec.tile_n * k_per_split
    tile_flops += access_ns * per_cu_flops_per_ns * tile_accesses(problem, spec, k_per_split, output=True)
    per_cu = math.ceil(groups / cus)
    concurrent = min(per_cu, resident)
    compute = per_cu * tile_flops / (per_cu_flops_per_ns * min(1.0, share * concurrent))
    wg_bytes = (spec.tile_m + spec.tile_n) * k_per_split * problem.dtype_bytes
    l2_bytes = l2_read_bytes(problem, spec, gpu)
    partials = problem.m * problem.n * problem.batch * ACCUMULATOR_BYTES * spec.split_k if spec.split_k > 1 else 0
    dram_bytes = problem.min_bytes + partials
    port_bytes_per_s = gpu.l2.sustained_bandwidth_bytes_per_s / gpu.num_cus
    memory = max(l2_bytes / gpu.l2.sustained_bandwidth_bytes_per_s, dram_bytes / gpu.hbm.sustained_bandwidth_bytes_per_s,
                 per_cu * l2_bytes / groups / port_bytes_per_s) * 1e9
    # Little's law: a CU moves at most its WGs' (and its own) in-flight bytes per access latency.
    miss_latency = gpu.unloaded_miss_latency_ns
    hit_latency = min(gpu.l2.hit_latency_ns, miss_latency)
    latency = hit_latency + min(1.0, problem.min_bytes / l2_bytes) * (miss_latency - hit_latency)
    inflight = concurrent * spec.inflight_bytes(problem.dtype)
    if not loads_by_tma(spec, gpu):
        inflight = min(inflight, gpu.cu.max_inflight_bytes)
    parallelism = per_cu * wg_bytes * latency / inflight
    reduction = (partials + problem.m * problem.n * problem.batch * problem.dtype_bytes) / gpu.hbm.sustained_bandwidth_bytes_per_s * 1e9
    return max(compute, memory, parallelism) + reduction + (split_k_fixed_ns(gpu) if spec.split_k > 1 else 0.0)


def split_k_fixed_ns(gpu: GpuConfig) -> float:
    """What a split-K GEMM's reduction kernel costs beyond moving its bytes, ns: it is a second kernel,
    so it waits for the GEMM's completion (``dependent_launch_ns``), pays the GPU's own cost of a
    kernel (``kernel_device_ns``) and, however small its output, one round trip to memory between
    reading the partials and writing C (the unloaded miss latency), as the simulation charges it.
    cuBLAS's ``splitKreduce_kernel`` takes 1.95-2.56 us on the H200 for outputs of up to 256 x 256
    and 3.0-5.5 us for larger ones (``validation/measured/h200/gemm_kernels.csv``); cuBLAS does not
    split GEMMs whose K loop is shorter than that saves (1760-2560 x 16-128 x 1760-2560 run unsplit
    on 56-112 CTAs)."""
    return gpu.dependent_launch_ns + gpu.kernel_device_ns + gpu.unloaded_miss_latency_ns


def tile_accesses(problem: GemmProblem, spec: GemmKernelSpec, depth: int, output: bool) -> float:
    """Accesses one workgroup of ``spec`` issues to load ``depth`` of K of its full A and B panels
    and, with ``output``, to write its output tile (not with K splits: their partials go to the
    library's own, aligned workspace)."""
    size = problem.dtype_bytes
    nbytes = (spec.tile_m + spec.tile_n) * depth * size
    if output and spec.split_k == 1:
        nbytes += spec.tile_m * spec.tile_n * size
    return spec.accesses(nbytes)


def fallback_costs(spec: GemmKernelSpec, gpu: GpuConfig, dtype: str) -> tuple[float, float]:
    """What running as a fallback kernel costs ``spec`` on ``gpu``: the factor on its matrix rate
    and the CU time of each of its accesses, ns (:class:`gpusim.config.GemmFallbackConfig`).

    ``(1.0, 0.0)`` for the library's kernels, and on a GPU without a fallback family, whose
    library runs any alignment at its rate.  The rate factor applies to dtypes with matrix units.
    """
    fallback = gpu.gemm_fallback
    if not spec.fallback or fallback is None:
        return 1.0, 0.0
    rate = fallback.mma_fraction if gpu.cu.matrix_flops_per_cycle.get(dtype) else 1.0
    return rate, fallback.access_cycles / gpu.clock_hz * 1e9


def for_operands(spec: GemmKernelSpec, problem: GemmProblem, gpu: GpuConfig) -> GemmKernelSpec:
    """``spec`` as ``gpu`` can run it on ``problem``'s operands: on a GPU with a fallback family, a
    kernel whose accesses are wider than the operands' rows are aligned becomes the fallback
    variant of its tile with accesses that wide (cuBLAS's ``align1`` / ``align2`` / ``align4``
    kernels); elsewhere, and on aligned rows, ``spec`` itself."""
    if gpu.gemm_fallback is None or spec.vector_bytes <= problem.row_alignment:
        return spec
    return replace(spec, vector_bytes=problem.row_alignment)


def pipelined(spec: GemmKernelSpec, gpu: GpuConfig, dtype: str) -> GemmKernelSpec:
    """``spec`` as it runs on ``gpu`` with ``dtype`` inputs: a double-buffered kernel keeps the GPU's
    ``gemm_pipeline_stages`` K-tiles in LDS (as many as fit in a CU's LDS, at least 2), so it has
    ``stages - 1`` loads in flight; a single-buffered kernel, and a fallback kernel, whose loads
    pass through registers, stay as they are."""
    if spec.lds_buffers < 2 or spec.fallback:
        return spec
    panel = (spec.tile_m + spec.tile_n) * spec.tile_k * DTYPE_BYTES[dtype]
    stages = max(2, min(gpu.gemm_pipeline_stages, int(gpu.cu.lds_bytes) // panel))
    return spec if stages == spec.lds_buffers else replace(spec, lds_buffers=stages)


def library_for(gpu: GpuConfig, dtype: str, row_alignment: int = ALIGNED_ROW_BYTES) -> tuple[GemmKernelSpec, ...]:
    """The kernel library as ``gpu``'s BLAS has it for ``dtype`` inputs whose rows are aligned to
    ``row_alignment`` bytes: :data:`LIBRARY` (with :data:`TMA_TILES` on a GPU with ``gemm_tma``), or,
    where the GPU sets ``gemm_k_tile_bytes``, its macro tiles with K-tiles of that many bytes per
    row.  Rows aligned to less than :data:`ALIGNED_ROW_BYTES` on a GPU with a fallback family get
    the fallback kernels: the library's tiles at their own depths (the K rows of TMA do not apply),
    with accesses of ``row_alignment`` bytes."""
    if gpu.gemm_fallback is not None and row_alignment < ALIGNED_ROW_BYTES:
        return tuple(replace(spec, vector_bytes=row_alignment) for spec in LIBRARY)
    library = KNOWN_TILES if gpu.gemm_tma is not None else LIBRARY
    if gpu.gemm_k_tile_bytes is None:
        return library
    depth = max(1, int(gpu.gemm_k_tile_bytes) // DTYPE_BYTES[dtype])
    return tuple(dict.fromkeys(replace(spec, tile_k=depth) for spec in library))


def candidates(problem: GemmProblem, library: Iterable[GemmKernelSpec] = LIBRARY) -> list[GemmKernelSpec]:
    """Every library kernel, with the split-K factors that make sense for ``problem``: at least 4
    K-tiles per split, and, for a fallback kernel, only where K is at least as deep as the output
    is long and wide (``k >= max(m, n)``).  cuBLAS split the fallback kernels' K in that case
    only: on the H200 the 35 x 8457 x 1760-4096 GEMMs ran unsplit (their time grows with K at the
    rate of one unsplit tile), GPT-2's 4096 x 768 x 50257 input gradient ran split 11 ways (the
    trace's grid)."""
    result = []
    for spec in library:
        for split in SPLIT_K_FACTORS:
            if split > 1 and (problem.k // split < 4 * spec.tile_k
                              or spec.fallback and problem.k < max(problem.m, problem.n)):
                break
            result.append(spec.with_split(split))
    return result


HEURISTIC_TOLERANCE = 0.03
"""Kernels estimated within this fraction of the fastest count as equally fast; the heuristic then
prefers the tile that covers the most of the output (most reuse: rows and columns beyond the
problem's are padding, which reuses nothing), then the largest tile, as BLAS heuristics do, then the
fewest K splits, then the shallower K-tile (32-deep fp16 tiles are the default of cuBLAS/CUTLASS
tensor-core kernels)."""


def choose_kernel(problem: GemmProblem, gpu: GpuConfig, cus: int | None = None) -> GemmKernelSpec:
    """The kernel a BLAS library's heuristic would pick.

    The fastest by :func:`estimate_ns`; among those within :data:`HEURISTIC_TOLERANCE` of it, the
    one whose tile covers the most of the output, then the largest tile, then the fewest K splits,
    then the shallowest K-tile.  Like cuBLAS, it considers only kernels the operands' row alignment
    allows (:func:`library_for`), and, like cuBLAS, it knows the GPU's rated clocks, not how far a
    power limit has lowered them (:meth:`GpuConfig.as_rated`).
    """
    gpu = gpu.as_rated()
    library = library_for(gpu, problem.dtype, problem.row_alignment)
    return _preferred([(estimate_ns(problem, spec, gpu, cus), spec) for spec in candidates(problem, library)],
                      problem)


def _preferred(estimates: list[tuple[float, GemmKernelSpec]], problem: GemmProblem) -> GemmKernelSpec:
    """:func:`choose_kernel`'s pick among ``(estimated ns, kernel)`` pairs, its output ``problem``'s."""
    fastest = min(estimate for estimate, _ in estimates)
    near = [spec for estimate, spec in estimates if estimate <= fastest * (1 + HEURISTIC_TOLERANCE)]
    return max(near, key=lambda spec: (min(spec.tile_m, problem.m) * min(spec.tile_n, problem.n),
                                       spec.tile_m * spec.tile_n, -spec.split_k, -spec.tile_k))


def choose_grouped_kernel(problems: list[GemmProblem], gpu: GpuConfig, cus: int | None = None) -> GemmKernelSpec:
    """The unsplit kernel for a grouped GEMM of ``problems``, as :func:`choose_kernel` picks one
    among the library kernels the least aligned problem's rows allow, by an estimate of the grouped
    kernel: the larger of :func:`estimate_ns` for a batch of the problems' mean shape (all their
    tiles at once; exact for equal problems, which then get the batched GEMM's unsplit kernel) and
    for the slowest problem alone (its longest tiles, where the problems' depths or sizes differ)."""
    gpu = gpu.as_rated()
    least_aligned = min(problems, key=lambda problem: problem.row_alignment)
    library = library_for(gpu, least_aligned.dtype, least_aligned.row_alignment)
    mean = GemmProblem(*(math.ceil(sum(dims) / len(problems)) for dims in zip(*((p.m, p.n, p.k) for p in problems))),
                       least_aligned.dtype, least_aligned.trans_a, least_aligned.trans_b, len(problems))

    def grouped_ns(spec: GemmKernelSpec) -> float:
        return max(estimate_ns(mean, spec, gpu, cus), *(estimate_ns(problem, spec, gpu, cus) for problem in problems))

    return _preferred([(grouped_ns(spec), spec) for spec in library], mean)


def k_step(problem: GemmProblem, spec: GemmKernelSpec) -> int:
    """K depth of one simulation step: a multiple of ``tile_k``, about :data:`TARGET_K_STEPS` steps per split."""
    per_split = math.ceil(problem.k / spec.split_k)
    steps = max(1, min(math.ceil(per_split / spec.tile_k), TARGET_K_STEPS))
    return math.ceil(math.ceil(per_split / steps) / spec.tile_k) * spec.tile_k


def padded_k(problem: GemmProblem, spec: GemmKernelSpec) -> int:
    """K extent of one split rounded up to whole simulation steps (the slices' address space)."""
    step = k_step(problem, spec)
    return math.ceil(math.ceil(problem.k / spec.split_k) / step) * step


RASTER_GROUP_ROWS = 8
"""Tile rows that BLAS libraries rasterize together (CUTLASS/Triton-style grouped swizzle)."""


def grouped_order(tiles_m: int, tiles_n: int, batch: int = 1, split_k: int = 1,
                  group_rows: int = RASTER_GROUP_ROWS) -> list[int]:
    """The dispatch order of a GEMM's workgroups as BLAS libraries rasterize their tiles.

    Tiles are visited in groups of ``group_rows`` tile rows: within a group column by column, and
    within a column row by row (M fastest, as a column-major library's ``blockIdx.x``), so that
    the workgroups resident together share B panels (and, across columns, A panels) in the L2.
    Workgroup indices are those of :meth:`GemmKernel.tile_of` (row-major tiles, splits innermost).
    """
    order = []
    for entry in range(batch):
        for first in range(0, tiles_m, group_rows):
            rows = range(first, min(first + group_rows, tiles_m))
            for col in range(tiles_n):
                for row in rows:
                    tile = (entry * tiles_m + row) * tiles_n + col
                    order.extend(range(tile * split_k, (tile + 1) * split_k))
    return order


StoreFn = Callable[[int, int, int, Join], Generator | None]
"""``store(wg, c_offset, nbytes, join)``: write a finished tile; may be a generator to wait in."""


class GemmKernel:
    """A GEMM lowered to a grid of workgroups on one GPU.

    Parameters
    ----------
    gpu
        The GPU it runs on.
    problem
        The GEMM.
    spec
        The kernel implementation.
    a, b, c
        Buffers of A, B and C (C receives the result; with split-K, fp32 partials go to a
        workspace and a reduction follows, see :attr:`reduction`).
    store
        Replaces the default tile write (used by T3 to send tiles to remote memory or to update).
    partials_in_place
        With split-K, every split stores its partial tile at its tile's place in C through
        ``store``, whose near-memory updates (op-and-store) add the partials (T3 with split-K,
        dissertation section 8.6.7), instead of into an fp32 workspace for a reduction kernel.
    ready
        ``ready(wg)``: an event workgroup ``wg`` waits for on its CU before its first load (its
        input rows arriving, as T3's tracker would trigger it), or ``None`` when it need not wait.
        The times when all resident workgroups wait go to the kernel's ``stalls``.
    c_cached
        Whether C is written through the L2.
    wg_order
        Dispatch order of the workgroups (T3 staggering); default: :func:`grouped_order`.
    cu_mask
        CUs the kernel may use.
    name
        Kernel name in results.
    """

    def __init__(
        self,
        gpu: Gpu,
        problem: GemmProblem,
        spec: GemmKernelSpec,
        a: Buffer,
        b: Buffer,
        c: Buffer,
        store: StoreFn | None = None,
        wg_order: list[int] | None = None,
        cu_mask: list[int] | None = None,
        name: str | None = None,
        partials_in_place: bool = False,
        ready: Callable[[int], Event | None] | None = None,
    ):
        if partials_in_place and store is None:
            raise ValueError("partial tiles can only be added in place by a store hook that updates C")
        self.gpu = gpu
        self.problem = problem
        self.spec = spec
        self.a, self.b, self.c = a, b, c
        self.store = store
        self.partials_in_place = partials_in_place
        self.ready = ready
        self.tiles_m, self.tiles_n = tiles(problem, spec)
        self.k_per_split = math.ceil(problem.k / spec.split_k)
        self.k_step = k_step(problem, spec)
        self.steps = math.ceil(self.k_per_split / self.k_step)
        rate, access_ns = fallback_costs(spec, gpu.config, problem.dtype)
        self.flops_per_ns = gpu.matrix_flops_per_ns(problem.dtype) * rate
        # a fallback kernel's accesses take CU time beside its FLOPs (as FLOPs at its rate): per K step, and the
        # output tile's with the last step
        self.access_flops_per_step = access_ns * self.flops_per_ns * tile_accesses(problem, spec, self.k_step, output=False)
        self.access_flops_per_tile = access_ns * self.flops_per_ns * tile_accesses(problem, spec, 0, output=True)
        self.wavefronts = spec.shape(problem.dtype).wavefronts(gpu.config.cu.wavefront_size)
        workspace = spec.split_k > 1 and not partials_in_place
        self.tile_bytes = spec.tile_m * spec.tile_n * (ACCUMULATOR_BYTES if workspace else problem.dtype_bytes)
        self.inflight_bytes = spec.inflight_bytes(problem.dtype)
        self.miss_latency_ns = gpu.unloaded_memory_latency_ns
        self.multicast = multicast(problem, spec, gpu.config)
        self.inflight_limit = TmaInflight if loads_by_tma(spec, gpu.config) else InflightLimit
        shape = workgroup_shape(spec, problem.dtype, gpu.config)
        if wg_order is None:
            wg_order = grouped_order(self.tiles_m, self.tiles_n, problem.batch, spec.split_k)
        cus = gpu.config.num_cus if cu_mask is None else len(cu_mask)
        wave = wg_order[:cus * occupancy(shape, gpu.config.cu)]
        self.run_a, self.run_b = panel_runs(problem, spec, *self.neighbours(wave))
        self.kernel = Kernel(
            name=name or f"gemm_{spec.name}",
            num_wgs=num_workgroups(problem, spec),
            shape=shape,
            body=self._workgroup,
            cu_mask=cu_mask,
            wg_order=wg_order,
            info={
                "impl": spec.name,
                "flops": problem.flops,
                "workgroups": num_workgroups(problem, spec),
                "occupancy": occupancy(shape, gpu.config.cu),
            },
        )
        self.kernel.math_units, self.kernel.peak_flops_per_cu_cycle = gpu.config.gemm_math(problem.dtype)
        self.stall_clock = None if ready is None else StallClock(self.kernel)

    # -- geometry -------------------------------------------------------------------------------
    def tile_of(self, wg: int) -> tuple[int, int, int, int]:
        """``(batch, tile_row, tile_col, split)`` computed by workgroup ``wg``."""
        split = wg % self.spec.split_k
        tile = wg // self.spec.split_k
        per_batch = self.tiles_m * self.tiles_n
        batch, within = divmod(tile, per_batch)
        row, col = divmod(within, self.tiles_n)
        return batch, row, col, split

    def neighbours(self, wave: Iterable[int]) -> tuple[int, int]:
        """Adjacent tile rows and adjacent tile columns whose workgroups load the same K-tiles at
        about the same time: the longest runs of consecutive rows, and of consecutive columns,
        among the tiles of workgroups ``wave`` (those resident together, which start together and
        step through K alike) that share a batch entry and a K split."""
        rows: dict[tuple[int, int], set[int]] = {}
        cols: dict[tuple[int, int], set[int]] = {}
        for wg in wave:
            batch, row, col, split = self.tile_of(wg)
            rows.setdefault((batch, split), set()).add(row)
            cols.setdefault((batch, split), set()).add(col)

        def longest(indices: set[int]) -> int:
            best = 0
            for first in indices:
                if first - 1 not in indices:
                    length = 1
                    while first + length in indices:
                        length += 1
                    best = max(best, length)
            return best

        return (max(map(longest, rows.values()), default=1), max(map(longest, cols.values()), default=1))

    def c_range(self, wg: int) -> tuple[int, int]:
        """Byte offset and length in C (or in the split-K workspace) of workgroup ``wg``'s output tile.

        C is dense, tile by tile in row-major tile order: its ``batch x m x n`` values and nothing
        else, so that an edge tile's bytes are followed by the next tile's and an op that reads C
        whole reads what the tiles wrote. The workspace holds each tile's ``split_k`` partial tiles
        one after another, in the same order. A fused ``store`` hook instead addresses C by tile
        slots of a whole tile each (:func:`gpusim.kernels.fused.tile_bytes`)."""
        p, s = self.problem, self.spec
        batch, row, col, split = self.tile_of(wg)
        value_bytes = self.tile_bytes // (s.tile_m * s.tile_n)
        if self.store is None:
            return dense_tile_range(p, s, batch, row, col, split, value_bytes)
        tile_index = (batch * self.tiles_m + row) * self.tiles_n + col
        if s.split_k > 1 and not self.partials_in_place:
            tile_index = tile_index * s.split_k + split
        _, length = dense_tile_range(p, s, batch, row, col, 0, value_bytes)  # the tile's own bytes
        return tile_index * self.tile_bytes, length

    # -- workgroup ------------------------------------------------------------------------------
    def _fetch(self, cu: InflightLimit, batch: int, row: int, col: int, split: int, step: int) -> Join:
        p, s = self.problem, self.spec
        gpu = self.gpu
        env = gpu.env
        k0 = split * self.k_per_split + step * self.k_step
        depth = max(0, min(self.k_step, p.k - k0, (split + 1) * self.k_per_split - k0))
        rows = min(s.tile_m, p.m - row * s.tile_m)
        cols = min(s.tile_n, p.n - col * s.tile_n)
        size = p.dtype_bytes
        # A and B are dense, K-tile by K-tile (the panels of one K step adjacent, as a matrix's are),
        # each K-tile row tile by row tile: a partial tile or K-tile takes only its own bytes
        a_offset = dense_panel_offset(p.m, p.k, s.tile_m, batch, row, k0, depth) * size
        b_offset = dense_panel_offset(p.n, p.k, s.tile_n, batch, col, k0, depth) * size
        a_bytes = rows * depth * size
        b_bytes = cols * depth * size
        join = Join(env)
        memory = gpu.memory
        missed = 0
        share = self.multicast.members(row, col, self.tiles_m, self.tiles_n)
        a_served = a_bytes / share if self.multicast.operand == "a" else None
        b_served = b_bytes / share if self.multicast.operand == "b" else None
        if a_bytes:
            missed += memory.read(self.a.addr + a_offset, a_bytes, join, COMPUTE, self.a.cached, self.run_a, a_served)
        if b_bytes:
            missed += memory.read(self.b.addr + b_offset, b_bytes, join, COMPUTE, self.b.cached, self.run_b, b_served)
        join.extend_to(cu.memory(env.now, a_bytes + b_bytes, missed))
        return join

    def _workgroup(self, wg: int, cu: ComputeUnit):
        env = self.gpu.env
        waiting = None if self.ready is None else self.ready(wg)
        waits = waiting is not None and not waiting.processed
        if self.stall_clock is not None:
            self.stall_clock.starts(env.now, waits)
        if waits:
            yield waiting
            self.stall_clock.resumes(env.now)
        batch, row, col, split = self.tile_of(wg)
        step_flops = 2.0 * self.spec.tile_m * self.spec.tile_n * self.k_step + self.access_flops_per_step
        limit = self.inflight_limit(cu, self.inflight_bytes, self.miss_latency_ns)
        pending = self._fetch(limit, batch, row, col, split, 0)
        yield pending.close()
        prefetch = self.spec.lds_buffers > 1
        for step in range(self.steps):
            flops = step_flops if step + 1 < self.steps else step_flops + self.access_flops_per_tile
            compute_done = cu.compute(env.now, flops, self.flops_per_ns, self.wavefronts)
            if step + 1 < self.steps and prefetch:
                pending = self._fetch(limit, batch, row, col, split, step + 1)
                pending.extend_to(compute_done)
                yield pending.close()
            else:
                yield env.timeout(compute_done - env.now)
                if step + 1 < self.steps:
                    yield self._fetch(limit, batch, row, col, split, step + 1).close()
        offset, nbytes = self.c_range(wg)
        join = Join(env)
        if self.store is None:
            self.gpu.memory.write(self.c.addr + offset, nbytes, join, COMPUTE, self.c.cached)
        else:
            waiting = self.store(wg, offset, nbytes, join)
            if waiting is not None:
                yield from waiting
        # a TMA kernel stores its tile by TMA too (as CUTLASS's sm90 epilogues do), past the CU's load/store slots
        outgoing = limit if isinstance(limit, TmaInflight) else cu
        join.extend_to(outgoing.memory(env.now, nbytes, 0 if self.c.cached and self.store is None else None))
        yield join.close()
        if self.stall_clock is not None:
            self.stall_clock.ends(env.now)


@functools.cache
def _named_kernels() -> dict[str, GemmKernelSpec]:
    """The kernels :func:`find_spec` knows, by name: :data:`KNOWN_TILES` at every depth of
    :data:`K_TILE_DEPTHS`, as library or fallback kernels, with every split of :data:`SPLIT_K_FACTORS`."""
    named: dict[str, GemmKernelSpec] = {}
    for spec in KNOWN_TILES:
        for depth in K_TILE_DEPTHS:
            for vector in (ALIGNED_ROW_BYTES, *FALLBACK_WIDTHS):
                for split in SPLIT_K_FACTORS:
                    candidate = replace(spec, tile_k=depth, vector_bytes=vector, split_k=split)
                    named.setdefault(candidate.name, candidate)
    return named


def find_spec(name: str) -> GemmKernelSpec:
    """The library kernel called ``name`` (fallback and split-K suffixes allowed; a deeper pipeline
    than double buffering, ``_LB3`` and up as results name a kernel on a GPU with more
    ``gemm_pipeline_stages``, is the double-buffered kernel, which :func:`pipelined` deepens again);
    :class:`OpError` if there is none."""
    named = _named_kernels()
    deepened = re.fullmatch(r"(.*)_LB(\d+)(.*)", name)
    if name not in named and deepened and int(deepened.group(2)) > 2:
        name = deepened.group(1) + deepened.group(3)
    if name in named:
        return named[name]
    known = ", ".join(spec.name for spec in KNOWN_TILES)
    raise OpError(f"unknown GEMM kernel {name!r}; library kernels: {known} (K depth may be any of "
                  f"{', '.join(map(str, K_TILE_DEPTHS))}; optionally with a fallback kernel's access width "
                  f"_V{'/_V'.join(map(str, FALLBACK_WIDTHS))} and _SK2.._SK16)")


def check_fits(spec: GemmKernelSpec, dtype: str, gpu: GpuConfig, label: str, named: bool = True) -> None:
    """Raise :class:`OpError` if a workgroup of ``spec`` (for ``dtype`` inputs) fits on no CU of
    ``gpu``, naming the op ``label``, the kernel, the GPU and the resources it lacks; ``named``:
    the user chose the kernel (else the library's heuristic did, and no kernel of it fits)."""
    shape = workgroup_shape(spec, dtype, gpu)
    if occupancy(shape, gpu.cu) > 0:
        return
    cu = gpu.cu
    needs = [
        ("threads", shape.threads, cu.max_threads),
        ("wavefronts", shape.wavefronts(cu.wavefront_size), cu.max_wavefronts),
        ("register bytes", shape.register_bytes(), int(cu.register_file_bytes)),
        ("LDS bytes", shape.lds_bytes, int(cu.lds_bytes)),
    ]
    short = "; ".join(f"{need} {what} (a CU has {have})" for what, need, have in needs if need > have)
    advice = ("choose a smaller kernel or leave 'kernel' out" if named else
              "the library's heuristic found no kernel that fits; check the CU's resources (gpu.cu)")
    raise OpError(f"{label}: GEMM kernel {spec.name} does not fit on a CU of {gpu.name}: one {dtype} workgroup "
                  f"needs {short}; {advice}")


def problem_of(op) -> GemmProblem:
    """The :class:`GemmProblem` of a :class:`gpusim.ops.Gemm`."""
    return GemmProblem(op.m, op.n, op.k, op.dtype, op.trans_a, op.trans_b, op.batch)


def launch_gemm(ctx, problem: GemmProblem, spec: GemmKernelSpec, a, b, c, store: StoreFn | None = None,
                cu_mask: list[int] | None = None, name: str | None = None, partials_in_place: bool = False,
                wg_order: list[int] | None = None, ready: Callable[[int], Event | None] | None = None):
    """Launch ``spec``'s kernels for ``problem`` on the buffers ``a``, ``b`` and ``c`` and return the GEMM
    kernel (a generator): the GEMM kernel, and with split-K an fp32 workspace for its partial tiles and
    an element-wise reduction kernel that writes C, unless ``partials_in_place`` (``store`` adds the
    partials into C).  ``cu_mask``: the CUs both may use (default: the stream's); ``name``: the GEMM
    kernel's (default ``gemm_<spec>``); ``wg_order``, ``ready``: as :class:`GemmKernel` takes them."""
    from gpusim.kernels.elementwise import StreamingKernel

    gpu = ctx.gpu
    tiles_m, tiles_n = tiles(problem, spec)
    reduced = spec.split_k > 1 and not partials_in_place
    if reduced:
        workspace = ctx.tensor(None, problem.batch * problem.m * problem.n * spec.split_k * ACCUMULATOR_BYTES
                               if store is None else tiles_m * tiles_n * problem.batch * spec.split_k * spec.tile_m
                               * spec.tile_n * ACCUMULATOR_BYTES)
        target = workspace
    else:
        target = c
    kernel = GemmKernel(gpu, problem, spec, a, b, target, store=store, cu_mask=cu_mask, wg_order=wg_order,
                        name=name or f"gemm_{spec.name}", partials_in_place=partials_in_place, ready=ready)
    yield from ctx.launch(kernel.kernel)
    if reduced:
        partial_bytes = problem.m * problem.n * problem.batch * 4
        reduction = StreamingKernel(
            gpu,
            name=f"splitk_reduce_{spec.split_k}",
            reads=[(workspace, partial_bytes * spec.split_k)],
            writes=[(c, problem.m * problem.n * problem.batch * problem.dtype_bytes)],
            flops=float(problem.m * problem.n * problem.batch * spec.split_k),
            dtype="fp32",
            cus=ctx.cus if cu_mask is None else len(cu_mask),
        )
        if cu_mask is not None:
            reduction.kernel.cu_mask = cu_mask
        yield from ctx.launch(reduction.kernel, host_ns=0.0)
    return kernel


class GroupedGemmKernel:
    """One kernel over several GEMM problems (CUTLASS's grouped GEMM): the workgroups of every
    problem's tiles, problem after problem, each as :class:`GemmKernel` runs it on that problem's
    own slices of A, B and C (packed one after another), with one tile shape and no K split.

    Parameters
    ----------
    gpu
        The GPU it runs on.
    problems
        The GEMMs (each ``batch`` 1).
    spec
        The kernel implementation (unsplit).
    a, b, c
        Buffers holding every problem's A, B and C.
    cu_mask, name
        As :class:`GemmKernel` takes them.
    """

    def __init__(self, gpu: Gpu, problems: list[GemmProblem], spec: GemmKernelSpec, a: Buffer, b: Buffer, c: Buffer,
                 cu_mask: list[int] | None = None, name: str | None = None):
        if spec.split_k != 1:
            raise ValueError("a grouped GEMM does not split K")
        self.parts: list[GemmKernel] = []
        self.first: list[int] = []
        """The first workgroup of each problem."""
        offsets = {"a": 0, "b": 0, "c": 0}
        order: list[int] = []
        for index, problem in enumerate(problems):
            size = problem.dtype_bytes
            sizes = {"a": problem.m * problem.k * size, "b": problem.k * problem.n * size,
                     "c": problem.m * problem.n * size}
            a_i, b_i, c_i = (Buffer(f"{whole.name}[{index}]", whole.addr + offsets[key], sizes[key], whole.cached)
                             for key, whole in (("a", a), ("b", b), ("c", c)))
            for key in offsets:
                offsets[key] += sizes[key]
            part = GemmKernel(gpu, problem, spec, a_i, b_i, c_i, cu_mask=cu_mask)
            first = len(order)
            self.first.append(first)
            order.extend(first + wg for wg in part.kernel.wg_order)
            self.parts.append(part)
        self.kernel = Kernel(
            name=name or f"gemm_grouped_{spec.name}",
            num_wgs=len(order),
            shape=self.parts[0].kernel.shape,
            body=self._workgroup,
            cu_mask=cu_mask,
            wg_order=order,
            info={"impl": f"grouped_{spec.name}", "flops": sum(problem.flops for problem in problems),
                  "workgroups": len(order), "occupancy": self.parts[0].kernel.info["occupancy"]},
            math_units=self.parts[0].kernel.math_units,
            peak_flops_per_cu_cycle=self.parts[0].kernel.peak_flops_per_cu_cycle,
        )

    def _workgroup(self, wg: int, cu: ComputeUnit):
        index = bisect.bisect_right(self.first, wg) - 1
        return self.parts[index]._workgroup(wg - self.first[index], cu)


def execute_grouped_gemm(ctx, op):
    """Run a :class:`gpusim.ops.GroupedGemm` on ``ctx``'s rank (a generator for the op's stream): the
    op's named kernel, else :func:`choose_grouped_kernel`'s, as the GPU runs it on the least aligned
    problem's rows (:func:`for_operands`) and with its pipeline stages (:func:`pipelined`)."""
    gpu = ctx.gpu
    problems = [GemmProblem(m, n, k, op.dtype, op.trans_a, op.trans_b) for m, n, k in op.shapes]
    spec = find_spec(op.kernel) if op.kernel is not None else choose_grouped_kernel(problems, gpu.config, ctx.cus)
    least_aligned = min(problems, key=lambda problem: problem.row_alignment)
    spec = pipelined(for_operands(spec, least_aligned, gpu.config), gpu.config, op.dtype)
    check_fits(spec, op.dtype, gpu.config, op.label, named=op.kernel is not None)
    size = DTYPE_BYTES[op.dtype]
    a = ctx.tensor(op.a, sum(m * k for m, _, k in op.shapes) * size)
    b = ctx.tensor(op.b, sum(k * n for _, n, k in op.shapes) * size)
    c = ctx.tensor(op.out, sum(m * n for m, n, _ in op.shapes) * size)
    kernel = GroupedGemmKernel(gpu, problems, spec, a, b, c)
    yield from ctx.launch(kernel.kernel)
    ctx.info.update(impl=kernel.kernel.info["impl"], flops=op.flops, workgroups=kernel.kernel.num_wgs,
                    bytes=sum(problem.min_bytes for problem in problems))


def execute_gemm(ctx, op, spec: GemmKernelSpec | None = None):
    """Run a :class:`gpusim.ops.Gemm` on ``ctx``'s rank (a generator for the op's stream).

    The kernel is ``spec``, else the op's named kernel, else the library's choice for the CUs the
    stream may use (``gpu.gemm_selection``: the heuristic's, or tuned by simulation), as the GPU runs it on the operands' rows (:func:`for_operands`:
    a named tile becomes its fallback variant where the rows are not aligned) and with the GPU's
    pipeline stages (:func:`pipelined`).  With split-K,
    fp32 partial tiles go to a workspace and an element-wise reduction kernel writes C.  A
    one-row (or one-column) product with neither a ``spec`` nor a named kernel runs as the BLAS's
    GEMV kernel where it has them (:mod:`gpusim.kernels.gemv`).  (Fused kernels launch their GEMM
    with a store hook through :func:`launch_gemm` or :class:`GemmKernel`.)
    """
    from gpusim.kernels.gemv import execute_gemv, runs_as_gemv

    problem = problem_of(op)
    gpu = ctx.gpu
    if spec is None and op.kernel is None and runs_as_gemv(problem, gpu.config):
        yield from execute_gemv(ctx, op, problem)
        return
    if spec is None:
        if op.kernel is not None:
            spec = find_spec(op.kernel)
        else:
            from gpusim.kernels.gemm_selection import select_kernel

            spec = select_kernel(problem, gpu.config, ctx.cus)
    spec = pipelined(for_operands(spec, problem, gpu.config), gpu.config, problem.dtype)
    check_fits(spec, problem.dtype, gpu.config, op.label, named=op.kernel is not None)
    size = problem.dtype_bytes
    a = ctx.tensor(op.a, problem.batch * problem.m * problem.k * size)
    b = ctx.tensor(op.b, problem.batch * problem.n * problem.k * size)
    c = ctx.tensor(op.out, problem.batch * problem.m * problem.n * size)
    kernel = yield from launch_gemm(ctx, problem, spec, a, b, c)
    ctx.info.update(
        impl=spec.name,
        flops=problem.flops,
        workgroups=kernel.kernel.num_wgs,
        bytes=problem.min_bytes,
    )
