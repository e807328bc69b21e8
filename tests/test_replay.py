"""DAG replay: the seed-000 estimator, layer caching, symmetric versus full, overlap, pipelines."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest

import gpusim
from gpusim import ops as gpusim_ops
from gpusim.cli import main
from gpusim.errors import TraceError
from gpusim.trace import ModelConfig, Trace, breakdown, compare, overlap_gemm_collectives, read, transformer
from gpusim.trace.replay import choose_mode
from tests.conftest import REPO

RING8 = gpusim.load_system("t3-ring8")
TINY = ModelConfig(name="tiny", hidden=256, layers=5, heads=4, vocab=1024, seq_len=64, batch=4)


def _kernels_inside_their_ops(result: gpusim.Result) -> pd.DataFrame:
    """Every kernel joined to its op; asserts that each lies on its op's stream and inside its span."""
    joined = result.kernels.merge(result.ops, on=["op_id", "gpu"], suffixes=("_kernel", "_op"), validate="many_to_one")
    assert len(joined) == len(result.kernels)
    assert (joined["stream_kernel"] == joined["stream_op"]).all()
    assert (joined["start_s_kernel"] >= joined["start_s_op"] - 1e-12).all()
    assert (joined["end_s_kernel"] <= joined["end_s_op"] + 1e-12).all()
    return joined


@pytest.mark.parametrize(("gpus", "reference_ms"), [(2, 134.853), (4, 166.27)])
def test_data_parallel_backward_estimator_of_seed_000(gpus, reference_ms):
    """seeds/000 section 3.5.2 replayed from Tables 4.11-4.12 reproduces its estimates within 0.5 %."""
    trace = read(REPO / "workloads" / "traces" / f"dp_backward_v100_{gpus}gpu.csv")
    result = gpusim.run(RING8, trace)
    assert result.time_s * 1e3 == pytest.approx(reference_ms, rel=0.005)
    parts = breakdown(result.ops).iloc[0]
    assert parts["overlapped_comm_s"] > 0 and parts["exposed_comm_s"] > 0  # communication-bound backward
    uncached = trace.replay(RING8, cache_layers=False)
    assert result.time_s == pytest.approx(uncached.time_s, rel=1e-12)  # delays: caching is exact
    assert result.stats["simulated_rows"] < uncached.stats["simulated_rows"]


def test_layer_caching_agrees_with_replaying_every_layer():
    """Tensor and data parallel training of a 4-layer model on 4 GPUs (2 x 2), full mode."""
    trace = transformer(TINY, tp=2, dp=2, batch=4, seq_len=32, layers=4, bucket_bytes=2**19)
    cached = gpusim.run(RING8, trace, mode="full")
    every = trace.replay(RING8, mode="full", cache_layers=False)
    assert cached.stats["simulated_rows"] < 0.75 * every.stats["simulated_rows"]
    assert cached.stats["events"] < every.stats["events"]
    assert cached.time_s == pytest.approx(every.time_s, rel=0.02)
    merged = cached.ops.merge(every.ops, on=["op_id", "gpu"], suffixes=("_cached", "_every"))
    assert len(merged) == len(every.ops) == len(trace)
    gemm = merged[merged["kind_cached"] == "gemm"]
    assert (gemm["duration_s_cached"] / gemm["duration_s_every"]).median() == pytest.approx(1.0, abs=0.02)
    replicated = cached.ops[~cached.ops["simulated"]]
    assert len(replicated) and (replicated["replica_of"] != replicated["op_id"]).all()
    # A left-out layer's collectives take their representative's kernels, on every rank.
    kernels = _kernels_inside_their_ops(cached)
    assert kernels[~kernels["simulated"] & (kernels["kind"] == "collective")]["gpu"].nunique() == 4
    parts_cached, parts_every = breakdown(cached.ops), breakdown(every.ops)
    for part in ("compute_s", "exposed_comm_s", "overlapped_comm_s"):  # within 3 % of the iteration
        assert parts_cached[part].sum() == pytest.approx(parts_every[part].sum(), abs=0.03 * parts_every["total_s"].sum())


def test_symmetric_mode_agrees_with_full_mode_for_tensor_parallelism():
    trace = transformer(TINY, tp=4, batch=2, seq_len=64, layers=2, optimizer=None)
    system = gpusim.load_system("t3-ring8", {"num_gpus": 4})
    full = gpusim.run(system, trace, mode="full")
    symmetric = gpusim.run(system, trace, mode="symmetric")
    assert set(symmetric.ops["gpu"]) == {0} and set(full.ops["gpu"]) == {0, 1, 2, 3}
    assert symmetric.time_s == pytest.approx(full.time_s, rel=0.03)


def test_gradient_all_reduce_overlaps_the_backward_pass():
    trace = transformer(TINY, dp=2, batch=4, seq_len=64, layers=3, bucket_bytes=2**18, optimizer=None,
                        head=False)
    result = gpusim.run(RING8, trace, mode="full")
    ops = result.ops[result.ops["gpu"] == 0]
    grads = ops[ops["stream"] == "comm"]
    last_backward = ops[(ops["stream"] == "compute") & (ops["phase"] == "bwd")]["end_s"].max()
    assert grads["start_s"].min() < last_backward
    assert breakdown(result.ops)["overlapped_comm_s"].min() > 0


@pytest.mark.slow
def test_gpipe_bubble_is_p_minus_1_over_m():
    """Uniform stages: (iteration - busy) / busy = (p - 1) / m (seeds/001 eq. 3).

    The formula leaves out the host and the network: the host's launch costs are set to 0 (with
    them this tiny model is host-bound), and the 2 (p - 1) sends on the critical path (the fill
    and the drain) are taken off the iteration.
    """
    p, m = 4, 4
    model = ModelConfig(name="uniform", hidden=256, layers=p, heads=4, vocab=256, seq_len=64, batch=m)
    trace = transformer(model, pp=p, microbatches=m, batch=m, schedule="gpipe", head=False, optimizer=None)
    result = gpusim.run(gpusim.load_system("t3-ring8", {"gpu.kernel_launch_ns": 0}), trace, mode="full")
    ops = result.ops
    send_s = ops[ops["stream"].str.startswith("send")]["duration_s"].mean()
    for stage in range(p):
        busy = ops[(ops["gpu"] == stage) & (ops["stream"] == "compute")]["duration_s"].sum()
        bubble = (result.time_s - 2 * (p - 1) * send_s - busy) / busy
        assert bubble == pytest.approx((p - 1) / m, rel=0.06)


def test_replay_rejects_traces_that_do_not_fit():
    trace = transformer(TINY, pp=2, batch=2, microbatches=2, layers=2, head=False, optimizer=None)
    with pytest.raises(TraceError, match="symmetric mode cannot replay a send/receive"):
        gpusim.run(RING8, trace, mode="symmetric")
    big = transformer(TINY, tp=4, dp=4, batch=4, layers=1, optimizer=None)
    with pytest.raises(TraceError, match=r"uses 16 GPUs \(its tp x pp x dp\), but t3-ring8 has 8"):
        gpusim.run(RING8, big)
    collective = {"kind": "collective", "collective": "allreduce", "bytes": 4096, "group": "0 1", "stream": "s"}
    lonely = Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, **collective}]))
    with pytest.raises(TraceError, match="GPUs \\[1\\] have no row for it"):
        gpusim.run(RING8, lonely, mode="full")
    assert gpusim.run(RING8, lonely, mode="symmetric").time_s > 0
    uneven = Trace(pd.DataFrame([
        {"op_id": 1, "gpu": 0, "stream": "s", "kind": "gemm", "m": 64, "n": 64, "k": 64},
        {"op_id": 1, "gpu": 1, "stream": "s", "kind": "gemm", "m": 64, "n": 64, "k": 64},
        {"op_id": 2, "gpu": 1, "stream": "s", "kind": "gemm", "m": 64, "n": 64, "k": 64},
    ]))  # fmt: skip
    with pytest.raises(TraceError, match="symmetric mode needs every GPU to do the same work"):
        gpusim.run(RING8, uneven, mode="symmetric")


def test_cached_timeline_has_every_op_and_its_kernels(tmp_path):
    trace = transformer(TINY, tp=2, batch=2, seq_len=64, optimizer=None)
    result = gpusim.run(RING8, trace, mode="symmetric")
    assert not result.ops["simulated"].all()
    path = result.to_perfetto(tmp_path / "t.json")
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "op"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(ops) == len(result.ops)
    assert len(kernels) >= len(result.ops[result.ops["kind"] == "gemm"])
    last_layer = [e for e in ops if e["name"] == f"L{TINY.layers - 1}.fc1"]
    assert last_layer and last_layer[0]["args"]["replica_of"] != last_layer[0]["args"]["op_id"]


@pytest.mark.parametrize(("argument", "value", "expected"), [
    ("warmup_layers", -1, "'warmup_layers' must be a non-negative integer or None, got -1"),
    ("warmup_layers", 1.5, "'warmup_layers' must be a non-negative integer or None, got 1.5"),
    ("warmup_layers", "2", "'warmup_layers' must be a non-negative integer or None, got '2'"),
    ("bin_s", 0, "'bin_s' must be a positive number of seconds, got 0"),
    ("bin_s", -1, "'bin_s' must be a positive number of seconds, got -1"),
    ("bin_s", float("nan"), "'bin_s' must be a positive number of seconds, got nan"),
])  # fmt: skip
def test_replay_rejects_bad_arguments(argument, value, expected):
    trace = transformer(TINY, tp=2, batch=2, seq_len=64, layers=2, optimizer=None)
    with pytest.raises(TraceError, match=expected):
        trace.replay(RING8, mode="symmetric", **{argument: value})


def test_breakdown_times_are_never_negative():
    """Back-to-back compute and communication: the unions' rounding must not give a negative overlap."""
    ops = pd.DataFrame({"gpu": [0, 0], "kind": ["gemm", "collective"], "start_s": [0.0, 1e-7],
                        "end_s": [1e-7, 1.4e-6]})
    parts = breakdown(ops).iloc[0]
    assert parts["overlapped_comm_s"] == 0.0
    assert (parts.drop("gpu") >= 0).all()


def test_a_fused_ops_reduce_scatter_tail_is_exposed_and_the_rest_overlapped():
    """Given the kernels, T3's fused op counts its launch and GEMM kernel as compute and its span
    after the kernel started as communication: the tail after the GEMM is exposed, the rest overlapped.
    Without them the op is compute, as before."""
    ops = pd.DataFrame({"gpu": [0, 0], "op_id": [7, 8], "kind": ["fused", "collective"], "chunks": [4, None],
                        "start_s": [0.0, 10e-6], "end_s": [10e-6, 14e-6]})
    kernels = pd.DataFrame({"gpu": [0, 0], "op_id": [7, 8], "name": ["gemm_rs_MT128x128x32", "ag_ring_8ch"],
                            "start_s": [1e-6, 10e-6], "end_s": [7e-6, 14e-6]})
    parts = breakdown(ops, kernels).iloc[0]
    assert parts["compute_s"] == pytest.approx(7e-6)  # 1 us launch, 6 us GEMM
    assert parts["overlapped_comm_s"] == pytest.approx(6e-6)
    assert parts["exposed_comm_s"] == pytest.approx(3e-6 + 4e-6)  # the tail, then the all-gather
    assert parts["compute_s"] + parts["exposed_comm_s"] + parts["idle_s"] == pytest.approx(parts["total_s"])
    plain = breakdown(ops).iloc[0]
    assert (plain["compute_s"], plain["exposed_comm_s"]) == pytest.approx((10e-6, 4e-6))
    alone = breakdown(ops.assign(chunks=[1, None]), kernels).iloc[0]  # a group of one exchanged nothing
    assert alone["compute_s"] == pytest.approx(10e-6)


def test_an_overlapped_layers_breakdown_shows_its_hidden_communication():
    trace = overlap_gemm_collectives(transformer(TINY, tp=4, batch=8, seq_len=256, layers=2, head=False,
                                                 optimizer=None, phase="prompt"))
    result = trace.replay(RING8.with_overrides({"num_gpus": 4}), mode="symmetric")
    with_kernels, without = breakdown(result.ops, result.kernels).iloc[0], breakdown(result.ops).iloc[0]
    assert with_kernels["overlapped_comm_s"] > without["overlapped_comm_s"]
    assert with_kernels["compute_s"] < without["compute_s"]
    assert with_kernels["total_s"] == without["total_s"] and with_kernels["idle_s"] == pytest.approx(without["idle_s"])


@pytest.mark.parametrize(("collective", "algorithm", "system", "mode"), [
    ("allreduce", "auto", "t3-ring8", "symmetric"),
    ("alltoall", "auto", "t3-ring8", "full"),
    ("allgather", "direct", "dgx-a100", "symmetric"),
    ("alltoall", "auto", "hgx-h200", "symmetric"),
    ("allgather", "direct", "mi210-4", "symmetric"),
])
def test_auto_mode_mirrors_only_where_it_is_exact(tmp_path, collective, algorithm, system, mode):
    system = gpusim.load_system(system)
    group = ",".join(str(gpu) for gpu in range(system.num_gpus))
    rows = [f'1,{gpu},comm,collective,{collective},{2**20},"{group}",{algorithm}' for gpu in range(system.num_gpus)]
    path = tmp_path / "coll.csv"
    path.write_text("op_id,gpu,stream,kind,collective,bytes,group,algorithm\n" + "\n".join(rows) + "\n")
    assert choose_mode(read(path), system) == mode


@pytest.mark.parametrize(("collective", "warns"), [("alltoall", True), ("allreduce", False)])
def test_symmetric_replay_warns_about_direct_traffic_on_a_ring(tmp_path, collective, warns):
    rows = [f'1,{gpu},comm,collective,{collective},{2**16},"0,1,2,3,4,5,6,7",auto' for gpu in range(8)]
    path = tmp_path / "coll.csv"
    path.write_text("op_id,gpu,stream,kind,collective,bytes,group,algorithm\n" + "\n".join(rows) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpusim.run(RING8, read(path), mode="symmetric")
    assert any(issubclass(w.category, gpusim.SymmetricModeWarning) for w in caught) == warns
    assert gpusim.run(RING8, read(path), mode="auto").stats["mode"] == ("full" if warns else "symmetric")


@pytest.mark.parametrize("ops", ["trace", "list"])
def test_an_unknown_mode_is_the_same_config_error_for_a_trace_and_for_ops(ops):
    trace = transformer(TINY, tp=1, batch=1, seq_len=64, layers=1, optimizer=None)
    with pytest.raises(gpusim.ConfigError, match="mode must be one of full, symmetric, auto, got 'fast'"):
        if ops == "trace":
            trace.replay(RING8, mode="fast")
        else:
            gpusim.run(RING8, [gpusim.ops.Gemm(64, 64, 64)], mode="fast")


def test_auto_mode_replays_a_lone_group_in_full_mode(tmp_path):
    """A reduce-scatter over GPUs 0, 2, 4 and 6 of a ring: mirroring it would add the rotations
    that do not exist (docs/model.md), so auto mode takes full mode."""
    rows = [f'1,{gpu},comm,collective,reducescatter,{4 * 2**20},"0 2 4 6",auto' for gpu in (0, 2, 4, 6)]
    path = tmp_path / "lone.csv"
    path.write_text("op_id,gpu,stream,kind,collective,bytes,group,algorithm\n" + "\n".join(rows) + "\n")
    assert choose_mode(read(path), RING8) == "full"


def test_auto_mode_mirrors_one_ranks_profile(tmp_path, capsys):
    """GPU 0's rows alone, with an all-reduce over GPUs 0 and 1: one rank's profile of a 2-GPU job, as
    a Kineto trace of rank 0 is.  Full mode has no rows for rank 1, so auto mode mirrors it and
    ``simulate`` replays it as docs/traces.md runs the shared A100 Kineto trace (rank 0's)."""
    path = tmp_path / "rank0.csv"
    path.write_text("op_id,gpu,stream,kind,m,n,k,collective,bytes,group\n"
                    "1,0,compute,gemm,256,256,256,,,\n"
                    '2,0,comm,collective,,,,allreduce,1048576,"0 1"\n')
    system = gpusim.load_system("dgx-a100")
    assert choose_mode(read(path), system) == "symmetric"
    assert main(["simulate", "--trace", str(path), "--system", "dgx-a100", "--quiet"]) == 0
    assert "(symmetric mode)" in capsys.readouterr().out
    path.write_text(path.read_text().replace('"0 1"', "0"))  # a collective of GPU 0 alone: nothing to mirror
    assert choose_mode(read(path), system) == "full"


@pytest.mark.parametrize("cache_layers", [True, False])
def test_kernels_carry_the_trace_op_id_of_their_op(tmp_path, cache_layers):
    trace = transformer(TINY, batch=1, seq_len=32, layers=3, optimizer=None)
    result = trace.replay(RING8, cache_layers=cache_layers)
    assert result.ops["simulated"].all() != cache_layers
    joined = _kernels_inside_their_ops(result)
    assert len(joined) > len(result.ops) // 2
    gemm_kernels = joined["name_kernel"].str.startswith(("gemm", "splitk"))
    assert (gemm_kernels == (joined["kind"] == "gemm")).all()
    layernorms = joined[joined["name_kernel"] == "vectorized_layer_norm_kernel"]
    assert len(layernorms) and layernorms["name_op"].str.contains(r"ln|norm").all()
    events = json.loads(result.to_perfetto(tmp_path / "t.json").read_text())["traceEvents"]
    kernel_ops = sorted(e["args"]["op_id"] for e in events if e.get("cat") == "kernel")
    assert kernel_ops == sorted(result.kernels["op_id"])


def _measured(*kinds):
    rows = []
    for op_id, kind in enumerate(kinds, start=1):
        row = {"op_id": op_id, "gpu": 0, "stream": "s", "kind": kind, "measured_s": 1e-4, "kernel_class": "gemm"}
        rows.append(row | ({"m": 256, "n": 256, "k": 256} if kind == "gemm" else {"delay_s": 1e-4}))
    return Trace(pd.DataFrame(rows))


def test_all_kernels_error_leaves_out_the_delays():
    result = _measured("gemm", "delay", "delay").replay(RING8)
    table = compare(result.ops, 1e-3).set_index("kernel_class")
    gemm = result.ops[result.ops["kind"] == "gemm"].iloc[0]
    whole = table.loc["all kernels"]
    assert whole["kernels"] == 1 and whole["not_simulated"] == 2
    assert whole["measured_s"] == pytest.approx(1e-4) and whole["not_simulated_s"] == pytest.approx(2e-4)
    assert whole["error"] == pytest.approx(gemm["duration_s"] / 1e-4 - 1.0)
    assert whole["error"] == pytest.approx(table.loc["gemm", "error"])


def test_a_replay_of_delays_alone_compares_nothing():
    """Delays replay their measured durations: the comparison must not read as 0 % error."""
    table = compare(read(REPO / "workloads" / "traces" / "dp_backward_v100_2gpu.csv").replay(RING8).ops, 0.2)
    table = table.set_index("kernel_class")
    assert (table["kernels"].drop("iteration") == 0).all()
    assert table["error"].isna().all()
    assert table.loc["all kernels", "not_simulated"] == 28


@pytest.mark.parametrize(("columns", "rows"), [
    ("kind,function,batch,heads,q_len,kv_len,head_dim,causal", ["attention,forward,1,8,64,{v},64,false"]),
    ("kind,m,n,k,issue_s", ["gemm,512,512,512,{t}"]),
    ("kind,shapes", ["grouped_gemm,{v} 256 256 64 256 256"]),
])
def test_layers_that_differ_in_any_field_that_shapes_them_are_all_simulated(tmp_path, columns, rows):
    """Four layers alike but for one field (the attention's cached keys, the measured issue time)."""
    lines = [f"op_id,gpu,stream,layer,{columns}"]
    for layer, (kv_len, issued) in enumerate(zip((128, 1024, 8192, 32768), (0.0, 1e-3, 2e-3, 3e-3))):
        lines += [f"{layer},0,s0,{layer},{row.format(v=kv_len, t=issued)}" for row in rows]
    path = tmp_path / "layers.csv"
    path.write_text("\n".join(lines) + "\n")
    system = gpusim.load_system("h100-sxm5")
    cached = read(path).replay(system)
    every = read(path).replay(system, cache_layers=False)
    assert cached.time_s == pytest.approx(every.time_s, rel=1e-9)


def test_an_op_waiting_for_its_measured_host_call_leaves_the_gpu_idle(tmp_path):
    """The second GEMM is issued 1 ms after the first: its record starts then, and the GPU is idle between."""
    path = tmp_path / "host_bound.csv"
    path.write_text("op_id,gpu,stream,kind,m,n,k,issue_s\n1,0,s0,gemm,256,256,256,0\n2,0,s0,gemm,256,256,256,1e-3\n")
    result = read(path).replay(gpusim.load_system("h100-sxm5"))
    second = result.ops[result.ops["op_id"] == 2].iloc[0]
    assert second["start_s"] >= 1e-3 and second["duration_s"] < 1e-4
    parts = breakdown(result.ops).iloc[0]
    assert parts["idle_s"] > 0.9e-3 and parts["compute_s"] < 1e-4


def test_a_send_without_its_receiver_asks_for_both_rows_not_for_symmetric_mode(tmp_path, capsys):
    """The hint was symmetric mode, which refuses every send/receive."""
    send = Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "sendrecv", "bytes": 1024, "group": "0 1"}]))
    with pytest.raises(TraceError, match=r"^trace: row 0 \(op_id 1, gpu 0\): the sendrecv spans GPUs \[0, 1\] but "
                                         r"GPUs \[1\] have no row for it; give the sender's and the receiver's rows "
                                         r"\(symmetric mode cannot replay a send/receive\)$"):
        gpusim.run(RING8, send, mode="full")
    path = send.write(tmp_path / "send.csv")
    assert main(["simulate", "--trace", str(path), "--system", "t3-ring8", "--mode", "full", "--quiet",
                 "--out", str(tmp_path / "out")]) == 2
    assert "give the sender's and the receiver's rows" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_breakdown_and_compare_given_a_result_instead_of_its_tables_say_which_table():
    """A whole Result was an AttributeError ('Result' object has no attribute 'empty') or a TypeError
    (not subscriptable); a table without a column they read, a KeyError naming the column alone."""
    result = gpusim.run(RING8, gpusim_ops.Gemm(64, 64, 64), mode="symmetric")
    for call, caller in [(lambda given: breakdown(given), "breakdown"), (lambda given: compare(given), "compare")]:
        with pytest.raises(gpusim.GpusimError, match=rf"^{caller}\(\): ops must be a result's ops table \(result\.ops\), "
                                                     r"got Result$"):
            call(result)
        with pytest.raises(gpusim.GpusimError, match=rf"^{caller}\(\): ops has no column '.*'; give a result's ops "
                                                     r"table \(result\.ops\), with columns .*gpu"):
            call(result.summary().drop(columns=["gpu"], errors="ignore").rename(columns={"kind": "category"}))
    with pytest.raises(gpusim.GpusimError, match=r"^breakdown\(\): kernels must be a result's kernels table "
                                                 r"\(result\.kernels\), got Result$"):
        breakdown(result.ops, result)
    assert breakdown(result.ops, result.kernels)["compute_s"].iloc[0] == pytest.approx(result.time_s)


def test_a_row_beside_left_out_layers_gets_their_run_simulated_whole():
    """Four alike instances (rows 0-3, one row each) with 0 and 1 simulated and 2, 3 left out.  A
    row of another stream that was running when instance 2 began did not have the left-out
    instances beside it in the simulation: the run is to be simulated whole.  A row that begins
    after instance 2 began (what follows the run) does not count."""
    import numpy as np

    from gpusim.trace.caching import CachePlan, StandIn, straddled_runs

    frame = pd.DataFrame({"gpu": [0] * 6})
    plan = CachePlan(np.array([True, True, False, False, True, True]), np.array([0, 1, 1, 1, 4, 5]))
    plan.stand_ins.append(StandIn(0, [1], [0], [[2], [3]], [0, 1]))
    times = {0: (0.0, 10.0), 1: (10.0, 20.0), 2: (20.0, 30.0), 3: (30.0, 40.0), 4: (15.0, 45.0), 5: (25.0, 50.0)}
    assert straddled_runs(frame, plan, times) == {0}
    times[4] = (15.0, 25.0)
    assert straddled_runs(frame, plan, times) == {0}
    times[4] = (21.0, 45.0)
    assert straddled_runs(frame, plan, times) == set()


def test_data_parallel_training_cached_is_close_to_every_layer_simulated():
    """BERT-base's embedding gradient all-reduce runs beside the per-layer optimizer steps: layer
    caching simulates them all (a second simulation); it was 8.8% short when the left-out steps
    were not there to slow the all-reduce.  The backward layers' 1-12 us kernels drain the lead
    the host gained during the output layer's GEMMs, so the left-out layers wait for the host where
    their representative did not: the re-timing replays the host thread, and the cached iteration
    is within 0.5% of the whole one (1.7% short without it)."""
    trace = transformer("bert-base", phase="train", batch=8, seq_len=64, layers=4, dp=8)
    cached = trace.replay("hgx-h100", mode="symmetric")
    whole = trace.replay("hgx-h100", mode="symmetric", cache_layers=False)
    assert cached.stats["simulations"] == 2 and whole.stats["simulations"] == 1
    assert [run["simulated"] for run in cached.stats["layer_runs"]] == [2, 2, 4]
    assert cached.time_s == pytest.approx(whole.time_s, rel=0.005)


def test_pipeline_parallel_training_cached_is_close_to_every_layer_simulated():
    """Two stages of four layers, two microbatches, two data-parallel replicas, full mode: a
    representative that waited for the host gave that wait to its left-out layers, 6.7% too long,
    until the re-timing replayed the host thread (within 1% since)."""
    model = ModelConfig(name="tiny8", hidden=256, layers=8, heads=4, vocab=1024, seq_len=64, batch=4)
    trace = transformer(model, pp=2, dp=2, batch=4, microbatches=2, seq_len=32)
    cached = trace.replay(RING8, mode="full")
    whole = trace.replay(RING8, mode="full", cache_layers=False)
    assert cached.stats["simulated_rows"] < whole.stats["simulated_rows"]
    assert cached.time_s == pytest.approx(whole.time_s, rel=0.01)
    _kernels_inside_their_ops(cached)


def test_a_kernel_measured_at_zero_is_left_out_of_the_comparison():
    """A profiler writes 0 for a kernel it did not time: an error against it would be infinite."""
    ops_table = pd.DataFrame([
        {"op_id": 1, "gpu": 0, "name": "a", "kind": "gemm", "measured_s": 2e-6, "duration_s": 1e-6, "start_s": 0.0,
         "end_s": 1e-6},
        {"op_id": 2, "gpu": 0, "name": "b", "kind": "gemm", "measured_s": 0.0, "duration_s": 1e-6, "start_s": 1e-6,
         "end_s": 2e-6},
    ])
    with pytest.warns(UserWarning, match=r"1 kernel\(s\) with a measured duration of 0 are left out"):
        table = compare(ops_table).set_index("kernel_class")
    assert table.loc["all kernels", "kernels"] == 1
    assert table.loc["all kernels", "error"] == pytest.approx(-0.5)
    assert np.isfinite(table["median_kernel_error"].dropna()).all()


@pytest.mark.parametrize(("nbytes", "group", "mode"), [(2, "", "full"), (2, "0 1 2 3 4 5 6 7", "full"),
                                                      (2**20, "", "symmetric")])
def test_auto_mode_replays_a_collective_too_small_for_every_rank_in_full_mode(nbytes, group, mode):
    """Two bytes over 8 ranks leave six ranks without a chunk: their work differs from rank 0's."""
    rows = [{"op_id": 1, "gpu": gpu, "stream": "s", "kind": "collective", "collective": "allreduce",
             "bytes": nbytes, "group": group} for gpu in range(8)]
    assert choose_mode(Trace(pd.DataFrame(rows)), gpusim.load_system("hgx-h100")) == mode
