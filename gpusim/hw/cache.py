"""The L2: a capacity-limited LRU over fixed-size address blocks, shared by all CUs of a GPU.

Hits are dictionary operations, not events.  Every access costs L2 bandwidth (a :class:`Pipe`)
and the hit latency.  A block is divided into :data:`SECTORS` sectors.  A byte is present once it
has been fetched from DRAM (or is being fetched) or written: a read hits only if every byte it
touches is present.  A miss fetches the absent bytes of the :data:`FETCH_BYTES` granules the read
touches, a real L2's sectors (32 B), so neighbouring workgroups that read different parts of one
block each fetch their own part from DRAM, a granule they share is fetched once (the second waits
for the first's fill), and no byte is fetched twice while it stays cached: a cold, streaming read of
a tensor fetches each of its bytes from DRAM exactly once, however its workgroups split it.  The
simulated sectors (512 B) only track presence; fetching them whole would read up to 480 B more than
a real L2 at each end of every read.  A sector whose bytes are all present is one bit of its block;
a sector only partly present keeps the byte ranges it holds until later fills or writes complete it.
The capacity counts the sectors that hold any bytes, not the blocks: a real cache holds lines, so
thousands of workgroups that each hold one row of a different block fill it by their rows, not by
their blocks.  The absent ranges of a read become DRAM reads; an access to bytes whose fill is
still in flight waits for the block's latest fill (miss-status merging) instead of reading DRAM
again.  Writes allocate (the block becomes dirty, its written
bytes present) unless the buffer is uncached; evicting a dirty block writes back its dirty bytes.
Where written data may wait for its write-back in only part of the capacity (``dirty_fraction``),
the L2 keeps the writes in order: once the bytes written and not yet written back pass that share,
the oldest write is written back, as one request of its bytes (its block stays cached), even where
the block was written again since; so a kernel that rewrites resident data still pays for its
writes at the DRAM's pace, and only the last writes of a long write are left for later kernels.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass

from gpusim.config.gpu import L2Config
from gpusim.engine.primitives import Join, Pipe
from gpusim.units import NS_PER_S

SECTORS = 32
"""Sectors per simulated block whose presence is tracked."""
ALL_SECTORS = (1 << SECTORS) - 1

FETCH_BYTES = 32
"""Bytes a DRAM fill fetches at least: a read's absent bytes are fetched in the aligned granules of
this size it touches, a real L2's sectors (NVIDIA's are 32 B)."""

Ranges = list[tuple[int, int]]
"""Disjoint ``[start, stop)`` byte ranges within a block, in address order."""


def _merged(ranges: Ranges, start: int, stop: int) -> Ranges:
    """``ranges`` with ``[start, stop)`` added, touching ranges joined into one."""
    kept = []
    for low, high in ranges:
        if high < start or low > stop:
            kept.append((low, high))
        else:
            start, stop = min(low, start), max(high, stop)
    kept.append((start, stop))
    kept.sort()
    return kept


def _gaps(ranges: Ranges, start: int, stop: int, into: Ranges) -> None:
    """Append the parts of ``[start, stop)`` outside ``ranges`` to ``into``, joined to its last range
    where they touch it."""
    for low, high in ranges:
        if high <= start:
            continue
        if low >= stop:
            break
        if low > start:
            _append(into, start, low)
        start = max(start, high)
    if start < stop:
        _append(into, start, stop)


def _append(ranges: Ranges, start: int, stop: int) -> None:
    """Append ``[start, stop)`` to ``ranges`` (in address order), joined to the last range where it
    touches it."""
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], stop)
    else:
        ranges.append((start, stop))


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
    bin_ns
        Width of the time bins of :attr:`traffic`, ns.

    Attributes
    ----------
    traffic
        Bytes read and written through the L2 per time bin (bin index: time // ``bin_ns``), which
        :class:`gpusim.hw.memory.MemorySystem` adds to.
    """

    def __init__(self, config: L2Config, bin_ns: float = 5000.0):
        self.bin_ns = bin_ns
        self.traffic: defaultdict[int, float] = defaultdict(float)
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
        # block id -> bit mask of the sectors whose bytes are all present (fetched, being fetched, or
        # written), and, for blocks with sectors only partly present, sector -> the byte ranges present
        # (block offsets); the capacity counts both
        self.present: dict[int, int] = {}
        self.partial: dict[int, dict[int, Ranges]] = {}
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

    def _span(self, sector: int) -> tuple[int, int]:
        """Byte offsets ``[start, stop)`` of ``sector`` in its block (the last sector takes the rest)."""
        start = sector * self.sector_bytes
        return start, self.block_bytes if sector == SECTORS - 1 else start + self.sector_bytes

    def lookup(self, block: int, now: float, start: int = 0, stop: int | None = None) -> Fill | bool:
        """Touch bytes ``[start, stop)`` of ``block`` (default: all of it) for reading.

        Returns
        -------
        Fill or bool
            ``True`` on a hit, the block's in-flight :class:`Fill` if the block is being fetched,
            ``False`` on a miss (one of the bytes is absent; :meth:`missing` says which).
        """
        held = self.present.get(block)  # the same keys as self.blocks
        if held is not None and (held == ALL_SECTORS or self._held(block, held, start, stop)):
            self.blocks.move_to_end(block)
            fill = self.fills.get(block)
            if fill is not None:
                if fill.pending or fill.latest > now:
                    self.stats.merged += 1
                    return fill
                del self.fills[block]  # arrived: as :meth:`in_flight`, inlined on this hot path
            self.stats.hits += 1
            return True
        self.stats.misses += 1
        return False

    def _held(self, block: int, held: int, start: int, stop: int | None) -> bool:
        """Whether bytes ``[start, stop)`` of cached ``block``, whose whole sectors present are the
        mask ``held``, are all present."""
        absent = (ALL_SECTORS if stop is None else self.sectors(start, stop)) & ~held
        return absent == 0 or self._partly_present(block, absent, start, stop)

    def _partly_present(self, block: int, absent: int, start: int, stop: int | None) -> bool:
        """Whether the bytes ``[start, stop)`` of ``block`` in the ``absent`` sectors (a mask) are in
        the byte ranges its partly present sectors hold."""
        parts = self.partial.get(block)
        if parts is None or stop is None:
            return False
        while absent:
            sector = (absent & -absent).bit_length() - 1
            absent &= absent - 1
            low, high = self._span(sector)
            low, high = max(start, low), min(stop, high)
            if not any(held_low <= low and high <= held_high for held_low, held_high in parts.get(sector, ())):
                return False
        return True

    def missing(self, block: int, start: int = 0, stop: int | None = None) -> Ranges:
        """Byte ranges that a read of bytes ``[start, stop)`` of ``block`` (default: all of it) fetches
        from DRAM: the absent bytes of the :data:`FETCH_BYTES` granules it touches, as block offsets
        in address order."""
        start -= start % FETCH_BYTES
        stop = self.block_bytes if stop is None else min(self.block_bytes, -(-stop // FETCH_BYTES) * FETCH_BYTES)
        touched = self.sectors(start, stop)
        held = self.present.get(block, 0) & touched
        parts = self.partial.get(block)
        if parts is not None:
            parts = [ranges for sector, ranges in parts.items() if touched >> sector & 1]
        if not held and not parts:
            return [(start, stop)]
        # the present bytes in the read's sectors, in address order: runs of whole sectors, partial ones
        have = [byte_range for ranges in parts for byte_range in ranges] if parts else []
        while held:
            first = (held & -held).bit_length() - 1
            run = held >> first
            count = (run ^ (run + 1)).bit_length() - 1  # sectors in the run
            have.append((first * self.sector_bytes, self._span(first + count - 1)[1]))
            held &= ~(((1 << count) - 1) << first)
        have.sort()
        gaps: Ranges = []
        _gaps(have, start, stop, gaps)
        return gaps

    def in_flight(self, block: int, now: float) -> Fill | None:
        """The block's latest DRAM fill, if it has not yet arrived at ``now``."""
        fill = self.fills.get(block)
        if fill is not None and fill.pending == 0 and fill.latest <= now:
            del self.fills[block]
            return None
        return fill

    def insert(
        self, block: int, dirty_bytes: int, fill: Fill | None = None, start: int = 0, stop: int | None = None
    ) -> list[tuple[int, int]]:
        """Make bytes ``[start, stop)`` of ``block`` (default: all of it) present, fetched by ``fill``
        or written (``dirty_bytes`` more dirty bytes); return evicted dirty blocks ``(block, bytes)``."""
        blocks, fills = self.blocks, self.fills
        if block in blocks:
            blocks.move_to_end(block)
            if dirty_bytes:
                blocks[block] = min(self.block_bytes, blocks[block] + dirty_bytes)
        else:
            blocks[block] = dirty_bytes
            self.present[block] = 0
        self._add(block, start, self.block_bytes if stop is None else stop)
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

    def _add(self, block: int, start: int, stop: int) -> None:
        """Make bytes ``[start, stop)`` of cached ``block`` present: sectors they cover whole, or that
        they complete, become present; the ends of sectors they cover in part join its ranges."""
        size = self.sector_bytes
        held = self.present[block]
        parts = self.partial.get(block)
        before = held.bit_count() + (len(parts) if parts else 0)
        first = start // size
        last = min((stop - 1) // size, SECTORS - 1)
        whole = ((1 << (last - first + 1)) - 1) << first
        if start > first * size and not held >> first & 1 and not self._complete(block, first, start, stop):
            whole &= ~(1 << first)
        if stop < self._span(last)[1] and not held >> last & 1 and not self._complete(block, last, start, stop):
            whole &= ~(1 << last)
        held |= whole
        self.present[block] = held
        parts = self.partial.get(block)
        if parts is not None:
            for sector in [sector for sector in parts if whole >> sector & 1]:
                del parts[sector]
            if not parts:
                del self.partial[block]
                parts = None
        self.occupied_sectors += held.bit_count() + (len(parts) if parts else 0) - before

    def _complete(self, block: int, sector: int, start: int, stop: int) -> bool:
        """Add the bytes of ``[start, stop)`` in ``sector`` of ``block`` to the byte ranges it holds;
        return whether they now cover the whole sector (the caller then makes it present)."""
        low, high = self._span(sector)
        parts = self.partial.setdefault(block, {})
        ranges = _merged(parts.get(sector, []), max(start, low), min(stop, high))
        if ranges[0] == (low, high):
            return True
        parts[sector] = ranges
        return False

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
        """Make every byte of each block in ``blocks`` (in order) present, for a DRAM fill in flight.

        The same as :meth:`insert` with ``dirty_bytes=0`` and whole blocks, block by block, in one call.
        """
        cache, present, partial, fills = self.blocks, self.present, self.partial, self.fills
        capacity = self.capacity_sectors
        occupied = self.occupied_sectors
        evictions = 0
        evicted: list[tuple[int, int]] = []
        for block in blocks:
            fills[block] = fill
            if block in cache:
                cache.move_to_end(block)
                occupied += SECTORS - present[block].bit_count() - len(partial.pop(block, ()))
            else:
                cache[block] = 0
                occupied += SECTORS
            present[block] = ALL_SECTORS
            # _evict_over_capacity, inlined: a fill into a full L2 evicts for nearly every block
            while occupied > capacity:
                victim, dirty = cache.popitem(last=False)
                evictions += 1
                fills.pop(victim, None)
                occupied -= present.pop(victim).bit_count() + len(partial.pop(victim, ()))
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
            self.occupied_sectors -= present.pop(victim).bit_count() + len(self.partial.pop(victim, ()))
            if dirty:
                stats.writebacks += 1
                evicted.append((victim, dirty))

    def invalidate(self, block: int) -> None:
        """Drop ``block`` (its data was replaced behind the cache, e.g. by a near-memory update)."""
        if self.blocks.pop(block, None) is not None:
            self.fills.pop(block, None)
            self.occupied_sectors -= self.present.pop(block).bit_count() + len(self.partial.pop(block, ()))

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
