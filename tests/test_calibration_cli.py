"""``gpusim validate``: table, files, and a non-zero exit when a tolerance is broken."""

from __future__ import annotations

import dataclasses

import pandas as pd

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
