"""The CI set of the concurrent-GEMM study (validation/concurrency/reproduce.py --quick): its tables,
and the signs and orderings of the dissertation's chapter 7 that it must reproduce."""

import contextlib
import importlib.util
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def load_reproduce():
    spec = importlib.util.spec_from_file_location("concurrency_reproduce", REPO / "validation" / "concurrency" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The CI run's output folder, exit status and what it printed."""
    out = tmp_path_factory.mktemp("concurrency")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = load_reproduce().main(["--out", str(out), "--quick", "--workers", "2", "--quiet", "--check"])
    return out, status, printed.getvalue()


def test_writes_summary_and_predictor_tables(quick):
    out, _, _ = quick
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == ["concurrency", "config", "geomean_speedup"]
    assert set(summary["config"]) == {"default", "go-kernels", "goldyloc", "oracle", "cu-partition", "resource-partition"}
    assert set(summary["concurrency"]) == {2, 4, 8, 16}
    assert summary.groupby("config").size().to_dict()["resource-partition"] == 2  # the CI set's partitions: 2 and 16
    predictor = pd.read_csv(out / "predictor.csv")
    assert list(predictor.columns[:2]) == ["concurrency", "accuracy"]
    assert predictor["accuracy"].between(0, 1).all()
    for name in ("per_app", "speedups", "impact", "go_properties", "selected", "cp_check", "comparison", "checks",
                 "size_trend"):
        assert (out / f"{name}.csv").exists()
    assert (out / "per_app.png").exists() and (out / "summary.png").exists()


def test_signs_and_orderings_of_chapter_7(quick):
    out, status, _ = quick
    checks = pd.read_csv(out / "checks.csv").set_index("check")
    for check in ("go-kernels never loses to Default in geomean", "goldyloc never loses to Default in geomean",
                  "Oracle >= GOLDYLOC in geomean", "Default gains over Sequential at 2"):
        assert checks.loc[check, "holds"], f"{check}: {checks.loc[check, 'detail']}"
    assert status == (0 if checks["holds"].all() else 1)


@pytest.mark.xfail(strict=True, reason=(
    "known deviation (docs/concurrency-log.md, 'The MI100 recalibration'): with the MI100's HBM at 0.9 of "
    "peak the CI set's GEMMs all gain more from concurrency at 16 than at 2 (1.232 -> 1.432 since stop 56's set); it fell "
    "only while BERT's GEMMs thrashed the L2 into a half-speed memory"))
def test_defaults_benefit_falls_with_concurrency(quick):
    """Chapter 7: Default's geomean benefit over Sequential is lower at 16 available GEMMs than at 2."""
    out, _, _ = quick
    checks = pd.read_csv(out / "checks.csv").set_index("check")
    check = "Default's benefit falls with concurrency"
    assert checks.loc[check, "holds"], f"{check}: {checks.loc[check, 'detail']}"


def test_smaller_gemms_gain_less_from_two_copies(quick):
    """Fig. 7.1a: in a 4K x N x 1K family, two concurrent copies of the smallest GEMM gain less over
    running back to back than two copies of the largest (measured: about 19% for the largest)."""
    out, _, _ = quick
    trend = pd.read_csv(out / "size_trend.csv").sort_values("gflop")
    assert list(trend.columns[:4]) == ["m", "n", "k", "gflop"]
    assert trend["speedup2"].iloc[0] < trend["speedup2"].iloc[-1], trend.to_string()
    assert 1.03 < trend["speedup2"].iloc[-1] < 1.3


def test_composed_goldyloc_agrees_with_the_command_processor(quick):
    out, _, _ = quick
    check = pd.read_csv(out / "cp_check.csv")
    assert len(check) and check["ratio"].between(0.7, 1.3).all()


def test_the_quick_run_counts_no_skipped_experiment_as_a_miss(quick):
    """--quick leaves out the section 7.5.7 mixes: their reference rows are 'not run', not misses, and say so."""
    out, _, printed = quick
    comparison = pd.read_csv(out / "comparison.csv")
    skipped = comparison["metric"].isin(["heterogeneous_over_default", "batched_over_default"])
    assert skipped.sum() == 3
    assert (comparison.loc[skipped, "status"] == "not run").all()
    assert comparison.loc[skipped, ["simulated", "within_tolerance"]].isna().all().all()
    assert comparison.loc[skipped, "note"].str.contains("--quick leaves them out").all()
    assert comparison.loc[~skipped, "status"].isin(["within tolerance", "miss"]).all()
    assert comparison.loc[~skipped, "within_tolerance"].notna().all()
    assert "3 not run (no misses): heterogeneous_over_default at 16; batched_over_default at 2, 4" in printed
    checks = pd.read_csv(out / "checks.csv")  # what --check counts: every check computed from what the run simulated
    assert checks["holds"].notna().all() and not checks["detail"].str.contains("nan").any()


def synthetic_result() -> SimpleNamespace:
    """The tables of a study result that compare() and plots() read, with made-up numbers."""
    configs = ["default", "go-kernels", "goldyloc", "oracle"]
    summary = pd.DataFrame([{"concurrency": d, "config": c, "geomean_speedup": 1.1 + 0.01 * i + 0.001 * d}
                            for d in (2, 4, 8, 16) for i, c in enumerate(configs)])
    return SimpleNamespace(
        summary=summary, per_app=summary.assign(app="gnmt"),
        predictor=pd.DataFrame({"concurrency": [2, 4, 8, 16], "accuracy": [0.8, 0.7, 0.62, 0.3]}),
        impact=pd.DataFrame({"concurrency": [2, 4, 8, 16], "improved": 0.6, "unchanged": 0.3, "degraded": 0.1}),
        go_properties=pd.DataFrame({"waves_ratio": [0.5, 2.0], "l2_accesses_per_wave_ratio": [0.8, 1.1],
                                    "l2_misses_per_wave_ratio": [0.9, float("nan")]}),
    )


def test_reference_values_a_run_did_not_compute_are_not_run_not_misses(tmp_path):
    reproduce = load_reproduce()
    empty = pd.DataFrame(columns=["concurrency", "config", "geomean_speedup", "over_default"])
    comparison = reproduce.compare(synthetic_result(), empty, empty)
    mixes = comparison["metric"].isin(["heterogeneous_over_default", "batched_over_default"])
    assert list(comparison.loc[mixes, "status"]) == ["not run"] * 3
    assert comparison.loc[mixes, "note"].str.contains("were not simulated; --quick leaves them out").all()
    assert comparison.loc[~mixes, "note"].eq("").all()
    accuracy = comparison.set_index(["metric", "concurrency"])["status"]
    assert accuracy[("predictor_accuracy", 16)] == "miss" and accuracy[("predictor_accuracy", 8)] == "within tolerance"
    comparison.to_csv(tmp_path / "comparison.csv", index=False)
    written = pd.read_csv(tmp_path / "comparison.csv")
    assert written.loc[mixes, "within_tolerance"].isna().all()  # empty, not False
    assert written.loc[~mixes, "within_tolerance"].isin([True, False]).all()
    line = reproduce.comparison_summary(comparison)
    assert line.startswith("reference values: ") and "of the 17 this run computed within 5 points" in line
    assert line.endswith("; 3 not run (no misses): heterogeneous_over_default at 16; batched_over_default at 2, 4")
    mixed = pd.DataFrame({"concurrency": [16, 2, 4], "config": ["goldyloc", "go-kernels", "goldyloc"],
                          "geomean_speedup": 1.2, "over_default": [1.15, 1.02, 1.2]})
    complete = reproduce.compare(synthetic_result(), mixed.iloc[:1], mixed.iloc[1:])
    assert not (complete["status"] == "not run").any() and "not run" not in reproduce.comparison_summary(complete)
    assert complete.set_index("metric").loc["batched_over_default", "status"].tolist() == ["within tolerance", "miss"]


def test_a_value_exactly_the_tolerance_away_is_within_it():
    """0.75 against the reference's 0.70 is 5 points in decimal and 5.000000000000004 in binary."""
    reproduce = load_reproduce()
    result = synthetic_result()
    result.predictor["accuracy"] = [0.8, 0.75, 0.62, 0.3]
    empty = pd.DataFrame(columns=["concurrency", "config", "geomean_speedup", "over_default"])
    status = reproduce.compare(result, empty, empty).set_index(["metric", "concurrency"])["status"]
    assert status[("predictor_accuracy", 4)] == "within tolerance"


def test_every_plot_axis_says_its_unit_or_what_its_ratio_is_of(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    reproduce = load_reproduce()
    figures = {}
    monkeypatch.setattr(reproduce.plot, "save_figure", lambda fig, path, dpi: figures.setdefault(path.name, fig))
    result = synthetic_result()
    empty = pd.DataFrame(columns=["concurrency", "config", "geomean_speedup", "over_default"])
    selected = pd.DataFrame({"gemm": ["gnmt 64_2048_512_01"] * 2, "config": ["default", "goldyloc"], "speedup": [1.1, 1.2]})
    sizes = pd.DataFrame({"gflop": [0.1, 1.0, 0.1, 1.0], "dtype": ["fp16", "fp16", "fp32", "fp32"],
                          "speedup": [1.0, 1.1, 1.05, 1.15]})
    reproduce.plots(tmp_path, result, selected, sizes, reproduce.compare(result, empty, empty))
    assert sorted(figures) == ["fp16.png", "go_properties.png", "partitions.png", "per_app.png", "predictor.png", "selected.png",
                               "summary.png"]
    labels = {name: [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes] for name, fig in figures.items()}
    for figure in figures.values():
        plt.close(figure)
    for name, axes in labels.items():
        for xlabel, ylabel in axes:
            assert re.search(r"\((x|ratio|GFLOP)\)|share of|Table 7.3|available independent GEMMs|GEMM \(|rank", xlabel), (name, xlabel)
            assert re.search(r"\((x|ratio)\)|share of", ylabel), (name, ylabel)
    assert labels["summary.png"] == [("available independent GEMMs", "geomean speedup over Sequential (x)")]
    assert labels["predictor.png"][0][0] == "available independent GEMMs"


def test_a_size_limit_that_leaves_no_gemm_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "none"
    with pytest.raises(SystemExit) as exit_:
        load_reproduce().main(["--out", str(out), "--max-gflop", "0.01", "--quiet"])
    assert exit_.value.code == 2  # a usage error
    assert re.search(r"--max-gflop 0.01 leaves none of the \d+ GEMMs; the smallest has", capsys.readouterr().err)
    assert not out.exists()  # nothing half-written
