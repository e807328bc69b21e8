"""L2: LRU capacity, hits as dictionary operations, bytes present, write-allocate, miss merging,
write-back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config import L2Config
from gpusim.engine import Join, Simulation
from gpusim.hw.cache import FETCH_BYTES, Fill, L2Cache
from gpusim.hw.memory import MemorySystem

CONFIG = L2Config(capacity_bytes=4 * 16384, block_bytes=16384, banks=4, clock_hz=1e9)


def test_lru_evicts_least_recently_used():
    l2 = L2Cache(CONFIG)
    for block in range(4):
        l2.insert(block, 0)
    assert l2.lookup(0, 0.0) is True  # 0 becomes most recent
    l2.insert(4, 0)
    assert l2.lookup(1, 0.0) is False
    assert l2.lookup(0, 0.0) is True
    assert len(l2.blocks) <= l2.capacity_blocks


def test_dirty_blocks_are_written_back_on_eviction():
    l2 = L2Cache(CONFIG)
    l2.insert(0, 1000)
    l2.insert(0, 20000)
    for block in range(1, 5):
        evicted = l2.insert(block, 0)
    assert evicted == [(0, 16384)]
    assert l2.stats.writebacks == 1


def test_second_miss_waits_for_the_first_fill():
    sim = Simulation()
    l2 = L2Cache(CONFIG)
    fill = Fill()
    fill.pending = 1
    l2.insert(7, 0, fill)
    join = Join(sim.env)
    state = l2.lookup(7, 0.0)
    assert state is fill
    state.wait(join, 0.0)
    fill.done_at(500.0)
    event = join.close()
    sim.run()
    assert event.processed and sim.now == 500.0
    assert l2.stats.merged == 1


def test_hits_stream_at_the_sustained_fraction_of_the_peak_bandwidth():
    """Hits cost bandwidth at the L2's sustained rate: the peak times its sustained efficiency."""
    nbytes = 2**20
    peak = L2Cache(CONFIG)
    derated = L2Cache(CONFIG.model_copy(update={"sustained_efficiency": 0.7}))
    at_peak = peak.bandwidth_done(0.0, nbytes) - CONFIG.hit_latency_ns
    assert at_peak == pytest.approx(nbytes / CONFIG.bandwidth_bytes_per_s * 1e9)
    assert derated.bandwidth_done(0.0, nbytes) - CONFIG.hit_latency_ns == pytest.approx(at_peak / 0.7)


BYTE_RANGES = st.tuples(st.integers(0, 16383), st.integers(1, 16384)).map(lambda r: (min(r[0], r[1] - 1), r[1]))
"""``(start, stop)`` byte ranges within a block."""


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.sampled_from([0, 512, 16384]), BYTE_RANGES), max_size=8),
    st.integers(0, 12),
    st.integers(1, 8),
)
def test_allocating_whole_blocks_at_once_equals_block_by_block(history, first, count):
    # Fills allocate their whole blocks in one call; the LRU order, the bytes present, the
    # dirty bytes, the evictions and the statistics must be those of one insert per block.
    one_by_one, at_once = L2Cache(CONFIG), L2Cache(CONFIG)
    for l2 in (one_by_one, at_once):
        for block, dirty, (start, stop) in history:
            l2.insert(block, dirty, None, start, stop)
    fill = Fill()
    expected = []
    for block in range(first, first + count):
        expected += one_by_one.insert(block, 0, fill)
    assert at_once.insert_whole(range(first, first + count), fill) == expected
    assert list(at_once.blocks.items()) == list(one_by_one.blocks.items())
    assert at_once.present == one_by_one.present and at_once.partial == one_by_one.partial
    assert at_once.occupied_sectors == one_by_one.occupied_sectors
    assert at_once.fills == one_by_one.fills
    assert at_once.stats == one_by_one.stats


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.sampled_from([0.25, 0.5, 0.7, 1.0]))
def test_the_lru_never_holds_more_than_its_shared_fraction(blocks, fraction):
    # capacity 16 blocks; the LRU holds capacity x shared_fraction of them, and the most recent stay
    l2 = L2Cache(CONFIG.model_copy(update={"capacity_bytes": 16 * 16384, "shared_fraction": fraction}))
    for block in blocks:
        l2.insert(block, 0)
        assert len(l2.blocks) <= int(16 * fraction)
    recent = list(dict.fromkeys(reversed(blocks)))[: int(16 * fraction)]
    assert all(l2.lookup(block, 0.0) for block in recent)


def test_capacity_counts_the_sectors_present_not_the_blocks():
    # four blocks' worth of sectors: eight half-filled blocks fit, a ninth evicts the least recent
    l2 = L2Cache(CONFIG)
    for block in range(8):
        assert l2.insert(block, 100, None, 0, 8192) == []
    assert len(l2.blocks) == 8 and l2.stats.evictions == 0
    assert l2.insert(8, 0, None, 0, 8192) == [(0, 100)]
    assert l2.lookup(0, 0.0) is False and l2.lookup(1, 0.0, 0, 8192) is True


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), BYTE_RANGES, st.booleans()), max_size=60))
def test_sectors_held_never_exceed_the_capacity(accesses):
    # a sector holding any bytes counts, whole or in part
    l2 = L2Cache(CONFIG)
    for block, (start, stop), invalidate in accesses:
        if invalidate:
            l2.invalidate(block)
        else:
            l2.insert(block, 0, None, start, stop)
        whole = sum(mask.bit_count() for mask in l2.present.values())
        partly = sum(len(parts) for parts in l2.partial.values())
        assert whole + partly == l2.occupied_sectors <= l2.capacity_sectors
        assert set(l2.present) == set(l2.blocks) >= set(l2.partial)
        assert all(not l2.present[block] & sum(1 << sector for sector in parts) and all(parts.values())
                   for block, parts in l2.partial.items())


def test_writes_past_their_share_write_back_the_block_of_the_oldest_write():
    # capacity 4 blocks, half of it may wait for write-back: the third block's write writes back block 0,
    # which stays cached, clean
    l2 = L2Cache(CONFIG.model_copy(update={"dirty_fraction": 0.5}))
    assert l2.insert(0, 16384) == [] and l2.insert(1, 100) == []
    assert l2.insert(2, 16384) == [(0, 16384)]
    assert l2.blocks[0] == 0 and l2.lookup(0, 0.0) is True
    assert l2.written_bytes == 16384 + 100 and l2.stats.writebacks == 1


def test_rewriting_resident_data_still_writes_it_back():
    # one block rewritten again and again: each write past the share writes the block back once, as a
    # GPU's kernel rewriting an L2-resident buffer pays for its writes at the DRAM's pace
    l2 = L2Cache(CONFIG.model_copy(update={"dirty_fraction": 0.5}))
    written_back = [l2.insert(0, 16384) for _ in range(6)]
    assert written_back == [[], [], [(0, 16384)], [(0, 16384)], [(0, 16384)], [(0, 16384)]]


def test_a_full_dirty_share_keeps_every_written_block_dirty_until_evicted():
    l2 = L2Cache(CONFIG)
    for _ in range(3):
        for block in range(4):
            assert l2.insert(block, 16384) == []
    assert l2.insert(4, 0) == [(0, 16384)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.sampled_from([0, 512, 16384]), st.sampled_from(["insert", "invalidate"])),
             max_size=60),
    st.sampled_from([0.25, 0.5, 0.75, 1.0]),
)
def test_written_bytes_stay_within_their_share_and_none_are_lost(accesses, fraction):
    # every dirty byte is either still dirty in the L2, written back, or dropped by an invalidation
    l2 = L2Cache(CONFIG.model_copy(update={"dirty_fraction": fraction}))
    dirtied = written_back = dropped = 0
    for block, dirty, action in accesses:
        if action == "invalidate":
            dropped += l2.blocks.get(block, 0)
            l2.invalidate(block)
            continue
        before = l2.blocks.get(block, 0)
        written_back += sum(size for _, size in l2.insert(block, dirty))
        dirtied += min(16384, before + dirty) - before
        if l2.written_limit is not None:
            assert l2.written_bytes <= l2.written_limit
        assert sum(l2.blocks.values()) <= l2.capacity_blocks * 16384
    assert dirtied == sum(l2.blocks.values()) + written_back + dropped


class Fetches(MemorySystem):
    """A GPU's memory path whose DRAM only records the reads it is sent, ``(addr, nbytes, fill)``."""

    def __init__(self, sim: Simulation, l2: L2Cache):
        super().__init__(sim.env, l2, None, [])
        self.reads: list[tuple[int, int, Fill]] = []

    def dram(self, addr, nbytes, kind, stream, completion=None, admission=None, tag=None, run_bytes=None) -> int:
        self.reads.append((addr, nbytes, completion))
        completion.pending += 1
        return 1


def union_bytes(ranges: list[tuple[int, int]]) -> int:
    """Bytes in the union of ``(start, stop)`` ranges."""
    total, reach = 0, 0
    for start, stop in sorted(ranges):
        if stop > reach:
            total += stop - max(start, reach)
            reach = stop
    return total


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4 * 16384), st.integers(1, 2 * 16384)), min_size=1, max_size=12),
       st.booleans())
def test_cold_reads_fetch_each_byte_of_their_union_once(reads, arrive):
    # Byte ranges read through a cold L2 that holds them all: the DRAM reads are disjoint and cover the
    # union of the ranges rounded out to whole 32-byte granules, byte for byte, whether each fill is
    # still in flight when the next read comes (miss merging) or has arrived; a second pass over them
    # reads nothing more.
    sim = Simulation()
    memory = Fetches(sim, L2Cache(CONFIG.model_copy(update={"capacity_bytes": 64 * 16384})))
    for addr, nbytes in reads:
        memory.read(addr, nbytes, Join(sim.env))
        if arrive:
            for _, _, fill in memory.reads:
                while fill.pending:
                    fill.done_at(0.0)
    fetched = sorted((addr, addr + nbytes) for addr, nbytes, _ in memory.reads)
    assert all(stop <= start for (_, stop), (start, _) in zip(fetched, fetched[1:]))
    wanted = [(addr // FETCH_BYTES * FETCH_BYTES, -(-(addr + nbytes) // FETCH_BYTES) * FETCH_BYTES)
              for addr, nbytes in reads]
    assert sum(stop - start for start, stop in fetched) == union_bytes(wanted) == union_bytes(fetched + wanted)
    count = len(memory.reads)
    for addr, nbytes in reads:
        assert memory.read(addr, nbytes, Join(sim.env)) == (0 if arrive else nbytes)
    assert len(memory.reads) == count


@pytest.mark.parametrize("first_arrives_ns, expected_ns", [(500.0, 800.0), (900.0, 900.0)])
def test_a_read_that_overlaps_a_fill_in_flight_fetches_only_its_absent_bytes(first_arrives_ns, expected_ns):
    # one read fetches [0, 1024) (whole 32-byte granules); the next, [500, 2000), fetches [1024, 2016)
    # and waits for both fills
    sim = Simulation()
    memory = Fetches(sim, L2Cache(CONFIG.model_copy(update={"hit_latency_ns": 0.0})))
    memory.read(0, 1000, Join(sim.env))
    join = Join(sim.env)
    assert memory.read(500, 1500, join) == 1500
    (_, _, first), (addr, nbytes, second) = memory.reads
    assert (addr, nbytes) == (1024, 992)
    first.done_at(first_arrives_ns)
    second.done_at(800.0)
    event = join.close()
    sim.run()
    assert event.processed and sim.now == expected_ns


@pytest.mark.parametrize("kind", ["copy", "add"])
def test_an_element_wise_kernel_on_a_cold_l2_reads_each_input_byte_once(kind):
    # The A100's copy splits 8 MiB at 3232- and 3248-byte chunks, neither a multiple of a 512-byte
    # sector: a neighbour must still fetch the rest of a sector another fill brought part of
    # (it read 8,368,752 of the 8,388,608 bytes when a fill marked every sector it touched present).
    result = gpusim.run(gpusim.load_system("a100-sxm4"), ops.Elementwise(kind, 2**21, "fp32"))
    reads = result.dram_totals().query("direction == 'read'")["bytes"].sum()
    assert reads == (1 if kind == "copy" else 2) * 2**23
