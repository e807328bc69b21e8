"""T3's tracker on the consumer side (dissertation section 8.6.2): :class:`gpusim.ops.AllGatherGemm`,
an all-gather whose arriving chunks trigger the workgroups of the one GEMM kernel that reads them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.cli import parse_op
from gpusim.errors import OpError
from gpusim.hw.compute import WAITING_PREFIX, Kernel, StallClock, WorkgroupShape
from gpusim.trace import transformer
from gpusim.trace.breakdown import breakdown
from gpusim.trace.fusion import overlap_gather_gemms, overlap_report

RING4 = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": 4})


def test_one_kernel_hides_the_gather_where_a_kernel_per_chunk_cannot():
    """8192 x 1596 x 4256 (T-NLG's QKV GEMM on 8 GPUs): a chunk's 1024 rows give 104 tiles for 80
    CUs, so the decomposition pays a second, mostly idle wave per chunk; the tracked GEMM runs as one
    kernel and ends within 10% of the GEMM alone (the gather's writes contend with its reads: 3-11%
    for neighbouring widths), far sooner than the gather then the GEMM."""
    ring8 = gpusim.load_system("t3-ring8")
    m, n, k = 8192, 1596, 4256
    tracked = gpusim.run(ring8, ops.AllGatherGemm(m, n, k), mode="symmetric")
    decomposed = gpusim.run(ring8, ops.DecomposedAllGatherGemm(m, n, k, driver="dma"), mode="symmetric").time_s
    gemm = gpusim.run(ring8, ops.Gemm(m, n, k), mode="symmetric").time_s
    in_turn = gpusim.run(ring8, [ops.AllGather(m * k * 2, out="x"), ops.Gemm(m, n, k, a="x")], mode="symmetric").time_s
    assert tracked.time_s < 1.1 * gemm and gemm < 0.9 * decomposed < in_turn and tracked.time_s < decomposed
    gemms = tracked.kernels[tracked.kernels["name"].str.startswith("gemm")]
    assert list(gemms["name"]) == [gemms["name"].iloc[0]] and gemms["name"].iloc[0].startswith("gemm_ag_tracked")
    assert tracked.ops["impl"].iloc[0].startswith("t3_ring_ag_gemm")


def test_workgroups_wait_for_their_rows():
    """With a slow ring the GEMM cannot end before the last chunk has arrived: the pair takes at least
    the DMA all-gather alone, and its kernel runs most of that time."""
    slow = RING4.with_overrides({"links.bandwidth": "2 GB/s"})
    m, n, k = 2048, 1024, 1024
    tracked = gpusim.run(slow, ops.AllGatherGemm(m, n, k), mode="symmetric")
    gather = gpusim.run(slow, ops.AllGather(m * k * 2, driver="dma"), mode="symmetric").time_s
    gemm = gpusim.run(slow, ops.Gemm(m, n, k), mode="symmetric").time_s
    assert gemm < 0.2 * gather  # the ring binds
    assert gather <= tracked.time_s < 1.1 * gather
    assert tracked.kernels["duration_s"].max() > 0.8 * gather


def test_the_times_all_workgroups_wait_are_exposed_communication():
    """On 25 GB/s links the kernel runs out of arrived rows between chunks: those intervals are
    ``waiting:`` spans inside its span, and the breakdown counts them as exposed communication, not
    compute; on the preset's 75 GB/s links the rows come in time."""
    for bandwidth, waits in (("25 GB/s", True), ("75 GB/s", False)):
        system = gpusim.load_system("t3-ring8", {"links.bandwidth": bandwidth})
        result = gpusim.run(system, ops.AllGatherGemm(8192, 1596, 4256), mode="symmetric")
        kernels = result.kernels
        waiting = kernels[kernels["name"].str.startswith(WAITING_PREFIX)].sort_values("start_s")
        (gemm,) = kernels[kernels["name"].str.startswith("gemm")].itertuples()
        assert (len(waiting) > 0) == waits
        assert (waiting["start_s"] >= gemm.start_s).all() and (waiting["end_s"] <= gemm.end_s).all()
        assert (waiting["start_s"].iloc[1:].to_numpy() >= waiting["end_s"].iloc[:-1].to_numpy()).all()
        parts = breakdown(result.ops, result.kernels).iloc[0]
        assert parts.exposed_comm_s == pytest.approx(waiting["duration_s"].sum(), abs=1e-9)
        assert parts.compute_s + parts.exposed_comm_s + parts.idle_s == pytest.approx(parts.total_s)


def test_stall_clock_intervals():
    """A kernel stalls while a resident workgroup waits and none works."""
    kernel = Kernel("k", 4, WorkgroupShape(threads=64), body=lambda wg, cu: iter(()))
    clock = StallClock(kernel)
    clock.starts(0.0, waits=True)    # alone, waiting: stalled from 0
    clock.starts(1.0, waits=False)   # another works: up to 1
    clock.ends(3.0)                  # it finished, the first still waits: stalled from 3
    clock.resumes(5.0)               # its rows arrived
    clock.starts(5.0, waits=True)    # a third waits while the first works
    clock.ends(6.0)                  # the first finished: stalled from 6
    clock.resumes(6.0)               # ...for no time
    clock.ends(7.0)
    assert kernel.stalls == [(0.0, 1.0), (3.0, 5.0)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "wait", "resume", "end"]), st.floats(0, 10)), max_size=40))
def test_stalls_are_ordered_disjoint_and_non_empty(events):
    kernel = Kernel("k", 1, WorkgroupShape(threads=64), body=lambda wg, cu: iter(()))
    clock = StallClock(kernel)
    now, waiting, working = 0.0, 0, 0
    for kind, step in events:
        now += step
        if kind == "start" or (kind == "end" and not working) or (kind == "resume" and not waiting):
            clock.starts(now, waits=False)
            working += 1
        elif kind == "wait":
            clock.starts(now, waits=True)
            waiting += 1
        elif kind == "resume":
            clock.resumes(now)
            waiting, working = waiting - 1, working + 1
        else:
            clock.ends(now)
            working -= 1
    assert all(start < end for start, end in kernel.stalls)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(kernel.stalls, kernel.stalls[1:]))


@pytest.mark.parametrize("mode", ["full", "symmetric"])
def test_every_rank_forwards_every_chunk_but_its_neighbours_once(mode):
    m, n, k = 4096, 1536, 1024
    result = gpusim.run(RING4, ops.AllGatherGemm(m, n, k), mode=mode)
    per_link = result.links.groupby(["src", "dst"])["bytes"].sum()
    ring = {(0, 1), (1, 2), (2, 3), (3, 0)} if mode == "full" else {(0, 1)}  # symmetric: GPU 0's own link
    assert set(per_link.index) == ring
    assert per_link.to_numpy() == pytest.approx(3 * m * k * 2 / 4)  # three chunks of A's rows over each link
    assert result.ops["chunks"].iloc[0] == 4


def test_symmetric_mode_agrees_with_full_mode():
    op = ops.AllGatherGemm(4096, 1536, 1024)
    full, symmetric = (gpusim.run(RING4, op, mode=mode).time_s for mode in ("full", "symmetric"))
    assert symmetric == pytest.approx(full, rel=0.03)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.integers(1, 6), st.sampled_from([64, 200, 512]), st.sampled_from([64, 96, 256]))
def test_any_shape_ends_after_its_gather(ranks, rows_per_rank, n, k):
    """No deadlock, whatever the chunk (down to a few rows, tiles that straddle chunks): every rank's
    GEMM ends no sooner than its input has gone round the ring, and the ring moves each byte once."""
    system = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": ranks})
    m = 16 * rows_per_rank * ranks
    result = gpusim.run(system, ops.AllGatherGemm(m, n, k), mode="full")
    assert result.links["bytes"].sum() == ranks * (ranks - 1) * m * k * 2 // ranks
    gather = gpusim.run(system, ops.AllGather(m * k * 2, driver="dma"), mode="full").time_s
    assert result.time_s >= 0.97 * gather


def test_bad_uses_are_errors():
    with pytest.raises(OpError, match="m = 1001 rows do not split evenly into 4 chunks"):
        gpusim.run(RING4, ops.AllGatherGemm(1001, 64, 64), mode="symmetric")
    with pytest.raises(OpError, match="field 'batch' must be 1"):
        ops.AllGatherGemm(1024, 64, 64, batch=2)
    assert parse_op("ag_gemm m=1024 n=64 k=64") == ops.AllGatherGemm(1024, 64, 64)


def test_a_sequence_parallel_layer_overlaps_its_gathers_with_t3():
    """The trace rewrite's ``t3`` rows replay as the tracked op, and beat the kernel-per-chunk overlap."""
    layer = transformer("megatron-gpt2", phase="prompt", tp=4, batch=1, seq_len=512, layers=1, head=False,
                        sequence_parallel=True)
    system = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": 4})
    times = {}
    for function in ("decomposed_dma", "t3"):
        rewritten = overlap_gather_gemms(layer, function)
        report = overlap_report(rewritten)
        assert set(report.loc[report["status"] == "overlapped", "function"]) == {function}
        result = rewritten.replay(system, mode="symmetric")
        times[function] = result.time_s
        impls = result.ops["impl"].astype(str)
        assert impls.str.startswith("t3_ring_ag_gemm").any() == (function == "t3")
    assert times["t3"] < times["decomposed_dma"]
