"""A GEMM and the ring reduce-scatter of its output, overlapped in software by decomposition.

This is what the dissertation's section 8.2.1 says software must do to overlap a producer GEMM with
its serialized collective without new hardware, and what Wang et al. (ASPLOS 2023, "Google
Decomposition" in Table 8.3) and Transformer Engine's communication overlap do: break the producer
into smaller kernels and let the collective consume their outputs as they finish.

The GEMM is cut along M into one chunk per rank.  The rank at ring position ``p`` computes chunk
``(p - s - 1) mod n`` in step ``s``, which is the chunk that step ``s`` of the ring reduce-scatter
(:func:`gpusim.kernels.collectives.ring_program`) reduces and sends on.  The chunks run as ``n``
kernels, one after another, each with its own launch.  Beside them, on a second hardware queue, a
CU-driven ring reduce-scatter (:class:`RingKernel`) runs on ``channels`` CUs of its own.  Its
workgroups wait, step by step, for the flag of the neighbour's data and for the kernel of their
local chunk.  So step ``s``'s communication overlaps step ``s + 1``'s GEMM.

What the overlap costs comes out of the same models as everything else, and it is the cost the
dissertation's section 8.2.2 and Fig. 8.4 describe:

- the GEMM loses the reduce-scatter's CUs;
- ``n`` smaller kernels replace one, each with its launch and its tail of idle CUs;
- the reduce-scatter still reads every chunk from memory and adds on CUs;
- both share the L2 and the HBM.

A transposed A is laid out chunk after chunk, as if its rows were contiguous; the model only
approximates where its chunks fall in DRAM.
"""

from __future__ import annotations

from dataclasses import replace

from simpy.events import Event

from gpusim.errors import OpError
from gpusim.kernels.collectives import Flags, RingKernel, channels_for, choose_protocol, ring_orders, ring_program
from gpusim.kernels.fused import whole_tile_spec
from gpusim.kernels.gemm import GemmKernel, GemmProblem, execute_gemm, padded_k, tiles

COMM_LANE_SUFFIX = ".comm"
"""The reduce-scatter's hardware queue and timeline lane: the op's stream name with this suffix."""


def execute_decomposed_gemm_rs(ctx, op):
    """Run a :class:`gpusim.ops.DecomposedGemmReduceScatter` on ``ctx``'s rank (a generator on the op's stream)."""
    group = ctx.group
    if ctx.rank not in group:
        return
    n = len(group)
    if n == 1:  # nothing to reduce: the GEMM alone
        yield from execute_gemm(ctx, op)
        return
    if op.m % n:
        raise OpError(f"{op.label}: m = {op.m} rows do not split evenly into {n} chunks, one per rank")
    cus = ctx.cu_mask if ctx.cu_mask is not None else tuple(range(ctx.gpu.config.num_cus))
    chunk_bytes = op.nbytes // n
    protocol = choose_protocol(ctx, op, "rs", group)
    channels = channels_for(ctx, op, chunk_bytes, protocol, op.nbytes)
    if channels >= len(cus):
        raise OpError(f"{op.label}: the reduce-scatter's {channels} CUs leave none of the stream's {len(cus)} "
                      f"to the GEMM; give it fewer channels")
    gemm_cus, comm_cus = list(cus[:-channels]), list(cus[-channels:])

    problem = GemmProblem(op.m // n, op.n, op.k, op.dtype, op.trans_a, op.trans_b, 1)
    spec = whole_tile_spec(ctx, op, problem, len(gemm_cus))
    size = problem.dtype_bytes
    tiles_m, tiles_n = tiles(problem, spec)
    a_chunk = tiles_m * spec.tile_m * padded_k(problem, spec) * size
    a = ctx.tensor(op.a, n * a_chunk)
    b = ctx.tensor(op.b, tiles_n * spec.tile_n * padded_k(problem, spec) * size)
    # Chunk j of the partial output starts where the reduce-scatter reads it; padded edge tiles of
    # a chunk (when its rows are not whole tiles) spill into the next one's first bytes.
    padded_chunk = tiles_m * tiles_n * spec.tile_m * spec.tile_n * size
    partials = ctx.tensor(None, (n - 1) * chunk_bytes + padded_chunk)
    out = ctx.tensor(op.out, op.nbytes)
    stage = ctx.tensor(None, chunk_bytes * 2)

    flags = ctx.shared().setdefault("flags", Flags(ctx, protocol.step_latency_ns))
    produced: dict[int, Event] = {chunk: ctx.env.event() for chunk in range(n)}
    ring = RingKernel(ctx, "rs", group, op.nbytes, partials, out, stage, flags, channels,
                      wire_efficiency=protocol.wire_efficiency, local_ready=produced.__getitem__)
    ring.kernel.cu_mask = comm_cus
    position = ring_orders(ctx, group, 1)[0].index(ctx.rank)
    order = [step.chunk for step in ring_program("rs", position, n)]

    def chunk_kernels():
        for step, chunk in enumerate(order):
            kernel = GemmKernel(ctx.gpu, problem, spec, _at(a, chunk * a_chunk), b, _at(partials, chunk * chunk_bytes),
                                cu_mask=gemm_cus, name=f"gemm_chunk{step}_{spec.name}")
            yield from ctx.launch(kernel.kernel)
            produced[chunk].succeed()

    gemms = ctx.env.process(chunk_kernels())
    set_up = ctx.config.collectives.launch_ns + protocol.base_latency_ns
    yield from ctx.launch(ring.kernel, latency_ns=set_up, queue=ctx.stream.name + COMM_LANE_SUFFIX)
    yield gemms
    ctx.info.update(impl=f"decomposed_ring_rs_{spec.name}", flops=2.0 * op.m * op.n * op.k, bytes=op.nbytes,
                    chunks=n, channels=channels, gemm_cus=len(gemm_cus), protocol=protocol.name,
                    workgroups=n * tiles_m * tiles_n)


def _at(buffer, offset: int):
    """``buffer`` from byte ``offset`` on."""
    return replace(buffer, addr=buffer.addr + offset, nbytes=max(0, buffer.nbytes - offset))


__all__ = ["COMM_LANE_SUFFIX", "execute_decomposed_gemm_rs"]
