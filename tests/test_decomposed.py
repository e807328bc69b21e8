"""The GEMM and its ring reduce-scatter overlapped in software by decomposition (T3's software rival)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.errors import OpError
from gpusim.kernels.decomposed import COMM_LANE_SUFFIX
from gpusim.sched.executor import Stream

RING8 = gpusim.load_system("t3-ring8")
RING4 = RING8.with_overrides({"num_gpus": 4})
M, N, K = 2048, 3072, 384
OUT = M * N * 2


def decomposed(**fields) -> ops.DecomposedGemmReduceScatter:
    shape = dict(m=M, n=N, k=K, dtype="fp16", out="y", channels=16, name="GEMM+RS")
    return ops.DecomposedGemmReduceScatter(**{**shape, **fields})


def test_the_gemm_runs_as_one_kernel_per_chunk_beside_the_reduce_scatter():
    result = gpusim.run(RING8, decomposed(), mode="symmetric")
    kernels = result.kernels.sort_values("start_s")
    chunks = kernels[kernels["name"].str.startswith("gemm_chunk")]
    ring = kernels[kernels["name"].str.startswith("rs_ring")]
    assert len(chunks) == 8 and len(ring) == 1
    assert (chunks["stream"] == "compute").all() and ring["stream"].iloc[0] == "compute" + COMM_LANE_SUFFIX
    assert (chunks["workgroups"] == chunks["workgroups"].iloc[0]).all()
    # one after another on the compute CUs, while the reduce-scatter runs from the first to past the last
    assert (chunks["start_s"].values[1:] >= chunks["end_s"].values[:-1]).all()
    assert ring["start_s"].iloc[0] < chunks["end_s"].iloc[0]
    assert ring["end_s"].iloc[0] > chunks["end_s"].iloc[-1]
    op = result.ops.iloc[0]
    assert op["chunks"] == 8 and op["channels"] == 16 and op["gemm_cus"] == RING8.gpu.num_cus - 16


def test_the_overlap_hides_communication_that_running_in_turn_exposes():
    """Decomposed, the sub-layer is shorter than its chunks then the reduce-scatter on the same CUs,
    and it cannot end before its GEMM chunks have."""
    gemm_cus, comm_cus = tuple(range(64)), tuple(range(64, 80))
    gemms = gpusim.run(RING8, [ops.Gemm(M // 8, N, K, out=f"c{i}") for i in range(8)],
                       streams=[Stream("compute", gemm_cus)] * 8, mode="symmetric")
    reduce_scatter = gpusim.run(RING8, ops.ReduceScatter(OUT, channels=16), streams=[Stream("comm", comm_cus)],
                                mode="symmetric")
    result = gpusim.run(RING8, decomposed(), mode="symmetric")
    chunks = result.kernels[result.kernels["name"].str.startswith("gemm_chunk")]
    assert chunks["end_s"].max() < result.time_s < 0.8 * (gemms.time_s + reduce_scatter.time_s)


def test_fewer_cus_for_the_gemm_slow_its_chunks():
    few = gpusim.run(RING8, decomposed(m=8192, k=1024, channels=40), mode="symmetric").kernels
    many = gpusim.run(RING8, decomposed(m=8192, k=1024, channels=8), mode="symmetric").kernels
    span = {name: k[k["name"].str.startswith("gemm_chunk")] for name, k in (("few", few), ("many", many))}
    assert (span["few"]["end_s"].max() - span["few"]["start_s"].min()) > 1.3 * (
        span["many"]["end_s"].max() - span["many"]["start_s"].min())


def test_dma_driven_the_gemm_keeps_every_cu_and_stores_updates():
    result = gpusim.run(RING8, decomposed(driver="dma"), mode="symmetric")
    assert set(result.kernels["name"].str[:10]) == {"gemm_chunk"}  # no reduce-scatter kernel
    op = result.ops.iloc[0]
    assert op["gemm_cus"] == RING8.gpu.num_cus and op["impl"].startswith("decomposed_dma_rs")
    updates = result.dram[result.dram["direction"] == "update"]
    compute_updates = updates.loc[updates["stream"] == "compute", "bytes"].sum()
    assert compute_updates == pytest.approx(OUT, rel=0.01)  # every partial tile lands as an update
    assert updates.loc[updates["stream"] != "compute", "bytes"].sum() == pytest.approx(7 / 8 * OUT, rel=0.01)


def test_dma_driven_without_near_memory_alus_is_an_op_error():
    plain = RING8.with_overrides({"gpu.nmc.enabled": False})
    with pytest.raises(OpError, match="driver 'dma' reduces with near-memory op-and-store"):
        gpusim.run(plain, decomposed(driver="dma"), mode="symmetric")


@pytest.mark.parametrize("driver", ["cu", "dma"])
def test_symmetric_mode_agrees_with_full_mode(driver):
    full = gpusim.run(RING4, decomposed(m=4096, driver=driver), mode="full")
    symmetric = gpusim.run(RING4, decomposed(m=4096, driver=driver), mode="symmetric")
    assert symmetric.time_s == pytest.approx(full.time_s, rel=0.03)
    assert full.ops["gpu"].nunique() == 4


@pytest.mark.parametrize("driver", ["cu", "dma"])
def test_the_links_carry_the_ring_reduce_scatters_volume(driver):
    result = gpusim.run(RING4, decomposed(m=1024, driver=driver), mode="full")
    per_link = result.links.groupby("link")["bytes"].sum()
    sent = per_link[[f"gpu{i}->gpu{(i + 1) % 4}" for i in range(4)]]
    assert sent.sum() == pytest.approx(4 * 3 / 4 * 1024 * N * 2, rel=0.001)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(1, 4), st.sampled_from([256, 1024]), st.integers(1, 24),
       st.sampled_from(["cu", "dma"]), st.sampled_from([1, 2, 4]))
def test_any_split_finishes_after_its_gemm_and_the_ring_bound(ranks, rows_per_rank, n, channels, driver, splits):
    """No deadlock whatever the chunk, kernel and CU split or driver, never faster than the GEMM chunks or
    the links, and the links carry exactly the ring reduce-scatter's bytes."""
    system = RING8.with_overrides({"num_gpus": ranks})
    m = ranks * 64 * rows_per_rank * splits
    result = gpusim.run(system, decomposed(m=m, n=n, k=256, channels=channels, driver=driver, splits=splits),
                        mode="full")
    chunks = result.kernels[(result.kernels["gpu"] == 0) & result.kernels["name"].str.startswith("gemm_chunk")]
    assert len(chunks) == ranks * splits
    link_bound = (ranks - 1) / ranks * m * n * 2 / system.config.links.bandwidth_bytes_per_s
    assert result.time_s >= max(chunks["end_s"].max(), link_bound)
    assert result.links["bytes"].sum() == pytest.approx(ranks * (ranks - 1) / ranks * m * n * 2, rel=0.001)


@pytest.mark.parametrize("driver", ["cu", "dma"])
def test_with_two_kernels_per_chunk_the_ring_starts_sooner(driver):
    """The ring sends the first kernel's rows without waiting for the chunk's second kernel: its first
    bytes leave as much sooner, after the first kernel, as that kernel ends before the whole chunk would."""
    runs = {splits: gpusim.run(RING4, decomposed(m=4096, driver=driver, splits=splits), mode="symmetric", bin_s=1e-7)
            for splits in (1, 2)}
    names = [name for name in runs[2].kernels["name"] if name.startswith("gemm_chunk")]
    assert [name.split("_")[1] for name in names] == [f"chunk{s}.{i}" for s in range(4) for i in range(2)]
    assert runs[2].ops["splits"].iloc[0] == 2

    def first_kernel_end(result):
        chunks = result.kernels[result.kernels["name"].str.startswith("gemm_chunk")]
        return chunks.sort_values("start_s")["end_s"].iloc[0]

    head_start = first_kernel_end(runs[1]) - first_kernel_end(runs[2])
    first_sent = {splits: result.links["t_s"].min() for splits, result in runs.items()}  # 0.1 us bins
    assert first_sent[2] >= first_kernel_end(runs[2])
    assert first_sent[1] - first_sent[2] == pytest.approx(head_start, rel=0.25)


def test_on_a_fully_connected_node_every_channel_takes_the_producers_ring():
    """A plain reduce-scatter spreads its channels over several rings (every link); the decomposed one's
    channels all follow the ring its chunks are produced for, so only that ring's links carry data and
    no channel waits for a chunk produced late in its own ring order."""
    node = gpusim.load_system("a100-4-nvlink")
    m, n, k = 4096, 8192, 2048
    plain = gpusim.run(node, ops.ReduceScatter(m * n * 2, channels=8), mode="full")
    assert len(plain.links.groupby(["src", "dst"])) == 12
    result = gpusim.run(node, ops.DecomposedGemmReduceScatter(m, n, k, channels=8), mode="full")
    ring = node.topology.ring_order
    assert set(map(tuple, result.links[["src", "dst"]].drop_duplicates().values)) == {
        (ring[i], ring[(i + 1) % 4]) for i in range(4)}
    sequential = gpusim.run(node, [ops.Gemm(m, n, k), ops.ReduceScatter(m * n * 2, channels=8)], mode="full")
    assert result.time_s < 0.95 * sequential.time_s


def test_one_rank_runs_the_gemm_alone():
    result = gpusim.run(RING8, decomposed(ranks=[0]), mode="full")
    assert list(result.kernels["name"].str.startswith("gemm_")) == [True]


@pytest.mark.parametrize("fields, message", [
    ({"m": 1004}, "m = 1004 rows do not split evenly into 8 chunks, one per rank"),
    ({"m": 1032, "splits": 2}, "m = 1032 rows do not split evenly into 8 chunks of 2 kernels each"),
    ({"m": 16384, "channels": 80}, "leave none of the stream's 80 to the GEMM"),
])
def test_splits_that_cannot_run_are_op_errors(fields, message):
    with pytest.raises(OpError, match=message):
        gpusim.run(RING8, decomposed(**fields), mode="symmetric")


@pytest.mark.parametrize("fields, message", [
    ({"batch": 2}, "field 'batch' must be 1"),
    ({"channels": 0}, "channels"),
    ({"splits": 0}, "splits"),
    ({"driver": "nccl"}, "field 'driver'"),
])
def test_bad_fields_are_named(fields, message):
    with pytest.raises(OpError, match=message):
        decomposed(**fields)


def test_a_dma_driven_chunk_may_split_k_and_adds_its_partials_in_place():
    """DMA-driven, each K split's partial tile is a near-memory update of the chunk: no reduction
    kernel, and the chunks' local updates are the splits' partials."""
    whole = gpusim.run(RING8, decomposed(kernel="MT128x128x32_T256", driver="dma", channels=None), mode="symmetric")
    split = gpusim.run(RING8, decomposed(kernel="MT128x128x32_T256_SK2", driver="dma", channels=None), mode="symmetric")
    assert not split.kernels["name"].str.startswith("splitk_reduce").any()
    assert split.kernels["name"].str.startswith("gemm_chunk").sum() == 8

    def local_updates(result):
        totals = result.dram_totals().set_index(["stream", "direction"])["bytes"]
        return totals[("compute", "update")], totals[("comm", "update")]

    (whole_local, whole_incoming), (split_local, split_incoming) = local_updates(whole), local_updates(split)
    assert split_local == pytest.approx(2 * whole_local, rel=0.01)
    assert split_incoming == pytest.approx(whole_incoming, rel=0.01)  # one DMA update per element and step


def test_a_cu_driven_chunk_may_split_k_and_the_ring_reads_it_after_its_reduction():
    """CU-driven, each chunk is a plain GEMM: a split-K kernel runs, and each chunk's reduction kernel
    ends before the ring kernel's step that reads the chunk (the ring still ends last)."""
    result = gpusim.run(RING8, decomposed(kernel="MT128x128x32_T256_SK2"), mode="symmetric")
    kernels = result.kernels.sort_values("start_s")
    reductions = kernels[kernels["name"].str.startswith("splitk_reduce")]
    chunks = kernels[kernels["name"].str.startswith("gemm_chunk")]
    assert len(reductions) == len(chunks) == 8
    assert (reductions["start_s"].to_numpy() >= chunks["end_s"].to_numpy()).all()
    ring = kernels[kernels["name"].str.startswith("rs_ring")]
    assert ring["end_s"].max() >= reductions["end_s"].max()
