"""T3's tracker: counts updates to producer tiles at the memory controllers and triggers their next step.

The tracker (dissertation section 8.3.2.1) sits beside a GPU's memory controllers.  A fused producer
programs it with *regions* of its output: for every workgroup tile of a region, how many bytes of
updates (local GEMM stores, remote stores, incoming DMA updates) the tile must receive before it is
complete, and what to do then (trigger a pre-programmed DMA, or report the tile as final).  Every
write or update that enters a controller's queue is attributed, by address, to the tiles it covers;
the request that completes a tile's count fires the tile's action at once.

The table is finite: ``sets`` sets indexed by the low bits of the tile (workgroup) index, each
with ``ways`` entries.  An entry is taken by a tile's first update and freed when the tile fires.
When a tile needs an entry and its set is full, the least recently updated entry of the set is
spilled to memory (an ``entry_bytes`` write) and refilled when its tile is next updated (an
``entry_bytes`` read); both are counted, so capacity pressure shows in ``Result.counters``
(``gpuN.tracker_evictions``, ``gpuN.tracker_refills``) and in DRAM traffic.

In hardware the entry is found by the workgroup and wavefront ids that travel with each request; the
simulated GEMM stores each workgroup's tile contiguously, so the address identifies the same tile.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from gpusim.config.gpu import TrackerConfig
from gpusim.hw.hbm import READ, WRITE, AddressMap
from gpusim.hw.request import COMM, MemRequest

_region_ids = itertools.count()


def global_ranges(address_map: AddressMap, channel: int, ch_addr: int, nbytes: int):
    """Yield ``(address, nbytes)``: the GPU addresses of a range of one channel's address space.

    The inverse of :meth:`gpusim.hw.hbm.AddressMap.split` for one piece: consecutive interleave
    units of a channel are ``channels`` units apart in the GPU's address space.
    """
    interleave, channels = address_map.interleave, address_map.channels
    position = ch_addr
    end = ch_addr + nbytes
    while position < end:
        unit, offset = divmod(position, interleave)
        take = min(end - position, interleave - offset)
        yield (unit * channels + channel) * interleave + offset, take
        position += take


@dataclass
class TrackedRegion:
    """A producer output region programmed into a tracker.

    Attributes
    ----------
    name
        For counters and errors.
    base
        Address of tile 0.
    tile_bytes
        Address stride of the tiles (a tile's updates fall in ``[base + i * tile_bytes, ...)``).
    thresholds
        Bytes of updates each tile must receive to be complete; 0 for tiles that are not tracked.
    on_ready
        Called as ``on_ready(tile, now_ns)`` by the update that completes a tile.
    spill_base
        Address of the memory that holds this region's spilled entries (``entry_bytes`` per
        tile), allocated by the producer like its other buffers.
    """

    name: str
    base: int
    tile_bytes: int
    thresholds: list[int]
    on_ready: Callable[[int, float], None]
    spill_base: int = 0
    uid: int = field(default_factory=lambda: next(_region_ids))

    @property
    def end(self) -> int:
        """First address after the region."""
        return self.base + len(self.thresholds) * self.tile_bytes


@dataclass
class TrackerStats:
    """What a tracker did.

    Attributes
    ----------
    tracked_bytes
        Bytes of updates attributed to tracked tiles.
    untracked_bytes
        Bytes that fell in a region but on a tile that is not (or no longer) tracked.
    triggers
        Tiles that reached their threshold.
    evictions, refills
        Entries spilled to memory because their set was full, and brought back.
    max_live
        Most entries in use at once.
    """

    tracked_bytes: float = 0.0
    untracked_bytes: float = 0.0
    triggers: int = 0
    evictions: int = 0
    refills: int = 0
    max_live: int = 0


class Tracker:
    """The track & trigger table of one GPU.

    It observes the GPU's memory controllers only while at least one region is programmed.

    Parameters
    ----------
    gpu
        The GPU (its memory controllers, address map, allocator and recorder are used).
    config
        Table geometry.
    """

    def __init__(self, gpu, config: TrackerConfig):
        self.gpu = gpu
        self.env = gpu.env
        self.config = config
        self.sets: list[dict[tuple[int, int], int]] = [{} for _ in range(config.sets)]
        self.spilled: dict[tuple[int, int], int] = {}
        self.regions: list[TrackedRegion] = []
        self.live = 0
        self.stats = TrackerStats()
        self._observing = False

    # -- programming ------------------------------------------------------------------------
    def program(self, region: TrackedRegion) -> None:
        """Start tracking ``region``."""
        for other in self.regions:
            if region.base < other.end and other.base < region.end:
                raise ValueError(f"tracker of GPU {self.gpu.index}: region {region.name!r} overlaps {other.name!r}")
        self.regions.append(region)
        if not self._observing:
            for controller in self.gpu.controllers:
                controller.enqueue_observers.append(self.observe)
            self._observing = True

    def release(self, region: TrackedRegion) -> None:
        """Stop tracking ``region``; entries it still holds are dropped."""
        self.regions.remove(region)
        for table in self.sets:
            for key in [key for key in table if key[0] == region.uid]:
                del table[key]
                self.live -= 1
        for key in [key for key in self.spilled if key[0] == region.uid]:
            del self.spilled[key]
        if not self.regions and self._observing:
            for controller in self.gpu.controllers:
                controller.enqueue_observers.remove(self.observe)
            self._observing = False

    # -- counting ---------------------------------------------------------------------------
    def observe(self, request: MemRequest, now: float) -> None:
        """Memory-controller enqueue observer: attribute a write or update to tracked tiles."""
        if request.kind == READ:
            return
        for address, nbytes in global_ranges(self.gpu.address_map, request.channel, request.ch_addr, request.nbytes):
            for region in self.regions:
                if region.base <= address < region.end:
                    self._count(region, address, nbytes, now)
                    break

    def _count(self, region: TrackedRegion, address: int, nbytes: int, now: float) -> None:
        stride = region.tile_bytes
        offset = address - region.base
        end = min(offset + nbytes, len(region.thresholds) * stride)
        while offset < end:
            tile = offset // stride
            take = min(end, (tile + 1) * stride) - offset
            self.update(region, tile, take, now)
            offset += take

    def update(self, region: TrackedRegion, tile: int, nbytes: int, now: float) -> None:
        """Add ``nbytes`` of updates to ``tile`` of ``region``; fire it when complete."""
        threshold = region.thresholds[tile]
        if threshold <= 0:
            self.stats.untracked_bytes += nbytes
            return
        self.stats.tracked_bytes += nbytes
        key = (region.uid, tile)
        table = self.sets[tile % self.config.sets]
        count = table.pop(key, None)
        if count is None:
            count = self.spilled.pop(key, None)
            if count is None:
                count = 0
            else:
                self.stats.refills += 1
                self._spill_traffic(region, tile, READ)
            if count + nbytes < threshold:
                self._allocate(table)
            else:
                self.live += 1  # taken and freed by this very request
        count += nbytes
        if count >= threshold:
            self.live -= 1
            region.thresholds[tile] = 0
            self.stats.triggers += 1
            region.on_ready(tile, now)
        else:
            table[key] = count  # most recently updated last

    def _allocate(self, table: dict[tuple[int, int], int]) -> None:
        """Make room for one more entry in ``table`` (a set), spilling its least recently updated."""
        if len(table) >= self.config.ways:
            victim = next(iter(table))
            self.spilled[victim] = table.pop(victim)
            self.stats.evictions += 1
            region = next(r for r in self.regions if r.uid == victim[0])
            self._spill_traffic(region, victim[1], WRITE)
        else:
            self.live += 1
            if self.live > self.stats.max_live:
                self.stats.max_live = self.live

    def _spill_traffic(self, region: TrackedRegion, tile: int, kind: str) -> None:
        """Write or read one tile's entry in the region's spill area, once the current controller call returns."""
        size = int(self.config.entry_bytes)
        address = region.spill_base + tile * size
        memory = self.gpu.memory
        wake = self.env.timeout(0)
        wake.callbacks.append(lambda _event: memory.dram(address, size, kind, COMM))

    def report(self, counters: dict, prefix: str) -> None:
        """Add the statistics to ``counters`` (a recorder's) under ``prefix`` (e.g. ``"gpu0."``)."""
        stats = self.stats
        for name in ("tracked_bytes", "untracked_bytes", "triggers", "evictions", "refills"):
            counters[f"{prefix}tracker_{name}"] = float(getattr(stats, name))
        counters[f"{prefix}tracker_max_entries"] = float(stats.max_live)
