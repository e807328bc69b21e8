"""T3's tracker: address attribution, thresholds, triggers at enqueue, finite table with spills."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.config import load_gpu_config
from gpusim.engine import Simulation
from gpusim.hw.gpu import Gpu
from gpusim.hw.hbm import AddressMap
from gpusim.hw.tracker import TrackedRegion, global_ranges

CONFIG = load_gpu_config("t3-table8.1")
TILE = 16384


def make_gpu(**tracker):
    config = CONFIG.model_copy(update={"tracker": CONFIG.tracker.model_copy(update=tracker)}) if tracker else CONFIG
    sim = Simulation()
    return sim, Gpu(sim, None, 0, config)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**26), st.integers(1, 2**21))
def test_global_ranges_invert_the_address_map(addr, nbytes):
    address_map = AddressMap(CONFIG.hbm, CONFIG.memctrl.max_request_bytes)
    covered = []
    for channel, ch_addr, size in address_map.split(addr, nbytes):
        covered.extend(global_ranges(address_map, channel, ch_addr, size))
    covered.sort()
    assert sum(size for _, size in covered) == nbytes
    position = addr
    for start, size in covered:
        assert start == position  # contiguous, no overlap, no gap
        position += size
    assert position == addr + nbytes


def region_on(gpu, tiles, threshold, log, base=None):
    buffer = gpu.alloc("c", tiles * TILE, cached=False)
    spill = gpu.alloc("spill", tiles * 64, cached=False)
    region = TrackedRegion("c", buffer.addr if base is None else base, TILE, [threshold] * tiles,
                           lambda tile, now: log.append((tile, now)), spill.addr)
    gpu.tracker.program(region)
    return region, buffer


def test_a_tile_fires_when_the_update_that_completes_it_is_enqueued():
    sim, gpu = make_gpu()
    log = []
    region, buffer = region_on(gpu, tiles=4, threshold=2 * TILE, log=log)

    def traffic():
        gpu.memory.dram(buffer.addr + TILE, TILE, "update", "compute")  # tile 1, local
        gpu.memory.dram(buffer.addr, 2 * TILE, "read", "comm")  # reads never count
        yield sim.timeout(1000.0)
        assert log == []
        gpu.memory.dram(buffer.addr + TILE, TILE, "update", "comm")  # tile 1, from a peer
        assert log == [(1, 1000.0)]  # at enqueue, not when the bank has written it
        gpu.memory.dram(buffer.addr + 2 * TILE + 100, TILE, "write", "comm")  # parts of tiles 2 and 3

    sim.process(traffic())
    sim.run()
    stats = gpu.tracker.stats
    assert stats.triggers == 1 and stats.tracked_bytes == 3 * TILE
    assert gpu.tracker.live == 2  # tiles 2 and 3 hold partial counts
    gpu.tracker.release(region)
    assert gpu.tracker.live == 0
    assert all(not controller.enqueue_observers for controller in gpu.controllers)


def test_updates_outside_regions_and_on_finished_tiles_are_not_counted():
    sim, gpu = make_gpu()
    log = []
    _, buffer = region_on(gpu, tiles=2, threshold=TILE, log=log)
    other = gpu.alloc("other", 4 * TILE)
    gpu.memory.dram(other.addr, 4 * TILE, "update", "comm")
    gpu.memory.dram(buffer.addr, TILE, "update", "comm")
    gpu.memory.dram(buffer.addr, TILE, "update", "comm")  # tile 0 again, after it fired
    sim.run()
    assert log == [(0, 0.0)]
    assert gpu.tracker.stats.tracked_bytes == TILE
    assert gpu.tracker.stats.untracked_bytes == TILE


def test_a_full_set_spills_its_least_recently_updated_entry_and_refills_it():
    sim, gpu = make_gpu(sets=1, ways=2)
    log = []
    _, buffer = region_on(gpu, tiles=3, threshold=2 * TILE, log=log)
    for tile in range(3):  # three half-complete tiles in a two-way set
        gpu.memory.dram(buffer.addr + tile * TILE, TILE, "update", "compute")
    stats = gpu.tracker.stats
    assert (stats.evictions, stats.refills, stats.max_live) == (1, 0, 2)
    for tile in range(3):
        gpu.memory.dram(buffer.addr + tile * TILE, TILE, "update", "comm")
    sim.run()
    assert sorted(tile for tile, _ in log) == [0, 1, 2]  # nothing is lost by spilling
    assert stats.refills == 1 and stats.evictions >= 1
    spill_traffic = sum(n for (gpu_, _, stream, _, _), n in sim.recorder.dram.items() if stream == "comm") - 3 * TILE
    assert spill_traffic == (stats.evictions + stats.refills) * CONFIG.tracker.entry_bytes
    counters = {}
    gpu.tracker.report(counters, "gpu0.")
    assert counters["gpu0.tracker_evictions"] == stats.evictions and counters["gpu0.tracker_max_entries"] == 2


def test_regions_may_not_overlap():
    sim, gpu = make_gpu()
    _, buffer = region_on(gpu, tiles=2, threshold=TILE, log=[])
    with pytest.raises(ValueError, match="overlaps"):
        region_on(gpu, tiles=2, threshold=TILE, log=[], base=buffer.addr + TILE)
