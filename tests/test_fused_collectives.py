"""T3's output address-space mapping applied to an all-gather and an all-to-all: a GEMM whose stores start
the collective of its output."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.cli import parse_op
from gpusim.kernels.fused import (
    DMA,
    FINAL,
    REMOTE,
    SEND,
    ChunkLayout,
    Frame,
    direct_all_gather_config,
    direct_all_to_all_config,
    expected_bytes,
    ring_all_gather_config,
)
from tests.test_fused import FC4, RING8, run

HGX = gpusim.load_system("hgx-h200")
M, N, K = 4096, 2048, 2048  # 128 output tiles of 256 x 128: several waves on 80 CUs
SHARD = M * N * 2


def deliveries(configs):
    """(receiver, chunk) -> senders, from every rank's SEND and DMA lines."""
    received = {}
    for config in configs:
        for mapping in config.mappings:
            for dst in mapping.dsts:
                received.setdefault((dst, mapping.chunk), []).append(config.rank)
    return received


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_configuration_relays_each_shard_round_the_ring(n):
    ring = list(range(n))
    configs = [ring_all_gather_config(ring, rank) for rank in ring]
    for rank, config in enumerate(configs):
        assert config.production_order == [rank]  # the GEMM produces only its own shard
        own = config.mappings[rank]
        assert own.kind == SEND and own.dsts == ((rank + 1) % n,) and own.operation == "write"
        for chunk, mapping in enumerate(config.mappings):
            if chunk == rank:
                continue
            assert not mapping.produced and mapping.updates_per_element == 1
            assert mapping.step == (rank - chunk) % n  # hops the shard has made
            assert mapping.kind == (FINAL if chunk == (rank + 1) % n else DMA)
    received = deliveries(configs)
    # every rank receives every other rank's shard exactly once, from its ring predecessor
    assert sorted(received) == sorted((r, q) for r in ring for q in ring if q != r)
    assert all(senders == [(r - 1) % n] for (r, _), senders in received.items())


def test_direct_configuration_stores_the_shard_into_every_peer():
    group = [0, 1, 2, 3]
    configs = [direct_all_gather_config(group, rank) for rank in group]
    for rank, config in enumerate(configs):
        assert config.mappings[rank].kind == SEND
        assert config.mappings[rank].dsts == tuple((rank + step) % 4 for step in (1, 2, 3))  # successor first
        assert all(m.kind == FINAL and not m.produced for c, m in enumerate(config.mappings) if c != rank)
    received = deliveries(configs)
    assert all(senders == [chunk] for (_, chunk), senders in received.items()) and len(received) == 12


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 10), st.lists(st.integers(1, 4096), min_size=1, max_size=20))
def test_every_received_tile_waits_for_one_store_per_element(n, valid):
    layout = ChunkLayout(4096, valid * n, n)
    ring = list(range(n))
    configs = [ring_all_gather_config(ring, r) for r in ring]
    for me in configs:
        full = expected_bytes(me, [c for c in configs if c.rank != me.rank], layout, Frame(me, layout, False))
        for tile, value in enumerate(full):
            own = layout.chunk_of(tile) == me.rank
            assert value == (0 if own else layout.valid[tile])
    mirrored = expected_bytes(configs[0], [configs[0]], layout, Frame(configs[0], layout, True))
    assert mirrored == expected_bytes(configs[0], configs[1:], layout, Frame(configs[0], layout, False))


@pytest.mark.parametrize("system, algorithm", [(RING8, "ring"), (FC4, "direct"), (FC4, "ring")])
def test_symmetric_mode_agrees_with_full_mode(system, algorithm):
    op = ops.GemmAllGather(M, N, K, algorithm=algorithm)
    full = run(system, op, "full")
    symmetric = run(system, op, "symmetric")
    assert symmetric.time_s == pytest.approx(full.time_s, rel=0.03)
    for result in (full, symmetric):
        # only the rank's own shard is written without being counted
        assert result.counters["gpu0.tracker_untracked_bytes"] == SHARD
        assert result.counters["gpu0.tracker_tracked_bytes"] == (system.num_gpus - 1) * SHARD


def test_the_ring_moves_each_shard_once_per_hop_and_only_the_gemm_runs():
    result = run(RING8, ops.GemmAllGather(M, N, K), "full")
    assert list(result.kernels["name"].unique()) == [result.kernels["name"].iloc[0]]  # the GEMM kernel only
    assert result.kernels["name"].iloc[0].startswith("gemm_ag")
    for gpu in range(8):
        assert result.counters[f"gpu{gpu}.t3_remote_bytes"] == SHARD
        assert result.counters[f"gpu{gpu}.t3_dma_bytes"] == 6 * SHARD  # every shard but its own and its successor's
    sent = result.links.groupby("link")["bytes"].sum()
    assert sorted(sent.index) == sorted(f"gpu{i}->gpu{(i + 1) % 8}" for i in range(8))
    assert (sent == 7 * SHARD).all()
    totals = result.dram_totals().groupby(["stream", "direction"])["bytes"].sum()
    assert totals[("compute", "write")] == pytest.approx(8 * SHARD)  # each GEMM writes its shard once, locally
    assert totals[("comm", "write")] == pytest.approx(8 * 7 * SHARD)  # and receives the seven others
    assert totals[("comm", "read")] == pytest.approx(8 * 6 * SHARD)  # the DMAs read what they forward
    assert ("compute", "update") not in totals.index  # plain stores: nothing is reduced


def test_fusion_overlaps_the_gather_with_the_gemm():
    bandwidth = RING8.config.links.bandwidth_bytes_per_s
    gemm = gpusim.run(RING8, ops.Gemm(M, N, K), mode="symmetric").time_s
    sequential = gpusim.run(RING8, [ops.Gemm(M, N, K, out="y"), ops.AllGather(8 * SHARD, input="y")],
                            mode="symmetric").time_s
    fused = run(RING8, ops.GemmAllGather(M, N, K, out="y"))
    assert fused.time_s < 0.9 * sequential
    assert fused.time_s >= max(gemm, 7 * SHARD / bandwidth)
    steps = [span for span in fused.spans if span.category == "ag step"]
    kernel = next(span for span in fused.spans if span.category == "kernel")
    assert len(steps) == 8 and sum(span.start_ns < kernel.end_ns for span in steps) >= 4  # relays start during the GEMM


@pytest.mark.filterwarnings("ignore::gpusim.SymmetricModeWarning")  # symmetric runs of direct ops, here for their errors
def test_bad_uses_are_errors():
    with pytest.raises(gpusim.OpError, match="direct all-gather needs a direct link"):
        run(RING8, ops.GemmAllGather(M, N, K, algorithm="direct"))
    with pytest.raises(gpusim.OpError, match="algorithm"):
        ops.GemmAllGather(M, N, K, algorithm="tree")
    with pytest.raises(gpusim.OpError, match="split-K"):
        run(RING8, ops.GemmAllGather(M, N, K, kernel="MT64x64x32_T256_SK2"))
    assert parse_op("gemm_ag m=8 n=8 k=8 algorithm=direct") == ops.GemmAllGather(8, 8, 8, algorithm="direct")


def test_all_to_all_configuration_sends_chunk_j_to_rank_j_at_the_senders_place():
    group = [0, 1, 2, 3]
    configs = [direct_all_to_all_config(group, rank) for rank in group]
    landed = {}
    for rank, config in enumerate(configs):
        assert config.production_order == [(rank + step) % 4 for step in (1, 2, 3, 0)]  # own chunk last
        assert config.mappings[rank].kind == FINAL and config.mappings[rank].produced
        for chunk, mapping in enumerate(config.mappings):
            if chunk != rank:
                assert mapping.kind == REMOTE and mapping.dsts == (chunk,) and mapping.operation == "write"
                assert mapping.receives and mapping.final  # the space it leaves holds what rank `chunk` sends
                landed.setdefault((chunk, mapping.lands_at), []).append((rank, chunk))
    # rank r's place s holds rank s's chunk r, for every s != r
    assert landed == {(r, s): [(s, r)] for r in group for s in group if s != r}


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.integers(1, 6), st.integers(1, 4096))
def test_an_all_to_all_place_waits_for_what_its_sender_stores(n, per_chunk, tile_bytes):
    layout = ChunkLayout(4096, [tile_bytes] * (n * per_chunk), n)
    group = list(range(n))
    configs = [direct_all_to_all_config(group, r) for r in group]
    for me in configs:
        full = expected_bytes(me, [c for c in configs if c.rank != me.rank], layout, Frame(me, layout, False))
        assert full == [tile_bytes] * layout.tiles  # every place: its sender's store, or the local one
    mirrored = expected_bytes(configs[0], [configs[0]], layout, Frame(configs[0], layout, True))
    assert mirrored == expected_bytes(configs[0], configs[1:], layout, Frame(configs[0], layout, False))


@pytest.mark.parametrize("system", [FC4, HGX], ids=["fully-connected", "switch"])
def test_all_to_all_symmetric_mode_agrees_with_full_mode(system):
    op = ops.GemmAllToAll(M, N, K)
    full = run(system, op, "full")
    symmetric = run(system, op, "symmetric")
    assert symmetric.time_s == pytest.approx(full.time_s, rel=0.03)
    for result in (full, symmetric):
        assert result.counters["gpu0.tracker_tracked_bytes"] == SHARD
        assert result.counters["gpu0.tracker_untracked_bytes"] == 0


def test_all_to_all_stores_every_chunk_once_and_keeps_only_its_own():
    result = run(FC4, ops.GemmAllToAll(M, N, K), "full")
    sent = result.links.groupby("link")["bytes"].sum()
    assert len(sent) == 12 and (sent == SHARD / 4).all()
    for gpu in range(4):
        assert result.counters[f"gpu{gpu}.t3_remote_bytes"] == 3 * SHARD / 4
        assert result.counters.get(f"gpu{gpu}.t3_dma_bytes", 0) == 0
    totals = result.dram_totals().groupby(["stream", "direction"])["bytes"].sum()
    assert totals[("compute", "write")] == pytest.approx(4 * SHARD / 4)  # each GPU writes only its own chunk
    assert totals[("comm", "write")] == pytest.approx(4 * 3 * SHARD / 4)
    assert ("comm", "read") not in totals.index  # no DMA: the GEMM's stores are the whole exchange


def test_all_to_all_fusion_hides_the_exchange_behind_the_gemm():
    sequential = gpusim.run(HGX, [ops.Gemm(M, N, K, out="y"), ops.AllToAll(SHARD, input="y")],
                            mode="symmetric").time_s
    gemm = gpusim.run(HGX, ops.Gemm(M, N, K), mode="symmetric").time_s
    fused = run(HGX, ops.GemmAllToAll(M, N, K)).time_s
    assert gemm <= fused < 0.8 * sequential


@pytest.mark.filterwarnings("ignore::gpusim.SymmetricModeWarning")  # symmetric runs of direct ops, here for their errors
def test_bad_all_to_alls_are_errors():
    with pytest.raises(gpusim.OpError, match="direct all-to-all needs a direct link"):
        run(RING8, ops.GemmAllToAll(M, N, K))
    with pytest.raises(gpusim.OpError, match="algorithm"):
        ops.GemmAllToAll(M, N, K, algorithm="ring")
    assert parse_op("gemm_a2a m=8 n=8 k=8").collective == "alltoall"


A100_NODE = gpusim.load_system("a100-4-nvlink")  # its L2 takes NVLink writes and writes them back later


LATE_CASES = [pytest.param(system, fused, id=f"{name}-{fused.__name__}")
              for name, system in (("ring8", RING8), ("fc4", FC4), ("a100-4", A100_NODE))
              for fused in (ops.GemmReduceScatter, ops.GemmAllGather, ops.GemmAllToAll)
              if not (fused is ops.GemmAllToAll and system is RING8)]  # an all-to-all needs direct links


@pytest.mark.parametrize("system, fused", LATE_CASES)
@pytest.mark.parametrize("before", ["delay", "gemm"])
def test_a_rank_that_reaches_the_op_late_still_has_every_update_counted(system, fused, before):
    """Rank 0 reaches the op 20 us late, or after a GEMM of its own that gave its buffers other
    addresses: its peers store into its output only once its tracker is armed, at its own addresses."""
    op = fused(512, 512, 256)
    late = ops.Delay(20e-6, ranks=[0]) if before == "delay" else ops.Gemm(1024, 1024, 1024, ranks=[0])
    together = gpusim.run(system, [op], mode="full")
    result = gpusim.run(system, [late, op], mode="full")
    counters = result.counters
    late_end = result.ops[result.ops["op_id"] == late.uid]["end_s"].max()
    for gpu in range(system.num_gpus):
        for counter in ("tracked_bytes", "untracked_bytes", "triggers"):  # an all-gather's own shard is untracked
            assert counters[f"gpu{gpu}.tracker_{counter}"] == together.counters[f"gpu{gpu}.tracker_{counter}"]
    fused_rows = result.ops[result.ops["op_id"] == op.uid]
    assert len(fused_rows) == system.num_gpus
    assert (fused_rows["end_s"] > late_end).all()  # no rank's collective ends before rank 0 has started it
