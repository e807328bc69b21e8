"""Collectives as today's libraries run them, on the same memory and link models as compute.

**CU-driven** (NCCL/RCCL): on every rank a kernel of ``channels`` workgroups, one per CU.  Each
workgroup owns a slice of every chunk and walks the algorithm's steps; per step and slice it waits
for the flag that says its neighbour's data has arrived, reads the received copy and/or its local
copy (through the L2), reduces on the CU, and stores the result straight into the next rank's
memory (remote stores over the links).  Received data lands in a double-buffered staging area;
a sender waits for the receiver's acknowledgement before it reuses a staging slot.

**DMA-driven**: the ranks' DMA engines move the chunks; reductions are near-memory op-and-store
updates at the destination (needs ``nmc.enabled``).  No CU is used.

Algorithms: ``ring`` (reduce-scatter, all-gather, all-reduce = both fused as in NCCL), ``direct``
(every rank writes to every other over its own links; all-to-all always), ``hierarchical``
(reduce-scatter inside each node, all-reduce across nodes between GPUs of the same local index,
all-gather inside each node).  Across several nodes the ring variant uses one ring per channel,
each leaving a node through a different GPU's NIC, as NCCL does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from simpy.events import Event

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.engine.primitives import Countdown, Join, succeed_at
from gpusim.errors import OpError
from gpusim.hw.compute import ComputeUnit, InflightLimit, Kernel, WorkgroupShape
from gpusim.hw.dma import DmaCommand
from gpusim.hw.gpu import Buffer
from gpusim.hw.hbm import UPDATE, WRITE
from gpusim.hw.request import COMM

MIN_CHANNEL_BYTES = 65536
"""A channel (CU) gets at least this much of a chunk; small collectives use fewer channels."""
COLLECTIVE_SHAPE = WorkgroupShape(threads=256, lds_bytes=0, registers_per_thread=64)


@dataclass(frozen=True)
class Step:
    """One step of a ring program for one rank.

    Attributes
    ----------
    index
        Global step number (flags are keyed by it).
    chunk
        Chunk the step works on.
    recv
        Where received data for this step sits: ``"stage"`` (reduce later), ``"out"`` (final
        position) or ``None`` (nothing received).
    read_local
        Whether the local input chunk is read (to reduce or to send).
    reduce
        Whether received and local data are added on the CU.
    send
        Where the result goes on the next rank: ``"stage"``, ``"out"`` or ``None``.
    write_out
        Whether the result is written to the local output.
    forward_from_out
        Whether the data sent is read from the local output (all-gather forwarding).
    """

    index: int
    chunk: int
    recv: str | None
    read_local: bool
    reduce: bool
    send: str | None
    write_out: bool
    forward_from_out: bool = False


@functools.cache
def ring_program(kind: str, position: int, n: int) -> tuple[Step, ...]:
    """The steps of ring reduce-scatter (``rs``), all-gather (``ag``) or all-reduce (``ar``) at ``position``
    (computed once: every workgroup of every rank walks them)."""
    steps: list[Step] = []
    if kind in ("rs", "ar"):
        for k in range(n):
            chunk = (position - k - 1) % n
            first, last = k == 0, k == n - 1
            if last:
                send = "out" if kind == "ar" else None
                steps.append(Step(k, chunk, "stage", True, True, send, True))
            else:
                steps.append(Step(k, chunk, None if first else "stage", True, not first, "stage", False))
    if kind in ("ag", "ar"):
        offset = n - 1 if kind == "ar" else 0
        start = 1 if kind == "ar" else 0
        for j in range(start, n):
            chunk = (position - j) % n
            if j == 0:
                steps.append(Step(offset + j, chunk, None, False, False, "out", False, True))
            elif j == n - 1:
                steps.append(Step(offset + j, chunk, "out", False, False, None, False))
            else:
                steps.append(Step(offset + j, chunk, "out", False, False, "out", False, True))
    return tuple(steps)


def ring_orders(ctx, group: list[int], channels: int) -> list[list[int]]:
    """One ring (an order of ``group``) per channel.

    Inside one node the channels' rings spread over the direct links (several rings on fully
    connected and hybrid cube-mesh nodes, see :meth:`Topology.rings`); across nodes each channel's
    ring leaves every node through a different local GPU, so the channels spread over all NICs.
    """
    topology = ctx.machine.topology
    per_node = ctx.config.num_gpus
    nodes: dict[int, list[int]] = {}
    for rank in group:
        nodes.setdefault(topology.node_of(rank), []).append(rank)
    if len(nodes) == 1:
        return topology.rings(group, channels)
    local_order = topology.ring_order
    rings = []
    for channel in range(channels):
        ring: list[int] = []
        for node_ranks in nodes.values():
            ordered = sorted(node_ranks, key=lambda r: local_order.index(r % per_node))
            if len(nodes) > 1:
                shift = (channel + 1) % len(ordered)
                ordered = ordered[shift:] + ordered[:shift]
            ring.extend(ordered)
        rings.append(ring)
    return rings


class Flags:
    """Arrival and acknowledgement flags of one collective, shared by all ranks taking part.

    Flags are keyed by the rank whose memory they live in; in symmetric mode every rank maps to
    the simulated GPU, so a flag raised "at rank 1" is the one rank 0 waits for.
    """

    def __init__(self, ctx, sync_ns: float | None = None):
        self.env = ctx.env
        self.machine = ctx.machine
        self.sync_ns = ctx.config.collectives.sync_ns if sync_ns is None else sync_ns
        self.mirrored = ctx.machine.mode == "symmetric"
        self._events: dict[tuple, Event] = {}

    def event(self, what: str, rank: int, *key: int) -> Event:
        """The flag ``what`` at ``rank`` for ``key`` (created on first use)."""
        full = (what, self.machine.gpu(rank).index, *key)
        event = self._events.get(full)
        if event is None:
            event = self._events[full] = Event(self.env)
        return event

    def raise_at(self, what: str, rank: int, time_ns: float, *key: int) -> None:
        """Raise a flag at absolute time ``time_ns`` plus the flag's own latency."""
        event = self.event(what, rank, *key)
        if not event.triggered:
            succeed_at(self.env, event, time_ns + self.sync_ns - self.env.now)

    def arrival_chunk(self, chunk: int, distance: int, n: int, chunk_bytes: int, nbytes: int) -> int:
        """The chunk position at which data sent as ``chunk`` to the rank ``distance`` ahead lands.

        In full mode that is ``chunk``.  In symmetric mode the simulated GPU receives its own
        traffic in the place of what the rank ``distance`` behind sends it, whose chunks are
        ``distance`` positions back, so the data lands there (and the reads that follow find it)
        as long as both chunks are as long; the last, shorter chunk keeps its place.
        """
        if not self.mirrored:
            return chunk
        mirrored = (chunk - distance) % n

        def length(c: int) -> int:
            return max(0, min(chunk_bytes, nbytes - c * chunk_bytes))

        return mirrored if length(mirrored) == length(chunk) else chunk

    def raise_for_empty(self, what: str, rank: int, *key: int) -> None:
        """A piece with no bytes is not sent; in symmetric mode raise its flag anyway.

        Mirrored traffic stands for another rank's piece, which may have bytes when this rank's
        has none (the last chunk of a size that the ranks do not divide), so the simulated GPU
        would otherwise wait for a flag that nobody raises.
        """
        if self.mirrored:
            self.raise_at(what, rank, self.env.now, *key)


def channel_memory(ctx, cu: ComputeUnit) -> ComputeUnit | InflightLimit:
    """What bounds one channel's memory traffic: the channel's own bytes in flight
    (``collectives.channel_inflight_bytes``, when set) and its CU's."""
    inflight = ctx.config.collectives.channel_inflight_bytes
    if inflight is None:
        return cu
    return InflightLimit(cu, inflight, ctx.gpu.unloaded_memory_latency_ns)


def channels_for(ctx, op, chunk_bytes: int, protocol=None, nbytes: int | None = None) -> int:
    """Channels (CUs) of a collective: the configured number, fewer for small messages."""
    configured = getattr(op, "channels", None) or ctx.config.collectives.cus
    configured = min(configured, ctx.gpu.config.num_cus)
    if protocol is not None and protocol.channel_bytes is not None and nbytes is not None:
        return max(1, min(configured, math.ceil(nbytes / protocol.channel_bytes)))
    return max(1, min(configured, math.ceil(chunk_bytes / MIN_CHANNEL_BYTES)))


class RingKernel:
    """A CU-driven ring collective on one rank.

    Parameters
    ----------
    ctx
        The op context of this rank.
    kind
        ``"rs"``, ``"ag"`` or ``"ar"``.
    group
        Ranks taking part.
    nbytes
        Full array size (input of rs/ar, output of ag).
    inp, out, stage
        This rank's input, output and staging buffers (same addresses on every rank).
    flags
        The collective's shared flags.
    channels
        Workgroups (CUs).
    tag
        Distinguishes several ring phases of one op in the flags.
    wire_efficiency
        Payload fraction of the bytes the protocol moves (received data is inflated by its inverse
        on the links and in the staging buffer).
    local_ready
        ``local_ready(chunk, offset, nbytes)`` is the event after which bytes ``offset`` to
        ``offset + nbytes`` of the local input chunk may be read (a producer that writes it while the
        collective runs); ``None``: the input is complete.  With
        a producer every channel takes the first channel's ring: the producer writes the chunks in
        one order, the one their ring steps need, and a channel on another ring would wait for
        chunks produced late in it.
    one_ring
        Every channel takes the first channel's ring even without a producer (a consumer that reads
        the chunks in the order they arrive: :meth:`pieces`).
    """

    def __init__(self, ctx, kind, group, nbytes, inp, out, stage, flags, channels, tag=0, wire_efficiency=1.0,
                 local_ready: Callable[[int, int, int], Event] | None = None, one_ring: bool = False):
        self.ctx = ctx
        self.gpu = ctx.gpu
        self.env = ctx.env
        self.kind = kind
        self.n = len(group)
        self.nbytes = nbytes
        self.chunk = math.ceil(nbytes / self.n)
        self.inp, self.out, self.stage = inp, out, stage
        self.flags = flags
        self.tag = tag
        if local_ready is None and not one_ring:
            self.rings = ring_orders(ctx, group, channels)
        else:
            self.rings = ring_orders(ctx, group, 1) * channels
        self.channels = channels
        self.wire_efficiency = wire_efficiency
        self.local_ready = local_ready
        self.piece = math.ceil(self.chunk / channels)
        slice_bytes = int(ctx.config.collectives.slice_bytes)
        self.slices = max(1, math.ceil(self.piece / slice_bytes))
        self.slice = math.ceil(self.piece / self.slices)
        self.elem_bytes = DTYPE_BYTES[ctx.op.dtype]
        self.flops_per_ns = self.gpu.vector_flops_per_ns("fp32")
        self.kernel = Kernel(
            name=f"{kind}_ring_{channels}ch",
            num_wgs=channels,
            shape=COLLECTIVE_SHAPE,
            body=self._workgroup,
            info={"impl": f"ring_{kind}", "channels": channels},
        )

    def _range(self, chunk: int, channel: int, slice_index: int) -> tuple[int, int]:
        """Offset within the array and length of one slice of one channel's piece of ``chunk``."""
        start = chunk * self.chunk + channel * self.piece + slice_index * self.slice
        stop = min(
            chunk * self.chunk + min((channel + 1) * self.piece, self.chunk),
            start + self.slice,
            self.nbytes,
        )
        return start, max(0, stop - start)

    def pieces(self, chunk: int) -> list[tuple[int, int]]:
        """The pieces ``(channel, slice)`` of ``chunk`` that have bytes; a piece's arrival flag at a
        rank is ``("data", rank, tag, step, channel, slice)``."""
        return [(c, s) for c in range(self.channels) for s in range(self.slices) if self._range(chunk, c, s)[1] > 0]

    def _stage_addr(self, step_index: int, chunk_offset: int) -> int:
        slot = step_index % 2
        return self.stage.addr + slot * self.chunk + chunk_offset

    def _workgroup(self, channel: int, cu: ComputeUnit):
        env = self.env
        ring = self.rings[channel]
        me = self.ctx.rank
        position = ring.index(me)
        nxt = ring[(position + 1) % self.n]
        memory = self.gpu.memory
        interconnect = self.ctx.machine.interconnect
        flags = self.flags
        tag = self.tag
        pending_writes = Join(env)
        bound = channel_memory(self.ctx, cu)
        stage_sends: set[tuple[int, int]] = set()  # (step index, slice) of the sends into the neighbour's stage
        for step in ring_program(self.kind, position, self.n):
            for s in range(self.slices):
                offset, size = self._range(step.chunk, channel, s)
                if size == 0:
                    if step.recv == "stage":
                        flags.raise_for_empty("ack", me, tag, step.index, channel, s)
                    if step.send is not None:
                        flags.raise_for_empty("data", nxt, tag, step.index + 1, channel, s)
                    continue
                in_chunk = offset - step.chunk * self.chunk
                if step.recv is not None:
                    arrived = flags.event("data", me, tag, step.index, channel, s)
                    if not arrived.processed:
                        yield arrived
                if step.read_local and self.local_ready is not None:
                    produced = self.local_ready(step.chunk, in_chunk, size)
                    if not produced.processed:
                        yield produced
                reads = Join(env)
                moved = 0
                wire = math.ceil(size / self.wire_efficiency)
                if step.recv == "stage" and step.reduce:
                    memory.read(self._stage_addr(step.index, in_chunk), wire, reads, COMM, self.stage.cached)
                    moved += wire
                if step.read_local:
                    memory.read(self.inp.addr + offset, size, reads, COMM, self.inp.cached)
                    moved += size
                if step.forward_from_out:
                    memory.read(self.out.addr + offset, size, reads, COMM, self.out.cached)
                    moved += size
                if step.reduce:
                    elements = size / self.elem_bytes
                    reads.extend_to(cu.compute(env.now, elements, self.flops_per_ns, COLLECTIVE_SHAPE.threads // 64))
                reads.extend_to(bound.memory(env.now, moved + (wire if step.send else 0)))
                yield reads.close()
                if step.recv == "stage":
                    flags.raise_at("ack", me, env.now, tag, step.index, channel, s)
                if step.write_out:
                    memory.write(self.out.addr + offset, size, pending_writes, COMM, self.out.cached)
                if step.send is not None:
                    if step.send == "stage":
                        target = self._stage_addr(step.index + 1, in_chunk)
                        # The slot was last filled two steps ago (for the neighbour's step index - 1),
                        # unless that chunk had no bytes on this channel and slice.
                        if (step.index - 2, s) in stage_sends:
                            freed = flags.event("ack", nxt, tag, step.index - 1, channel, s)
                            if not freed.processed:
                                yield freed
                        stage_sends.add((step.index, s))
                    else:
                        landing = flags.arrival_chunk(step.chunk, 1, self.n, self.chunk, self.nbytes)
                        target = self.out.addr + landing * self.chunk + in_chunk
                    delivered = Countdown(self._arrival(nxt, step.index + 1, channel, s))
                    yield from interconnect.transfer(me, nxt, target, wire, WRITE, delivered)
                    delivered.close(env.now)
        yield pending_writes.close()

    def _arrival(self, rank: int, step_index: int, channel: int, slice_index: int) -> Callable[[float], None]:
        def arrived(time_ns: float) -> None:
            self.flags.raise_at("data", rank, time_ns, self.tag, step_index, channel, slice_index)

        return arrived


class DirectKernel:
    """A CU-driven direct collective: every rank writes to every other rank over its own links.

    ``kind`` is ``"rs"`` (chunk j goes to rank j's staging slot, then rank j reduces all copies),
    ``"ag"`` (rank i's chunk goes to every rank's output), ``"a2a"`` (chunk j to rank j; with
    ``send_bytes``, the uneven pieces of :class:`gpusim.ops.AllToAll`) or ``"ar"`` (``rs`` then ``ag``).
    """

    def __init__(self, ctx, kind, group, nbytes, inp, out, stage, flags, channels, tag=0, send_bytes=None):
        self.ctx = ctx
        self.send_bytes = send_bytes
        self.gpu = ctx.gpu
        self.env = ctx.env
        self.kind = kind
        self.group = group
        self.n = len(group)
        self.nbytes = nbytes
        self.chunk = math.ceil(nbytes / self.n)
        self.inp, self.out, self.stage = inp, out, stage
        self.flags = flags
        self.tag = tag
        self.channels = channels
        self.piece = math.ceil(self.chunk / channels)
        self.elem_bytes = DTYPE_BYTES[ctx.op.dtype]
        self.flops_per_ns = self.gpu.vector_flops_per_ns("fp32")
        self.kernel = Kernel(
            name=f"{kind}_direct_{channels}ch",
            num_wgs=channels,
            shape=COLLECTIVE_SHAPE,
            body=self._workgroup,
            info={"impl": f"direct_{kind}", "channels": channels},
        )

    def _piece(self, chunk: int, channel: int) -> tuple[int, int]:
        start = chunk * self.chunk + channel * self.piece
        stop = min(chunk * self.chunk + min((channel + 1) * self.piece, self.chunk), self.nbytes)
        return start, max(0, stop - start)

    def _scatter(self, bound: ComputeUnit | InflightLimit, channel, phase, source: Buffer,
                 place: Callable[[int, int], tuple[int, int, int]]):
        """Send a piece to every other rank.

        ``bound`` limits the channel's memory traffic (:func:`channel_memory`); ``place(dst_index,
        distance)`` gives this channel's piece for that rank: its offset in ``source``, its size (0:
        nothing is sent) and the address it lands at there.
        """
        env = self.env
        me = self.ctx.rank
        my_index = self.group.index(me)
        interconnect = self.ctx.machine.interconnect
        for step in range(self.n - 1):
            # each channel starts with a different peer, so that the channels load every link at once
            distance = 1 + (channel + step) % (self.n - 1)
            j = (my_index + distance) % self.n
            dst = self.group[j]
            offset, size, target = place(j, distance)
            if size == 0:
                self.flags.raise_for_empty("data", dst, self.tag, phase, distance, channel)
                continue
            reads = Join(env)
            self.gpu.memory.read(source.addr + offset, size, reads, COMM, source.cached)
            reads.extend_to(bound.memory(env.now, 2 * size))
            yield reads.close()
            delivered = Countdown(self._arrival(dst, phase, distance, channel))
            yield from interconnect.transfer(me, dst, target, size, WRITE, delivered)
            delivered.close(env.now)

    def _chunk_place(self, channel: int, chunks: Callable[[int, int], tuple[int, int, bool]]
                     ) -> Callable[[int, int], tuple[int, int, int]]:
        """:meth:`_scatter`'s placement of even chunks: ``chunks(dst_index, my_index)`` gives the
        chunk read here, the chunk position written there, and whether it lands in the
        destination's staging area (slot = distance between the ranks, so mirrored traffic in
        symmetric mode lands in distinct slots)."""
        my_index = self.group.index(self.ctx.rank)

        def place(j: int, distance: int) -> tuple[int, int, int]:
            src_chunk, dst_chunk, staged = chunks(j, my_index)
            offset, size = self._piece(src_chunk, channel)
            within = offset - src_chunk * self.chunk
            if staged:
                return offset, size, self.stage.addr + distance * self.chunk + within
            landing = self.flags.arrival_chunk(dst_chunk, distance, self.n, self.chunk, self.nbytes)
            return offset, size, self.out.addr + landing * self.chunk + within

        return place

    def _uneven_piece(self, nbytes: int, channel: int) -> tuple[int, int]:
        """This channel's slice (start, size) of an uneven all-to-all's ``nbytes`` piece."""
        piece = math.ceil(nbytes / self.channels)
        start = channel * piece
        return start, max(0, min(nbytes, start + piece) - start)

    def _uneven_place(self, channel: int) -> Callable[[int, int], tuple[int, int, int]]:
        """:meth:`_scatter`'s placement of an uneven all-to-all (``send_bytes``): the piece for rank
        ``j`` follows this rank's pieces for the ranks before it, and lands after what the ranks
        before this one send to ``j``."""
        me = self.group.index(self.ctx.rank)
        sends = self.send_bytes[me]

        def place(j: int, distance: int) -> tuple[int, int, int]:
            start, size = self._uneven_piece(sends[j], channel)
            landing = sum(self.send_bytes[i][j] for i in range(me))
            return sum(sends[:j]) + start, size, self.out.addr + landing + start

        return place

    def _gather_wait(self, phase: int, channel: int, sent_bytes: Callable[[int], int]):
        """Wait for this channel's piece from every other rank; ``sent_bytes(sender_index)`` is the
        size of the piece that rank sent here (a piece with no bytes is never sent)."""
        me = self.ctx.rank
        my_index = self.group.index(me)
        for distance in range(1, self.n):
            if sent_bytes((my_index - distance) % self.n) == 0:
                continue
            arrived = self.flags.event("data", me, self.tag, phase, distance, channel)
            if not arrived.processed:
                yield arrived

    def _workgroup(self, channel: int, cu: ComputeUnit):
        env = self.env
        me_index = self.group.index(self.ctx.rank)

        def piece_of(chunk: int) -> int:
            return self._piece(chunk, channel)[1]

        bound = channel_memory(self.ctx, cu)
        if self.kind in ("rs", "ar"):
            yield from self._scatter(bound, channel, 0, self.inp, self._chunk_place(channel, lambda j, me: (j, j, True)))
            yield from self._gather_wait(0, channel, lambda sender: piece_of(me_index))
            offset, size = self._piece(me_index, channel)
            if size:
                within = offset - me_index * self.chunk
                reads = Join(env)
                for distance in range(1, self.n):
                    addr = self.stage.addr + distance * self.chunk + within
                    self.gpu.memory.read(addr, size, reads, COMM, self.stage.cached)
                self.gpu.memory.read(self.inp.addr + offset, size, reads, COMM, self.inp.cached)
                elements = size / self.elem_bytes * (self.n - 1)
                reads.extend_to(cu.compute(env.now, elements, self.flops_per_ns, COLLECTIVE_SHAPE.threads // 64))
                reads.extend_to(bound.memory(env.now, size * (self.n + 1)))
                yield reads.close()
                written = Join(env)
                self.gpu.memory.write(self.out.addr + offset, size, written, COMM, self.out.cached)
                yield written.close()
        if self.kind in ("ag", "ar"):
            yield from self._scatter(bound, channel, 1, self.out, self._chunk_place(channel, lambda j, me: (me, me, False)))
            yield from self._gather_wait(1, channel, piece_of)
        if self.kind == "a2a" and self.send_bytes is not None:
            yield from self._scatter(bound, channel, 0, self.inp, self._uneven_place(channel))
            yield from self._gather_wait(0, channel, lambda sender: self._uneven_piece(
                self.send_bytes[sender][me_index], channel)[1])
        elif self.kind == "a2a":
            yield from self._scatter(bound, channel, 0, self.inp, self._chunk_place(channel, lambda j, me: (j, me, False)))
            yield from self._gather_wait(0, channel, lambda sender: piece_of(me_index))

    def _arrival(self, rank: int, phase: int, distance: int, channel: int) -> Callable[[float], None]:
        def arrived(time_ns: float) -> None:
            self.flags.raise_at("data", rank, time_ns, self.tag, phase, distance, channel)

        return arrived


class DmaPieces:
    """How :func:`dma_ring` cuts an array of ``nbytes`` over ``n`` ranks: a chunk per rank, each
    chunk a part per DMA engine of the GPU, each part slices of at most ``collectives.slice_bytes``.
    A piece ``(p, s)`` is slice ``s`` of engine ``p``'s part; its arrival flag is ``("data", rank,
    tag, step, p, s)``."""

    def __init__(self, ctx, n: int, nbytes: int):
        self.nbytes = nbytes
        self.chunk = math.ceil(nbytes / n)
        self.parts = len(ctx.gpu.dma)
        self.part = math.ceil(self.chunk / self.parts)
        self.slice_bytes = min(self.part, int(ctx.config.collectives.slice_bytes))
        self.slices = math.ceil(self.part / self.slice_bytes)

    def range(self, chunk_index: int, p: int, s: int) -> tuple[int, int]:
        """Offset and length (<= 0: no bytes) of slice ``s`` of engine ``p``'s part of a chunk."""
        start = chunk_index * self.chunk + p * self.part + s * self.slice_bytes
        return start, min(self.slice_bytes, self.part - s * self.slice_bytes, self.nbytes - start,
                          (chunk_index + 1) * self.chunk - start)

    def pieces(self, chunk_index: int) -> list[tuple[int, int]]:
        """The pieces ``(p, s)`` of a chunk that have bytes."""
        return [(p, s) for s in range(self.slices) for p in range(self.parts) if self.range(chunk_index, p, s)[1] > 0]


def dma_ring(ctx, kind: str, group: list[int], nbytes: int, buf: Buffer, flags: Flags, tag: int = 0,
             local_ready: Callable[[int, int, int], Event] | None = None):
    """A DMA-driven ring collective on this rank (a generator).

    Reduce-scatter updates the next rank's copy of each chunk in place with near-memory
    op-and-store (so it needs NMC); all-gather writes chunks into the next rank's buffer.  Each
    step's chunk is split over the GPU's DMA engines, and each engine's part into slices of
    ``collectives.slice_bytes``; a slice is forwarded as soon as the previous rank's update of the
    same slice has arrived (as T3's tracker triggers a DMA when a block's updates are complete),
    so the steps overlap as the CU-driven ring's do instead of each waiting for the whole chunk.
    ``local_ready(chunk, offset, nbytes)``, where given, is the event after which this rank's own
    contribution to bytes ``offset`` to ``offset + nbytes`` of ``chunk`` is in ``buf`` (a producer
    writing it as updates while the ring runs); a step sends none of those bytes before it, and
    sends its slices in the order they become ready.
    """
    gpu = ctx.gpu
    env = ctx.env
    if kind in ("rs", "ar") and not gpu.config.nmc.enabled:
        raise OpError(f"{ctx.op.label}: a DMA-driven reduction needs near-memory op-and-store, which "
                      f"{gpu.config.name} lacks (gpu.nmc.enabled); use driver='cu'")
    n = len(group)
    geometry = DmaPieces(ctx, n, nbytes)
    chunk, slices, parts, piece_range = geometry.chunk, geometry.slices, geometry.parts, geometry.range
    engines = gpu.dma
    ring = ring_orders(ctx, group, 1)[0]
    position = ring.index(ctx.rank)
    nxt = ring[(position + 1) % n]
    me = ctx.rank

    # Reduce-scatter: position q updates chunk q - k - 1 on the next rank, so that it ends owning
    # chunk q; all-gather: it then sends chunk q - j (its own first).
    plan: list[tuple[int, int, str]] = []  # (step index, chunk, update/write)
    if kind in ("rs", "ar"):
        plan += [(k, (position - k - 1) % n, UPDATE) for k in range(n - 1)]
    if kind in ("ag", "ar"):
        base = n - 1 if kind == "ar" else 0
        plan += [(base + j, (position - j) % n, WRITE) for j in range(n - 1)]
    finished = Join(env)
    pieces = [(s, p) for s in range(slices) for p in range(parts)]
    for step_index, chunk_index, op_kind in plan:
        landing_chunk = flags.arrival_chunk(chunk_index, 1, n, chunk, nbytes)
        waits = local_ready is not None and op_kind == UPDATE
        ready: dict[tuple[int, int], Event] = {}
        if waits:  # every rank sends its pieces in the order they are produced, so arrivals follow it
            for s, p in pieces:
                start, size = piece_range(chunk_index, p, s)
                if size > 0:
                    ready[(s, p)] = local_ready(chunk_index, start - chunk_index * chunk, size)
        for s, p in _in_ready_order(pieces, ready, lambda piece, c=chunk_index: sum(piece_range(c, piece[1], piece[0]))):
            engine = engines[p]
            start, size = piece_range(chunk_index, p, s)
            if size <= 0:
                flags.raise_for_empty("data", nxt, tag, step_index + 1, p, s)
                continue
            if waits and not ready[(s, p)].processed:
                yield ready[(s, p)]
            if step_index > 0:
                arrived = flags.event("data", me, tag, step_index, p, s)
                if not arrived.processed:
                    yield arrived
            finished.add()

            def done(time_ns: float, step=step_index, p=p, s=s) -> None:
                flags.raise_at("data", nxt, time_ns, tag, step + 1, p, s)
                finished.done_at(time_ns)

            landing = start - chunk_index * chunk + landing_chunk * chunk
            engine.submit(DmaCommand(buf.addr + start, size, nxt, buf.addr + landing, op_kind, buf.cached, done))
    yield finished.close()
    # The previous rank's last step sends the chunk that this rank's next step would handle.
    last = (plan[-1][0] + 1) if plan else 0
    last_chunk = (position - (n - 1)) % n if kind in ("ag", "ar") else position
    for s in range(slices):
        for p in range(parts):
            if piece_range(last_chunk, p, s)[1] <= 0:
                continue
            arrived = flags.event("data", me, tag, last, p, s)
            if not arrived.processed:
                yield arrived


def _in_ready_order(pieces: list[tuple[int, int]], ready: dict[tuple[int, int], Event],
                    end_of: Callable[[tuple[int, int]], int]) -> list[tuple[int, int]]:
    """``pieces`` (slice, engine) in the order their producer finishes them: grouped by the event they
    wait for in ``ready``, the groups in the order of the bytes they cover (``end_of``), and each group
    in slice-then-engine order, so that every engine keeps busy; pieces without an event first."""
    rank: dict[int, int] = {}
    for piece in sorted(ready, key=end_of):
        rank.setdefault(id(ready[piece]), len(rank))
    return sorted(pieces, key=lambda piece: (rank[id(ready[piece])] if piece in ready else -1, piece))


def ring_bandwidth(topology, rings: list[list[int]]) -> float:
    """Bytes/s the rings can move together: each ring at the share of its bottleneck link that it gets
    when every link (or port, NIC) is divided evenly among the rings crossing it."""
    load: dict[tuple[str, str], int] = {}
    paths = []
    for ring in rings:
        edges = [edge for a, b in zip(ring, ring[1:] + ring[:1]) for edge in topology.route(a, b)]
        paths.append(edges)
        for edge in edges:
            load[edge] = load.get(edge, 0) + 1
    graph = topology.graph
    return sum(min(graph.edges[edge]["bandwidth_bytes_per_s"] / load[edge] for edge in edges) for edges in paths)


def choose_protocol(ctx, op, kind: str, group: list[int]):
    """The protocol a library's tuner picks for a ring collective: least predicted time.

    Predicted time = the protocol's base latency + ring steps x its step latency + the bytes one
    rank sends / (the bandwidth of the protocol's rings x its wire efficiency), as in NCCL's
    cost model.
    """
    protocols = ctx.config.collectives.protocol_list()
    if len(protocols) == 1:
        return protocols[0]
    n = len(group)
    nbytes = op.nbytes
    steps = 2 * (n - 1) if kind == "ar" else n - 1
    sent = steps * math.ceil(nbytes / n)

    def predicted(protocol) -> float:
        channels = channels_for(ctx, op, math.ceil(nbytes / n), protocol, nbytes)
        bandwidth = ring_bandwidth(ctx.machine.topology, ring_orders(ctx, group, channels)) * 1e-9  # bytes/ns
        return protocol.base_latency_ns + steps * protocol.step_latency_ns + sent / (bandwidth * protocol.wire_efficiency)

    return min(protocols, key=predicted)


def simple_protocol(ctx):
    """The configured protocol with full wire efficiency (NCCL's Simple), for non-ring algorithms."""
    protocols = ctx.config.collectives.protocol_list()
    return max(protocols, key=lambda protocol: (protocol.wire_efficiency, -protocol.step_latency_ns))


def _node_groups(ctx, group: list[int]) -> tuple[list[int], list[int]]:
    """This rank's node-local group and its cross-node group (same local index)."""
    topology = ctx.machine.topology
    per_node = ctx.config.num_gpus
    me = ctx.rank
    local = [r for r in group if topology.node_of(r) == topology.node_of(me)]
    cross = [r for r in group if r % per_node == me % per_node]
    return local, cross


def _algorithm(ctx, op, group: list[int]) -> str:
    if op.algorithm != "auto":
        return op.algorithm
    if op.collective == "alltoall":
        return "direct"
    return "ring"


def execute_collective(ctx, op):
    """Run a collective on ``ctx``'s rank (a generator on the op's stream)."""
    group = ctx.group
    if ctx.rank not in group:
        return
    n = len(group)
    send_bytes = getattr(op, "send_bytes", None)
    ctx.info.update(bytes=op.nbytes if send_bytes is None else sum(send_bytes[group.index(ctx.rank)]))
    if n == 1:  # nothing to exchange
        ctx.info.update(impl="none_single_rank")
        return
    kind = {"allreduce": "ar", "reducescatter": "rs", "allgather": "ag", "alltoall": "a2a"}[op.collective]
    algorithm = _algorithm(ctx, op, group)
    shared = ctx.shared()
    chunk = math.ceil(op.nbytes / n) if send_bytes is None else max(1, *(max(row) for row in send_bytes))
    ring_on_cus = algorithm == "ring" and op.driver == "cu" and kind != "a2a"
    protocol = choose_protocol(ctx, op, kind, group) if ring_on_cus else simple_protocol(ctx)
    channels = channels_for(ctx, op, chunk, protocol, op.nbytes)
    flags = shared.setdefault("flags", Flags(ctx, protocol.step_latency_ns))
    if kind == "ag":
        inp = out = ctx.tensor(op.out or op.input, op.nbytes)
    else:
        inp = ctx.tensor(op.input, op.nbytes)
        out = ctx.tensor(op.out, op.nbytes) if op.out is not None or kind != "ar" else inp
    if op.driver == "dma":  # the op allows only the ring (or auto) with DMA, and no all-to-all
        yield ctx.env.timeout(ctx.config.collectives.launch_ns)
        yield from dma_ring(ctx, kind, group, op.nbytes, inp, flags)
        ctx.info.update(impl=f"dma_ring_{kind}")
        return
    set_up = ctx.config.collectives.launch_ns + protocol.base_latency_ns
    if algorithm == "hierarchical":
        yield from _hierarchical(ctx, op, group, inp, out, flags, set_up)
        return
    stage = ctx.tensor(None, chunk * (n if algorithm == "direct" else 2))
    if algorithm == "ring":  # never for all-to-all (the op refuses it, and auto picks direct)
        kernel = RingKernel(ctx, kind, group, op.nbytes, inp, out, stage, flags, channels,
                            wire_efficiency=protocol.wire_efficiency)
    else:
        kernel = DirectKernel(ctx, kind, group, op.nbytes, inp, out, stage, flags, channels, send_bytes=send_bytes)
    yield from ctx.launch(kernel.kernel, latency_ns=set_up)
    ctx.info.update(impl=kernel.kernel.info["impl"], channels=channels, protocol=protocol.name)


def _hierarchical(ctx, op, group, inp, out, flags, set_up):
    """Reduce-scatter inside the node, all-reduce across nodes, all-gather inside the node (all-reduce
    only: the other collectives refuse the algorithm)."""
    local, cross = _node_groups(ctx, group)
    local_chunk = math.ceil(op.nbytes / len(local))
    stage = ctx.tensor(None, local_chunk * 2)
    phases = [("rs", local, op.nbytes), ("ar", cross, local_chunk), ("ag", local, op.nbytes)]
    for tag, (phase, ranks, size) in enumerate(phases):
        if len(ranks) == 1:
            continue
        channels = channels_for(ctx, op, math.ceil(size / len(ranks)))
        cross_stage = ctx.tensor(None, math.ceil(size / len(ranks)) * 2) if phase == "ar" else stage
        kernel = RingKernel(ctx, phase, ranks, size, inp, out, cross_stage, flags, channels, tag=tag)
        yield from ctx.launch(kernel.kernel, latency_ns=set_up)
    ctx.info.update(impl="hierarchical_ar")


def execute_sendrecv(ctx, op):
    """Run a :class:`gpusim.ops.SendRecv` on ``ctx``'s rank: the sender's kernel (or, with
    ``driver="dma"``, its DMA engine) writes the data into the receiver's memory; the receiver waits
    for all of it.  The receiver's ``wait_s`` is how long it waited before the sender began (a
    pipeline's bubble, not communication: :func:`gpusim.trace.breakdown`)."""
    shared = ctx.shared()
    flags = shared.setdefault("flags", Flags(ctx))
    buf = ctx.tensor(op.input if ctx.rank == op.src else op.out, op.nbytes)
    if ctx.machine.mode != "full":
        raise OpError(f"{op.label}: send/recv needs full mode (the two ranks do different work)")
    channels = 1 if op.driver == "dma" else channels_for(ctx, op, op.nbytes)
    if ctx.rank == op.src:
        shared["sending_ns"] = ctx.env.now
        flags.raise_at("sending", op.dst, ctx.env.now)
        if op.driver == "dma":
            finished = Join(ctx.env)
            finished.add()

            def done(time_ns: float) -> None:
                flags.raise_at("data", op.dst, time_ns, 0)
                finished.done_at(time_ns)

            ctx.gpu.dma[0].submit(DmaCommand(buf.addr, op.nbytes, op.dst, buf.addr, WRITE, buf.cached, done, "send"))
            yield finished.close()
            ctx.info.update(impl="dma_copy", bytes=op.nbytes)
            return
        kernel = SendKernel(ctx, op, buf, flags, channels)
        yield from ctx.launch(kernel.kernel, latency_ns=ctx.config.collectives.launch_ns)
        ctx.info.update(impl=kernel.kernel.info["impl"], bytes=op.nbytes, channels=channels)
    elif ctx.rank == op.dst:
        issued = ctx.env.now
        sending = flags.event("sending", op.dst)
        if not sending.processed:
            yield sending
        ctx.info.update(wait_s=max(0.0, shared["sending_ns"] - issued) * 1e-9)
        for channel in range(channels):
            arrived = flags.event("data", op.dst, channel)
            if not arrived.processed:
                yield arrived
        ctx.info.update(impl="dma_copy" if op.driver == "dma" else f"recv_{channels}ch", bytes=op.nbytes)


class SendKernel:
    """NCCL's send on the sender: ``channels`` workgroups, each moving its part of the message slice
    by slice (``collectives.slice_bytes``): it reads a slice, bounded by the channel's bytes in
    flight (:func:`channel_memory`), and writes it over the links into the receiver's memory while
    it reads the next; the receiver's flag for the channel rises when its last slice has landed."""

    def __init__(self, ctx, op, buf: Buffer, flags: Flags, channels: int):
        self.ctx, self.op, self.buf, self.flags = ctx, op, buf, flags
        self.part = math.ceil(op.nbytes / channels)
        self.slice = max(1, int(ctx.config.collectives.slice_bytes))
        self.kernel = Kernel(name=f"send_{channels}ch", num_wgs=channels, shape=COLLECTIVE_SHAPE, body=self._workgroup,
                             info={"impl": f"send_{channels}ch", "channels": channels})

    def _workgroup(self, channel: int, cu: ComputeUnit):
        ctx, op, buf = self.ctx, self.op, self.buf
        env, memory = ctx.env, ctx.gpu.memory
        start = channel * self.part
        stop = min(op.nbytes, start + self.part)
        if stop <= start:
            self.flags.raise_for_empty("data", op.dst, channel)
            return
        bound = channel_memory(ctx, cu)
        delivered = Countdown(lambda time_ns: self.flags.raise_at("data", op.dst, time_ns, channel))
        for offset in range(start, stop, self.slice):
            size = min(self.slice, stop - offset)
            reads = Join(env)
            memory.read(buf.addr + offset, size, reads, COMM, buf.cached)
            reads.extend_to(bound.memory(env.now, 2 * size))
            yield reads.close()
            yield from ctx.machine.interconnect.transfer(ctx.rank, op.dst, buf.addr + offset, size, WRITE, delivered)
        delivered.close(env.now)
