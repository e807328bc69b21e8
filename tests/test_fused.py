"""T3's fused GEMM -> reduce-scatter: address-space configuration, staggering, tracking, DMA, MCA."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.kernels.fused import (
    DMA,
    FINAL,
    REMOTE,
    ChunkLayout,
    Frame,
    direct_reduce_scatter_config,
    expected_bytes,
    ring_reduce_scatter_config,
    workgroup_order,
)
from gpusim.kernels.gemm import grouped_order

RING8 = gpusim.load_system("t3-ring8")
FC4 = RING8.with_overrides({"topology.kind": "fully_connected", "num_gpus": 4})
M, N, K = 2048, 2048, 512
OUT = M * N * 2


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_ring_configuration_staggers_and_ends_with_each_rank_owning_its_chunk(n):
    ring = list(range(n))
    owners = []
    for rank in ring:
        config = ring_reduce_scatter_config(ring, rank)
        order = config.production_order
        assert sorted(order) == list(range(n))
        assert order == [(rank - step - 1) % n for step in range(n)]  # GPU p produces chunk p-s-1 in step s
        kinds = [config.mappings[chunk].kind for chunk in order]
        assert kinds == [REMOTE] + [DMA] * (n - 2) + [FINAL]
        assert all(config.mappings[c].dsts == ((rank + 1) % n,) for c in order[:-1])
        owners.append(order[-1])
        # what this rank sends in step s is what the next rank produces in step s + 1
        nxt = ring_reduce_scatter_config(ring, (rank + 1) % n).production_order
        assert order[:-1] == nxt[1:]
    assert owners == ring  # rank p ends with chunk p, as after ops.ReduceScatter


@pytest.mark.parametrize("partials", [1, 3])
def test_direct_configuration_sends_every_other_chunk_to_its_owner(partials):
    group = [0, 1, 2, 3]
    for rank in group:
        config = direct_reduce_scatter_config(group, rank, partials)
        assert config.production_order[-1] == rank and config.partials == partials
        for chunk, mapping in enumerate(config.mappings):
            if chunk == rank:  # every rank's K splits update it
                assert mapping.kind == FINAL and mapping.updates_per_element == 4 * partials
            else:
                assert mapping.kind == REMOTE and mapping.dsts == (chunk,)


def test_a_ring_chunk_expects_the_local_partials_and_what_arrives():
    """With K split 3 ways: step 1's chunk gets 3 local and 3 remote partial updates per element,
    later chunks 3 local ones and one DMA update."""
    config = ring_reduce_scatter_config(list(range(4)), 0, partials=3)
    expected = [config.mappings[chunk].updates_per_element for chunk in config.production_order]
    assert expected == [1, 6, 4, 4]  # the first chunk leaves as remote updates: not tracked here


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.lists(st.integers(1, 4096), min_size=1, max_size=70), st.integers(1, 4))
def test_thresholds_are_tile_size_times_updates_per_element(n, valid, partials):
    """Full mode: the dissertation's threshold (with a GEMM's K splits, each a partial update)."""
    layout = ChunkLayout(4096, valid, n)
    ring = list(range(n))
    configs = [ring_reduce_scatter_config(ring, r, partials) for r in ring]
    for me in configs:
        full = expected_bytes(me, [c for c in configs if c.rank != me.rank], layout, Frame(me, layout, False))
        for tile, value in enumerate(full[: layout.tiles]):
            kind = me.mappings[layout.chunk_of(tile)].kind
            assert value == (0 if kind == REMOTE else me.mappings[layout.chunk_of(tile)].updates_per_element * valid[tile])


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 12), st.integers(1, 6), st.integers(1, 4096), st.integers(1, 4))
def test_symmetric_thresholds_are_the_full_modes_where_the_mirror_exists(n, tiles_per_chunk, tile_bytes, partials):
    """Symmetric mode mirrors rank 0's own stores into the other ranks' places: with equal tiles and
    chunks, the bytes each tile expects are those of the real neighbours' stores."""
    layout = ChunkLayout(4096, [tile_bytes] * (n * tiles_per_chunk), n)
    configs = [ring_reduce_scatter_config(list(range(n)), r, partials) for r in range(n)]
    mirrored = expected_bytes(configs[0], [configs[0]], layout, Frame(configs[0], layout, True))
    assert mirrored == expected_bytes(configs[0], configs[1:], layout, Frame(configs[0], layout, False))


def test_chunks_are_segments_of_the_gemm_order_and_staggering_rotates_them():
    base = grouped_order(5, 10)  # 5 x 10 tiles, BLAS rasterization
    layout = ChunkLayout(1024, [1024] * 50, 8, base)
    assert [tile for chunk in range(8) for tile in layout.tiles_of(chunk)] == base
    assert [len(layout.tiles_of(chunk)) for chunk in range(8)] == [7] * 7 + [1]
    config = ring_reduce_scatter_config(list(range(8)), 3)
    order = workgroup_order(config, layout, stagger=True)
    assert sorted(order) == list(range(50))
    assert order == [tile for chunk in config.production_order for tile in base[chunk * 7:(chunk + 1) * 7]]
    assert workgroup_order(config, layout, stagger=False) == base
    # mirrored traffic keeps a tile's place in its chunk; the last chunk's missing places are padding
    assert layout.shifted(base[7 + 2], 1) == base[2] and layout.shifted(base[2], -7) == 51


def run(system, op, mode="symmetric", policy="round-robin"):
    return gpusim.run(system, [op], mode=mode, memory_policy=policy)


@pytest.mark.parametrize("system, algorithm", [(RING8, "ring"), (FC4, "direct"), (FC4, "ring")])
def test_symmetric_mode_agrees_with_full_mode(system, algorithm):
    op = ops.GemmReduceScatter(M, N, K, algorithm=algorithm)
    full = run(system, op, "full")
    symmetric = run(system, op, "symmetric")
    assert symmetric.time_s == pytest.approx(full.time_s, rel=0.03)
    assert full.ops["gpu"].nunique() == system.num_gpus
    for result in (full, symmetric):
        assert result.counters["gpu0.tracker_untracked_bytes"] == 0


def test_each_gpu_sends_its_first_chunk_remotely_and_dmas_the_middle_ones():
    result = run(RING8, ops.GemmReduceScatter(M, N, K), "full")
    counters = result.counters
    for gpu in range(8):
        assert counters[f"gpu{gpu}.t3_remote_bytes"] == pytest.approx(OUT / 8, rel=0.01)
        assert counters[f"gpu{gpu}.t3_dma_bytes"] == pytest.approx(OUT * 6 / 8, rel=0.01)
        # every tracked tile fires: 6 DMA chunks and the final one
        assert counters[f"gpu{gpu}.tracker_triggers"] == pytest.approx(counters["gpu0.tracker_triggers"])
    sent = result.links.groupby("link")["bytes"].sum()
    assert sent[[f"gpu{i}->gpu{(i + 1) % 8}" for i in range(8)]].sum() == pytest.approx(8 * OUT * 7 / 8, rel=0.01)
    assert sent.sum() == pytest.approx(sent[[f"gpu{i}->gpu{(i + 1) % 8}" for i in range(8)]].sum())  # one direction


@pytest.mark.parametrize("system, algorithm", [(RING8, "ring"), (FC4, "direct")])
def test_a_split_k_gemm_adds_its_partial_tiles_near_memory(system, algorithm):
    """T3 with split-K (dissertation section 8.6.7): every K split stores its partial tile as an
    update, locally or remotely, and the tracker waits for all of them before it triggers a DMA."""
    split = 4
    op = ops.GemmReduceScatter(512, 4096, 4096, algorithm=algorithm, kernel=f"MT128x128x32_T256_SK{split}")
    whole = run(system, replace(op, kernel="MT128x128x32_T256"), "full")
    results = {mode: run(system, op, mode) for mode in ("full", "symmetric")}
    assert results["symmetric"].time_s == pytest.approx(results["full"].time_s, rel=0.03)
    assert results["full"].time_s < 0.9 * whole.time_s  # 32 x 16 whole tiles leave most of the 80 CUs idle
    for result in results.values():
        counters = result.counters
        assert counters["gpu0.tracker_untracked_bytes"] == 0  # no partial arrives after its tile fired
        assert counters["gpu0.tracker_triggers"] == whole.counters["gpu0.tracker_triggers"]
        assert counters["gpu0.tracker_tracked_bytes"] > whole.counters["gpu0.tracker_tracked_bytes"]
        assert counters["gpu0.t3_remote_bytes"] == pytest.approx(split * whole.counters["gpu0.t3_remote_bytes"])
        assert counters.get("gpu0.t3_dma_bytes", 0) == whole.counters.get("gpu0.t3_dma_bytes", 0)
        assert set(result.kernels["name"]) == {f"gemm_rs_MT128x128x32_T256_SK{split}"}  # no reduction kernel
        assert result.ops["workgroups"].iloc[0] == split * whole.ops["workgroups"].iloc[0]
    totals = results["symmetric"].dram_totals().set_index(["stream", "direction"])["bytes"]
    whole_totals = run(system, replace(op, kernel="MT128x128x32_T256")).dram_totals().set_index(["stream", "direction"])["bytes"]
    assert totals[("compute", "update")] == pytest.approx(split * whole_totals[("compute", "update")], rel=0.01)


def test_the_heuristics_split_k_choice_is_kept():
    """A skinny GEMM that the library splits along K keeps its split when fused (it had to drop it
    until T3 added partial tiles near memory)."""
    op = ops.GemmReduceScatter(512, 4096, 8192)
    assert "_SK" in run(RING8, op).ops["impl"].iloc[0]


def test_no_cu_reduces_and_reductions_happen_near_memory():
    result = run(RING8, ops.GemmReduceScatter(M, N, K))
    assert list(result.kernels["name"]) == [result.kernels["name"].iloc[0]]  # only the GEMM kernel
    totals = result.dram_totals().set_index(["stream", "direction"])["bytes"]
    assert totals[("compute", "update")] == pytest.approx(OUT * 7 / 8, rel=0.01)  # local stores are op-and-store
    assert totals[("comm", "update")] == pytest.approx(OUT * 7 / 8, rel=0.01)  # one remote + six DMA chunks arrive
    assert totals[("comm", "read")] == pytest.approx(OUT * 6 / 8, rel=0.01)  # only the DMAs read
    assert ("compute", "write") not in totals.index  # C bypasses the L2: nothing to write back


def test_fusion_overlaps_the_reduce_scatter_with_the_gemm():
    gemm_alone = gpusim.run(RING8, ops.Gemm(M, N, K), mode="symmetric").time_s
    sequential = gpusim.run(RING8, [ops.Gemm(M, N, K, out="y"), ops.ReduceScatter(OUT, input="y")], mode="symmetric")
    fused = run(RING8, ops.GemmReduceScatter(M, N, K))
    assert fused.time_s < 0.8 * sequential.time_s
    assert fused.time_s >= gemm_alone
    spans = [span for span in fused.spans if span.category == "rs step"]
    gemm = next(span for span in fused.spans if span.category == "kernel")
    assert len(spans) == 8 and sum(span.start_ns < gemm.end_ns for span in spans) >= 7  # steps run during the GEMM


def test_staggering_matters():
    staggered = run(RING8, ops.GemmReduceScatter(M, N, K), "full").time_s
    unstaggered = run(RING8, ops.GemmReduceScatter(M, N, K, stagger=False), "full").time_s
    assert unstaggered > 1.05 * staggered
    with pytest.raises(gpusim.OpError, match="symmetric mode"):
        run(RING8, ops.GemmReduceScatter(M, N, K, stagger=False), "symmetric")


def test_a_small_tracker_spills_but_still_completes():
    small = RING8.with_overrides({"gpu.tracker.sets": 2, "gpu.tracker.ways": 2})
    roomy = run(RING8, ops.GemmReduceScatter(M, N, K))
    cramped = run(small, ops.GemmReduceScatter(M, N, K))
    assert roomy.counters["gpu0.tracker_evictions"] == 0
    assert cramped.counters["gpu0.tracker_evictions"] > 100
    assert cramped.counters["gpu0.tracker_max_entries"] <= 4
    assert cramped.counters["gpu0.tracker_triggers"] == roomy.counters["gpu0.tracker_triggers"]
    assert cramped.time_s >= roomy.time_s


def test_mca_chooses_a_threshold_from_the_first_stage_and_protects_the_gemm_under_contention():
    slow_memory = RING8.with_overrides({"gpu.hbm.clock": "250 MHz"})  # a GEMM that needs its DRAM bandwidth
    shape = {"m": 4096, "n": 4256, "k": 2128}
    alone = gpusim.run(slow_memory, ops.Gemm(**shape), mode="symmetric")
    naive = run(slow_memory, ops.GemmReduceScatter(**shape), policy="round-robin")
    mca = run(slow_memory, ops.GemmReduceScatter(**shape), policy="t3-mca")

    def gemm_kernel(result):
        return result.kernels.loc[result.kernels["name"].str.startswith("gemm"), "duration_s"].iloc[0]

    assert gemm_kernel(naive) > 1.05 * gemm_kernel(alone)
    assert gemm_kernel(mca) < gemm_kernel(naive)
    row = mca.ops.iloc[0]
    assert 0 < row["mca_intensity"] <= 1 and row["mca_threshold"] < 1


@pytest.mark.filterwarnings("ignore::gpusim.SymmetricModeWarning")  # symmetric runs of direct ops, here for their errors
def test_bad_uses_are_errors():
    with pytest.raises(gpusim.OpError, match="direct link"):
        run(RING8, ops.GemmReduceScatter(M, N, K, algorithm="direct"))
    with pytest.raises(gpusim.OpError, match="algorithm"):
        ops.GemmReduceScatter(M, N, K, algorithm="tree")
    with pytest.raises(gpusim.OpError, match="field 'k'"):
        ops.GemmReduceScatter(M, N, 0)
    with pytest.raises(gpusim.OpError, match="near-memory op-and-store.*nmc.enabled"):
        run(RING8.with_overrides({"gpu.nmc.enabled": False}), ops.GemmReduceScatter(M, N, K))


def test_a_single_rank_is_just_the_gemm():
    result = run(gpusim.load_system("t3-table8.1"), ops.GemmReduceScatter(M, N, K), mode="full")
    assert result.time_s == pytest.approx(gpusim.run(gpusim.load_system("t3-table8.1"), ops.Gemm(M, N, K)).time_s, rel=0.05)
