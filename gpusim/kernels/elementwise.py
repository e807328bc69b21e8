"""Streaming kernels: element-wise ops and split-K reductions (row reductions: :mod:`gpusim.kernels.rowreduce`).

A streaming kernel reads some tensors, computes a few FLOPs per element and writes some tensors.
Its real grid has one workgroup per ``threads x bytes_per_thread`` of data; the simulation runs at
most one *logical* workgroup per resident slot, each looping over the real workgroups it stands for
in up to :data:`MAX_CHUNKS` chunks (prefetching the next chunk while it computes and writes the
current one); a logical workgroup that is one real workgroup does one load-compute-store round.
A kernel with fewer real workgroups than slots runs exactly those, so small kernels are latency-
and parallelism-bound as on hardware.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpusim.config.gpu import DTYPE_BYTES, GpuConfig
from gpusim.engine.primitives import Join
from gpusim.hw.compute import ComputeUnit, InflightLimit, Kernel, WorkgroupShape, issue_lanes, issue_slots, occupancy
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.hw.request import COMPUTE

BYTES_PER_THREAD = 16
"""Bytes of each tensor one thread handles (vectorised 16-byte accesses)."""
SCALAR_THREADS = 128
"""Threads per workgroup of PyTorch's element-at-a-time kernels (``elementwise_kernel<128, 4>``)."""
SCALAR_ELEMENTS_PER_THREAD = 4
"""Elements each of their threads handles, its loads all issued before the first is used."""
DIVMOD_INSTRUCTIONS = 4
"""Integer instructions of one division with remainder by a precomputed divisor (PyTorch's
``IntDivider``: a high multiply, an add and a shift for the quotient, a multiply-add for the
remainder)."""
DIVISION_INSTRUCTIONS = 16
"""Integer-lane instructions of a 32-bit division by a divisor known only at run time, with its
remainder: the reciprocal estimate and its conversions, the quotient's high multiply, two
correction steps and the zero-divisor check that NVIDIA's compiler emits (an estimate)."""
MAX_CHUNKS = 8
"""Most chunks per logical workgroup (simulation granularity); it has one per real workgroup it
stands for, up to this many."""


@dataclass(frozen=True)
class InstructionMix:
    """What one element of a kernel costs in instructions, counted in its SASS.

    Attributes
    ----------
    ops
        Lane-instruction issue slots per element besides special functions (a warp instruction
        takes 32 whatever its predicate), loads, stores and the loop's set-up included.
    transcendentals
        Special functions (``MUFU``) per element.
    fma_share
        Share of ``ops`` that runs on the FP32 (FMA) pipe (FFMA, FMUL, FADD, IMAD, half-precision
        arithmetic).
    """

    ops: float
    transcendentals: float
    fma_share: float


INSTRUCTION_MIXES = {"gelu_erf": InstructionMix(ops=28.625, transcendentals=1.0, fma_share=0.515)}
"""Element-wise kinds whose compute is their measured instructions rather than their FLOPs.
``gelu_erf``: PyTorch's ``vectorized_elementwise_kernel<8, GeluCUDAKernelImpl>`` over 4096 x 4096
fp16 values on the H200 (``validation/measured/h200/compiled_sass.csv.gz``, Nsight Compute's
source counters): 29.6 issue slots per element, of which 1 ``MUFU`` and 15.25 on the FMA pipe;
``erff`` evaluates both of its polynomials and selects (9 ``FSEL``), so the count does not depend
on the values. At 4096 x 4096 it kept the H200's issue slots 67% busy (``compiled_counters.csv.gz``)."""


def instruction_flops(config: GpuConfig, mix: InstructionMix) -> float:
    """FP32 FLOPs per element that take a CU as long as ``mix``'s instructions: they issue at the
    CU's issue rate (or the FP32 pipe's, where it has fewer lanes than the schedulers issue),
    special functions at their units' rate. :class:`StreamingKernel` charges them, as every
    element-wise kernel's FLOPs, at ``gpu.vector_efficiency`` of that peak (the H200 issued
    ``gelu_erf`` in 67% of its slots, :data:`INSTRUCTION_MIXES`)."""
    lanes = issue_lanes(config.cu, mix.fma_share)
    cycles = issue_slots(config.cu, lanes, mix.ops, mix.transcendentals) / lanes
    return cycles * config.cu.vector_peak("fp32")


PERSISTENT_CHUNK_WINDOWS = 4
"""In-flight windows (the workgroup's bytes in flight) per chunk of a persistent workgroup."""
MAX_PERSISTENT_CHUNKS = 1024
"""Most chunks per persistent workgroup (simulation granularity)."""


Ranges = list[tuple[Buffer, int, int]]
"""``(buffer, offset, nbytes)`` ranges of tensors, bytes."""


def read_ranges(gpu: Gpu, limit: InflightLimit, ranges: Ranges) -> Join:
    """Read ``(buffer, offset, nbytes)`` ranges (bytes) through the L2, paced by ``limit``.

    Returns
    -------
    Join
        Done when the data has arrived (and the workgroup's in-flight budget allowed the request).
    """
    join = Join(gpu.env)
    total = 0
    missed = 0
    for buffer, offset, nbytes in ranges:
        if nbytes > 0:
            missed += gpu.memory.read(buffer.addr + offset, nbytes, join, COMPUTE, buffer.cached)
            total += nbytes
    join.extend_to(limit.memory(gpu.env.now, total, missed))
    return join


def write_ranges(gpu: Gpu, cu: ComputeUnit, ranges: Ranges, written: Join) -> None:
    """Write ``(buffer, offset, nbytes)`` ranges (bytes) from ``cu``; ``written`` extends to their completion."""
    size = 0
    uncached = 0
    for buffer, offset, nbytes in ranges:
        if nbytes > 0:
            gpu.memory.write(buffer.addr + offset, nbytes, written, COMPUTE, buffer.cached)
            size += nbytes
            uncached += 0 if buffer.cached else nbytes
    written.extend_to(cu.memory(gpu.env.now, size, uncached))


def pipelined(
    gpu: Gpu,
    cu: ComputeUnit,
    pieces: int,
    fetch: Callable[[int], Join] | None,
    flops: Callable[[int], float],
    writes: Callable[[int], Ranges],
    flops_per_ns: float,
    wavefronts: int,
):
    """One logical streaming workgroup: fetch, compute and write ``pieces`` pieces in order (a generator).

    The next piece is fetched while the current one is computed and written.  ``fetch(piece)``
    requests a piece's data (``None``: the kernel reads nothing); ``flops(piece)`` and
    ``writes(piece)`` give the piece's work and output ranges.  Returns when every write is done.
    """
    env = gpu.env
    pending = fetch(0) if fetch is not None else None
    written = Join(env)
    for piece in range(pieces):
        if pending is not None:
            yield pending.close()
        done = cu.compute(env.now, flops(piece), flops_per_ns, wavefronts)
        more = piece + 1 < pieces
        if more and fetch is not None:
            pending = fetch(piece + 1)
            pending.extend_to(done)
        else:
            pending = None
            yield env.timeout(max(0.0, done - env.now))
        write_ranges(gpu, cu, writes(piece), written)
        if pending is None and more:
            yield env.timeout(max(0.0, written.latest - env.now))
    yield written.close()


class StreamingKernel:
    """A memory-streaming kernel on one GPU.

    Parameters
    ----------
    gpu
        The GPU.
    name
        Kernel name.
    reads, writes
        ``(buffer, nbytes)`` of every tensor read / written (each workgroup handles the same
        fraction of every tensor).
    flops
        Total FLOPs (vector units).
    dtype
        Compute dtype of the FLOPs.
    threads
        Threads per workgroup.
    bytes_per_thread
        Bytes of the largest tensor each thread handles.
    inflight_bytes_per_thread
        Bytes of each read tensor a thread keeps in flight (default: the GPU's
        ``streaming_inflight_bytes_per_thread``).
    int_ops
        Total 32-bit integer instructions (address arithmetic), lanes; they issue at the CU's
        ``int32_ops_per_cycle`` beside the FLOPs.
    max_workgroups
        A persistent kernel's grid: at most this many workgroups, each striding over its share
        (default: one per ``threads x bytes_per_thread`` of data).
    cus
        CUs the kernel may use (its stream's CU mask; default: all of the GPU's): the resident
        workgroups the model simulates.
    """

    def __init__(
        self,
        gpu: Gpu,
        name: str,
        reads: list[tuple[Buffer, int]],
        writes: list[tuple[Buffer, int]],
        flops: float,
        dtype: str = "fp32",
        threads: int = 256,
        bytes_per_thread: int = BYTES_PER_THREAD,
        inflight_bytes_per_thread: float | None = None,
        int_ops: float = 0.0,
        max_workgroups: int | None = None,
        cus: int | None = None,
    ):
        self.gpu = gpu
        self.reads = reads
        self.writes = writes
        cu_config = gpu.config.cu
        # the integer instructions as the FLOPs that take as long: they issue at the integer lanes'
        # peak, which the FLOP rate's vector efficiency (FLOPs per FMA slot) does not apply to
        fp32_lanes = cu_config.vector_peak("fp32") / 2
        fma_slots = int_ops * fp32_lanes / cu_config.int32_ops_per_cycle
        self.flops = flops + 2.0 * fma_slots * gpu.config.vector_efficiency
        self.flops_per_ns = gpu.vector_flops_per_ns(dtype)
        largest = max([n for _, n in reads + writes] + [1])
        real = max(1, math.ceil(largest / (threads * bytes_per_thread)))
        shape = WorkgroupShape(threads, 0, 32)
        slots = (cus or gpu.config.num_cus) * max(1, occupancy(shape, gpu.config.cu))
        self.workgroups = min(real, slots, max_workgroups or slots)
        per_thread = inflight_bytes_per_thread or gpu.config.streaming_inflight_bytes_per_thread
        self.inflight_bytes = threads * per_thread * max(1, len(reads))
        if max_workgroups:
            # a persistent workgroup streams its share a few in-flight windows per chunk: a chunk's
            # reads enter the memory system at once, and larger ones would flood its queues
            windows = math.ceil(largest / (self.workgroups * PERSISTENT_CHUNK_WINDOWS * threads * per_thread))
            self.chunks = max(1, min(MAX_PERSISTENT_CHUNKS, windows))
        else:
            self.chunks = max(1, min(MAX_CHUNKS, math.ceil(real / self.workgroups)))
        self.units = math.ceil(largest / bytes_per_thread)
        self.wavefronts = shape.wavefronts(gpu.config.cu.wavefront_size)
        self.miss_latency_ns = gpu.unloaded_memory_latency_ns
        self.kernel = Kernel(
            name=name,
            num_wgs=self.workgroups,
            shape=shape,
            body=self._workgroup,
            info={"flops": flops, "bytes": sum(n for _, n in reads) + sum(n for _, n in writes)},
        )
        self.kernel.math_units, self.kernel.peak_flops_per_cu_cycle = gpu.config.vector_math(dtype)

    def _span(self, wg: int, chunk: int) -> tuple[float, float]:
        """Fraction of every tensor that chunk ``chunk`` of workgroup ``wg`` covers, as [start, stop).

        The chunks are dealt out round by round, as the hardware dispatches workgroups in order:
        the ``chunk``-th chunks of all logical workgroups cover one contiguous stretch of the
        tensors, so the workgroups resident together touch neighbouring addresses (and DRAM rows).
        """
        per_piece = self.units / (self.workgroups * self.chunks)
        piece = chunk * self.workgroups + wg
        return math.floor(piece * per_piece) / self.units, math.floor((piece + 1) * per_piece) / self.units

    def _fetch(self, limit: InflightLimit, wg: int, chunk: int) -> Join:
        """Request one chunk's data of every read tensor."""
        lo, hi = self._span(wg, chunk)
        return read_ranges(self.gpu, limit, [(buffer, int(lo * n), int(hi * n) - int(lo * n)) for buffer, n in self.reads])

    def _workgroup(self, wg: int, cu: ComputeUnit):
        limit = InflightLimit(cu, self.inflight_bytes, self.miss_latency_ns)

        def fetch(chunk: int) -> Join:
            return self._fetch(limit, wg, chunk)

        def flops(chunk: int) -> float:
            lo, hi = self._span(wg, chunk)
            return self.flops * (hi - lo)

        def writes(chunk: int) -> Ranges:
            lo, hi = self._span(wg, chunk)
            return [(buffer, int(lo * n), int(hi * n) - int(lo * n)) for buffer, n in self.writes]

        yield from pipelined(self.gpu, cu, self.chunks, fetch if self.reads else None, flops, writes,
                             self.flops_per_ns, self.wavefronts)


def offset_instructions(index_dims: int, tensors: int, kind: str = "copy") -> float:
    """Integer instructions per element of an element-at-a-time kernel over ``tensors`` tensors
    whose offsets span ``index_dims`` dimensions (:attr:`gpusim.ops.Elementwise.index_dims`).

    Per tensor a 64-bit address add and the access itself, and the element's index and its bounds
    check; then on the offset-calculator path, per dimension, a division with remainder by a
    precomputed divisor and a multiply-add per tensor (PyTorch's ``OffsetCalculator``); for a
    ``cat``, the output's and the input's offsets each take a run-time division and a multiply-add
    per dimension but the outermost (``CatArrIndexToOffset``).
    """
    base = 3 * tensors + 2
    if index_dims < 2:
        return base
    if kind == "cat":
        return base + 2 * (index_dims - 1) * (DIVISION_INSTRUCTIONS + 1)
    return base + index_dims * (DIVMOD_INSTRUCTIONS + tensors)


def _per_row(ctx, op, source: Buffer, flops: float):
    """Run vLLM's per-row kernel of ``op`` (:func:`gpusim.kernels.rowreduce.vllm_row_kernel`, ``flops``
    per value) on its read tensor ``source``: ``silu_and_mul`` reads its halves as the gate's and the up projection's
    rows (in the real layout each row holds the two side by side) and writes ``op.out``; ``rope``
    rotates ``source`` in place."""
    from gpusim.kernels.rowreduce import RowReduceKernel, vllm_row_kernel

    size = DTYPE_BYTES[op.dtype]
    cols = op.elements // op.rows
    nbytes = op.elements * size
    spec = vllm_row_kernel(op.kind, cols, size)
    parts = [replace(source, name=f"{source.name}[{i}]", addr=source.addr + i * nbytes, nbytes=nbytes)
             for i in range(spec.inputs)]
    target = parts[0] if op.kind == "rope" else ctx.tensor(op.out, nbytes)
    kernel = RowReduceKernel(ctx.gpu, spec, parts[0], target, op.rows, cols, op.dtype, nbytes, tuple(parts[1:]),
                             cus=ctx.cus)
    yield from ctx.launch(kernel.kernel)
    ctx.info.update(impl=spec.name, flops=flops * op.elements, bytes=spec.inputs * nbytes + nbytes)


def execute_elementwise(ctx, op):
    """Run a :class:`gpusim.ops.Elementwise` on ``ctx``'s rank."""
    from gpusim.ops import ELEMENTWISE_INPUT_WIDTH, ELEMENTWISE_KINDS, ELEMENTWISE_MASKS, MASK_BYTES

    n_in, n_out, flops = ELEMENTWISE_KINDS[op.kind]
    mix = INSTRUCTION_MIXES.get(op.kind)
    cost = instruction_flops(ctx.gpu.config, mix) if mix else flops
    size = DTYPE_BYTES[op.dtype]
    nbytes = op.elements * size
    read_bytes = nbytes * ELEMENTWISE_INPUT_WIDTH.get(op.kind, 1)
    masked = ELEMENTWISE_MASKS.get(op.kind)
    read_sizes = [read_bytes] * n_in
    write_sizes = [nbytes] * n_out
    if masked == "read":
        read_sizes[-1] = op.elements * MASK_BYTES
    elif masked == "write":
        write_sizes[-1] = op.elements * MASK_BYTES
    names_in = list(op.inputs or []) + [None] * n_in
    if op.kind == "rope" and names_in[0] is None:
        names_in[0] = op.out  # rotated in place: the tensor its output names
    reads = [(ctx.tensor(names_in[i], read_sizes[i]), read_sizes[i]) for i in range(n_in)]
    if op.rows:
        yield from _per_row(ctx, op, reads[0][0], flops)
        return
    writes = [(ctx.tensor(op.out if i == 0 else None, write_sizes[i]), write_sizes[i]) for i in range(n_out)]
    impl = f"{op.kind}_kernel"
    geometry = {}
    if op.index_dims:
        # PyTorch's element-at-a-time kernels: one element per access, offsets computed per element
        impl = f"{op.kind}_kernel_strided{op.index_dims}" if op.index_dims > 1 else f"{op.kind}_kernel_unrolled"
        per_thread = SCALAR_ELEMENTS_PER_THREAD * size
        geometry = {"threads": SCALAR_THREADS, "bytes_per_thread": per_thread,
                    "inflight_bytes_per_thread": min(per_thread, ctx.gpu.config.streaming_inflight_bytes_per_thread),
                    "int_ops": offset_instructions(op.index_dims, n_in + n_out, op.kind) * op.elements}
    if op.workgroups:
        impl = f"{impl}_persistent{op.workgroups}"
        geometry["max_workgroups"] = op.workgroups
    if op.inflight_bytes_per_thread:
        geometry["inflight_bytes_per_thread"] = op.inflight_bytes_per_thread
    kernel = StreamingKernel(ctx.gpu, impl, reads, writes, cost * op.elements, "fp32", cus=ctx.cus, **geometry)
    yield from ctx.launch(kernel.kernel)
    ctx.info.update(impl=impl, flops=flops * op.elements, bytes=sum(read_sizes) + sum(write_sizes))

