"""The simulate and validate-trace commands."""

import json

import pandas as pd

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
    code = main(["simulate", "--model", str(model), "--tp", "2", "--dp", "2", "--system", "t3-ring8", "--quiet",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "per iteration" in printed and "exposed_comm_ms" in printed
    for name in ("ops.parquet", "summary.json", "timeline.perfetto.json", "breakdown.png"):
        assert (out / name).exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "symmetric" and summary["time_s"] > 0
    assert {"compute_s", "exposed_comm_s", "overlapped_comm_s", "idle_s"} <= set(summary["breakdown"][0])
    ops = pd.read_parquet(out / "ops.parquet")
    assert {"op_id", "kind", "duration_s", "measured_s"} <= set(ops.columns)


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
