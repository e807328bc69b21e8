"""L2: LRU capacity, hits as dictionary operations, write-allocate, miss merging, write-back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.config import L2Config
from gpusim.engine import Join, Simulation
from gpusim.hw.cache import Fill, L2Cache

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


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.sampled_from([0, 512, 16384]), st.integers(1, (1 << 32) - 1)), max_size=8),
    st.integers(0, 12),
    st.integers(1, 8),
)
def test_allocating_whole_blocks_at_once_equals_block_by_block(history, first, count):
    # Fills allocate their whole blocks in one call; the LRU order, the sectors present, the
    # dirty bytes, the evictions and the statistics must be those of one insert per block.
    one_by_one, at_once = L2Cache(CONFIG), L2Cache(CONFIG)
    for l2 in (one_by_one, at_once):
        for block, dirty, sectors in history:
            l2.insert(block, dirty, None, sectors)
    fill = Fill()
    expected = []
    for block in range(first, first + count):
        expected += one_by_one.insert(block, 0, fill)
    assert at_once.insert_whole(range(first, first + count), fill) == expected
    assert list(at_once.blocks.items()) == list(one_by_one.blocks.items())
    assert at_once.present == one_by_one.present
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
    half = (1 << 16) - 1
    for block in range(8):
        assert l2.insert(block, 100, None, half) == []
    assert len(l2.blocks) == 8 and l2.stats.evictions == 0
    assert l2.insert(8, 0, None, half) == [(0, 100)]
    assert l2.lookup(0, 0.0) is False and l2.lookup(1, 0.0, half) is True


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, (1 << 32) - 1), st.booleans()), max_size=60))
def test_sectors_held_never_exceed_the_capacity(accesses):
    l2 = L2Cache(CONFIG)
    for block, sectors, invalidate in accesses:
        if invalidate:
            l2.invalidate(block)
        else:
            l2.insert(block, 0, None, sectors)
        held = sum(mask.bit_count() for mask in l2.present.values())
        assert held == l2.occupied_sectors <= l2.capacity_sectors
        assert set(l2.present) == set(l2.blocks)


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
