"""The L2: a capacity-limited LRU over fixed-size address blocks, shared by all CUs of a GPU.

Hits are dictionary operations, not events.  Every access costs L2 bandwidth (a :class:`Pipe`)
and the hit latency.  A block is divided into :data:`SECTORS` sectors that are present or not (as a
real cache's lines within the simulated block): a read hits only if every sector it touches is
present, so neighbouring workgroups that read different parts of one block each fetch their own
part from DRAM.  The capacity counts the sectors present, not the blocks: a real cache holds lines,
so thousands of workgroups that each hold one row of a different block fill it by their rows, not
by their blocks.  A missing block becomes part of a DRAM read; a second access to a block
whose fill is still in flight waits for that fill (miss-status merging) instead of reading DRAM
again.  Writes allocate (the block becomes dirty) unless the buffer is uncached; evicting a dirty
block writes back its dirty bytes.  Where written data may wait for its write-back in only part of
the capacity (``dirty_fraction``), the L2 keeps the writes in order: once the bytes written and not
yet written back pass that share, the oldest write is written back, as one request of its bytes (its
block stays cached), even where the block was written again since; so a kernel that rewrites
resident data still pays for its writes at the DRAM's pace, and only the last writes of a long
write are left for later kernels.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from gpusim.config.gpu import L2Config
from gpusim.engine.primitives import Join, Pipe
from gpusim.units import NS_PER_S

SECTORS = 32
"""Sectors per simulated block whose presence is tracked."""
ALL_SECTORS = (1 << SECTORS) - 1


class Fill:
    """A DRAM fill of some L2 blocks, done when all of its requests are done."""

    __slots__ = ("pending", "latest", "dependents")

    def __init__(self) -> None:
        self.pending = 0
        self.latest = 0.0
        self.dependents: list[Join] = []

    def done_at(self, time_ns: float) -> None:
        """One request of the fill completes at ``time_ns``."""
        if time_ns > self.latest:
            self.latest = time_ns
        self.pending -= 1
        if self.pending == 0:
            for join in self.dependents:
                join.done_at(self.latest)
            self.dependents = []

    def wait(self, join: Join, now: float) -> None:
        """Make ``join`` wait for this fill.

        A join that is already the last dependent (a read covering several blocks of one fill)
        is not added again: its parts would complete one after the other at the same time.
        """
        if self.pending == 0:
            join.extend_to(self.latest)
        elif not self.dependents or self.dependents[-1] is not join:
            join.add()
            self.dependents.append(join)


@dataclass
class CacheStats:
    """Access counts of the L2, in blocks and bytes."""

    hits: int = 0
    misses: int = 0
    merged: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    writebacks: int = 0
    evictions: int = 0


class L2Cache:
    """LRU state and bandwidth of one GPU's L2.

    Parameters
    ----------
    config
        Capacity, block size, bandwidth and latency.
    """

    def __init__(self, config: L2Config):
        self.block_bytes = int(config.block_bytes)
        self.capacity_blocks = max(1, int(config.capacity_bytes * config.shared_fraction // self.block_bytes))
        self.capacity_sectors = self.capacity_blocks * SECTORS
        self.occupied_sectors = 0
        self.hit_latency = config.hit_latency_ns
        self.pipe = Pipe(NS_PER_S / config.sustained_bandwidth_bytes_per_s)
        self.write_cost = config.write_cost
        self.remote_writes_allocate = config.remote_writes_allocate
        self.remote_writes_through = config.remote_writes_through or config.write_through
        self.write_through = config.write_through
        # block id -> dirty bytes (0 when clean)
        self.blocks: OrderedDict[int, int] = OrderedDict()
        # writes not yet written back, oldest first (block, bytes), their bytes and the most they may be
        # (none: every written block stays dirty until it is evicted)
        self.writes: deque[tuple[int, int]] = deque()
        self.written_bytes = 0
        self.written_limit = (int(config.dirty_fraction * self.capacity_blocks * self.block_bytes)
                              if config.dirty_fraction < 1 else None)
        # block id -> bit mask of the sectors present (fetched, being fetched, or written)
        self.present: dict[int, int] = {}
        self.sector_bytes = max(1, self.block_bytes // SECTORS)
        self.fills: dict[int, Fill] = {}
        self.stats = CacheStats()

    def sectors(self, start: int, stop: int) -> int:
        """Bit mask of the sectors that byte offsets ``[start, stop)`` of a block touch."""
        first = start // self.sector_bytes
        last = (stop - 1) // self.sector_bytes
        if last > SECTORS - 1:
            last = SECTORS - 1
        return ((1 << (last - first + 1)) - 1) << first

    def lookup(self, block: int, now: float, sectors: int = ALL_SECTORS) -> Fill | bool:
        """Touch ``sectors`` of ``block`` for reading.

        Returns
        -------
        Fill or bool
            ``True`` on a hit, the in-flight :class:`Fill` if the block is being fetched, ``False``
            on a miss (the block, or one of the sectors, is absent).
        """
        blocks = self.blocks
        if block in blocks and sectors & ~self.present[block] == 0:
            blocks.move_to_end(block)
            fill = self.fills.get(block)
            if fill is not None:
                if fill.pending == 0 and fill.latest <= now:
                    del self.fills[block]
                    self.stats.hits += 1
                    return True
                self.stats.merged += 1
                return fill
            self.stats.hits += 1
            return True
        self.stats.misses += 1
        return False

    def insert(
        self, block: int, dirty_bytes: int, fill: Fill | None = None, sectors: int = ALL_SECTORS
    ) -> list[tuple[int, int]]:
        """Allocate ``sectors`` of ``block`` (or add to its dirty bytes); return evicted dirty blocks
        ``(block, bytes)``."""
        blocks, present, fills = self.blocks, self.present, self.fills
        if block in blocks:
            blocks.move_to_end(block)
            if dirty_bytes:
                blocks[block] = min(self.block_bytes, blocks[block] + dirty_bytes)
            held = present[block]
            present[block] = held | sectors
            self.occupied_sectors += (held | sectors).bit_count() - held.bit_count()
        else:
            blocks[block] = dirty_bytes
            present[block] = sectors
            self.occupied_sectors += sectors.bit_count()
        if dirty_bytes and self.written_limit is not None:
            self.writes.append((block, dirty_bytes))
            self.written_bytes += dirty_bytes
        if fill is not None:
            fills[block] = fill
        evicted: list[tuple[int, int]] = []
        if self.occupied_sectors > self.capacity_sectors:
            self._evict_over_capacity(evicted)
        if self.written_limit is not None and self.written_bytes > self.written_limit:
            self._write_back_oldest(evicted)
        return evicted

    def _write_back_oldest(self, written_back: list[tuple[int, int]]) -> None:
        """Write back the oldest writes, each as one request of its bytes, until the bytes written and
        not written back are within the limit; their blocks stay cached.  Appends them to
        ``written_back``."""
        blocks, writes = self.blocks, self.writes
        while self.written_bytes > self.written_limit:
            block, nbytes = writes.popleft()
            self.written_bytes -= nbytes
            dirty = blocks.get(block, 0)
            if dirty:  # not evicted, invalidated or written back since
                nbytes = min(nbytes, dirty)
                blocks[block] = dirty - nbytes
                self.stats.writebacks += 1
                written_back.append((block, nbytes))

    def insert_whole(self, blocks: range, fill: Fill) -> list[tuple[int, int]]:
        """Allocate every sector of each block in ``blocks`` (in order) for a DRAM fill in flight.

        The same as :meth:`insert` with ``dirty_bytes=0`` and all sectors, block by block, in one call.
        """
        cache, present, fills = self.blocks, self.present, self.fills
        capacity = self.capacity_sectors
        occupied = self.occupied_sectors
        evictions = 0
        evicted: list[tuple[int, int]] = []
        for block in blocks:
            fills[block] = fill
            if block in cache:
                cache.move_to_end(block)
                occupied += SECTORS - present[block].bit_count()
            else:
                cache[block] = 0
                occupied += SECTORS
            present[block] = ALL_SECTORS
            # _evict_over_capacity, inlined: a fill into a full L2 evicts for nearly every block
            while occupied > capacity:
                victim, dirty = cache.popitem(last=False)
                evictions += 1
                fills.pop(victim, None)
                occupied -= present.pop(victim).bit_count()
                if dirty:
                    evicted.append((victim, dirty))
        self.occupied_sectors = occupied
        self.stats.evictions += evictions
        self.stats.writebacks += len(evicted)
        return evicted

    def _evict_over_capacity(self, evicted: list[tuple[int, int]]) -> None:
        """Drop least recently used blocks until their sectors fit the capacity; append the dirty ones
        to ``evicted``."""
        blocks, present, fills, stats = self.blocks, self.present, self.fills, self.stats
        while self.occupied_sectors > self.capacity_sectors:
            victim, dirty = blocks.popitem(last=False)
            stats.evictions += 1
            fills.pop(victim, None)
            self.occupied_sectors -= present.pop(victim).bit_count()
            if dirty:
                stats.writebacks += 1
                evicted.append((victim, dirty))

    def invalidate(self, block: int) -> None:
        """Drop ``block`` (its data was replaced behind the cache, e.g. by a near-memory update)."""
        if self.blocks.pop(block, None) is not None:
            self.fills.pop(block, None)
            self.occupied_sectors -= self.present.pop(block).bit_count()

    def flush(self) -> list[tuple[int, int]]:
        """Write back and clean every dirty block; return them as ``(block, bytes)``."""
        dirty = [(block, size) for block, size in self.blocks.items() if size]
        for block, _ in dirty:
            self.blocks[block] = 0
        self.writes.clear()
        self.written_bytes = 0
        return dirty

    def bandwidth_done(self, now: float, nbytes: float) -> float:
        """Reserve L2 bandwidth for ``nbytes``; return when they have passed, including hit latency."""
        return self.pipe.reserve(now, nbytes) + self.hit_latency
