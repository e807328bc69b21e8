"""An all-gather overlapped with the GEMM that consumes it: :class:`gpusim.ops.DecomposedAllGatherGemm`,
the ``collective_gemm`` row kind and :func:`gpusim.trace.fusion.overlap_gather_gemms`."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.errors import ConfigError, OpError, TraceError
from gpusim.trace import Trace, transformer
from gpusim.trace.fusion import overlap_gather_gemms, overlap_gemm_collectives, overlap_report
from gpusim.trace.models import ModelConfig, load_model

RING4 = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": 4})
TINY = load_model(ModelConfig(name="tiny", hidden=256, layers=4, heads=4, vocab=1024, seq_len=64, batch=4), heads=8)
M, N, K = 4096, 1536, 1024
GATHERED = M * K * 2
GROUP = "0 1 2 3"


# -- the op -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("driver", "channels"), [("dma", None), ("cu", 8)])
def test_the_decomposition_beats_gather_then_gemm_and_not_its_bounds(driver, channels):
    """Overlapped, the pair takes less than the all-gather then the GEMM, and longer than the all-gather
    (on a large pair: on the other tests' a chunk's kernel is too small to gain).  The GEMM alone is no
    bound: its chunks may pick a tile that quantizes better."""
    m, n, k = 8192, 3072, 2048
    overlapped = gpusim.run(RING4, ops.DecomposedAllGatherGemm(m, n, k, a="x", driver=driver, channels=channels),
                            mode="symmetric").time_s
    gather = gpusim.run(RING4, ops.AllGather(m * k * 2), mode="symmetric").time_s
    in_turn = gpusim.run(RING4, [ops.AllGather(m * k * 2, out="x"), ops.Gemm(m, n, k, a="x")], mode="symmetric").time_s
    assert gather < overlapped < in_turn


def test_every_rank_sends_every_chunk_but_its_neighbours_once():
    """Full mode, DMA-driven: each of the 4 ranks forwards 3 chunks of A over its ring link, nothing more."""
    result = gpusim.run(RING4, ops.DecomposedAllGatherGemm(M, N, K, a="x", driver="dma"), mode="full")
    assert result.links["bytes"].sum() == 4 * 3 * GATHERED // 4


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.integers(1, 6), st.sampled_from([64, 200, 512]), st.sampled_from([64, 96, 256]),
       st.sampled_from(["dma", "cu"]))
def test_any_shape_gathers_every_byte_once_and_ends(ranks, rows_per_rank, n, k, driver):
    """No deadlock, whatever the chunk (down to a few rows); each rank forwards ``ranks - 1`` chunks of
    A to its neighbour (the CU ring's protocol adds its flags to the payload), and the GEMM runs once
    per chunk on every rank."""
    system = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": ranks})
    m = 16 * rows_per_rank * ranks
    op = ops.DecomposedAllGatherGemm(m, n, k, driver=driver, channels=None if driver == "dma" else 4)
    result = gpusim.run(system, op, mode="full")
    sent = round(result.links["bytes"].sum())  # whole bytes: the link table's time bins split a packet between them
    payload = ranks * (ranks - 1) * m * k * 2 // ranks
    assert sent == payload if driver == "dma" else payload <= sent <= 1.25 * payload
    chunks = result.kernels[result.kernels["name"].str.startswith("gemm_chunk")]
    assert len(chunks) == ranks * ranks


def test_full_and_symmetric_mode_agree():
    op = ops.DecomposedAllGatherGemm(M, N, K, a="x", driver="dma")
    full = gpusim.run(RING4, op, mode="full").time_s
    assert gpusim.run(RING4, op.copy(), mode="symmetric").time_s == pytest.approx(full, rel=0.03)


def test_the_gemm_chunks_run_in_ring_order_after_their_data():
    """Four chunk kernels, one after another; the first (the rank's own chunk) before any data arrives."""
    result = gpusim.run(RING4, ops.DecomposedAllGatherGemm(M, N, K, a="x", driver="dma"), mode="full")
    kernels = result.kernels[(result.kernels["gpu"] == 0) & result.kernels["name"].str.startswith("gemm_chunk")]
    assert kernels["name"].str.slice(0, 11).tolist() == [f"gemm_chunk{i}" for i in range(4)]
    assert (kernels["start_s"].diff().dropna() > 0).all()


@pytest.mark.parametrize(("fields", "message"), [
    ({"driver": "nccl"}, "driver"),
    ({"batch": 2}, "field 'batch' must be 1"),
    ({"channels": 0}, "channels"),
])  # fmt: skip
def test_bad_fields_are_op_errors(fields, message):
    with pytest.raises(OpError, match=message):
        ops.DecomposedAllGatherGemm(M, N, K, **fields)


def test_rows_that_do_not_split_over_the_ranks_are_an_error_naming_the_op():
    with pytest.raises(OpError, match="m = 4098 rows do not split evenly into 4 chunks"):
        gpusim.run(RING4, ops.DecomposedAllGatherGemm(M + 2, N, K, driver="dma"), mode="symmetric")


# -- the row kind -------------------------------------------------------------------------------------
def gather_row(**fields) -> pd.DataFrame:
    row = dict(op_id=1, gpu=0, stream="compute", kind="collective_gemm", m=M, n=N, k=K, collective="allgather",
               group="0")
    return pd.DataFrame([{**row, **fields}])


def test_a_collective_gemm_row_is_dma_driven_unless_it_says_otherwise():
    assert Trace(gather_row()).frame["function"].iloc[0] == "decomposed_dma"


@pytest.mark.parametrize(("fields", "field", "expected"), [
    ({"function": "nccl"}, "function", "decomposed_dma, decomposed, t3"),
    ({"collective": "reducescatter"}, "collective", "must be one of allgather"),
    ({"algorithm": "direct"}, "algorithm", "ring, auto"),
    ({"trans_a": True}, "trans_a", "concatenates whole rows of A"),
    ({"batch": 2}, "batch", "must be 1"),
    ({"m": 1023, "group": "0 1"}, "m", "split evenly over the 2 ranks"),
    ({"channels": 8}, "channels", "must be blank for a decomposed_dma collective_gemm"),
    ({"splits": 2}, "splits", "must be blank except on a decomposed"),
    ({"async_collective": True}, "async_collective", "only a gemm_collective"),
])  # fmt: skip
def test_a_bad_collective_gemm_row_names_its_field(fields, field, expected):
    with pytest.raises(TraceError, match=rf"row 0 \(op_id 1, gpu 0\): field '{field}'.*{expected}"):
        Trace(gather_row(**fields), "bad.csv")


@pytest.mark.parametrize(("function", "fields", "driver"), [("decomposed_dma", {}, "dma"),
                                                            ("decomposed", {"channels": 8}, "cu")])
def test_a_replayed_row_is_the_op_it_describes(function, fields, driver):
    trace = Trace(pd.concat([gather_row(gpu=gpu, group=GROUP, function=function, **fields) for gpu in range(4)]))
    replayed = gpusim.run(RING4, trace, mode="symmetric")
    direct = gpusim.run(RING4, ops.DecomposedAllGatherGemm(M, N, K, driver=driver, **fields), mode="symmetric")
    assert replayed.time_s == pytest.approx(direct.time_s, rel=1e-12)
    assert replayed.ops["kind"].iloc[0] == "fused"


def test_communication_bytes_count_the_gathered_input():
    trace = Trace(pd.concat([gather_row(gpu=gpu, group=GROUP) for gpu in range(4)]))
    assert trace.communication_bytes()[["kind", "collective", "bytes"]].values.tolist() == [
        ["collective_gemm", "allgather", GATHERED]]


# -- the rewrite --------------------------------------------------------------------------------------
def gather_then(gemm: dict, extra: list[dict] | None = None) -> Trace:
    """An all-gather of ``GATHERED`` bytes on every rank of RING4, then ``gemm`` and ``extra`` rows."""
    rows = []
    for gpu in range(4):
        rows.append(dict(op_id=1, gpu=gpu, stream="compute", kind="collective", name="ln_gather",
                         collective="allgather", bytes=GATHERED, group=GROUP))
        rows.append({"op_id": 2, "gpu": gpu, "stream": "compute", "kind": "gemm", "name": "fc1", **gemm})
        rows += [{**row, "gpu": gpu} for row in extra or []]
    return Trace(pd.DataFrame(rows), "hand-made")


def test_an_all_gather_and_the_gemm_after_it_become_one_row_that_its_consumers_wait_for():
    wgrad = dict(op_id=3, stream="compute", kind="gemm", name="wgrad", m=K, n=N, k=M, trans_a=True, deps="1")
    trace = overlap_gather_gemms(gather_then(dict(m=M, n=N, k=K), [wgrad]))
    frame = trace.frame
    assert frame["kind"].tolist() == ["collective_gemm", "gemm"] * 4
    fused = frame[frame["kind"] == "collective_gemm"].iloc[0]
    assert (fused["name"], fused["function"], fused["group"]) == ("ln_gather+fc1", "decomposed_dma", GROUP)
    assert (frame.loc[frame["kind"] == "gemm", "deps"] == str(fused["op_id"])).all()
    report = overlap_report(trace)
    assert report[["collective_op_id", "function", "gemm_op_id", "status"]].values.tolist() == [
        [1, "decomposed_dma", 2, "overlapped"]]
    result = gpusim.run(RING4, trace, mode="symmetric")
    direct = gpusim.run(RING4, [ops.DecomposedAllGatherGemm(M, N, K, driver="dma"),
                                ops.Gemm(K, N, M, trans_a=True)], mode="symmetric")
    assert result.time_s == pytest.approx(direct.time_s, rel=1e-9)


@pytest.mark.parametrize(("gemm", "extra", "reason"), [
    (dict(m=K, n=N, k=M, trans_a=True), [], "untransposed A"),  # the gathered tensor along K (a weight gradient)
    (dict(m=M, n=N, k=K // 2), [], "untransposed A"),
    (dict(m=M, n=N, k=K, dtype="fp32"), [], "untransposed A"),
])  # fmt: skip
def test_an_all_gather_the_rewrite_cannot_overlap_is_left_as_it_was_and_reported(gemm, extra, reason):
    trace = gather_then(gemm, extra)
    rewritten = overlap_gather_gemms(trace)
    pd.testing.assert_frame_equal(rewritten.frame, trace.frame)
    report = overlap_report(rewritten)
    assert report["status"].tolist() == ["skipped"] and reason in report["reason"].iloc[0]


def test_an_all_gather_not_followed_by_a_gemm_is_left_alone():
    rows = [dict(op_id=1, gpu=gpu, stream="compute", kind="collective", collective="allgather", bytes=GATHERED,
                 group=GROUP) for gpu in range(4)]
    report = overlap_report(overlap_gather_gemms(Trace(pd.DataFrame(rows))))
    assert report["reason"].tolist() == ["the next op on its stream is not a GEMM"]


def test_bad_arguments_are_config_errors():
    trace = gather_then(dict(m=M, n=N, k=K))
    with pytest.raises(ConfigError, match="function"):
        overlap_gather_gemms(trace, "nccl")
    with pytest.raises(ConfigError, match="'channels'.*decomposed' only"):
        overlap_gather_gemms(trace, "t3", channels=8)
    with pytest.raises(ConfigError, match="'channels'.*decomposed' only"):
        overlap_gather_gemms(trace, "decomposed_dma", channels=8)
    with pytest.raises(ConfigError, match="positive whole number"):
        overlap_gather_gemms(trace, "decomposed", channels=0)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from(["train", "prompt"]), st.sampled_from(["decomposed_dma", "decomposed"]),
       st.booleans())
def test_the_rewrite_keeps_the_work_and_the_communication(tp, phase, function, then_t3):
    """Every GEMM FLOP and every communicated byte stays; each forward column-parallel GEMM of a
    sequence-parallel layer takes its all-gather; the trace validates (acyclic); T3 can follow."""
    trace = transformer(TINY, tp=tp, batch=8, seq_len=64, layers=2, optimizer=None, phase=phase,
                        sequence_parallel=True)
    rewritten = overlap_gather_gemms(trace, function, 4 if function == "decomposed" else None)
    if then_t3:
        rewritten = overlap_gemm_collectives(rewritten, "t3")
    before, after = trace.frame, rewritten.frame

    def flops(frame):
        gemms = frame[frame["kind"].isin(["gemm", "gemm_collective", "collective_gemm"])]
        return (2 * gemms["m"] * gemms["n"] * gemms["k"] * gemms["batch"]).groupby(gemms["gpu"]).sum()

    pd.testing.assert_series_equal(flops(before), flops(after))
    gathered = overlap_report(rewritten).query("collective == 'allgather' and status == 'overlapped'")
    assert len(gathered) >= 2 * 2  # QKV and FC-1 of both layers
    assert trace.communication_bytes()["bytes"].sum() == rewritten.communication_bytes()["bytes"].sum()


def test_a_sequence_parallel_layer_gains_from_overlapping_its_gathers():
    trace = transformer(TINY, tp=4, batch=8, seq_len=256, layers=1, optimizer=None, phase="prompt", head=False,
                        sequence_parallel=True)
    plain = trace.replay(RING4, mode="symmetric").time_s
    assert overlap_gather_gemms(trace).replay(RING4, mode="symmetric").time_s < plain
