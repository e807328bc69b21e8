"""``gpusim validate``: table, files, and a non-zero exit when a tolerance is broken."""

from __future__ import annotations

import dataclasses
import re

import pandas as pd
import pytest

from gpusim import validation
from gpusim.cli import main


def test_validate_writes_csv_plot_and_summary(tmp_path, capsys):
    assert main(["validate", "--dataset", "gelu-mi210", "--points", "4", "--out", str(tmp_path), "--quiet",
                 "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "gelu-mi210" in out and "validation passed" in out
    for name in ("gelu-mi210.csv", "gelu-mi210.png", "summary.csv"):
        assert (tmp_path / name).exists()
    assert {"measured_s", "simulated_s", "error"} <= set(open(tmp_path / "gelu-mi210.csv").readline().strip().split(","))


def test_validate_fails_loudly_beyond_the_tolerance(tmp_path, capsys, monkeypatch):
    strict = dataclasses.replace(validation.DATASETS["gelu-mi210"], tolerances={"median": 0.0})
    monkeypatch.setitem(validation.DATASETS, "gelu-mi210", strict)
    assert main(["validate", "--dataset", "gelu-mi210", "--points", "3", "--out", str(tmp_path), "--quiet",
                 "--workers", "1"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "exceeds its tolerance" in captured.err


def test_unknown_dataset_is_refused(capsys):
    try:
        main(["validate", "--dataset", "nope"])
    except SystemExit as exit_:
        assert exit_.code == 2
    assert "invalid choice" in capsys.readouterr().err


def _two_row_gelu(monkeypatch) -> None:
    """Make gelu-mi210 a data set of its first two rows (two quick simulations)."""
    small = dataclasses.replace(validation.DATASETS["gelu-mi210"], select=lambda frame: frame.head(2))
    monkeypatch.setitem(validation.DATASETS, "gelu-mi210", small)


def test_validate_states_the_points_it_used(tmp_path, capsys, monkeypatch):
    _two_row_gelu(monkeypatch)
    assert main(["validate", "--dataset", "gelu-mi210", "--points", "100000", "--out", str(tmp_path), "--quiet",
                 "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "validation passed (on random subsets of the points: gelu-mi210 2 of 2)" in out
    assert "100000" not in out


def test_validate_compares_a_repeated_dataset_once(tmp_path, capsys, monkeypatch):
    _two_row_gelu(monkeypatch)
    assert main(["validate", "--dataset", "gelu-mi210", "--dataset", "gelu-mi210", "--out", str(tmp_path), "--quiet",
                 "--workers", "1"]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary["dataset"]) == ["gelu-mi210"]


def test_validate_tries_an_override_at_every_point_and_records_it(tmp_path, capsys, monkeypatch):
    _two_row_gelu(monkeypatch)
    assert main(["validate", "--dataset", "gelu-mi210", "--out", str(tmp_path / "preset"), "--quiet",
                 "--workers", "1"]) == 0
    status = main(["validate", "--dataset", "gelu-mi210", "--set", "gpu.kernel_launch_ns=1ms", "--out",
                   str(tmp_path / "tried"), "--quiet", "--workers", "1"])
    assert status == 1  # a millisecond per call is far beyond GeLU's tolerance
    assert "with the overrides gpu.kernel_launch_ns=1ms at every point" in capsys.readouterr().out
    preset = pd.read_csv(tmp_path / "preset" / "gelu-mi210.csv")
    tried = pd.read_csv(tmp_path / "tried" / "gelu-mi210.csv")
    assert (tried["simulated_s"] - preset["simulated_s"]).between(0.9e-3, 1.0e-3).all()
    assert "overrides" not in pd.read_csv(tmp_path / "preset" / "summary.csv")
    assert set(pd.read_csv(tmp_path / "tried" / "summary.csv")["overrides"]) == {"gpu.kernel_launch_ns=1ms"}


def test_a_bad_override_is_refused_before_any_simulation(tmp_path, capsys):
    assert main(["validate", "--dataset", "gelu-mi210", "--set", "gpu.no_such_field=1", "--out",
                 str(tmp_path / "out"), "--quiet"]) == 2
    assert "no_such_field" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["validate", "--vidur", str(tmp_path / "none.csv"), "--system", "h100-sxm5", "--set",
                 "gpu.num_cus=-1"]) == 2
    assert "num_cus" in capsys.readouterr().err


def _vidur_profile(path, ops=("input_layernorm", "mlp_act", "add"), extra_row=True):
    """A vidur MLP profile as vidur writes it: two token counts of a Llama-like layer (the second
    repeated, as vidur's files repeat some), ``time_stats.<op>.<stat>`` columns in ms."""
    rows = []
    for tokens in (64, 512, 512) if extra_row else (64, 512):
        row = {}
        for op in ops:
            row.update({f"time_stats.{op}.{stat}": 0.004 * tokens / 64 for stat in ("min", "max", "mean", "median")})
            row[f"time_stats.{op}.std"] = 0.0
        row.update(n_head=32, n_kv_head=8, n_embd=4096, n_expanded_embd=14336, vocab_size=128256, use_gated_mlp=True,
                   num_tokens=tokens, num_tensor_parallel_workers=2)
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_validate_reads_a_vidur_profile_as_vidur_writes_it(tmp_path, capsys):
    path = _vidur_profile(tmp_path / "Meta-Llama-3-8B" / "mlp.csv", ops=("post_attention_layernorm", "mlp_act", "add"))
    frame = validation.read_vidur_profile(path)
    assert len(frame) == 2 * 3 and set(frame["op"]) == {"post_attention_layernorm", "mlp_act", "add"}
    model = validation.vidur_model(frame)
    assert (model.kv_heads, model.mlp, model.gated, model.post_attention_norm) == (8, 14336, True, True)
    assert model.add_calls == 1
    dataset = validation.vidur_dataset(path, "h100-sxm5")
    point = dataset.point(dataset.load().query("op == 'mlp_act'").iloc[0])
    # 14336 / 2 values per token on each of two tensor-parallel ranks, one row per token
    assert (point["op"], point["elements"], point["rows"]) == ("silu_and_mul", 64 * 7168, 64)
    out_dir = tmp_path / "out"
    status = main(["validate", "--vidur", str(path), "--system", "h100-sxm5", "--out", str(out_dir), "--quiet",
                   "--workers", "1"])
    assert status in (0, 1)
    summary = pd.read_csv(out_dir / "summary.csv")
    assert list(summary.query("subset == 'all'")["dataset"]) == ["vidur-Meta-Llama-3-8B-h100-sxm5"]
    assert "Meta-Llama-3-8B" in capsys.readouterr().out


def test_a_failing_data_sets_verdict_is_on_its_own_row_not_on_its_groups(tmp_path, capsys):
    """The tolerances judge the whole data set; its per-operation rows used to repeat its FAIL."""
    path = _vidur_profile(tmp_path / "Meta-Llama-3-8B" / "mlp.csv", extra_row=False)
    wide = pd.read_csv(path)
    times = [column for column in wide.columns if column.startswith("time_stats.")]
    wide[times] *= 1000  # seconds where vidur writes milliseconds: every point far too long
    wide.to_csv(path, index=False)
    out_dir = tmp_path / "out"
    assert main(["validate", "--vidur", str(path), "--system", "h100-sxm5", "--out", str(out_dir), "--quiet",
                 "--workers", "1"]) == 1
    summary = pd.read_csv(out_dir / "summary.csv", keep_default_na=False)
    assert summary.set_index("subset")["verdict"].to_dict() == {
        "all": "FAIL", "op=add": "", "op=input_layernorm": "", "op=mlp_act": ""}
    assert (summary["bias"].astype(float) < -0.99).all()  # the signed median: the model is 1000x fast
    assert "vidur-Meta-Llama-3-8B-h100-sxm5: median |error|" in capsys.readouterr().err


def test_a_bad_vidur_profile_is_an_error_naming_the_file_and_field(tmp_path, capsys):
    path = _vidur_profile(tmp_path / "m" / "mlp.csv")
    pd.read_csv(path).drop(columns=["n_kv_head"]).to_csv(path, index=False)
    assert main(["validate", "--vidur", str(path), "--system", "h100-sxm5", "--quiet"]) == 2
    assert f"{path}: field 'n_kv_head' is missing" in capsys.readouterr().err
    assert main(["validate", "--vidur", str(path)]) == 2
    assert "--system" in capsys.readouterr().err
    assert main(["validate", "--vidur", str(tmp_path / "none.csv"), "--system", "h100-sxm5"]) == 2
    assert "vidur profile not found" in capsys.readouterr().err
    assert main(["validate", "--vidur", str(tmp_path / "m"), "--system", "h100-sxm5"]) == 2
    assert capsys.readouterr().err == (f"gpusim: error: {tmp_path / 'm'}: is a folder; a vidur profile is a file "
                                       f"(data/profiling/compute/<gpu>/<model>/mlp.csv)\n")
    assert main(["validate", "--vidur", "", "--system", "h100-sxm5"]) == 2  # not the current folder
    assert capsys.readouterr().err == "gpusim: error: vidur profile: expected the path of an mlp.csv, got an empty path\n"


@pytest.mark.parametrize(("column", "value", "message"), [
    ("time_stats.add.median", "abc", r"line 2: field 'time_stats.add.median' must be a time above 0 ms, got 'abc'"),
    ("time_stats.add.median", -0.01, r"line 2: field 'time_stats.add.median' must be a time above 0 ms, got -0.01"),
    ("time_stats.add.median", 0.5, r"line 2: field 'time_stats.add.median' \(0.5\) must lie between its min \(0.004\) and max \(0.004\)"),
    ("num_tokens", "x", r"line 2: field 'num_tokens' must be a whole number above 0, got 'x'"),
    ("num_tokens", None, r"line 2: field 'num_tokens' must be a whole number above 0, got nan"),
    ("n_head", 0, r"line 2: field 'n_head' must be a whole number above 0, got 0"),
    ("num_tensor_parallel_workers", 3, r"field 'num_tensor_parallel_workers': 3 GPUs do not split the model \(32 heads, "
                                       r"8 key/value heads, an MLP of 14336\) into equal parts"),
    ("time_stats.mlp_actt.median", 0.004, r"field 'time_stats.mlp_actt.\*' times an operation gpusim does not know"),
])
def test_a_vidur_profile_with_a_bad_value_names_the_line_and_field(tmp_path, capsys, column, value, message):
    """A cell that is not a count, not a time or out of order is refused, not simulated or scored."""
    path = _vidur_profile(tmp_path / "m" / "mlp.csv")
    wide = pd.read_csv(path)
    wide[column] = wide[column].astype(object) if column in wide else None
    wide.loc[0, column] = value
    wide.to_csv(path, index=False)
    assert main(["validate", "--vidur", str(path), "--system", "h100-sxm5", "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
