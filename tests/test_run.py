"""The public run() API, results, timelines, streams and bad input."""

import json

import pytest

import gpusim
from gpusim import ops

RING8 = gpusim.load_system("t3-ring8")
ONE = gpusim.load_system("t3-table8.1")


def test_gemm_then_reduce_scatter_on_the_ring():
    m, n, k = 1024, 1024, 512
    result = gpusim.run(RING8, [ops.Gemm(m, n, k, out="c"), ops.ReduceScatter(m * n * 2, input="c")], mode="symmetric")
    summary = result.summary()
    assert list(summary["kind"]) == ["gemm", "collective"]
    assert summary["start_s"].iloc[1] >= summary["end_s"].iloc[0]
    assert result.time_s == pytest.approx(summary["end_s"].max() - summary["start_s"].min())
    assert {"compute", "comm"} <= set(result.dram["stream"])


def test_ops_on_different_streams_overlap_and_share_the_gpu():
    gemm = ops.Gemm(2048, 2048, 2048)
    alone = gpusim.run(ONE, gemm).time_s
    together = gpusim.run(ONE, [ops.Gemm(2048, 2048, 2048), ops.Gemm(2048, 2048, 2048)], streams=["a", "b"])
    sequential = gpusim.run(ONE, [ops.Gemm(2048, 2048, 2048), ops.Gemm(2048, 2048, 2048)])
    starts = together.ops["start_s"]
    assert starts.max() < together.ops["end_s"].min()  # they overlap
    assert together.time_s < sequential.time_s
    assert together.time_s > alone  # sharing slows each down


def test_cu_masks_partition_the_gpu():
    half = tuple(range(40))
    result = gpusim.run(ONE, [ops.Gemm(2048, 2048, 2048)], streams=[gpusim.Stream("masked", cu_mask=half)])
    full = gpusim.run(ONE, [ops.Gemm(2048, 2048, 2048)])
    assert result.time_s > 1.5 * full.time_s


def test_perfetto_timeline(tmp_path):
    result = gpusim.run(RING8, [ops.Gemm(512, 512, 512), ops.AllReduce(2**20)], mode="symmetric")
    path = result.to_perfetto(tmp_path / "t.json")
    trace = json.loads(path.read_text())
    phases = {event["ph"] for event in trace["traceEvents"]}
    assert {"X", "M", "C"} <= phases
    names = {event["name"] for event in trace["traceEvents"] if event["ph"] == "X"}
    assert any(name.startswith("gemm") for name in names)


def test_result_keeps_configuration_and_stats():
    result = gpusim.run(ONE, ops.Elementwise("gelu", 2**20))
    assert result.config["gpu"]["num_cus"] == 80
    assert result.stats["events"] > 0 and result.stats["wall_s"] > 0


def test_bad_inputs():
    with pytest.raises(gpusim.OpError, match="non-empty list"):
        gpusim.run(ONE, [])
    with pytest.raises(gpusim.OpError, match="streams has 1 entries for 2 ops"):
        gpusim.run(ONE, [ops.Gemm(8, 8, 8), ops.Gemm(8, 8, 8)], streams=["a"])
    with pytest.raises(ValueError, match="rank 3 does not exist"):
        gpusim.run(ONE, ops.Gemm(8, 8, 8, ranks=[3]))
    with pytest.raises(gpusim.OpError, match="Elementwise: field 'kind'"):
        ops.Elementwise("frobnicate", 10)
    with pytest.raises(gpusim.OpError, match="ranks"):
        ops.AllReduce(1024, ranks=[0, 0])
    with pytest.raises(ValueError, match="symmetric mode"):
        gpusim.run(gpusim.load_system("t3-ring8", {"topology.kind": "custom", "topology.edges": [[0, 1]]}),
                   ops.Gemm(8, 8, 8), mode="symmetric")


@pytest.mark.parametrize(("mask", "message"), [
    ((), "stream 'part': cu_mask is empty"),
    ((0, 80), r"stream 'part': cu_mask has \[80\], outside t3-table8.1's CUs 0..79"),
    ((3, 3), "stream 'part': cu_mask repeats a CU"),
])
def test_a_bad_cu_mask_names_the_stream(mask, message):
    with pytest.raises(gpusim.OpError, match=message):
        gpusim.run(ONE, ops.Gemm(8, 8, 8), streams=[gpusim.Stream("part", cu_mask=mask)])


def test_elementwise_and_row_reductions_are_memory_bound():
    n = 64 * 2**20
    result = gpusim.run(ONE, [ops.Elementwise("add", n), ops.RowReduce("softmax", 8192, 8192)])
    for row in result.ops.itertuples():
        assert row.bytes / row.duration_s < ONE.gpu.hbm.bandwidth_bytes_per_s
