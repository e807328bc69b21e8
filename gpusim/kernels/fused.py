"""T3: a GEMM fused with the reduce-scatter, all-gather or all-to-all of its output through its output address space.

Dissertation sections 8.3.1-8.3.4.  The GEMM kernel itself is unchanged (:class:`GemmKernel`); what
changes is where its workgroups' output tiles go.  The tiles, in the order the GEMM produces them
(its rasterization), are split into ``n`` chunks (one per rank), and each rank's driver programs, per
chunk, one line of the *output address-space configuration* (dissertation Fig. 8.10):

``remote_map``
    the chunk's stores go straight into a peer's memory as fine-grained remote updates;
``dma_map``
    the chunk is written locally as near-memory updates (op-and-store at the banks, no CU does the
    reduction) and, once the tracker has counted the expected local and incoming updates of a
    tile (its *trigger count*), a pre-programmed DMA sends the tile to a peer as an update;
``final``
    the chunk is written locally as updates and is this rank's result once every tile is complete;
``send``
    the chunk is written locally and, at once, stored into peers' memory (an all-gather's own shard).

Ring reduce-scatter (:func:`ring_reduce_scatter_config`): GPU at ring position ``p`` produces chunk
``(p - s - 1) mod n`` in step ``s`` (staggered workgroup order); the first chunk it produces is
``remote_map``-ped to the next GPU, the next ``n - 2`` are ``dma_map``-ped to it with a trigger count
of two updates per element, and the last one is its final chunk.  Direct reduce-scatter on a fully
connected node (:func:`direct_reduce_scatter_config`): every chunk but its own is
``remote_map``-ped to its owner, whose final chunk expects ``n`` updates per element.

A GEMM that splits K (dissertation section 8.6.7) stores each split's partial tile as an update, so
a reduce-scatter's trigger counts include every partial (:attr:`OutputConfig.partials`); the DMAs
still send each reduced tile once.

All-gather (:func:`ring_all_gather_config`, :func:`direct_all_gather_config`): the output address space
holds one chunk per rank, each rank's GEMM produces only its own, and every store is a plain write.  In
a ring the own chunk is sent to the next GPU as it is stored; a chunk that arrives is counted by the
tracker (one store per element) and forwarded tile by tile by DMA until it has gone round.  On a fully
connected node the own chunk is stored into every peer at once.

All-to-all (:func:`direct_all_to_all_config`, dissertation section 8.6.1): chunk ``j`` of each rank's
GEMM output is rank ``j``'s; it is stored straight into that rank's memory and not written locally, so
the space it leaves holds what rank ``j`` sends back: rank ``r``'s chunk ``j`` lands in rank ``j``'s
chunk ``r``.

GEMM outputs are uncached (they bypass the L2).  Remote stores are posted: a workgroup hands them to
its GPU's link interface and finishes; they leave as fast as the link and its flow control allow.

Each rank's driver programs its tracker when the rank reaches the op, and a rank stores or DMAs into a
peer's output only once the peer has done so (an ``armed`` flag at the peer, ``collectives.sync_ns``
after it): updates that arrived before the peer's tracker counted them would never be counted, and
the peer may still be using the buffer for an earlier op.  The destination address is the peer's own
output buffer (ranks' allocations need not coincide).  Ranks that start together never wait for it:
a GEMM tile takes longer than the flag.

Symmetric mode simulates one GPU and delivers what it sends to any rank back to itself.  What rank
``r`` sends to rank ``d`` stands for what rank ``r - (d - r)`` sends to ``r``, whose chunks are
shifted by ``d - r`` positions; addresses of remote stores and DMAs are translated by that shift so
that the mirrored traffic lands on the tiles the simulated GPU's tracker expects.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from simpy.events import Event

from gpusim.engine.primitives import Countdown, Join
from gpusim.engine.simulation import Span
from gpusim.errors import OpError
from gpusim.hw.dma import DmaCommand
from gpusim.hw.hbm import UPDATE, WRITE
from gpusim.hw.request import COMPUTE
from gpusim.hw.tracker import TrackedRegion
from gpusim.kernels.collectives import Flags, ring_orders
from gpusim.kernels.gemm import (
    GemmKernel,
    check_fits,
    execute_gemm,
    find_spec,
    for_operands,
    grouped_order,
    padded_k,
    pipelined,
    problem_of,
    tiles,
)
from gpusim.kernels.gemm_selection import select_kernel

REMOTE = "remote"
"""``remote_map``: fine-grained remote stores/updates straight into a peer's memory."""
DMA = "dma"
"""``dma_map``: written locally, tracked, then DMA'd to a peer."""
FINAL = "final"
"""Tracked; the rank's own result (written locally when the rank produces it)."""
SEND = "send"
"""Written locally and stored into peers' memory at once (an all-gather's own shard)."""


@dataclass(frozen=True)
class ChunkMapping:
    """One line of a rank's output address-space configuration.

    Attributes
    ----------
    chunk
        Chunk index (chunk ``c`` is tiles ``[c q, (c + 1) q)`` of C in tile order).
    step
        When this rank produces the chunk (0 first).
    kind
        :data:`REMOTE`, :data:`DMA`, :data:`FINAL` or :data:`SEND`.
    dsts
        Ranks whose memory receives the chunk (none for :data:`FINAL`; every peer for a direct
        all-gather's own shard).
    operation
        ``"update"`` (near-memory op-and-store) or ``"write"`` (a plain store), locally and at the
        destinations.
    updates_per_element
        The tracker's trigger count for :data:`DMA` and :data:`FINAL` chunks: updates or stores each
        element receives (the local stores, one per K split of the GEMM, if the rank produces the
        chunk, plus those arriving from peers).
    produced
        Whether this rank's GEMM produces the chunk (an all-gather's other chunks only arrive).
    lands_at
        The chunk of the destinations' address space it lands in (``None``: the same chunk; an
        all-to-all's chunk lands at the sender's place).
    receives
        Whether the chunk's local space, left free by a :data:`REMOTE` chunk, holds this rank's
        result arriving from a peer (an all-to-all); it is tracked and final like a :data:`FINAL`
        chunk.
    """

    chunk: int
    step: int
    kind: str
    dsts: tuple[int, ...] = ()
    operation: str = UPDATE
    updates_per_element: int = 1
    produced: bool = True
    lands_at: int | None = None
    receives: bool = False

    @property
    def final(self) -> bool:
        """Whether this rank's tracker completes the chunk as its own result."""
        return self.kind == FINAL or self.receives


@dataclass(frozen=True)
class OutputConfig:
    """A rank's output address-space configuration for a fused GEMM and collective.

    Attributes
    ----------
    rank
        The rank it programs.
    members
        The ranks of the collective in algorithm order (ring order, or the group).
    mappings
        One :class:`ChunkMapping` per chunk, indexed by chunk.
    partials
        Stores the GEMM makes to each of its output tiles: its K splits, each a partial tile that
        near-memory updates add (dissertation section 8.6.7; 1 for whole tiles).
    """

    rank: int
    members: tuple[int, ...]
    mappings: tuple[ChunkMapping, ...]
    partials: int = 1

    @property
    def production_order(self) -> list[int]:
        """Chunks in the order this rank's workgroups produce them (staggered)."""
        return [m.chunk for m in sorted(self.mappings, key=lambda m: m.step) if m.produced]


def ring_reduce_scatter_config(ring: list[int], rank: int, partials: int = 1) -> OutputConfig:
    """Ring reduce-scatter: ``rank`` ends with chunk ``ring.index(rank)``, reduced over the ring.

    Parameters
    ----------
    ring
        Ranks in ring order; each sends to the next.
    rank
        The rank to configure.
    partials
        The GEMM's stores per output tile (its K splits).  A chunk's elements expect the local
        partials plus what arrives: the previous rank's remote partials in step 1, one DMA update
        later (two updates per element with whole tiles).
    """
    n = len(ring)
    position = ring.index(rank)
    nxt = ring[(position + 1) % n]
    mappings: list[ChunkMapping | None] = [None] * n
    for step in range(n):
        chunk = (position - step - 1) % n
        expected = partials + (partials if step == 1 else 1)
        if step == 0:
            mapping = ChunkMapping(chunk, step, REMOTE, (nxt,), UPDATE, 1)
        elif step < n - 1:
            mapping = ChunkMapping(chunk, step, DMA, (nxt,), UPDATE, expected)
        else:
            mapping = ChunkMapping(chunk, step, FINAL, (), UPDATE, expected)
        mappings[chunk] = mapping
    return OutputConfig(rank, tuple(ring), tuple(mappings), partials)


def _successor_first(group: list[int], rank: int, own: Callable[[int, int], ChunkMapping],
                     other: Callable[[int, int], ChunkMapping]) -> OutputConfig:
    """A direct program: ``rank`` produces the others' chunks first, starting with its successor's
    (so that the ranks load different links at once), and its own chunk last; ``own(chunk, step)``
    and ``other(chunk, step)`` make the lines."""
    n = len(group)
    position = group.index(rank)
    mappings: list[ChunkMapping | None] = [None] * n
    for step in range(n):
        chunk = (position + step + 1) % n
        mappings[chunk] = own(chunk, step) if chunk == position else other(chunk, step)
    return OutputConfig(rank, tuple(group), tuple(mappings))


def direct_reduce_scatter_config(group: list[int], rank: int, partials: int = 1) -> OutputConfig:
    """Direct reduce-scatter (fully connected): every chunk goes straight to its owner, the
    successor's first (:func:`_successor_first`); the own chunk expects ``partials`` updates per
    element (the GEMM's K splits) from every rank."""
    config = _successor_first(group, rank,
                              lambda chunk, step: ChunkMapping(chunk, step, FINAL, (), UPDATE, len(group) * partials),
                              lambda chunk, step: ChunkMapping(chunk, step, REMOTE, (group[chunk],), UPDATE, 1))
    return replace(config, partials=partials)


def ring_all_gather_config(ring: list[int], rank: int) -> OutputConfig:
    """Ring all-gather: chunk ``q`` is the shard of the rank at ring position ``q``; every rank ends
    with all of them.

    ``rank`` produces its own chunk, writes it locally and stores it into the next rank's copy of
    that chunk as it goes.  The chunk of the rank ``h`` positions back arrives after ``h`` hops
    (its ``step``); once the tracker has counted one store per element of a tile, a pre-programmed
    DMA forwards the tile to the next rank.  The next rank's chunk has then gone round the ring:
    here it is final.
    """
    n = len(ring)
    position = ring.index(rank)
    nxt = ring[(position + 1) % n]
    mappings = []
    for chunk in range(n):
        hops = (position - chunk) % n
        if hops == 0:
            mappings.append(ChunkMapping(chunk, 0, SEND, (nxt,), WRITE, 1))
        elif hops < n - 1:
            mappings.append(ChunkMapping(chunk, hops, DMA, (nxt,), WRITE, 1, produced=False))
        else:
            mappings.append(ChunkMapping(chunk, hops, FINAL, (), WRITE, 1, produced=False))
    return OutputConfig(rank, tuple(ring), tuple(mappings))


def direct_all_gather_config(group: list[int], rank: int) -> OutputConfig:
    """Direct all-gather (fully connected): ``rank`` stores its own chunk into every peer's copy of
    it at once (successor first, so that the ranks load different links); every other chunk arrives
    from its owner in one hop and is final."""
    n = len(group)
    position = group.index(rank)
    peers = tuple(group[(position + step) % n] for step in range(1, n))
    mappings = [ChunkMapping(chunk, 0, SEND, peers, WRITE, 1) if chunk == position
                else ChunkMapping(chunk, 1, FINAL, (), WRITE, 1, produced=False) for chunk in range(n)]
    return OutputConfig(rank, tuple(group), tuple(mappings))


def direct_all_to_all_config(group: list[int], rank: int) -> OutputConfig:
    """Direct all-to-all (fully connected): chunk ``j`` goes to rank ``j`` and lands at this rank's
    place; the space it leaves receives rank ``j``'s chunk for this rank.  The others' chunks are
    produced successor first (:func:`_successor_first`); the own chunk, written locally, last."""
    position = group.index(rank)
    return _successor_first(group, rank, lambda chunk, step: ChunkMapping(chunk, step, FINAL, (), WRITE, 1),
                            lambda chunk, step: ChunkMapping(chunk, step, REMOTE, (group[chunk],), WRITE, 1,
                                                             lands_at=position, receives=True))


class ChunkLayout:
    """The tiles of C and their chunks.

    The GEMM produces its tiles in its dispatch (rasterization) order; chunk ``c`` is the ``c``-th
    of ``chunks`` equal segments of that order, so a chunk is what the GEMM produces in one ring
    step and keeps the kernel's L2 locality.  A chunk need not be contiguous in memory: the
    tracker and the DMAs work per tile.  Positions past the last tile (when the tile count is not a
    multiple of ``chunks``) stand for padding tiles after the last real one.

    Parameters
    ----------
    tile_bytes
        Address stride of a tile.
    valid_bytes
        Bytes each tile really holds (edge tiles are partial), by tile index.
    chunks
        Number of chunks (ranks).
    order
        The GEMM's dispatch order of the tiles (default: index order).
    """

    def __init__(self, tile_bytes: int, valid_bytes: list[int], chunks: int, order: list[int] | None = None):
        self.tile_bytes = tile_bytes
        self.valid = valid_bytes
        self.tiles = len(valid_bytes)
        self.chunks = chunks
        self.per_chunk = math.ceil(self.tiles / chunks)
        self.order = list(range(self.tiles)) if order is None else list(order)
        if sorted(self.order) != list(range(self.tiles)):
            raise ValueError("a chunk layout's order must list every tile once")
        self.order += range(self.tiles, self.padded_tiles)
        self.position = [0] * self.padded_tiles
        for position, tile in enumerate(self.order):
            self.position[tile] = position

    @property
    def padded_tiles(self) -> int:
        """Tiles of address space: every chunk ``per_chunk`` tiles long."""
        return self.per_chunk * self.chunks

    def chunk_of(self, tile: int) -> int:
        """Chunk of ``tile``."""
        return self.position[tile] // self.per_chunk

    def places_of(self, chunk: int) -> list[int]:
        """Every tile of ``chunk``'s address space in production order, padding included."""
        return self.order[chunk * self.per_chunk:(chunk + 1) * self.per_chunk]

    def tiles_of(self, chunk: int) -> list[int]:
        """The real tiles of ``chunk`` in production order (the last chunks may have fewer, or none)."""
        return [tile for tile in self.places_of(chunk) if tile < self.tiles]

    def shifted(self, tile: int, shift: int) -> int:
        """The tile at the same place of the chunk ``shift`` chunks earlier (cyclically)."""
        chunk, slot = divmod(self.position[tile], self.per_chunk)
        return self.order[((chunk - shift) % self.chunks) * self.per_chunk + slot]


def workgroup_order(config: OutputConfig, layout: ChunkLayout, stagger: bool) -> list[int]:
    """The GEMM's dispatch order: its own order cut into chunks, taken in this rank's production order
    (its own order unchanged without staggering)."""
    chunks = config.production_order if stagger else range(layout.chunks)
    return [tile for chunk in chunks for tile in layout.tiles_of(chunk)]


class Frame:
    """Where data a rank sends lands: the same address in full mode, shifted chunks in symmetric mode.

    Parameters
    ----------
    config
        The sender's configuration (its ``members`` give positions).
    layout
        Tiles and chunks.
    mirrored
        Whether traffic to other ranks is delivered back to the sender (symmetric mode).
    """

    def __init__(self, config: OutputConfig, layout: ChunkLayout, mirrored: bool):
        self.position = {rank: index for index, rank in enumerate(config.members)}
        self.layout = layout
        self.mirrored = mirrored

    def destination_tile(self, tile: int, src: int, dst: int, lands_at: int | None = None) -> int:
        """Tile index at which ``src``'s ``tile`` lands when sent to ``dst``, in chunk ``lands_at``
        of the destination (``None``: the tile's own chunk), at the same place in the chunk.  In
        symmetric mode it lands where what the rank ``src - (dst - src)`` sends to ``src`` lands."""
        if lands_at is None and not self.mirrored:
            return tile
        chunk = self.layout.chunk_of(tile)
        landing = chunk if lands_at is None else lands_at
        if self.mirrored:
            landing -= self.position[dst] - self.position[src]
        return self.layout.shifted(tile, chunk - landing)


def expected_bytes(
    me: OutputConfig, senders: list[OutputConfig], layout: ChunkLayout, frame: Frame
) -> list[int]:
    """Per tile of the padded address space: the update bytes the tracker of ``me.rank`` must count.

    A tile of a :data:`DMA` or :data:`FINAL` chunk expects its local updates (if ``me`` produces the
    chunk: one per K split of the GEMM) plus every update or store that a sender's :data:`REMOTE`
    (one per K split of the sender's GEMM), :data:`SEND` or :data:`DMA` chunk delivers to it; a tile
    of a chunk that ``receives`` expects what arrives in it (which may include padding places, when
    the sender's chunk has more real tiles); other tiles are not tracked (0).  In full mode every
    tile of a ring reduce-scatter of whole tiles expects twice its bytes: the dissertation's
    threshold of tile size times two updates per element.
    """
    expected = [0] * layout.padded_tiles
    tracked = [False] * layout.padded_tiles
    receiving = [False] * layout.chunks
    for mapping in me.mappings:
        receiving[mapping.chunk] = mapping.receives
        if mapping.kind in (DMA, FINAL):
            for tile in layout.tiles_of(mapping.chunk):
                tracked[tile] = True
                if mapping.produced:
                    expected[tile] += layout.valid[tile] * me.partials
    for sender in senders:
        for mapping in sender.mappings:
            stores = sender.partials if mapping.kind == REMOTE else 1
            for dst in mapping.dsts:
                if not (frame.mirrored or dst == me.rank):
                    continue
                for tile in layout.tiles_of(mapping.chunk):
                    target = frame.destination_tile(tile, sender.rank, dst, mapping.lands_at)
                    if tracked[target] or receiving[layout.chunk_of(target)]:
                        expected[target] += layout.valid[tile] * stores
    return expected


def tile_bytes(problem, spec) -> tuple[int, list[int]]:
    """Address stride of C's tiles and the bytes each tile really holds (edge tiles are partial)."""
    tiles_m, tiles_n = tiles(problem, spec)
    size = problem.dtype_bytes
    valid = []
    for _batch in range(problem.batch):
        for row in range(tiles_m):
            rows = min(spec.tile_m, problem.m - row * spec.tile_m)
            for col in range(tiles_n):
                valid.append(rows * min(spec.tile_n, problem.n - col * spec.tile_n) * size)
    return spec.tile_m * spec.tile_n * size, valid


class PostedWrites:
    """A GPU's posted remote stores to one peer: queued by workgroups, drained onto the link in order
    once the peer's tracker is armed.

    Parameters
    ----------
    ctx
        The op context (rank, machine, simulation).
    dst
        The receiving rank.
    armed
        Succeeds when ``dst`` has programmed its tracker for the op (``None``: it has).
    base
        Returns the address of ``dst``'s output buffer (known once it is armed).
    """

    def __init__(self, ctx, dst: int, armed: Event | None, base: Callable[[], int]):
        self.env = ctx.env
        self.interconnect = ctx.machine.interconnect
        self.src = ctx.rank
        self.dst = dst
        self.armed = armed
        self.base = base
        self.queue: deque[tuple[int, int, str, Callable[[float], None]]] = deque()
        self.draining = False

    def post(self, offset: int, nbytes: int, operation: str, on_arrival: Callable[[float], None]) -> None:
        """Queue an ``operation`` (update or write) of ``nbytes`` at byte ``offset`` of the peer's
        output; ``on_arrival(time_ns)`` once it is accepted there."""
        self.queue.append((offset, nbytes, operation, on_arrival))
        if not self.draining:
            self.draining = True
            self.env.process(self._drain())

    def _drain(self):
        if self.armed is not None and not self.armed.processed:
            yield self.armed
        while self.queue:
            offset, nbytes, operation, on_arrival = self.queue.popleft()
            arrived = Countdown(on_arrival)
            yield from self.interconnect.transfer(self.src, self.dst, self.base() + offset, nbytes, operation, arrived,
                                                  cached=False)
            arrived.close(self.env.now)
        self.draining = False


class DmaFeeder:
    """Hands triggered DMA commands to the GPU's engines, the least loaded first, holding them while every queue is full."""

    def __init__(self, engines):
        self.engines = engines
        self.held: deque[DmaCommand] = deque()

    def submit(self, command: DmaCommand) -> None:
        """Start ``command`` on an engine with room, or hold it."""
        engine = min(self.engines, key=lambda e: e.backlog)
        if engine.backlog >= engine.config.queue_entries:
            self.held.append(command)
        else:
            engine.submit(command)

    def slot_freed(self) -> None:
        """An engine finished a command: start a held one."""
        if self.held:
            self.submit(self.held.popleft())


def gemm_spec(ctx, op, problem, cus: int | None = None, whole_tiles: bool = False):
    """The kernel of one of ``op``'s GEMMs: ``op``'s named kernel, else the library's choice for
    ``cus`` CUs (default: the stream's; ``gpu.gemm_selection``), as the GPU runs it on the operands (:func:`for_operands`,
    :func:`pipelined`).  ``whole_tiles``: the output tiles must leave the workgroups whole, as where
    a fused GEMM's plain stores drive its collective (an all-gather or all-to-all: the partial tiles
    of a K split cannot be added there); the heuristic's choice then drops its K split, and a named
    split-K kernel is an error."""
    if op.kernel is not None:
        spec = find_spec(op.kernel)
        if whole_tiles and spec.split_k > 1:
            raise OpError(f"{op.label}: field 'kernel': its stores are plain writes that cannot add K splits' "
                          f"partial tiles, so it needs whole output tiles, not split-K ({op.kernel})")
    else:
        spec = select_kernel(problem, ctx.gpu.config, ctx.cus if cus is None else cus)
        if whole_tiles:
            spec = spec.with_split(1)
    spec = pipelined(for_operands(spec, problem, ctx.gpu.config), ctx.gpu.config, op.dtype)
    check_fits(spec, op.dtype, ctx.gpu.config, op.label, named=op.kernel is not None)
    return spec


CONFIGURATIONS = {
    ("reducescatter", "ring"): ring_reduce_scatter_config,
    ("reducescatter", "direct"): direct_reduce_scatter_config,
    ("allgather", "ring"): ring_all_gather_config,
    ("allgather", "direct"): direct_all_gather_config,
    ("alltoall", "direct"): direct_all_to_all_config,
}
"""The pre-programmed output configuration of each collective and algorithm."""
STEP_LABELS = {"reducescatter": "rs", "allgather": "ag", "alltoall": "a2a"}
"""Short name of each fused collective, in kernel names, implementations and step spans."""
COLLECTIVE_NAMES = {"reducescatter": "reduce-scatter", "allgather": "all-gather", "alltoall": "all-to-all"}
"""Each fused collective's name in errors."""


def _configure(op, members: list[int], rank: int, partials: int) -> OutputConfig:
    """``rank``'s configuration for ``op``, whose GEMM stores ``partials`` partial tiles per tile (K
    splits; a reduce-scatter only)."""
    make = CONFIGURATIONS[(op.collective, op_algorithm(op))]
    return make(members, rank, partials) if op.collective == "reducescatter" else make(members, rank)


def op_algorithm(op) -> str:
    """The collective algorithm of a fused op (``auto`` is ring, or direct for an all-to-all)."""
    if op.algorithm == "auto":
        return "direct" if op.collective == "alltoall" else "ring"
    return op.algorithm


class FusedRank:
    """One rank's side of a fused GEMM -> collective: its programmed output, tracker region and traffic.

    Parameters
    ----------
    ctx
        The op context of the rank.
    op
        The :class:`gpusim.ops.GemmReduceScatter`, :class:`gpusim.ops.GemmAllGather` or
        :class:`gpusim.ops.GemmAllToAll`.
    config
        This rank's output address-space configuration.
    senders
        Configurations of the ranks whose traffic reaches this rank's memory (itself, in symmetric mode).
    layout
        Tiles and chunks of the output address space.
    c, spill
        The output (uncached) and the tracker's spill area on this rank.
    first_tile
        The tile of ``layout`` at which the GEMM's own C starts (0 when the GEMM produces every
        chunk; an all-gather's GEMM produces only its rank's chunk).
    """

    def __init__(self, ctx, op, config: OutputConfig, senders: list[OutputConfig], layout: ChunkLayout, c, spill,
                 first_tile: int = 0):
        self.ctx = ctx
        self.env = ctx.env
        self.gpu = ctx.gpu
        self.config = config
        self.layout = layout
        self.c = c
        self.first_tile = first_tile
        self.step_label = f"{STEP_LABELS[op.collective]} step"
        self.frame = Frame(config, layout, ctx.machine.mode == "symmetric")
        thresholds = expected_bytes(config, senders, layout, self.frame)
        self.outgoing = Join(self.env)  # a part per tile and peer it goes to: done when the peer has accepted it
        self.final = Join(self.env)  # a part per tracked tile of this rank's result: done when it is complete
        for mapping in config.mappings:
            stores = config.partials if mapping.kind == REMOTE else 1  # each K split's partial goes out
            self.outgoing.add(len(layout.tiles_of(mapping.chunk)) * len(mapping.dsts) * stores)
            if mapping.final:
                self.final.add(sum(1 for tile in layout.places_of(mapping.chunk) if thresholds[tile] > 0))
        self.region = TrackedRegion(f"{op.label}#{op.uid}", c.addr, layout.tile_bytes, thresholds, self.ready,
                                    spill.addr)
        self.posted: dict[int, PostedWrites] = {}
        self.feeder = DmaFeeder(self.gpu.dma)
        self.chunk_times: dict[int, list[float]] = {}
        self.counters = ctx.sim.recorder.counters
        self.prefix = f"gpu{self.gpu.index}."
        self.mca = self.gpu.arbiter.mca
        shared = ctx.shared()
        self.flags: Flags = shared.setdefault("flags", Flags(ctx))
        self.bases: dict[int, int] = shared.setdefault("bases", {})  # output buffer per GPU, once armed
        self.handshake = ctx.machine.mode == "full"  # mirrored ranks arm together by construction

    def _armed(self, dst: int) -> Event | None:
        """The flag raised when ``dst`` has programmed its tracker for this op; ``None`` once it is
        processed, or where no rank waits for it."""
        if not self.handshake:
            return None
        event = self.flags.event("armed", dst)
        return None if event.processed else event

    def _base(self, dst: int) -> int:
        """Address of ``dst``'s output buffer (``dst`` is armed)."""
        return self.bases[self.ctx.machine.gpu(dst).index]

    def _when_armed(self, dst: int, action: Callable[[int], None]) -> None:
        """Call ``action(base)`` with ``dst``'s output address now, or once ``dst`` is armed."""
        armed = self._armed(dst)
        if armed is None:
            action(self._base(dst))
        else:
            armed.callbacks.append(lambda _event: action(self._base(dst)))

    def _mark(self, chunk: int, time_ns: float) -> None:
        span = self.chunk_times.setdefault(chunk, [time_ns, time_ns])
        span[0] = min(span[0], time_ns)
        span[1] = max(span[1], time_ns)

    def _delivered(self, chunk: int) -> Callable[[float], None]:
        def done(time_ns: float) -> None:
            self._mark(chunk, time_ns)
            self.outgoing.done_at(time_ns)

        return done

    def store(self, wg: int, offset: int, nbytes: int, join: Join) -> None:
        """The GEMM's tile store, as the output configuration maps it (the kernel's ``store`` hook)."""
        if self.mca is not None and self.mca.observing:
            self.mca.choose()  # the first, isolated stage is over
        layout = self.layout
        tile = self.first_tile + offset // layout.tile_bytes
        mapping = self.config.mappings[layout.chunk_of(tile)]
        self._mark(mapping.chunk, self.env.now)
        if mapping.kind in (REMOTE, SEND):
            for dst in mapping.dsts:
                writer = self.posted.get(dst)
                if writer is None:
                    writer = self.posted[dst] = PostedWrites(self.ctx, dst, self._armed(dst),
                                                             lambda dst=dst: self._base(dst))
                target = self.frame.destination_tile(tile, self.ctx.rank, dst, mapping.lands_at)
                writer.post(target * layout.tile_bytes, nbytes, mapping.operation, self._delivered(mapping.chunk))
                self.counters[self.prefix + "t3_remote_bytes"] += nbytes
        if mapping.kind != REMOTE:
            self.gpu.memory.write(self.c.addr + tile * layout.tile_bytes, nbytes, join, COMPUTE, cached=False,
                                  kind=mapping.operation)

    def ready(self, tile: int, now: float) -> None:
        """The tracker's trigger: a tile has received every update it expects."""
        layout = self.layout
        mapping = self.config.mappings[layout.chunk_of(tile)]
        self._mark(mapping.chunk, now)
        if mapping.final:
            self.final.done_at(now)
            return
        nbytes = layout.valid[tile]
        delivered = self._delivered(mapping.chunk)

        def finished(time_ns: float) -> None:
            delivered(time_ns)
            self.feeder.slot_freed()

        for dst in mapping.dsts:
            offset = self.frame.destination_tile(tile, self.ctx.rank, dst, mapping.lands_at) * layout.tile_bytes
            self.counters[self.prefix + "t3_dma_bytes"] += nbytes

            def send(base: int, dst: int = dst, offset: int = offset) -> None:
                self.feeder.submit(DmaCommand(self.c.addr + tile * layout.tile_bytes, nbytes, dst, base + offset,
                                              mapping.operation, src_cached=False, dst_cached=False, on_done=finished,
                                              label=f"t3 chunk {mapping.chunk}", setup_ns=0.0))

            self._when_armed(dst, send)

    def run(self, kernel: GemmKernel):
        """Program the tracker, run the GEMM, wait for the collective (a generator on the op's stream,
        which may move on once the GEMM has ended: :meth:`gpusim.sched.executor.OpContext.release_stream`)."""
        tracker = self.gpu.tracker
        tracker.program(self.region)
        self.bases[self.gpu.index] = self.c.addr
        self.flags.raise_at("armed", self.ctx.rank, self.env.now)
        if self.mca is not None:
            self.mca.observe()
        yield from self.ctx.launch(kernel.kernel)
        if self.mca is not None:
            self.mca.release()  # kernel boundary: drain communication without a limit
        self.ctx.release_stream()  # the rest is DMA and near-memory updates: no CU, no stream slot
        yield self.outgoing.close()
        yield self.final.close()
        tracker.release(self.region)
        tracker.report(self.counters, self.prefix)
        for mapping in self.config.mappings:
            if mapping.chunk in self.chunk_times:
                start, end = self.chunk_times[mapping.chunk]
                target = f" -> {', '.join(f'gpu{dst}' for dst in mapping.dsts)}" if mapping.dsts else ""
                self.ctx.sim.recorder.span(
                    Span(f"{self.step_label} {mapping.step}: chunk {mapping.chunk} {mapping.kind}{target}",
                         self.step_label, self.ctx.rank, self.ctx.stream.name, start, end,
                         {"chunk": mapping.chunk, "kind": mapping.kind})
                )


def execute_fused_gemm(ctx, op):
    """Run a :class:`gpusim.ops.GemmReduceScatter`, :class:`gpusim.ops.GemmAllGather` or
    :class:`gpusim.ops.GemmAllToAll` on ``ctx``'s rank (a generator on the op's stream)."""
    group = ctx.group
    if ctx.rank not in group:
        return
    gpu = ctx.gpu
    machine = ctx.machine
    n = len(group)
    problem = problem_of(op)
    reduces = op.collective == "reducescatter"
    spec = gemm_spec(ctx, op, problem, whole_tiles=not reduces)  # K splits' partials are reduced as updates
    if n == 1:  # nothing to send: the GEMM alone
        yield from execute_gemm(ctx, op, spec)
        return
    if reduces and not gpu.config.nmc.enabled:
        raise OpError(f"{op.label}: T3 reduces with near-memory op-and-store updates, which {gpu.config.name} "
                      f"lacks (gpu.nmc.enabled); run ops.Gemm and ops.ReduceScatter instead")
    algorithm = op_algorithm(op)
    if algorithm == "ring":
        members = ring_orders(ctx, group, 1)[0]
    else:
        members = list(group)
        neighbours = set(machine.topology.neighbours(ctx.rank))
        if any(other != ctx.rank and other not in neighbours for other in group):
            raise OpError(f"{op.label}: direct {COLLECTIVE_NAMES[op.collective]} needs a direct link from every GPU to every other")
    mirrored = machine.mode == "symmetric"
    gather = op.collective == "allgather"
    stagger = getattr(op, "stagger", True)  # only a reduce-scatter may leave its GPUs unstaggered
    if mirrored and not stagger:
        raise OpError(
            f"{op.label}: without staggering the GPUs do different work in their own frames "
            f"(each produces chunk 0 first), so symmetric mode cannot stand for them; use mode='full'"
        )
    me = _configure(op, members, ctx.rank, spec.split_k)
    senders = [me] if mirrored else [_configure(op, members, r, spec.split_k) for r in members if r != ctx.rank]

    size = problem.dtype_bytes
    tiles_m, tiles_n = tiles(problem, spec)
    k_extent = padded_k(problem, spec) * spec.split_k
    a = ctx.tensor(op.a, problem.batch * tiles_m * spec.tile_m * k_extent * size)
    b = ctx.tensor(op.b, problem.batch * tiles_n * spec.tile_n * k_extent * size)
    stride, valid = tile_bytes(problem, spec)
    order = grouped_order(tiles_m, tiles_n, problem.batch)
    if gather:  # one chunk per rank, each the whole output of that rank's GEMM
        layout = ChunkLayout(stride, valid * n, n)
        first_tile = members.index(ctx.rank) * len(valid)
        wg_order = order
    else:  # one GEMM output, cut into a chunk per rank
        layout = ChunkLayout(stride, valid, n, order)
        first_tile = 0
        wg_order = [tile * spec.split_k + split for tile in workgroup_order(me, layout, stagger)
                    for split in range(spec.split_k)]
    out = replace(ctx.tensor(op.out, layout.padded_tiles * stride), cached=False)
    c = replace(out, addr=out.addr + first_tile * stride, nbytes=len(valid) * stride)
    spill = ctx.tensor(None, layout.padded_tiles * int(gpu.config.tracker.entry_bytes), cached=False)
    rank = FusedRank(ctx, op, me, senders, layout, out, spill, first_tile)
    label = STEP_LABELS[op.collective]
    kernel = GemmKernel(gpu, problem, spec, a, b, c, store=rank.store, wg_order=wg_order,
                        name=f"gemm_{label}_{spec.name}", partials_in_place=reduces)
    yield from rank.run(kernel)
    ctx.info.update(impl=f"t3_{algorithm}_{label}_{spec.name}", flops=problem.flops, bytes=op.nbytes,
                    workgroups=kernel.kernel.num_wgs, chunks=n)
    if rank.mca is not None and rank.mca.chosen:
        intensity, threshold = rank.mca.chosen[-1]
        ctx.info.update(mca_intensity=intensity, mca_threshold=threshold if threshold is not None else 1.0)
