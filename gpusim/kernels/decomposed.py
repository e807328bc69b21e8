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

With ``driver="dma"`` the same decomposition runs on T3's data path without its tracker: the chunk
kernels keep every CU and store their tiles as near-memory updates (op-and-store), and the DMA-driven
ring (:func:`gpusim.kernels.collectives.dma_ring`) sends a chunk once its kernel has finished and the
previous rank's update of it has arrived.  Against T3 (:mod:`gpusim.kernels.fused`) this isolates
what triggering per tile inside one unchanged GEMM is worth over triggering per kernel.

A transposed A is laid out chunk after chunk, as if its rows were contiguous; the model only
approximates where its chunks fall in DRAM.
"""

from __future__ import annotations

from dataclasses import replace

from simpy.events import Event

from gpusim.errors import OpError
from gpusim.hw.hbm import UPDATE
from gpusim.hw.request import COMPUTE
from gpusim.kernels.collectives import (
    DmaPieces,
    Flags,
    RingKernel,
    channels_for,
    choose_protocol,
    dma_ring,
    ring_orders,
    ring_program,
    simple_protocol,
)
from gpusim.kernels.fused import gemm_spec
from gpusim.kernels.gemm import GemmProblem, execute_gemm, launch_gemm, padded_k, tiles

COMM_LANE_SUFFIX = ".comm"
"""The reduce-scatter's hardware queue and timeline lane: the op's stream name with this suffix."""


def execute_decomposed_gemm_rs(ctx, op):
    """Run a :class:`gpusim.ops.DecomposedGemmReduceScatter` on ``ctx``'s rank (a generator on the op's stream)."""
    group = ctx.group
    n = len(group)
    if ctx.rank not in group or n == 1:
        yield from _without_peers(ctx, op)
        return
    splits = op.splits
    if op.m % (n * splits):
        per = f"{n} chunks, one per rank" if splits == 1 else f"{n} chunks of {splits} kernels each"
        raise OpError(f"{op.label}: m = {op.m} rows do not split evenly into {per}")
    chunk_bytes = op.nbytes // n
    split_bytes = chunk_bytes // splits
    protocol = simple_protocol(ctx) if op.driver == "dma" else choose_protocol(ctx, op, "rs", group)
    gemm_cus, comm_cus = _split_cus(ctx, op, protocol, chunk_bytes)

    problem = GemmProblem(op.m // (n * splits), op.n, op.k, op.dtype, op.trans_a, op.trans_b, 1)
    # CU-driven, each kernel is a plain GEMM whose output the ring reads once it has ended (with split-K,
    # after its reduction kernel); DMA-driven, the kernels store their tiles, or their K splits' partial
    # tiles, as near-memory updates that add in place.
    spec = gemm_spec(ctx, op, problem, len(gemm_cus))
    size = problem.dtype_bytes
    tiles_m, tiles_n = tiles(problem, spec)
    k_extent = padded_k(problem, spec) * spec.split_k
    a_split = tiles_m * spec.tile_m * k_extent * size
    a = ctx.tensor(op.a, n * splits * a_split)
    b = ctx.tensor(op.b, tiles_n * spec.tile_n * k_extent * size)
    # Kernel i of chunk j writes its rows where the reduce-scatter reads them; padded edge tiles
    # (when its rows are not whole tiles) spill into the next kernel's first bytes.  DMA-driven,
    # the partials are the output, uncached, as the near-memory updates that land in them need.
    padded_split = tiles_m * tiles_n * spec.tile_m * spec.tile_n * size
    partials_bytes = n * chunk_bytes - split_bytes + padded_split
    if op.driver == "dma":  # reduced in place: the op's output
        partials = replace(ctx.tensor(op.out, partials_bytes), cached=False)
    else:
        partials = ctx.tensor(None, partials_bytes)
    produced: dict[tuple[int, int], Event] = {(chunk, i): ctx.env.event() for chunk in range(n) for i in range(splits)}
    position = ring_orders(ctx, group, 1)[0].index(ctx.rank)
    order = [step.chunk for step in ring_program("rs", position, n)]

    def local_ready(chunk: int, offset: int, nbytes: int) -> Event:
        """When bytes ``offset .. offset + nbytes`` of ``chunk`` are written: the chunk's kernels run in
        order, so when the last kernel that writes them has finished."""
        return produced[(chunk, min(splits - 1, (offset + nbytes - 1) // split_bytes))]

    def chunk_kernels():
        for step, chunk in enumerate(order):
            for i in range(splits):
                target = _at(partials, chunk * chunk_bytes + i * split_bytes)
                yield from launch_gemm(ctx, problem, spec, _at(a, (chunk * splits + i) * a_split), b, target,
                                       store=_updates(ctx, target) if op.driver == "dma" else None, cu_mask=gemm_cus,
                                       name=f"gemm_chunk{step}" + (f".{i}" if splits > 1 else "") + f"_{spec.name}",
                                       partials_in_place=op.driver == "dma")
                produced[(chunk, i)].succeed()
        ctx.release_stream()  # the ring's tail runs on its own lane (or the DMA engines)

    gemms = ctx.env.process(chunk_kernels())
    flags = ctx.shared().setdefault("flags", Flags(ctx, protocol.step_latency_ns))
    if op.driver == "dma":
        yield ctx.env.timeout(ctx.config.collectives.launch_ns)
        yield from dma_ring(ctx, "rs", group, op.nbytes, partials, flags, local_ready=local_ready)
        ctx.info.update(impl=f"decomposed_dma_rs_{spec.name}")
    else:
        ring = RingKernel(ctx, "rs", group, op.nbytes, partials, ctx.tensor(op.out, op.nbytes),
                          ctx.tensor(None, chunk_bytes * 2), flags, len(comm_cus),
                          wire_efficiency=protocol.wire_efficiency, local_ready=local_ready)
        ring.kernel.cu_mask = comm_cus
        set_up = ctx.config.collectives.launch_ns + protocol.base_latency_ns
        yield from ctx.launch(ring.kernel, latency_ns=set_up, queue=ctx.stream.name + COMM_LANE_SUFFIX)
        ctx.info.update(impl=f"decomposed_ring_rs_{spec.name}", channels=len(comm_cus), protocol=protocol.name)
    yield gemms
    ctx.info.update(flops=2.0 * op.m * op.n * op.k, bytes=op.nbytes, chunks=n, splits=splits,
                    gemm_cus=len(gemm_cus), workgroups=n * splits * tiles_m * tiles_n)


def execute_decomposed_ag_gemm(ctx, op):
    """Run a :class:`gpusim.ops.DecomposedAllGatherGemm` on ``ctx``'s rank (a generator on the op's stream).

    The rank at ring position ``p`` runs the kernel of chunk ``(p - j) mod n`` in step ``j``: its own
    chunk first, then each chunk once every piece of it has arrived (the ring's arrival flags)."""
    group = ctx.group
    n = len(group)
    if ctx.rank not in group or n == 1:
        yield from _without_peers(ctx, op)
        return
    if op.m % n:
        raise OpError(f"{op.label}: m = {op.m} rows do not split evenly into {n} chunks, one per rank")
    problem = GemmProblem(op.m // n, op.n, op.k, op.dtype, op.trans_a, op.trans_b, 1)
    size = problem.dtype_bytes
    chunk_bytes = problem.m * op.k * size
    protocol = simple_protocol(ctx) if op.driver == "dma" else choose_protocol(ctx, op, "ag", group)
    gemm_cus, comm_cus = _split_cus(ctx, op, protocol, chunk_bytes, reduces=False)
    spec = gemm_spec(ctx, op, problem, len(gemm_cus))  # a plain GEMM per chunk: split-K too
    tiles_m, tiles_n = tiles(problem, spec)
    k_extent = padded_k(problem, spec) * spec.split_k
    a_chunk = tiles_m * spec.tile_m * k_extent * size
    # The ring gathers chunk c at c x chunk_bytes; a kernel reads its padded chunk from there.
    a = ctx.tensor(op.a, (n - 1) * chunk_bytes + max(a_chunk, chunk_bytes))
    b = ctx.tensor(op.b, tiles_n * spec.tile_n * k_extent * size)
    c_chunk = tiles_m * tiles_n * spec.tile_m * spec.tile_n * size
    out = ctx.tensor(op.out, n * c_chunk)
    gathering, order, pending = start_gather(ctx, op, group, a, protocol, comm_cus)
    for step, chunk in enumerate(order):
        waiting = pending(chunk)
        if waiting:
            yield ctx.env.all_of(waiting)
        yield from launch_gemm(ctx, problem, spec, _at(a, chunk * chunk_bytes), b, _at(out, chunk * c_chunk),
                               cu_mask=gemm_cus, name=f"gemm_chunk{step}_{spec.name}")
    yield gathering
    ctx.info.update(impl=f"decomposed_{'dma' if op.driver == 'dma' else 'ring'}_ag_{spec.name}",
                    flops=2.0 * op.m * op.n * op.k, bytes=op.nbytes, chunks=n, gemm_cus=len(gemm_cus),
                    workgroups=n * tiles_m * tiles_n)
    if comm_cus:
        ctx.info.update(channels=len(comm_cus), protocol=protocol.name)


def start_gather(ctx, op, group: list[int], a, protocol, comm_cus: list[int]):
    """Start the ring all-gather of ``op``'s input into ``a`` (chunk ``c`` at ``c`` x its bytes): on the
    DMA engines, or as a ring kernel on ``comm_cus`` on its own lane when there are any.

    Returns
    -------
    tuple
        The gather's process; the chunks in the order they are complete on this rank (its own first,
        then the ring's); and ``pending(chunk)``, the arrival events of ``chunk``'s pieces that have not
        happened yet (none for the own chunk).
    """
    n = len(group)
    tag = 0
    flags = ctx.shared().setdefault("flags", Flags(ctx, protocol.step_latency_ns))
    if not comm_cus:
        pieces = DmaPieces(ctx, n, op.nbytes).pieces

        def gather():
            yield ctx.env.timeout(ctx.config.collectives.launch_ns)
            yield from dma_ring(ctx, "ag", group, op.nbytes, a, flags, tag)
    else:
        ring = RingKernel(ctx, "ag", group, op.nbytes, a, a, ctx.tensor(None, 2 * op.nbytes // n), flags,
                          len(comm_cus), tag, wire_efficiency=protocol.wire_efficiency, one_ring=True)
        ring.kernel.cu_mask = comm_cus
        pieces = ring.pieces

        def gather():
            set_up = ctx.config.collectives.launch_ns + protocol.base_latency_ns
            yield from ctx.launch(ring.kernel, latency_ns=set_up, queue=ctx.stream.name + COMM_LANE_SUFFIX)

    position = ring_orders(ctx, group, 1)[0].index(ctx.rank)
    order = [(position - step) % n for step in range(n)]

    def pending(chunk: int) -> list[Event]:
        step = order.index(chunk)
        if step == 0:
            return []
        arrivals = (flags.event("data", ctx.rank, tag, step, *piece) for piece in pieces(chunk))
        return [event for event in arrivals if not event.processed]

    return ctx.env.process(gather()), order, pending


def _without_peers(ctx, op):
    """A decomposed op on a rank with nothing to exchange (a generator): no work outside its group, the
    GEMM alone in a group of one."""
    if ctx.rank in ctx.group:
        yield from execute_gemm(ctx, op)


def _split_cus(ctx, op, protocol, chunk_bytes: int, reduces: bool = True) -> tuple[list[int], list[int]]:
    """The stream's CUs for the GEMM chunks and for the collective's kernel (none when DMA-driven; a
    DMA-driven collective that ``reduces`` needs near-memory updates, an all-gather only writes)."""
    cus = list(ctx.cu_mask) if ctx.cu_mask is not None else list(range(ctx.gpu.config.num_cus))
    if op.driver == "dma":
        if reduces and not ctx.gpu.config.nmc.enabled:
            raise OpError(f"{op.label}: driver 'dma' reduces with near-memory op-and-store updates, which "
                          f"{ctx.gpu.config.name} lacks (gpu.nmc.enabled); use driver='cu'")
        return cus, []
    channels = channels_for(ctx, op, chunk_bytes, protocol, op.nbytes)
    if channels >= len(cus):
        raise OpError(f"{op.label}: the collective's {channels} CUs leave none of the stream's {len(cus)} "
                      f"to the GEMM; give it fewer channels")
    return cus[:-channels], cus[-channels:]


def _updates(ctx, target):
    """A GEMM store hook that writes ``target``'s tiles as near-memory updates (op-and-store), so the
    partial adds to whatever a peer's DMA has already added there."""
    def store(wg: int, offset: int, nbytes: int, join) -> None:
        ctx.gpu.memory.write(target.addr + offset, nbytes, join, COMPUTE, cached=False, kind=UPDATE)

    return store


def _at(buffer, offset: int):
    """``buffer`` from byte ``offset`` on."""
    return replace(buffer, addr=buffer.addr + offset, nbytes=max(0, buffer.nbytes - offset))


__all__ = ["COMM_LANE_SUFFIX", "execute_decomposed_ag_gemm", "execute_decomposed_gemm_rs", "start_gather"]
