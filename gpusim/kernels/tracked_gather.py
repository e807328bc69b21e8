"""T3's tracker on the consumer side: a ring all-gather whose arriving chunks trigger the GEMM that reads them.

The dissertation's section 8.6.2 ("TP with All-gather") sketches T3 for a collective followed by a
long-running consumer, as a sequence-parallel layer's all-gather is by its column-parallel GEMM: the
tracker counts the arrivals of the gathered input and, instead of triggering a DMA, triggers the
scheduling of the consumer's workgroups whose input is complete.  Here the all-gather is the
DMA-driven ring (:func:`gpusim.kernels.collectives.dma_ring`, the engines forwarding each slice as it
arrives) and the consumer is one unchanged GEMM kernel over all the gathered rows.  Its workgroups are
dispatched in the order their rows become complete on this rank (its own chunk first, then the
ring's, the GEMM's grouped rasterization within each), and a workgroup whose rows have not all
arrived waits for them on its CU before its first load; dispatch is in order, so it holds back those
behind it, as a dispatcher waiting for the tracker's trigger would.

Against the software decomposition (:func:`gpusim.kernels.decomposed.execute_decomposed_ag_gemm`)
this removes the kernel per chunk: its launch and the idle CUs of each chunk's last wave.  The
dissertation notes that which workgroups read which gathered rows depends on the kernel; the model
takes it from the kernel's tile rows (a tile whose rows straddle two chunks waits for both).  As in
the decomposition, the ring writes chunk ``c`` of A at ``c`` times its bytes and the kernel reads its
K-step slices from the same buffer, so which bytes of A a workgroup reads is approximate.
"""

from __future__ import annotations

from simpy.events import Event

from gpusim.errors import OpError
from gpusim.kernels.collectives import simple_protocol
from gpusim.kernels.decomposed import start_gather
from gpusim.kernels.fused import gemm_spec
from gpusim.kernels.gemm import execute_gemm, grouped_order, launch_gemm, padded_k, problem_of, tiles


def execute_tracked_ag_gemm(ctx, op):
    """Run a :class:`gpusim.ops.AllGatherGemm` on ``ctx``'s rank (a generator on the op's stream)."""
    group = ctx.group
    n = len(group)
    if ctx.rank not in group:
        return
    if n == 1:  # nothing to gather: the GEMM alone
        yield from execute_gemm(ctx, op)
        return
    if op.m % n:
        raise OpError(f"{op.label}: m = {op.m} rows do not split evenly into {n} chunks, one per rank")
    problem = problem_of(op)
    spec = gemm_spec(ctx, op, problem)
    size = problem.dtype_bytes
    tiles_m, tiles_n = tiles(problem, spec)
    k_extent = padded_k(problem, spec) * spec.split_k
    a = ctx.tensor(op.a, max(op.nbytes, tiles_m * spec.tile_m * k_extent * size))
    b = ctx.tensor(op.b, tiles_n * spec.tile_n * k_extent * size)
    c = ctx.tensor(op.out, tiles_m * tiles_n * spec.tile_m * spec.tile_n * size)
    gathering, order, pending = start_gather(ctx, op, group, a, simple_protocol(ctx), [])

    rows_per_chunk = op.m // n
    arrived: dict[int, Event | None] = {}  # per chunk: when every piece is here (None: already)
    for chunk in order:
        waiting = pending(chunk)
        arrived[chunk] = ctx.env.all_of(waiting) if waiting else None
    step_of_row: list[int] = []  # per tile row: the ring step after which all its rows are here
    ready_of_row: list[Event | None] = []
    for row in range(tiles_m):
        first = row * spec.tile_m // rows_per_chunk
        last = (min(op.m, (row + 1) * spec.tile_m) - 1) // rows_per_chunk
        chunks = range(first, last + 1)
        step_of_row.append(max(order.index(chunk) for chunk in chunks))
        events = [arrived[chunk] for chunk in chunks if arrived[chunk] is not None]
        ready_of_row.append(None if not events else events[0] if len(events) == 1 else ctx.env.all_of(events))

    def row_of(wg: int) -> int:
        return wg // spec.split_k // tiles_n

    wg_order = sorted(grouped_order(tiles_m, tiles_n, 1, spec.split_k), key=lambda wg: step_of_row[row_of(wg)])
    kernel = yield from launch_gemm(ctx, problem, spec, a, b, c, name=f"gemm_ag_tracked_{spec.name}",
                                    wg_order=wg_order, ready=lambda wg: ready_of_row[row_of(wg)])
    yield gathering
    ctx.info.update(impl=f"t3_ring_ag_gemm_{spec.name}", flops=problem.flops, bytes=op.nbytes, chunks=n,
                    workgroups=kernel.kernel.num_wgs)


__all__ = ["execute_tracked_ag_gemm"]
