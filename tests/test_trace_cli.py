"""The simulate and validate-trace commands."""

import json
import re

import pandas as pd
import pytest

from gpusim.cli import main
from tests.conftest import REPO, shared_data

TINY_YAML = """
name: tiny
hidden: 256
layers: 3
heads: 4
vocab: 1024
seq_len: 64
batch: 2
sources: ["a test model"]
"""


def test_simulate_a_generated_model_writes_every_output(tmp_path, capsys):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    out = tmp_path / "out"
    code = main(["simulate", "--model", str(model), "--tp", "4", "--dp", "2", "--system", "t3-ring8", "--quiet",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "per iteration" in printed and "exposed_comm_ms" in printed
    for name in ("ops.parquet", "summary.json", "timeline.perfetto.json", "breakdown.png", "energy.csv"):
        assert (out / name).exists()
    assert "energy.csv" in printed.splitlines()[-1]
    energy = pd.read_csv(out / "energy.csv")  # the layer-cached replay priced whole (docs/energy.md)
    assert set(energy["gpu"]) == {0} and (energy["energy_j"] >= 0).all() and energy["energy_j"].sum() > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "symmetric" and summary["time_s"] > 0
    assert {"compute_s", "exposed_comm_s", "overlapped_comm_s", "idle_s"} <= set(summary["breakdown"][0])
    ops = pd.read_parquet(out / "ops.parquet")
    assert {"op_id", "kind", "duration_s", "measured_s"} <= set(ops.columns)


def test_simulate_within_the_power_limit_replays_every_layer_at_a_lower_clock(tmp_path, capsys):
    base = ["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--tp", "8", "--layers", "2", "--batch", "1",
            "--seq-len", "128", "--system", "t3-ring8", "--quiet"]
    assert main(base + ["--no-cache"]) == 0
    free = capsys.readouterr().out
    assert float(re.search(r"average power up to (\d+) W", free).group(1)) > 85 and "within the" not in free
    assert main(base + ["--set", "gpu.power.tdp_watts=85", "--within-power-limit", "--out", str(tmp_path / "out")]) == 0
    capped = capsys.readouterr().out
    assert "within the 85 W limit at" in capped and "limit 85 W)" in capped  # the energy line: every row simulated
    stats = json.loads((tmp_path / "out" / "summary.json").read_text())["stats"]
    assert stats["simulated_rows"] == stats["trace_rows"] and stats["clock_hz"] < 1.4e9
    assert main(base + ["--vary", "gpu.power.tdp_watts=85,300", "--within-power-limit", "--workers", "1"]) == 0
    assert "clock_hz" in capsys.readouterr().out


def test_simulate_overlaps_the_gemms_with_their_reductions_when_asked(tmp_path, capsys):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    out = tmp_path / "out"
    argv = ["simulate", "--model", str(model), "--phase", "prompt", "--tp", "4", "--dp", "2", "--system", "t3-ring8", "--quiet"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--overlap", "t3", "--policy", "t3-mca", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # two tensor-parallel groups, 3 layers of 2 reductions each, and the embedding's all-reduce
    assert "--overlap t3: 12 of 14 reduce-scatters and all-reduces overlapped" in printed
    assert "2 left as they were: no GEMM whose output it reduces" in printed
    ops = pd.read_parquet(out / "ops.parquet")
    assert (ops["kind"] == "fused").sum() == 6  # GPU 0's, in symmetric mode
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace_metadata"]["overlap"]["function"] == "t3"

    def per_iteration(text):
        return float(text.split(" ms per iteration")[0].rsplit(" ", 1)[1])

    assert per_iteration(printed) < per_iteration(plain)


def test_simulate_overlaps_a_sequence_parallel_layers_gathers_when_asked(tmp_path, capsys):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    argv = ["simulate", "--model", str(model), "--phase", "prompt", "--tp", "4", "--sequence-parallel",
            "--system", "t3-ring8", "--quiet", "--overlap-gathers", "decomposed_dma", "--overlap", "t3",
            "--policy", "t3-mca", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # 3 layers' QKV and FC-1; the head's gather is left
    assert "--overlap-gathers decomposed_dma: 6 of 7 all-gathers overlapped with the GEMM that consumes" in printed
    assert "1 left as they were: the GEMM after it does not take the gathered tensor" in printed
    assert "--overlap t3: 6 of 7 " in printed
    ops = pd.read_parquet(tmp_path / "out" / "ops.parquet")
    assert (ops.loc[ops["gpu"] == 0, "kind"] == "fused").sum() == 12  # QKV and FC-1 (gathers), OP and FC-2 (T3)
    cu_ring = [*argv[:argv.index("--overlap-gathers")], "--overlap-gathers", "decomposed", "--overlap-channels", "8",
               "--out", str(tmp_path / "cu")]
    assert main(cu_ring) == 0
    assert "--overlap-gathers decomposed: 6 of 7 all-gathers" in capsys.readouterr().out
    impls = pd.read_parquet(tmp_path / "cu" / "ops.parquet")["impl"].dropna()
    assert impls.str.startswith("decomposed_ring_ag").sum() == 6 * 4  # every GPU's rows, in full mode


def test_a_generated_model_larger_than_the_node_says_so(capsys):
    assert main(["simulate", "--model", "megatron-gpt2", "--tp", "16", "--layers", "1", "--system", "t3-ring8",
                 "--quiet"]) == 2
    assert "megatron-gpt2-train-tp16-dp1-pp1 uses 16 GPUs (its tp x pp x dp), but t3-ring8 has 8" in capsys.readouterr().err


def test_simulate_a_trace_file_and_bad_arguments(tmp_path, capsys):
    trace = REPO / "workloads" / "traces" / "dp_backward_v100_2gpu.csv"
    assert main(["simulate", "--trace", str(trace), "--system", "t3-ring8", "--quiet"]) == 0
    assert "134.763 ms" in capsys.readouterr().out
    assert main(["simulate", "--system", "t3-ring8"]) == 2
    assert "exactly one of --trace FILE or --model NAME" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("op_id,gpu,stream,kind\n1,0,s,conv\n")
    assert main(["simulate", "--trace", str(bad), "--system", "t3-ring8"]) == 2
    assert "field 'kind'" in capsys.readouterr().err


def test_simulate_rejects_a_layer_count_below_one(capsys):
    assert main(["simulate", "--model", "gpt3", "--layers", "0", "--system", "t3-ring8"]) == 2
    assert "transformer(): 'layers' must be a positive integer, got 0" in capsys.readouterr().err


def test_validate_trace_reports_per_class_and_fails_loudly(tmp_path, capsys):
    trace = str(shared_data("traces/kineto/mi250_minitoy_train_kineto.json.gz"))
    out = tmp_path / "val"
    assert main(["validate-trace", trace, "--system", "mi210", "--unsupported", "delay", "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for word in ("gemm", "elementwise", "reduction", "all kernels", "iteration"):
        assert word in printed
    table = pd.read_csv(out / "validate_trace.csv")
    assert set(table["kernel_class"]) >= {"gemm", "all kernels"}
    assert (out / "validate_trace.png").exists() and (out / "kernels.csv").exists()
    assert main(["validate-trace", trace, "--system", "mi210", "--unsupported", "delay", "--quiet",
                 "--tolerance", "0.0001"]) == 1
    assert main(["validate-trace", trace, "--system", "mi210", "--quiet"]) == 2
    assert "cannot be modelled" in capsys.readouterr().err


def test_validate_trace_replays_the_measured_host_unless_told_to_model_it(tmp_path):
    """The MI250 step is CPU-bound: its iteration is the measured host's, or far shorter without it."""
    trace = str(shared_data("traces/kineto/mi250_minitoy_train_kineto.json.gz"))
    errors = {}
    for flags in ([], ["--model-host"]):
        out = tmp_path / ("model" if flags else "measured")
        assert main(["validate-trace", trace, "--system", "mi210", "--unsupported", "delay", "--quiet",
                     "--out", str(out), *flags]) == 0
        table = pd.read_csv(out / "validate_trace.csv").set_index("kernel_class")
        errors[bool(flags)] = table.loc["iteration", "error"]
    assert abs(errors[False]) < 0.02 and errors[True] < -0.8


def test_simulate_refuses_more_layers_than_the_model_has(capsys):
    assert main(["simulate", "--model", "bert-base", "--layers", "13", "--system", "t3-ring8", "--quiet"]) == 2
    assert capsys.readouterr().err == "gpusim: error: transformer(): 'layers' (13) exceeds the 12 layers of bert-base\n"


TRACE = str(REPO / "workloads" / "traces" / "dp_backward_v100_2gpu.csv")


@pytest.mark.parametrize(("argv", "message"), [
    (["simulate", "--model", "bert-base", "--phase", "decode", "--recompute"],
     "--recompute applies to --phase train only, not to --phase decode"),
    (["simulate", "--model", "bert-base", "--phase", "prompt", "--schedule", "gpipe"],
     "--schedule applies to --phase train only, not to --phase prompt"),
    (["simulate", "--model", "bert-base", "--decode-tokens", "4"],
     "--decode-tokens applies to --phase decode only, not to --phase train"),
    (["simulate", "--trace", TRACE, "--tp", "2"], "--tp describes a generated model (--model) and does not apply to --trace"),
    (["simulate", "--trace", TRACE, "--layers", "2"],
     "--layers describes a generated model (--model) and does not apply to --trace"),
    (["simulate", "--model", "bert-base", "--phase", "decode", "--sequence-parallel"],
     "--sequence-parallel applies to --phase train and prompt, not to --phase decode"),
    (["simulate", "--trace", TRACE, "--sequence-parallel"],
     "--sequence-parallel describes a generated model (--model) and does not apply to --trace"),
    (["simulate", "--model", "bert-base", "--phase", "prompt", "--async-tp-backward"],
     "--async-tp-backward applies to --phase train only, not to --phase prompt"),
    (["simulate", "--model", "bert-base", "--phase", "decode", "--distributed-optimizer"],
     "--distributed-optimizer applies to --phase train only, not to --phase decode"),
    (["simulate", "--model", "bert-base", "--overlap-param-gather"],
     "'overlap_param_gather' overlaps the distributed optimizer's parameter all-gathers; it needs"),
    (["simulate", "--model", "bert-base", "--distributed-optimizer"],
     r"--distributed-optimizer shards the optimizer over the data-parallel ranks; with --dp 1 it changes nothing"),
    (["simulate", "--model", "bert-base", "--async-tp-backward", "--dp", "2"],
     r"--async-tp-backward overlaps the tensor-parallel communication; with --tp 1 it changes nothing"),
    (["simulate", "--model", "bert-base", "--virtual-stages", "2"],
     "virtual_stages=2 (the interleaved 1F1B schedule) needs pp > 1"),
    (["simulate", "--trace", TRACE, "--async-tp-backward"],
     "--async-tp-backward describes a generated model (--model) and does not apply to --trace"),
    (["simulate", "--trace", TRACE, "--vocab-divisible-by", "128"],
     "--vocab-divisible-by describes a generated model (--model) and does not apply to --trace"),
    (["simulate", "--model", "bert-base", "--overlap-channels", "8"],
     "--overlap-channels applies to --overlap decomposed"),
    (["simulate", "--model", "bert-base", "--overlap", "t3", "--overlap-channels", "8"],
     "--overlap-channels applies to --overlap decomposed"),
    (["simulate", "--model", "bert-base", "--overlap", "t3", "--overlap-splits", "2"],
     "--overlap-splits applies to --overlap decomposed and decomposed_dma"),
    (["validate-trace", TRACE, "--iteration", "2"],
     f"--iteration selects a ProfilerStep of a Kineto trace (.json/.json.gz), but the trace {TRACE} is not one"),
    (["simulate", "--trace", TRACE, "--iteration", "2"],
     f"simulate: --iteration selects a ProfilerStep of a Kineto trace (.json/.json.gz), but the trace {TRACE} is not one"),
    (["simulate", "--model", "bert-base", "--iteration", "2"],
     "simulate: --iteration selects a ProfilerStep of Kineto traces (--trace), not of --model"),
    (["validate-trace", TRACE, "--dataflow"],
     f"--dataflow chooses how the tensors of a Kineto trace (.json/.json.gz) are inferred, but the trace {TRACE} is "
     "not one"),
    (["validate-trace", TRACE, "--no-dataflow"],
     f"--no-dataflow chooses how the tensors of a Kineto trace (.json/.json.gz) are inferred, but the trace {TRACE} "
     "is not one"),
])
def test_contradictory_options_are_errors(argv, message, capsys):
    assert main([*argv, "--system", "t3-ring8", "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gpusim: error: ") and message in captured.err and captured.out == ""


def test_a_trace_that_is_not_there_is_named(tmp_path, capsys):
    (tmp_path / "gemms.csv").write_text("")
    (tmp_path / "empty").mkdir()
    for path, message in [(tmp_path / "nope.csv", "no such file or folder"),
                          (tmp_path / "*.et", "no file matches the pattern"),
                          (tmp_path / "*.csv", "a pattern must select Chakra .et files or Kineto .json/.json.gz files, "
                                               f"but it matches {tmp_path / 'gemms.csv'}"),
                          (tmp_path / "empty", "the folder holds no trace files; give Chakra .et files or Kineto "
                                               ".json/.json.gz files, one a rank")]:
        assert main(["simulate", "--trace", str(path), "--system", "t3-ring8", "--quiet"]) == 2
        assert capsys.readouterr().err == f"gpusim: error: {path}: {message}\n"


def kineto_rank(folder, rank: int, name: str) -> None:
    """A one-kernel Kineto trace of ``rank`` of a two-GPU job: an NCCL all-reduce of 1 MiB."""
    nccl = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": 10.0, "dur": 20.0,
            "args": {"stream": 7, "correlation": 1, "Collective name": "allreduce", "In msg nelems": 2**18,
                     "Out msg nelems": 2**18, "dtype": "Float", "Process Group Ranks": "[0, 1]"}}
    (folder / name).write_text(json.dumps({"traceEvents": [nccl], "distributedInfo": {"rank": rank, "world_size": 2}}))


def test_a_folder_or_pattern_of_kineto_traces_is_one_job_of_a_file_a_rank(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    kineto_rank(job, 1, "worker_a.json")  # the ranks come from distributedInfo, not the names
    kineto_rank(job, 0, "worker_b.json")
    for given in (job, job / "*.json"):
        assert main(["simulate", "--trace", str(given), "--system", "mi210-4", "--quiet", "--out",
                     str(tmp_path / "out")]) == 0
        ops = pd.read_parquet(tmp_path / "out" / "ops.parquet")
        assert sorted(ops["gpu"]) == [0, 1] and ops["op_id"].nunique() == 1
    capsys.readouterr()
    chakra = job / "rank.0.et"
    chakra.write_bytes(b"")
    assert main(["simulate", "--trace", str(job), "--system", "mi210-4", "--quiet"]) == 2
    assert capsys.readouterr().err == (f"gpusim: error: {job}: the folder holds Chakra traces (rank.0.et) and Kineto "
                                       f"traces (worker_a.json); give the files of one job, of one kind\n")


def test_simulate_replays_one_profiler_step_of_a_kineto_trace(tmp_path, capsys):
    """Two profiler steps of a 1 MiB and a 4 MiB all-reduce: --iteration 2 replays the second alone."""
    events = []
    for step, elements in ((1, 2**18), (2, 2**20)):
        start = 100.0 * step
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": start, "dur": 90.0})
        events.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": start + 10,
                       "dur": 20.0, "args": {"stream": 7, "correlation": step, "Collective name": "allreduce",
                                             "In msg nelems": elements, "Out msg nelems": elements, "dtype": "Float",
                                             "Process Group Ranks": "[0, 1]"}})
    trace = tmp_path / "steps.json"
    trace.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    simulate = ["simulate", "--trace", str(trace), "--system", "mi210-4", "--quiet"]
    assert main([*simulate, "--iteration", "2", "--out", str(tmp_path / "out")]) == 0
    ops = pd.read_parquet(tmp_path / "out" / "ops.parquet")
    assert ops["bytes"].tolist() == [4 * 2**20]
    capsys.readouterr()
    assert main([*simulate, "--iteration", "3"]) == 2
    assert "no ProfilerStep#3 annotation; the trace has ProfilerStep#1, ProfilerStep#2" in capsys.readouterr().err


def test_an_unmodelled_kineto_kernel_points_to_the_option(tmp_path, capsys):
    trace = tmp_path / "one.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                                                  "args": {"stream": 7, "correlation": 1}}]}))
    assert main(["simulate", "--trace", str(trace), "--system", "t3-ring8", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot be modelled" in err and "--unsupported delay replays" in err and "read_kineto" not in err
    assert main(["simulate", "--trace", str(trace), "--system", "t3-ring8", "--quiet", "--unsupported", "delay"]) == 0


def test_a_tolerance_cannot_pass_when_nothing_was_simulated(capsys):
    trace = str(REPO / "workloads" / "traces" / "dp_backward_v100_2gpu.csv")
    assert main(["validate-trace", trace, "--system", "dgx1-v100", "--tolerance", "0.01", "--quiet"]) == 1
    assert "nothing to check against the tolerance: all 28 kernels" in capsys.readouterr().out


@pytest.mark.parametrize("tolerance", ["-1", "nan", "inf"])
def test_a_tolerance_is_a_finite_non_negative_fraction(tolerance, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["validate-trace", "t.csv", "--system", "dgx1-v100", "--tolerance", tolerance])
    assert exit_.value.code == 2 and "expected a finite number of at least 0" in capsys.readouterr().err


def test_unsupported_applies_to_imported_traces_only(capsys):
    argv = ["simulate", "--model", "bert-base", "--layers", "1", "--system", "a100-sxm4", "--unsupported", "delay"]
    assert main(argv) == 2
    assert "--unsupported applies to imported traces (--trace), not to --model" in capsys.readouterr().err


def test_simulate_a_generated_model_in_another_dtype(tmp_path, capsys):
    out = tmp_path / "fp32"
    assert main(["simulate", "--model", "bert-base", "--layers", "1", "--dtype", "fp32", "--phase", "prompt",
                 "--batch", "1", "--seq-len", "128", "--system", "a100-sxm4", "--quiet", "--out", str(out)]) == 0
    query = pd.read_parquet(out / "ops.parquet").set_index("name").loc["L0.q"]
    tokens, hidden = query["flops"] / (2 * 768 * 768), 768  # bert-base: hidden 768
    assert query["bytes"] == 4 * (2 * tokens * hidden + hidden * hidden)  # input, weight and output in fp32
    assert main(["simulate", "--trace", TRACE, "--dtype", "fp32", "--system", "t3-ring8"]) == 2
    assert "--dtype describes a generated model (--model) and does not apply to --trace" in capsys.readouterr().err


def test_the_megatron_options_reach_the_generator(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    out = tmp_path / "sp"
    assert main(["simulate", "--model", str(model), "--tp", "4", "--layers", "1", "--sequence-parallel",
                 "--vocab-divisible-by", "100", "--async-tp-backward", "--distributed-optimizer", "--dp", "2",
                 "--overlap-param-gather",
                 "--recompute", "selective",
                 "--system", "t3-ring8", "--quiet", "--out", str(out)]) == 0
    metadata = json.loads((out / "summary.json").read_text())["trace_metadata"]
    assert metadata["sequence_parallel"] is True and metadata["vocab_divisible_by"] == 100
    assert metadata["async_tp_backward"] is True and metadata["distributed_optimizer"] is True
    assert metadata["overlap_param_gather"] is True
    assert metadata["recompute"] == "selective"
    ops = pd.read_parquet(out / "ops.parquet")
    rank0 = ops[ops["gpu"] == 0].set_index("name")
    assert set(rank0.loc[["L0.ln1_allgather_wgrad", "L0.attn_reducescatter_bwd"], "stream"]) == {"tp_comm"}
    assert rank0.loc["L0.param_allgather", "stream"] == "comm"
    assert rank0.loc["recompute.L0.softmax", "phase"] == "bwd" and "recompute.L0.ln1" not in rank0.index
    assert {"L0.ln1_allgather", "L0.attn_reducescatter"} <= set(rank0.index)
    # a replica's one sequence of 64 tokens; 1024 words padded to 1200, over 4 ranks
    assert rank0.loc["lm_head", "flops"] == 2 * 64 * 256 * 1200 // 4


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_vocabulary_multiple_names_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--model", "bert-base", "--vocab-divisible-by", value, "--system", "t3-ring8"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument --vocab-divisible-by: expected a positive integer, got '{value}'" in err


def test_a_trace_with_a_repeated_column_fails_cleanly_and_writes_nothing(tmp_path, capsys):
    trace = tmp_path / "dup.csv"
    trace.write_text("op_id,gpu,stream,kind,m,n,k,m\n1,0,s,gemm,64,64,64,64\n")
    out = tmp_path / "out"
    for command in (["simulate", "--trace", str(trace)], ["validate-trace", str(trace)]):
        assert main([*command, "--system", "t3-ring8", "--quiet", "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"gpusim: error: {trace}: column 'm' appears 2 times; give each column once\n"
        assert not out.exists()


def test_a_trace_of_an_unknown_format_lists_what_the_commands_read(tmp_path, capsys):
    """The message listed only the table suffixes and pointed to the Python readers of Kineto and Chakra
    traces, which the commands read themselves."""
    trace = tmp_path / "trace.txt"
    trace.write_text("op_id,gpu,stream,kind\n1,0,s,delay\n")
    for command in (["simulate", "--trace", str(trace)], ["validate-trace", str(trace)]):
        assert main([*command, "--system", "t3-ring8", "--quiet", "--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == (f"gpusim: error: {trace}: unknown trace format; give a gpusim table (.csv, "
                                           ".csv.gz, .parquet, .pq), a Kineto trace (.json, .json.gz) or Chakra traces "
                                           "(.et files), or a folder or pattern of a job's Kineto or Chakra traces, "
                                           "one a rank\n")
        assert not (tmp_path / "out").exists()
