"""Traces whose GEMMs overlap the collectives of their outputs: the ``gemm_collective`` row kind and
:func:`gpusim.trace.fusion.overlap_gemm_collectives`."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import Trace, transformer
from gpusim.trace.fusion import overlap_gather_gemms, overlap_gemm_collectives, overlap_report
from gpusim.trace.models import ModelConfig, load_model
from gpusim.trace.schema import parse_ints

RING4 = gpusim.load_system("t3-ring8").with_overrides({"num_gpus": 4})
TINY = load_model(ModelConfig(name="tiny", hidden=256, layers=4, heads=4, vocab=1024, seq_len=64, batch=4), heads=8)
M, N, K = 1024, 768, 256
OUT = M * N * 2
GROUP = "0 1 2 3"


def gemm_then(collective: str, *, deps: str = "", extra: list[dict] | None = None, shape=(M, N, K)) -> Trace:
    """A GEMM on every rank of RING4, the ``collective`` of its output, and ``extra`` rows."""
    rows = []
    m, n, k = shape
    for gpu in range(4):
        rows.append(dict(op_id=1, gpu=gpu, stream="compute", kind="gemm", name="fc2", m=m, n=n, k=k))
        rows.append(dict(op_id=2, gpu=gpu, stream="compute", kind="collective", name="mlp_reduce", collective=collective,
                         bytes=m * n * 2, group=GROUP, deps=deps))
        rows += [{**row, "gpu": gpu} for row in extra or []]
    return Trace(pd.DataFrame(rows), "hand-made")


def overlap_row(**fields) -> pd.DataFrame:
    row = dict(op_id=1, gpu=0, stream="compute", kind="gemm_collective", m=M, n=N, k=K, collective="reducescatter",
               group="0")
    return pd.DataFrame([{**row, **fields}])


# -- the row kind ---------------------------------------------------------------------------------
def test_a_gemm_collective_row_is_t3_unless_it_says_otherwise():
    assert Trace(overlap_row()).frame["function"].iloc[0] == "t3"


@pytest.mark.parametrize(("fields", "field", "expected"), [
    ({"function": "nccl"}, "function", "t3, decomposed, decomposed_dma"),
    ({"collective": "allreduce"}, "collective", "reducescatter, allgather, alltoall"),
    ({"algorithm": "hierarchical"}, "algorithm", "ring, direct, auto"),
    ({"function": "decomposed", "collective": "allgather"}, "collective", "must be reducescatter"),
    ({"function": "decomposed_dma", "batch": 2}, "batch", "must be 1"),
    ({"function": "decomposed", "m": 1023, "group": "0 1"}, "m", "split evenly over the 2 ranks"),
    ({"channels": 8}, "channels", "must be blank for a t3"),
    ({"function": "decomposed", "channels": 0}, "channels", "positive whole number"),
    ({"splits": 2}, "splits", "must be blank except on a decomposed or decomposed_dma gemm_collective row"),
    ({"function": "decomposed", "splits": 0}, "splits", "positive whole number of kernels"),
    ({"function": "decomposed", "m": 1026, "group": "0 1", "splits": 2}, "m",
     "split evenly over the 2 ranks of the group x 2 kernels per chunk"),
    ({"k": 0}, "k", "positive whole number"),
])  # fmt: skip
def test_a_bad_gemm_collective_row_names_its_field(fields, field, expected):
    with pytest.raises(TraceError, match=rf"row 0 \(op_id 1, gpu 0\): field '{field}'.*{expected}"):
        Trace(overlap_row(**fields), "bad.csv")


@pytest.mark.parametrize(("function", "fields"), [
    ("t3", {}), ("decomposed", {"channels": 8}), ("decomposed_dma", {}), ("decomposed", {"channels": 8, "splits": 2}),
    ("decomposed_dma", {"splits": 4}),
])  # fmt: skip
def test_a_replayed_row_is_the_op_it_describes(function, fields):
    """The row replays exactly as the op run directly (same simulation, same time)."""
    trace = Trace(pd.DataFrame([dict(op_id=1, gpu=gpu, stream="compute", kind="gemm_collective", m=M, n=N, k=K,
                                     collective="reducescatter", group=GROUP, function=function, **fields)
                                for gpu in range(4)]))
    if function == "t3":
        op = ops.GemmReduceScatter(M, N, K)
    else:
        op = ops.DecomposedGemmReduceScatter(M, N, K, driver="cu" if function == "decomposed" else "dma", **fields)
    replayed = gpusim.run(RING4, trace, mode="symmetric")
    direct = gpusim.run(RING4, op, mode="symmetric")
    assert replayed.time_s == pytest.approx(direct.time_s, rel=1e-12)
    assert replayed.ops["kind"].iloc[0] == "fused"


# -- the rewrite ------------------------------------------------------------------------------------
def test_a_reduce_scatter_and_its_gemm_become_one_row_that_its_consumers_wait_for():
    after = dict(op_id=3, stream="compute", kind="elementwise", name="residual", function="add", elements=M * N // 4,
                 deps="2")
    trace = overlap_gemm_collectives(gemm_then("reducescatter", extra=[after]))
    frame = trace.frame
    assert frame["kind"].tolist() == ["gemm_collective", "elementwise"] * 4
    fused = frame[frame["kind"] == "gemm_collective"]
    assert fused["op_id"].nunique() == 1 and fused["name"].iloc[0] == "fc2+mlp_reduce"
    assert (fused[["m", "n", "k", "collective", "group", "function"]].iloc[0].tolist()
            == [M, N, K, "reducescatter", GROUP, "t3"])
    assert (frame.loc[frame["kind"] == "elementwise", "deps"] == str(fused["op_id"].iloc[0])).all()
    report = overlap_report(trace)
    assert report[["collective_op_id", "gemm_op_id", "status"]].values.tolist() == [[2, 1, "overlapped"]]
    result = gpusim.run(RING4, trace, mode="symmetric")
    assert result.time_s == pytest.approx(
        gpusim.run(RING4, [ops.GemmReduceScatter(M, N, K), ops.Elementwise("add", M * N // 4)], mode="symmetric").time_s,
        rel=1e-9)


def test_an_all_reduce_becomes_the_overlapped_reduce_scatter_then_an_all_gather():
    trace = overlap_gemm_collectives(Trace(gemm_then("allreduce").frame.assign(measured_s=1e-3)))
    frame = trace.frame[trace.frame["gpu"] == 0]
    assert frame["kind"].tolist() == ["gemm_collective", "collective"]
    gather = frame.iloc[1]
    assert (gather["op_id"], gather["collective"], gather["bytes"]) == (2, "allgather", OUT)
    assert frame["measured_s"].isna().all()  # neither row is what was measured
    assert gather["name"] == "mlp_reduce.allgather"
    assert parse_ints(gather["deps"]) == [int(frame["op_id"].iloc[0])]
    result = gpusim.run(RING4, trace, mode="symmetric")
    direct = gpusim.run(RING4, [ops.GemmReduceScatter(M, N, K), ops.AllGather(OUT)], mode="symmetric")
    assert result.time_s == pytest.approx(direct.time_s, rel=1e-9)


def test_a_decomposition_with_several_kernels_per_chunk_is_written_on_its_rows():
    rewritten = overlap_gemm_collectives(gemm_then("reducescatter"), "decomposed_dma", splits=2)
    assert set(rewritten.frame["splits"]) == {2}
    unsplittable = overlap_gemm_collectives(gemm_then("reducescatter", shape=(M + 4, N, K)), "decomposed_dma", splits=2)
    assert "x 2 kernels per chunk" in overlap_report(unsplittable)["reason"].iloc[0]


def test_communication_bytes_count_the_collective_inside_an_overlapped_row():
    """An all-reduce of X bytes becomes an overlapped reduce-scatter of X and an all-gather of X; an
    overlapped all-gather counts the gathered size, every rank's shard."""
    comm = overlap_gemm_collectives(gemm_then("allreduce")).communication_bytes()
    assert comm[["kind", "collective", "bytes"]].values.tolist() == [["gemm_collective", "reducescatter", OUT],
                                                                     ["collective", "allgather", OUT]]
    gather = Trace(pd.DataFrame([dict(op_id=1, gpu=gpu, stream="compute", kind="gemm_collective", m=M, n=N, k=K,
                                      collective="allgather", group=GROUP) for gpu in range(4)]))
    assert gather.communication_bytes()["bytes"].tolist() == [4 * OUT]


def test_overlapping_shortens_a_large_sub_layer_against_gemm_then_all_reduce():
    """(On the small GEMM of the other tests a chunk per rank is too small for the decomposition to gain;
    on 8 channels, which the T3 rings' fit makes 1.4x slower than 80, its reduce-scatter is too slow.)"""
    plain = gemm_then("allreduce", shape=(4096, 3072, 1024))
    base = gpusim.run(RING4, plain, mode="symmetric").time_s
    for function, channels in (("t3", None), ("decomposed", 16), ("decomposed_dma", None)):
        overlapped = overlap_gemm_collectives(plain, function, channels)
        assert gpusim.run(RING4, overlapped, mode="symmetric").time_s < base, function


def test_one_ranks_trace_with_a_blank_group_overlaps_over_every_gpu_of_the_system():
    """A rank-0 profile whose all-reduce names no group (all GPUs): the overlapped row keeps the blank
    group, so it spans the replaying system's GPUs, not just the one GPU the trace has rows for."""
    frame = gemm_then("allreduce").frame
    trace = Trace(frame[frame["gpu"] == 0].assign(group=""), "rank0")
    rewritten = overlap_gemm_collectives(trace)
    fused = rewritten.frame[rewritten.frame["kind"] == "gemm_collective"]
    assert fused["group"].tolist() == [""]
    result = gpusim.run(RING4, rewritten, mode="auto")
    direct = gpusim.run(RING4, [ops.GemmReduceScatter(M, N, K), ops.AllGather(OUT)], mode="symmetric")
    assert result.stats["mode"] == "symmetric" and result.time_s == pytest.approx(direct.time_s, rel=1e-9)


def test_a_gemm_with_other_gemms_between_it_and_its_reduction_is_found_by_its_output_size():
    """A backward pass's weight gradient (another output size) sits between the activation gradient
    and its all-reduce; the collective has no dependencies, so the rewrite walks back its stream."""
    rows = []
    for gpu in range(4):
        rows += [dict(op_id=1, gpu=gpu, stream="compute", kind="gemm", name="dgrad", m=M, n=N, k=K),
                 dict(op_id=2, gpu=gpu, stream="compute", kind="gemm", name="wgrad", m=N, n=K, k=M),
                 dict(op_id=3, gpu=gpu, stream="compute", kind="collective", collective="allreduce", bytes=OUT,
                      group=GROUP)]
    frame = overlap_gemm_collectives(Trace(pd.DataFrame(rows))).frame
    assert frame[frame["gpu"] == 0]["kind"].tolist() == ["gemm_collective", "gemm", "collective"]
    assert frame[frame["kind"] == "gemm_collective"]["name"].iloc[0] == "dgrad"


@pytest.mark.parametrize(("trace", "function", "reason"), [
    (gemm_then("allreduce", extra=[]).frame.assign(bytes=OUT // 2), "t3", "no GEMM whose output it reduces"),
    (gemm_then("allreduce").frame.assign(algorithm="hierarchical"), "t3", "hierarchical"),
    (gemm_then("allreduce").frame.assign(batch=2, bytes=2 * OUT), "decomposed", "decomposed: the GEMM's batch must be 1 (the chunks are cut along m), got 2"),
    (gemm_then("allreduce").frame.assign(m=M - 2, bytes=(M - 2) * N * 2), "decomposed_dma",
     "decomposed_dma: the GEMM's m must split evenly over the 4 ranks of the group, got 1022"),
])  # fmt: skip
def test_a_collective_the_rewrite_cannot_overlap_is_left_as_it_was_and_reported(trace, function, reason):
    before = Trace(trace)
    after = overlap_gemm_collectives(before, function)
    pd.testing.assert_frame_equal(after.frame, before.frame)
    report = overlap_report(after)
    assert report["status"].tolist() == ["skipped"] and reason in report["reason"].iloc[0]


def test_a_collective_fed_by_a_named_non_gemm_op_is_not_overlapped():
    extra = [dict(op_id=3, stream="compute", kind="elementwise", function="add", elements=M * N),
             dict(op_id=4, stream="comm", kind="collective", collective="allreduce", bytes=OUT, group=GROUP, deps="3")]
    report = overlap_report(overlap_gemm_collectives(gemm_then("allreduce", extra=extra)))
    assert report.set_index("collective_op_id")["status"].to_dict() == {2: "overlapped", 4: "skipped"}


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="function.*t3, decomposed, decomposed_dma"):
        overlap_gemm_collectives(gemm_then("allreduce"), "nccl")
    with pytest.raises(ConfigError, match=r"'channels' \(the CUs of its ring\) applies to function 'decomposed' only"):
        overlap_gemm_collectives(gemm_then("allreduce"), "t3", channels=8)
    with pytest.raises(ConfigError, match="positive whole number"):
        overlap_gemm_collectives(gemm_then("allreduce"), "decomposed", channels=0)
    with pytest.raises(ConfigError, match="'splits' .* applies to function 'decomposed' or 'decomposed_dma' only"):
        overlap_gemm_collectives(gemm_then("allreduce"), "t3", splits=2)
    with pytest.raises(ConfigError, match="'splits' must be a positive whole number"):
        overlap_gemm_collectives(gemm_then("allreduce"), "decomposed_dma", splits=0)


@pytest.mark.parametrize(("options", "overlapped"), [
    ({}, ["attn_allreduce", "mlp_allreduce", "mlp_allreduce_bwd", "attn_allreduce_bwd"]),
    ({"sequence_parallel": True},
     ["attn_reducescatter", "mlp_reducescatter", "mlp_reducescatter_bwd", "attn_reducescatter_bwd"]),
    ({"async_tp_backward": True}, ["attn_allreduce", "mlp_allreduce", "mlp_allreduce_bwd", "attn_allreduce_bwd"]),
])  # fmt: skip
def test_the_generator_layers_tensor_parallel_reductions_are_overlapped(options, overlapped):
    trace = transformer(TINY, tp=4, batch=4, seq_len=64, layers=1, head=False, optimizer=None, **options)
    rewritten = overlap_gemm_collectives(trace)
    report = overlap_report(rewritten)
    done = report[report["status"] == "overlapped"]
    assert done["name"].tolist() == [f"L0.{name}" for name in overlapped]
    gathers = rewritten.frame.loc[rewritten.frame["collective"] == "allgather", "name"].unique().tolist()
    if not options.get("sequence_parallel"):  # each all-reduce left its all-gather, named as such
        assert gathers == [f"L0.{name.replace('allreduce', 'allgather')}" for name in overlapped]


def async_all_reduce(*, gemm_m: int = 4096) -> Trace:
    """Megatron-LM's asynchronous backward all-reduce on RING4: the activation gradient's all-reduce on
    ``tp_comm`` (op 2), the weight gradient on the compute stream meanwhile (op 3), and an op that
    needs the reduced gradient (op 4)."""
    rows = []
    for gpu in range(4):
        rows += [
            dict(op_id=1, gpu=gpu, stream="compute", kind="gemm", name="fc1_dgrad", m=gemm_m, n=N, k=K),
            dict(op_id=2, gpu=gpu, stream="tp_comm", kind="collective", name="mlp_allreduce_bwd",
                 collective="allreduce", bytes=gemm_m * N * 2, group=GROUP, deps="1"),
            dict(op_id=3, gpu=gpu, stream="compute", kind="gemm", name="fc1_wgrad", m=N, n=K, k=gemm_m),
            dict(op_id=4, gpu=gpu, stream="compute", kind="elementwise", name="ln_bwd", function="add",
                 elements=gemm_m * N, deps="2"),
        ]  # fmt: skip
    return Trace(pd.DataFrame(rows), "async")


def test_an_overlapped_collective_from_another_stream_lets_the_gemms_stream_move_on():
    """The rewrite keeps the asynchrony of an all-reduce that ran beside its GEMM's stream: the weight
    gradient starts once the fused GEMM has ended, while the reduce-scatter's DMA tail runs on; the op
    that needs the reduced gradient still waits for the all-gather, which waits for the whole fused row."""
    rewritten = overlap_gemm_collectives(async_all_reduce())
    fused = rewritten.frame[rewritten.frame["kind"] == "gemm_collective"]
    assert fused["async_collective"].all()
    assert not overlap_gemm_collectives(gemm_then("allreduce")).frame["async_collective"].any()  # same stream
    result = gpusim.run(RING4, rewritten, mode="symmetric")
    ops_ = result.ops.set_index("name")
    fused_op = ops_.loc["fc1_dgrad+mlp_allreduce_bwd"]
    wgrad, gather, consumer = ops_.loc["fc1_wgrad"], ops_.loc["mlp_allgather_bwd"], ops_.loc["ln_bwd"]
    assert wgrad["start_s"] < fused_op["end_s"]
    assert gather["start_s"] >= fused_op["end_s"] and consumer["start_s"] >= gather["end_s"]
    held = Trace(rewritten.frame.assign(async_collective=False), "held")
    held_ops = gpusim.run(RING4, held, mode="symmetric").ops.set_index("name")
    assert held_ops.loc["fc1_wgrad", "start_s"] >= held_ops.loc["fc1_dgrad+mlp_allreduce_bwd", "end_s"]
    assert wgrad["start_s"] < held_ops.loc["fc1_wgrad", "start_s"]


@pytest.mark.parametrize("function", ["decomposed", "decomposed_dma"])
def test_a_decomposition_lets_its_stream_move_on_after_its_last_gemm_kernel(function):
    rewritten = overlap_gemm_collectives(async_all_reduce(), function)
    ops_ = gpusim.run(RING4, rewritten, mode="symmetric").ops.set_index("name")
    fused_op = ops_.loc["fc1_dgrad+mlp_allreduce_bwd"]
    assert fused_op["start_s"] < ops_.loc["fc1_wgrad", "start_s"] < fused_op["end_s"]


def test_async_collective_is_only_for_gemm_collective_rows():
    with pytest.raises(TraceError, match=r"row 0 \(op_id 1, gpu 0\): field 'async_collective'.*gemm_collective"):
        Trace(pd.DataFrame([dict(op_id=1, gpu=0, stream="compute", kind="gemm", m=M, n=N, k=K,
                                   async_collective=True)]), "bad.csv")
    with pytest.raises(TraceError, match="field 'async_collective'.*true or false"):
        Trace(overlap_row(async_collective="sometimes"), "bad.csv")


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.booleans(), st.booleans(),
       st.sampled_from(["t3", "decomposed", "decomposed_dma"]))
def test_the_rewrite_keeps_the_work_and_a_valid_acyclic_trace(tp, dp, pp, sequence_parallel, async_tp, function):
    """Every GEMM FLOP stays; every overlapped reduce-scatter's bytes are its GEMM's output; the rest of the
    communication is unchanged but for the all-reduces that became all-gathers; the trace validates (acyclic)."""
    trace = transformer(TINY, tp=tp, dp=dp, pp=pp, batch=8, seq_len=64, layers=2, optimizer=None,
                        sequence_parallel=sequence_parallel, async_tp_backward=async_tp)
    rewritten = overlap_gemm_collectives(trace, function)  # validated: a cycle would raise
    before, after = trace.frame, rewritten.frame

    def flops(frame):
        gemms = frame[frame["kind"].isin(["gemm", "gemm_collective"])]
        return (2 * gemms["m"] * gemms["n"] * gemms["k"] * gemms["batch"]).groupby(gemms["gpu"]).sum()

    pd.testing.assert_series_equal(flops(before), flops(after))
    report = overlap_report(rewritten)
    done = report[report["status"] == "overlapped"]
    fused = after[after["kind"] == "gemm_collective"]
    assert fused["op_id"].nunique() == len(done)
    output = fused["m"] * fused["n"] * fused["batch"] * fused["dtype"].map(DTYPE_BYTES)
    removed = before[before["op_id"].isin(done["collective_op_id"])]
    assert sorted(output) == sorted(removed["bytes"])
    kept = after[after["kind"] == "collective"]
    gathered = kept["op_id"].isin(done["collective_op_id"])
    assert (kept.loc[gathered, "collective"] == "allgather").all()
    untouched = before[(before["kind"] == "collective") & ~before["op_id"].isin(done["collective_op_id"])]
    assert len(kept[~gathered]) == len(untouched)


def test_layer_caching_and_symmetric_mode_hold_for_overlapped_rows():
    """Four identical overlapped layers: reusing a warm layer's times gives the fully simulated
    iteration's; symmetric mode (GPU 0 mirrored) gives full mode's."""
    trace = overlap_gemm_collectives(transformer(TINY, tp=4, batch=4, seq_len=64, layers=4, head=False,
                                                 optimizer=None, phase="prompt"))
    cached = trace.replay(RING4, mode="symmetric", warmup_layers=1)
    every = trace.replay(RING4, mode="symmetric", cache_layers=False)
    full = trace.replay(RING4, mode="full", cache_layers=False)
    assert cached.stats["simulated_rows"] < every.stats["simulated_rows"]
    assert cached.time_s == pytest.approx(every.time_s, rel=0.01)
    assert full.time_s == pytest.approx(every.time_s, rel=0.03)


def test_layer_caching_follows_the_stream_moving_on_after_an_async_overlapped_row():
    """Megatron-LM's asynchronous backward all-reduces, overlapped: a warm layer's times reused (with
    its rows' streams moving on after their GEMMs) give the fully simulated iteration's."""
    trace = overlap_gemm_collectives(transformer(TINY, tp=4, batch=4, seq_len=64, layers=4, head=False,
                                                 optimizer=None, async_tp_backward=True))
    assert trace.frame["async_collective"].any()
    cached = trace.replay(RING4, mode="symmetric", warmup_layers=1)
    every = trace.replay(RING4, mode="symmetric", cache_layers=False)
    assert cached.stats["simulated_rows"] < every.stats["simulated_rows"]
    assert cached.time_s == pytest.approx(every.time_s, rel=0.01)


@pytest.mark.parametrize("rewrite", [overlap_gemm_collectives, overlap_gather_gemms, overlap_report])
def test_a_path_or_a_table_for_the_trace_says_how_to_make_one(rewrite, tmp_path):
    """A path was an AttributeError ('str' object has no attribute 'frame')."""
    frame = pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "gemm", "m": 64, "n": 64, "k": 64}])
    path = Trace(frame).write(tmp_path / "t.csv")
    for not_a_trace, kind in [(str(path), "str"), (frame, "DataFrame")]:
        with pytest.raises(TraceError, match=rf"^{rewrite.__name__}\(\): trace must be a gpusim\.trace\.Trace \(a file's: "
                                             rf"gpusim\.trace\.read\(path\); a table's: gpusim\.trace\.Trace\(frame\)\), "
                                             rf"got {kind}$"):
            rewrite(not_a_trace)
