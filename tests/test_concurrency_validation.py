"""The CI set of the concurrent-GEMM study (validation/concurrency/reproduce.py --quick): its tables,
and the signs and orderings of the dissertation's chapter 7 that it must reproduce."""

import importlib.util
import re
from pathlib import Path

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
    out = tmp_path_factory.mktemp("concurrency")
    status = load_reproduce().main(["--out", str(out), "--quick", "--workers", "2", "--quiet", "--check"])
    return out, status


def test_writes_summary_and_predictor_tables(quick):
    out, _ = quick
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
    out, status = quick
    checks = pd.read_csv(out / "checks.csv").set_index("check")
    for check in ("go-kernels never loses to Default in geomean", "goldyloc never loses to Default in geomean",
                  "Oracle >= GOLDYLOC in geomean", "Default gains over Sequential at 2"):
        assert checks.loc[check, "holds"], f"{check}: {checks.loc[check, 'detail']}"
    assert status == (0 if checks["holds"].all() else 1)


@pytest.mark.xfail(strict=True, reason=(
    "known deviation (docs/concurrency.md, 'The MI100 recalibration'): with the MI100's HBM at 0.9 of "
    "peak the CI set's GEMMs all gain more from concurrency at 16 than at 2 (1.216 -> 1.392); it fell "
    "only while BERT's GEMMs thrashed the L2 into a half-speed memory"))
def test_defaults_benefit_falls_with_concurrency(quick):
    """Chapter 7: Default's geomean benefit over Sequential is lower at 16 available GEMMs than at 2."""
    out, _ = quick
    checks = pd.read_csv(out / "checks.csv").set_index("check")
    check = "Default's benefit falls with concurrency"
    assert checks.loc[check, "holds"], f"{check}: {checks.loc[check, 'detail']}"


def test_smaller_gemms_gain_less_from_two_copies(quick):
    """Fig. 7.1a: in a 4K x N x 1K family, two concurrent copies of the smallest GEMM gain less over
    running back to back than two copies of the largest (measured: about 19% for the largest)."""
    out, _ = quick
    trend = pd.read_csv(out / "size_trend.csv").sort_values("gflop")
    assert list(trend.columns[:4]) == ["m", "n", "k", "gflop"]
    assert trend["speedup2"].iloc[0] < trend["speedup2"].iloc[-1], trend.to_string()
    assert 1.03 < trend["speedup2"].iloc[-1] < 1.3


def test_composed_goldyloc_agrees_with_the_command_processor(quick):
    out, _ = quick
    check = pd.read_csv(out / "cp_check.csv")
    assert len(check) and check["ratio"].between(0.7, 1.3).all()


def test_a_size_limit_that_leaves_no_gemm_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "none"
    with pytest.raises(SystemExit) as exit_:
        load_reproduce().main(["--out", str(out), "--max-gflop", "0.01", "--quiet"])
    assert exit_.value.code == 2  # a usage error
    assert re.search(r"--max-gflop 0.01 leaves none of the \d+ GEMMs; the smallest has", capsys.readouterr().err)
    assert not out.exists()  # nothing half-written
