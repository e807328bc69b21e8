"""The public run() API, results, timelines, streams and bad input."""

import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.results import OP_COLUMNS, SUMMARY_COLUMNS, Result, nested_lanes

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


@pytest.mark.parametrize("op", [
    ops.RowReduce("softmax", 4096, 4096),
    ops.RowReduce("layernorm", 2048, 4096),
    ops.Elementwise("gelu", 2**24),
    ops.Elementwise("rope", 2048 * 4096, rows=2048),
    ops.Optimizer("adam", [2**20] * 8, impl="multi_fused"),
], ids=lambda op: op.label)
@pytest.mark.parametrize("cus", [131, 66])
def test_a_cu_mask_runs_a_kernel_as_a_gpu_with_that_many_cus(op, cus):
    """Kernels that simulate one workgroup per resident slot size their slots by the mask."""
    h100 = gpusim.load_system("h100-sxm5")
    masked = gpusim.run(h100, [op], streams=[gpusim.Stream("s", cu_mask=range(cus))])
    smaller = gpusim.run(h100.with_overrides({"gpu.num_cus": cus}), [op])
    assert masked.time_s == pytest.approx(smaller.time_s, rel=0.01)


def partly_overlapping(intervals):
    """Pairs of intervals that overlap without one holding the other."""
    return [(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:]
            if max(a[0], b[0]) < min(a[1], b[1]) and not (a[0] <= b[0] and b[1] <= a[1]) and not (
                b[0] <= a[0] and a[1] <= b[1])]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])), max_size=30))
def test_nested_lanes_never_put_partly_overlapping_intervals_together(intervals):
    lanes = nested_lanes(intervals)
    for lane in set(lanes):
        assert not partly_overlapping([iv for iv, chosen in zip(intervals, lanes) if chosen == lane])
    if not partly_overlapping(intervals):
        assert set(lanes) <= {0}


def perfetto_slices(events) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The (start, end) of each ``X`` event per (pid, tid), ns, as Perfetto's JSON importer reads
    them: ``ts`` and ``dur`` each rounded to whole ns (``llround(us * 1000)``), end = start + dur."""
    threads = {}
    for event in events:
        if event["ph"] == "X":
            start = round(event["ts"] * 1000)
            threads.setdefault((event["pid"], event["tid"]), []).append((start, start + round(event["dur"] * 1000)))
    return threads


def strict_json(path):
    """The JSON in ``path``, refusing NaN and Infinity (which Perfetto and strict parsers reject)."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize(("system", "op"), [("t3-ring8", ops.GemmReduceScatter(2048, 2048, 512)),
                                            ("hgx-h100", ops.GemmAllGather(1024, 1024, 512))])
def test_perfetto_threads_hold_only_nested_slices(tmp_path, system, op):
    trace = json.loads(gpusim.run(system, [op]).to_perfetto(tmp_path / "t.json").read_text())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert any(name.endswith("(2)") for name in names)  # the steps needed a second thread
    for intervals in perfetto_slices(trace["traceEvents"]).values():
        assert not partly_overlapping(intervals)


def test_back_to_back_ops_do_not_overlap_by_a_rounding_nanosecond(tmp_path):
    """An op that starts where the previous one ends: in ns as Perfetto rounds ``ts`` and ``dur``,
    the first used to end 1 ns after the second began (a misnested slice)."""
    result = gpusim.run(ONE, [ops.Gemm(256, 512, 512), ops.Elementwise("gelu", 256 * 512)] * 2)
    events = strict_json(result.to_perfetto(tmp_path / "t.json"))["traceEvents"]
    for intervals in perfetto_slices(events).values():
        assert not partly_overlapping(intervals)
    ops_thread = next(e["tid"] for e in events if e["name"] == "thread_name" and e["args"]["name"] == "compute ops")
    slices = sorted(perfetto_slices(events)[(0, ops_thread)])
    assert [end for _, end in slices] == [round(end_s * 1e9) for end_s in result.ops["end_s"]]
    assert [start for start, _ in slices[1:]] == [end for _, end in slices[:-1]]
    for event in events:
        if event["ph"] in "XC":  # whole ns in us, as written
            assert event["ts"] * 1000 == pytest.approx(round(event["ts"] * 1000), abs=1e-6)


def test_perfetto_is_strict_json_with_non_finite_arguments(tmp_path):
    from gpusim.engine.simulation import Span
    from gpusim.results import DRAM_DTYPES, KERNEL_DTYPES, LINK_DTYPES, OP_DTYPES, empty_frame

    spans = [Span("k", "kernel", 0, "s", 0.0, 10.0, {"ratio": float("nan"), "limit": float("inf"),
                                                      "count": np.int64(3), "share": np.float32(0.5)})]
    result = Result(1e-8, empty_frame(OP_DTYPES), empty_frame(KERNEL_DTYPES), empty_frame(DRAM_DTYPES),
                    empty_frame(LINK_DTYPES), {}, {}, {}, spans)
    events = strict_json(result.to_perfetto(tmp_path / "t.json"))["traceEvents"]
    assert next(e for e in events if e["ph"] == "X")["args"] == {"ratio": "nan", "limit": "inf", "count": 3,
                                                                   "share": 0.5}


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
    with pytest.raises(gpusim.OpError, match=r"gemm 8x8x8 fp16: rank 3 does not exist; t3-table8.1 has ranks 0\.\.0"):
        gpusim.run(ONE, ops.Gemm(8, 8, 8, ranks=[3]))
    with pytest.raises(gpusim.OpError, match="Elementwise: field 'kind'"):
        ops.Elementwise("frobnicate", 10)
    with pytest.raises(gpusim.OpError, match="ranks"):
        ops.AllReduce(1024, ranks=[0, 0])
    with pytest.raises(gpusim.ConfigError, match="symmetric mode needs a topology"):
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


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ops.Gemm(8, 8, 8, dtype=["fp16"]), "Gemm: field 'dtype' must be one of"),
    (lambda: ops.Elementwise(["relu"], 10), "Elementwise: field 'kind' must be one of"),
    (lambda: ops.Gemm(64, 64, 64, a=["x"]), "Gemm: field 'a' must be a non-empty string or None"),
    (lambda: ops.AllReduce(1024, input=["x"]), "AllReduce: field 'input' must be a non-empty string"),
    (lambda: ops.Gemm(8, 8, 8, out=""), "Gemm: field 'out' must be a non-empty string"),
    (lambda: ops.Gemm(8, 8, 8, name=5), "Gemm: field 'name' must be a non-empty string"),
    (lambda: ops.RowReduce("softmax", 8, 8, library="vllm"), "library 'vllm' runs kind 'rmsnorm' only"),
    (lambda: ops.Optimizer({"adam"}, [8]), "Optimizer: field 'algorithm' must be one of"),
])
def test_ops_reject_values_of_the_wrong_type_when_made(make, message):
    with pytest.raises(gpusim.OpError, match=message):
        make()


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: gpusim.run(ONE, [ops.Gemm(8, 8, 8)] * 3, streams="abc"), gpusim.OpError, "a stream for each op"),
    (lambda: gpusim.run(ONE, ops.Gemm(8, 8, 8), streams=[gpusim.Stream(3)]), gpusim.OpError, "stream's name"),
    (lambda: gpusim.run(5, ops.Gemm(8, 8, 8)), gpusim.ConfigError, "expected a gpusim.System or a preset name"),
    (lambda: gpusim.load_system(None), gpusim.ConfigError, "preset name or a YAML path"),
    (lambda: ONE.with_overrides(None), gpusim.ConfigError, "overrides must be a mapping"),
    (lambda: gpusim.run(ONE, ops.Gemm(2**18, 8, 2**18)), gpusim.OpError,
     r"bytes do not fit in t3-table8.1's 32 GiB of memory \(gpu.hbm.capacity_bytes\)"),
])
def test_bad_run_arguments_are_gpusim_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_cu_masks_may_be_numpy_arrays():
    masked = gpusim.run(ONE, ops.Gemm(256, 256, 256), streams=[gpusim.Stream("s", cu_mask=np.arange(10))])
    plain = gpusim.run(ONE, ops.Gemm(256, 256, 256), streams=[gpusim.Stream("s", cu_mask=range(10))])
    assert masked.time_s == plain.time_s
    listed = gpusim.run(ONE, ops.Gemm(64, 64, 64), streams=[gpusim.Stream("s", cu_mask=list(np.arange(4)))])
    assert listed.time_s == gpusim.run(ONE, ops.Gemm(64, 64, 64), streams=[gpusim.Stream("s", cu_mask=range(4))]).time_s
    with pytest.raises(gpusim.OpError, match="stream 's': cu_mask must be a collection of CU indices"):
        gpusim.run(ONE, ops.Delay(1e-6), streams=[gpusim.Stream("s", cu_mask=5)])
    with pytest.raises(gpusim.OpError, match=r"cu_mask has \[1.0\], outside"):
        gpusim.run(ONE, ops.Delay(1e-6), streams=[gpusim.Stream("s", cu_mask=[0, 1.0])])


@pytest.mark.parametrize(("settings", "message"), [
    ({"bin_s": 0}, "bin_s must be a positive finite number of seconds, got 0"),
    ({"bin_s": -1e-6}, "bin_s must be a positive"),
    ({"bin_s": float("nan")}, "bin_s must be a positive"),
    ({"bin_s": True}, "bin_s must be a positive"),
    ({"memory_policy": "bogus"}, "memory_policy: unknown memory-controller policy 'bogus'; known: fcfs, fr-fcfs"),
    ({"dispatch_policy": "bogus"}, "dispatch_policy: unknown dispatch policy 'bogus'; known: round_robin, fifo"),
    ({"mode": "bogus"}, "mode must be one of full, symmetric"),
])
def test_bad_run_settings_are_config_errors(settings, message):
    with pytest.raises(gpusim.ConfigError, match=message):
        gpusim.run(ONE, ops.Delay(1e-6), **settings)


@pytest.mark.parametrize("op", [
    ops.Gemm(256, 256, 256, ranks=[3]),
    ops.AllReduce(2**16, ranks=[1, 2]),
], ids=["gemm", "allreduce"])
def test_symmetric_mode_rejects_ops_that_do_not_run_on_rank_0(op):
    with pytest.raises(gpusim.OpError, match="symmetric mode simulates rank 0 only.*use mode='full'"):
        gpusim.run(RING8, op, mode="symmetric")


@pytest.mark.parametrize(("system", "op", "warns"), [
    ("t3-ring8", ops.AllToAll(2**16), True),
    ("t3-ring8", ops.AllGather(2**16, algorithm="direct"), True),
    ("t3-ring8", ops.AllGather(2**16), False),
    ("hgx-h100", ops.AllToAll(2**16), False),
    ("dgx-a100", ops.AllGather(2**16, algorithm="direct"), False),
], ids=["alltoall-ring", "direct-ring", "ring-ring", "alltoall-switch", "direct-fully-connected"])
def test_symmetric_mode_warns_where_it_only_approximates_direct_traffic(system, op, warns):
    """Peers several hops apart (a ring): the mirrored packets meet the real ones at other moments
    (docs/model.md), so the result is approximate and the run says so; one hop apart it is exact."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gpusim.run(system, op, mode="symmetric").time_s > 0
    messages = [str(w.message) for w in caught if issubclass(w.category, gpusim.SymmetricModeWarning)]
    if warns:
        assert len(messages) == 1
        assert f"on {system}" in messages[0] and "mode='full'" in messages[0]
    else:
        assert messages == []


@pytest.mark.parametrize(("op", "mode"), [
    (ops.AllReduce(2**18), "symmetric"),
    (ops.Gemm(256, 256, 256), "symmetric"),
    (ops.AllToAll(2**16), "full"),
    (ops.AllReduce(2**16, ranks=[0, 2, 4, 6]), "full"),
    (ops.SendRecv(1024, src=0, dst=1), "full"),
    (ops.AllReduce(2), "full"),  # too small to give each of 8 ranks a chunk: the ranks differ
], ids=["ring-allreduce", "gemm", "alltoall-ring", "lone-group", "sendrecv", "two-byte-allreduce"])
def test_auto_mode_mirrors_only_where_it_is_exact(op, mode):
    result = gpusim.run(RING8, op, mode="auto")
    assert result.stats["mode"] == mode
    if mode == "symmetric":  # the same answer as full mode, from one simulated GPU
        full = gpusim.run(RING8, op.copy(), mode="full")
        assert result.time_s == pytest.approx(full.time_s, rel=1e-3)
        assert result.stats["simulated_gpus"] == 1 < full.stats["simulated_gpus"]


def test_auto_mode_simulates_every_gpu_of_a_node_that_is_not_alike():
    assert gpusim.run("dgx1-v100", ops.AllReduce(2**18), mode="auto").stats["mode"] == "full"


@pytest.mark.parametrize(("src", "dst"), [(0, 1), (3, 5)])
def test_symmetric_mode_rejects_send_recv(src, dst):
    with pytest.raises(gpusim.OpError, match="SendRecv needs mode='full'"):
        gpusim.run(RING8, ops.SendRecv(1024, src=src, dst=dst), mode="symmetric")


def test_an_empty_summary_has_the_summary_columns():
    empty = Result(0.0, pd.DataFrame(columns=OP_COLUMNS), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {}, {}, {})
    assert list(empty.summary().columns) == SUMMARY_COLUMNS
    assert list(gpusim.run(ONE, ops.Delay(1e-6)).summary().columns) == SUMMARY_COLUMNS


def test_a_fused_gemm_has_the_rate_of_its_gemm_over_its_whole_span():
    fused = ops.GemmReduceScatter(1024, 2048, 1024)
    row = gpusim.run(RING8, fused, mode="symmetric").summary().iloc[0]
    assert row["kind"] == "fused" and row["flops"] == 2 * 1024 * 2048 * 1024
    assert row["tflop_per_s"] == pytest.approx(row["flops"] / row["duration_s"] / 1e12)
    collective = gpusim.run(RING8, ops.AllReduce(2**20), mode="symmetric").summary().iloc[0]
    assert np.isnan(collective["tflop_per_s"])


def test_each_execution_of_one_op_object_has_its_own_row():
    gemm = ops.Gemm(256, 256, 256)
    twice = gpusim.run(ONE, [gemm, gemm]).summary()
    apart = gpusim.run(ONE, [ops.Gemm(256, 256, 256), ops.Gemm(256, 256, 256)]).summary()
    assert len(twice) == 2 and twice["op_id"].nunique() == 2
    assert twice["tflop_per_s"].tolist() == pytest.approx(apart["tflop_per_s"].tolist())
    reduce = ops.AllReduce(2**20)  # a collective run twice must not reuse the first run's arrival flags
    same = gpusim.run(RING8, [reduce, reduce], mode="symmetric")
    distinct = gpusim.run(RING8, [ops.AllReduce(2**20), ops.AllReduce(2**20)], mode="symmetric")
    assert same.time_s == pytest.approx(distinct.time_s)


def test_auto_collectives_run_a_ring_across_nodes_too():
    two_nodes = gpusim.load_system("dgx-a100", {"nodes": 2, "num_gpus": 2})
    assert set(gpusim.run(two_nodes, ops.AllReduce(4096)).ops["impl"]) == {"ring_ar"}
    documented = " ".join(ops.Collective.__doc__.split())
    assert "``ring`` for the others, within a node and across nodes alike" in documented


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1e-6, True, "1", None])
def test_delay_needs_a_finite_non_negative_number(seconds):
    with pytest.raises(gpusim.OpError, match="Delay: field 'seconds' must be a finite non-negative number"):
        ops.Delay(seconds)


def test_delay_accepts_numpy_numbers():
    assert ops.Delay(np.float64(2e-6)).seconds == 2e-6
    assert type(ops.Delay(np.int64(1)).seconds) is float


@pytest.mark.parametrize("ranks", [[2, 3], [0], [0, 1, 2]])
def test_send_recv_runs_on_src_and_dst_only(ranks):
    with pytest.raises(gpusim.OpError, match=r"SendRecv: field 'ranks' must be the two ranks src and dst, 0 and 1"):
        ops.SendRecv(1024, src=0, dst=1, ranks=ranks)


def test_send_recv_ranks_are_src_and_dst():
    assert ops.SendRecv(1024, src=3, dst=1).ranks == (3, 1)
    assert ops.SendRecv(1024, src=3, dst=1, ranks=[1, 3]).ranks == (3, 1)


@pytest.mark.parametrize(("cls", "fields", "message"), [
    (ops.ReduceScatter, {"algorithm": "hierarchical"}, "ReduceScatter: field 'algorithm' must be one of ring, direct, auto"),
    (ops.AllGather, {"algorithm": "hierarchical"}, "AllGather: field 'algorithm' must be one of ring, direct, auto"),
    (ops.AllToAll, {"algorithm": "ring"}, "AllToAll: field 'algorithm' must be one of direct, auto"),
    (ops.AllToAll, {"driver": "dma"}, "AllToAll: driver 'dma' is not supported"),
    (ops.AllReduce, {"algorithm": "direct", "driver": "dma"}, "AllReduce: driver 'dma' runs the ring algorithm only"),
    (ops.AllGather, {"algorithm": "direct", "driver": "dma"}, "AllGather: driver 'dma' runs the ring algorithm only"),
    (ops.AllReduce, {"algorithm": "hierarchical", "driver": "dma"}, "driver 'dma' runs the ring algorithm only"),
])
def test_collectives_reject_algorithms_they_lack_at_construction(cls, fields, message):
    with pytest.raises(gpusim.OpError, match=message):
        cls(1024, **fields)


def test_collectives_accept_the_algorithms_they_have():
    ops.AllReduce(1024, algorithm="hierarchical")
    ops.AllToAll(1024, algorithm="direct")
    ops.ReduceScatter(1024, algorithm="ring", driver="dma")
    ops.AllGather(1024, driver="dma")


def test_ops_accept_numpy_integers_as_ints():
    gemm = ops.Gemm(np.int64(128), np.int32(64), np.uint16(32), batch=np.int64(2), ranks=[np.int64(0)])
    assert (gemm.m, gemm.n, gemm.k, gemm.batch, gemm.ranks) == (128, 64, 32, 2, (0,))
    assert all(type(value) is int for value in (gemm.m, gemm.n, gemm.k, gemm.batch, *gemm.ranks))
    assert ops.AllReduce(np.int64(1024), ranks=np.arange(2), channels=np.int8(2)).ranks == (0, 1)
    assert ops.Optimizer("adam", np.array([4, 8])).sizes == (4, 8)
    assert ops.SendRecv(np.int64(8), src=np.int64(1), dst=np.int64(0)).ranks == (1, 0)
    with pytest.raises(gpusim.OpError, match="field 'm' must be a positive integer"):
        ops.Gemm(np.float64(128), 64, 32)
    with pytest.raises(gpusim.OpError, match="field 'ranks' must hold non-negative integers, got True"):
        ops.Gemm(8, 8, 8, ranks=[True])
    with pytest.raises(gpusim.OpError, match="field 'ranks' must be a non-empty list"):
        ops.Gemm(8, 8, 8, ranks=np.zeros((2, 2), dtype=int))


@pytest.mark.parametrize(("inputs", "message"), [
    ("ab", "field 'inputs' must be a tuple of tensor names, got 'ab'"),
    (("a", 3), "field 'inputs' must be a tuple of tensor names"),
    (("a", "b", "c"), "field 'inputs' names 3 tensors, but 'add' reads 2"),
])
def test_elementwise_inputs_are_names_the_kind_reads(inputs, message):
    with pytest.raises(gpusim.OpError, match=message):
        ops.Elementwise("add", 8, inputs=inputs)


def test_elementwise_inputs_may_name_some_of_its_reads():
    assert ops.Elementwise("add", 8, inputs=["x"]).inputs == ("x",)
    with pytest.raises(gpusim.OpError, match="'fill' reads 0"):
        ops.Elementwise("fill", 8, inputs=("x",))


def _counter_at(events, name, pid, ts_us):
    """The value of a Perfetto counter track at ``ts_us`` (its last sample at or before it)."""
    samples = sorted((e["ts"], e["args"]) for e in events if e["ph"] == "C" and e["name"] == name and e["pid"] == pid)
    held = [args for ts, args in samples if ts <= ts_us]
    return held[-1] if held else None, samples


def test_dram_bandwidth_is_zero_while_the_gpu_idles(tmp_path):
    result = gpusim.run(ONE, [ops.Gemm(512, 512, 512), ops.Delay(100e-6), ops.Gemm(512, 512, 512)])
    delay = result.ops.set_index("kind").loc["delay"]
    bandwidth = result.dram_bandwidth(0)
    assert bandwidth["t_s"].iloc[0] <= result.ops["start_s"].min()
    assert bandwidth["t_s"].iloc[-1] < result.ops["end_s"].max() <= bandwidth["t_s"].iloc[-1] + result.bin_s
    assert np.diff(bandwidth["t_s"]) == pytest.approx(result.bin_s)  # every bin, traffic or not
    idle = bandwidth[(bandwidth["t_s"] >= delay["start_s"]) & (bandwidth["t_s"] + result.bin_s <= delay["end_s"])]
    assert len(idle) >= 15 and (idle.drop(columns="t_s") == 0).all().all()
    span_s = len(bandwidth) * result.bin_s
    bins = result.time_bins()
    assert np.array_equal(bins * result.bin_s, bandwidth["t_s"])  # the public bins are the timeline's
    assert set(result.bin_of(result.dram["t_s"])) <= set(bins)
    for (stream, direction), moved in result.dram.groupby(["stream", "direction"])["bytes"].sum().items():
        assert bandwidth[f"{stream}_{direction}"].mean() * 1e9 * span_s == pytest.approx(moved)
    events = json.loads(result.to_perfetto(tmp_path / "t.json").read_text())["traceEvents"]
    middle_us = (delay["start_s"] + delay["end_s"]) / 2 * 1e6
    held, samples = _counter_at(events, "DRAM GB/s", 0, middle_us)
    assert set(held.values()) == {0.0}  # nothing moves during the delay
    last_ts, last = samples[-1]
    assert set(last.values()) == {0.0} and last_ts > result.dram["t_s"].max() * 1e6  # drops to 0 after the last traffic


def test_link_counters_are_zero_while_links_idle(tmp_path):
    result = gpusim.run(RING8, [ops.AllReduce(2**20), ops.Delay(100e-6), ops.AllReduce(2**20)], mode="symmetric")
    delay = result.ops[result.ops["kind"] == "delay"].iloc[0]
    events = json.loads(result.to_perfetto(tmp_path / "t.json").read_text())["traceEvents"]
    pid = next(e["pid"] for e in events if e["ph"] == "M" and e["args"].get("name") == "links")
    links = set(result.links["link"])
    assert links
    for link in links:
        held, samples = _counter_at(events, link, pid, (delay["start_s"] + delay["end_s"]) / 2 * 1e6)
        assert held == {"GB/s": 0.0}
        assert samples[-1][1] == {"GB/s": 0.0} and samples[-1][0] > result.links["t_s"].max() * 1e6
        assert max(args["GB/s"] for _, args in samples) > 0


def test_a_run_without_kernels_keeps_every_frame_s_columns():
    from gpusim.results import KERNEL_COLUMNS

    result = gpusim.run(ONE, ops.Delay(1e-5))
    assert list(result.kernels.columns) == KERNEL_COLUMNS and result.kernels["duration_s"].sum() == 0
    assert list(result.ops.columns[: len(OP_COLUMNS)]) == OP_COLUMNS
    assert list(result.dram.columns) == ["gpu", "channel", "stream", "direction", "t_s", "bytes"]
    assert list(result.links.columns) == ["link", "src", "dst", "t_s", "bytes"]
    assert list(result.dram_totals().columns) == ["gpu", "stream", "direction", "bytes"]
    bandwidth = result.dram_bandwidth(0)
    assert list(bandwidth.columns) == ["t_s"] and len(bandwidth) == 2  # the 10 us span, no traffic


def test_empty_frames_have_the_dtypes_of_full_ones():
    """A frame without rows keeps numeric columns numeric (not object), so it concatenates with,
    sums and compares like one from a run that has rows."""
    quiet = gpusim.run(ONE, ops.Delay(1e-5))  # no kernels, no DRAM or link traffic
    busy = gpusim.run(RING8, [ops.Gemm(256, 256, 256), ops.AllReduce(2**16)], mode="symmetric")
    for frame in ("kernels", "dram", "links"):
        empty, full = getattr(quiet, frame), getattr(busy, frame)
        assert empty.empty and not full.empty
        assert empty.dtypes.to_dict() == full[list(empty.columns)].dtypes.to_dict(), frame
    assert quiet.dram_totals().dtypes.to_dict() == busy.dram_totals().dtypes.to_dict()
    none = Result(0.0, quiet.ops.iloc[:0], quiet.kernels, quiet.dram, quiet.links, {}, {}, {})
    assert none.summary().dtypes.to_dict() == busy.summary().dtypes.to_dict()


def test_plots_of_empty_frames_say_so():
    import matplotlib.pyplot as plt

    from gpusim import plot

    result = gpusim.run(ONE, ops.Delay(1e-5))
    empty = pd.DataFrame(columns=["x", "y", "by", "measured_s", "simulated_s", "error"])
    no_breakdown = pd.DataFrame(columns=["gpu", "compute_s", "overlapped_comm_s", "exposed_comm_s", "idle_s"])
    drawings = [
        plot.timeline(result.ops, gpus=[1]),
        plot.dram_bandwidth(result.dram_bandwidth(0)),
        plot.bars(result.dram_totals(), "gpu", "bytes", hue="direction"),
        plot.stacked_bars(result.dram_totals(), "gpu", "bytes", "direction"),
        plot.measured_vs_simulated(empty),
        plot.measured_and_simulated(empty, "x", by="by"),
        plot.relative_error(empty, tolerance=0.1),
        plot.lines(empty, "x", "y", by="by"),
        plot.breakdown(no_breakdown),
    ]
    for ax in drawings:
        assert [text.get_text() for text in ax.texts] in (["no data"], ["no ops"], ["no DRAM traffic"])
        plt.close(ax.figure)


def test_grouped_bars_keep_the_axis_labels_they_are_given():
    import matplotlib.pyplot as plt

    from gpusim import plot

    frame = pd.DataFrame({"concurrency": [2, 2, 4, 4], "config": ["a", "b", "a", "b"], "speedup": [1.1, 1.2, 1.3, 1.4]})
    for hue in ("config", None):
        ax = plot.bars(frame, "concurrency", "speedup", hue=hue, xlabel="available GEMMs", ylabel="speedup over A (x)")
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("available GEMMs", "speedup over A (x)")  # not the column names
        plt.close(ax.figure)


def test_perfetto_refuses_folders_and_leaves_no_temporary_file(tmp_path):
    result = gpusim.run(ONE, ops.Delay(1e-6))
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    for target, message in [
        (tmp_path / "adir", "adir: cannot write the Perfetto timeline: it is a folder"),
        ("/", "/: cannot write the Perfetto timeline: it is a folder"),
        ("", "cannot write the Perfetto timeline to an empty path"),
        (tmp_path / "afile" / "t.json", "afile/t.json: cannot write the Perfetto timeline"),
    ]:
        with pytest.raises(gpusim.GpusimError, match=message):
            result.to_perfetto(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adir", "afile"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_a_long_run_reports_its_simulated_time_while_it_runs():
    """The engine calls its progress hook every PROGRESS_EVENTS events with the simulated time; a
    run with a progress bar shows that time, so a single long op is seen to move."""
    from gpusim.engine.simulation import PROGRESS_EVENTS, CountingEnvironment

    env = CountingEnvironment()
    seen = []
    env.on_progress = seen.append

    def ticks():
        for _ in range(3 * PROGRESS_EVENTS):
            yield env.timeout(1.0)

    env.process(ticks())
    env.run()
    assert len(seen) == 3 and seen == sorted(seen) and seen[-1] <= env.now


def test_the_engine_time_is_the_time_of_the_event_being_processed():
    """``now`` is a plain attribute of the engine (not simpy's property): run(), run(until) and
    step() all keep it equal to simpy's time, and callbacks see the time of their event."""
    from gpusim.engine.simulation import CountingEnvironment

    env = CountingEnvironment()
    seen = []

    def ticks():
        for delay in (1.0, 2.5, 4.0):
            yield env.timeout(delay)
            seen.append(env.now)

    env.process(ticks())
    env.step()  # the process starts
    env.step()
    assert env.now == env._now == 1.0 and seen == [1.0]
    env.run(until=2.0)
    assert env.now == env._now == 2.0
    env.run()
    assert seen == [1.0, 3.5, 7.5] and env.now == env._now == 7.5


def test_the_garbage_collector_runs_less_often_in_a_simulation_and_its_thresholds_are_restored():
    import gc

    from gpusim.simulate import GC_THRESHOLDS, fewer_collections

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 20, 10)
        with fewer_collections(GC_THRESHOLDS):
            assert gc.get_threshold() == (GC_THRESHOLDS[0], 20, GC_THRESHOLDS[2])
        assert gc.get_threshold() == (700, 20, 10)
        gpusim.run(RING8, ops.AllReduce(2**20), mode="symmetric")
        assert gc.get_threshold() == (700, 20, 10)
        gc.set_threshold(0)  # a disabled collector stays disabled
        with fewer_collections(GC_THRESHOLDS):
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


def test_the_progress_bar_shows_the_simulated_time(capsys):
    gpusim.run(gpusim.load_system("mi210"), ops.Gemm(4096, 4096, 4096), progress=True)
    assert "simulated" in capsys.readouterr().err


def test_an_op_that_takes_no_time_has_no_rate():
    summary = gpusim.run(RING8, ops.AllReduce(2**20, ranks=[0])).summary().iloc[0]
    assert summary["duration_s"] == 0 and summary["impl"] == "none_single_rank"
    assert np.isnan(summary["gb_per_s"]) and np.isnan(summary["tflop_per_s"])


def test_the_progress_bar_ends_showing_every_op_and_the_final_simulated_time(capsys):
    """Redraws are rate-limited, so the last one can come before the last ops end; the bar closes
    on the run's end state (it stays, in a terminal and in a log)."""
    result = gpusim.run(RING8, [ops.Gemm(2048, 2048, 2048), ops.AllReduce(16 * 2**20)], mode="full", progress=True)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "16/16" in last
    assert f"simulated {result.summary()['end_s'].max() * 1e6:,.1f} us" in last


@pytest.mark.parametrize("mode", ["full", "symmetric"])
@pytest.mark.parametrize(("nbytes", "protocol", "efficiency"), [(2**20, "ll", 0.5), (2**22, "ll128", 120 / 128),
                                                                 (2**26, "simple", 1.0)])
def test_ring_all_reduce_link_bytes_are_wire_bytes(mode, nbytes, protocol, efficiency):
    """Each GPU of an N-GPU ring all-reduce sends 2 (N - 1) / N of its array, in wire bytes: the
    payload over the protocol's wire efficiency (NCCL's LL below its threshold, LL128, then Simple)."""
    result = gpusim.run("a100-4-nvlink", ops.AllReduce(nbytes, algorithm="ring"), mode=mode)
    assert result.ops["protocol"].iloc[0] == protocol
    expected = 2 * 3 / 4 * nbytes / efficiency
    sent = result.links.groupby("src")["bytes"].sum()
    assert list(sent.index) == ([0, 1, 2, 3] if mode == "full" else [0])
    assert sent.to_numpy() == pytest.approx(expected, rel=1e-3)
    assert (result.links["src"] != result.links["dst"]).all()
    assert result.links["link"].tolist() == [f"gpu{s}->gpu{d}" for s, d in zip(result.links["src"], result.links["dst"])]


def test_dram_bandwidth_of_a_gpu_that_was_not_simulated_is_an_error():
    """Symmetric mode simulates GPU 0 only: GPU 1's bandwidth used to be a table of zeros."""
    result = gpusim.run(RING8, ops.AllReduce(2**16), mode="symmetric")
    assert result.dram_bandwidth(0).drop(columns="t_s").to_numpy().sum() > 0
    with pytest.raises(gpusim.GpusimError, match=r"GPU 1 was not simulated; this run simulated GPUs 0\.\.0 "
                                                   r"\(symmetric mode simulates GPU 0 only\)"):
        result.dram_bandwidth(1)
    with pytest.raises(gpusim.GpusimError, match="GPU 8 was not simulated; this run simulated GPUs 0..7$"):
        gpusim.run(RING8, ops.Gemm(64, 64, 64, ranks=[0]), mode="full").dram_bandwidth(8)


def test_streams_with_a_trace_are_refused_not_ignored():
    trace = gpusim.trace.Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "compute", "kind": "gemm",
                                              "m": 64, "n": 64, "k": 64}]))
    with pytest.raises(gpusim.OpError, match=r"^streams applies to a list of ops, not to a trace, whose rows name their "
                                             r"streams \(its 'stream' column\); got \['side'\]$"):
        gpusim.run(ONE, trace, streams=["side"])


@pytest.mark.parametrize("word", ["no", "false", 0, None])
def test_flags_must_be_true_or_false_not_words_that_count_as_true(word):
    """progress="no" showed a progress bar and cache_layers="no" cached the layers: any word is true."""
    trace = gpusim.trace.Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "delay", "delay_s": 1e-6}]))
    with pytest.raises(gpusim.ConfigError, match=rf"^progress must be True or False, got {re.escape(repr(word))}$"):
        gpusim.run(ONE, ops.Gemm(8, 8, 8), progress=word)
    for name in ("progress", "cache_layers"):
        with pytest.raises(gpusim.TraceError, match=rf"^replay\(\): '{name}' must be True or False, got "
                                                    rf"{re.escape(repr(word))}$"):
            trace.replay(ONE, **{name: word})
        with pytest.raises(gpusim.ConfigError, match=rf"^sweep_parameters: {name} must be True or False, got "
                                                     rf"{re.escape(repr(word))}$"):
            gpusim.sweep_parameters(ONE, trace, {"gpu.num_cus": [40]}, workers=1, **{name: word})
    assert gpusim.run(ONE, ops.Gemm(8, 8, 8), progress=np.bool_(False)).time_s > 0


def test_a_file_where_an_output_folder_should_be_is_named(tmp_path):
    """The reason given was 'File exists' (from creating the folders), which named neither file."""
    (tmp_path / "afile").write_text("kept")
    result = gpusim.run(ONE, ops.Gemm(8, 8, 8))
    trace = gpusim.trace.Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "delay", "delay_s": 0.0}]))
    for write, target, what, error in [
        (result.to_perfetto, tmp_path / "afile" / "t.json", "the Perfetto timeline", gpusim.GpusimError),
        (trace.write, tmp_path / "afile" / "deeper" / "t.csv", "the trace file", gpusim.TraceError),
    ]:
        with pytest.raises(error, match=rf"^{re.escape(str(target))}: cannot write {what}: "
                                        rf"{re.escape(str(tmp_path / 'afile'))} is a file, not a folder$"):
            write(target)
    assert [path.name for path in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "kept"


def test_perfetto_slices_of_one_start_are_written_longest_first(tmp_path):
    """A reader that keeps the file's order at equal starts would make the shorter slice the parent
    of the longer one, which ends after it: misnested."""
    result = gpusim.run(RING8, [ops.GemmReduceScatter(2048, 2048, 1024, out="y")], mode="full",
                        memory_policy="t3-mca")
    events = json.loads(result.to_perfetto(tmp_path / "t.json").read_text())
    assert "displayTimeUnit" not in events  # older Perfetto read "ns" as the unit of ts
    slices = [e for e in events["traceEvents"] if e["ph"] == "X"]
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in slices:
        by_thread.setdefault((event["pid"], event["tid"]), []).append((event["ts"], -event["dur"]))
    assert any(len({ts for ts, _ in spans}) < len(spans) for spans in by_thread.values())  # equal starts exist
    assert all(spans == sorted(spans) for spans in by_thread.values())
