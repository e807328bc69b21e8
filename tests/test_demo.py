"""`gpusim demo --quick` (what `make demo` runs, at a quarter of the tokens): its table, plot and
Perfetto timelines, and what the table shows of T3."""

import json

import pandas as pd

from gpusim.cli import main


def test_the_quick_demo_writes_its_table_plot_and_timelines(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "configurations.csv").set_index("config")
    assert list(table.index) == ["sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc"]
    assert (table["time_s"] > 0).all() and table.loc["sequential", "speedup"] == 1
    # the overlap hides the reduce-scatter: T3 gains 20-40%, and no configuration is slower than sequential
    assert 1.2 < table.loc["t3-mca", "speedup"] < 1.5 and (table["speedup"] >= 1).all()
    # what is left of the reduce-scatter after the fused GEMM is at most its last update's trip: under 1 us of the
    # sequential reduce-scatter's hundreds
    assert (table.loc[["t3", "t3-mca"], "rs_exposed_s"] < 1e-6).all() and table.loc["sequential", "rs_s"] > 1e-4
    beats_ideal = table.loc[["t3", "t3-mca"], "time_s"].min() < table.loc["ideal-overlap", "time_s"]
    assert ("T3 beats the ideal overlap here" in printed) == beats_ideal
    assert (tmp_path / "t3_demo.png").stat().st_size > 0
    for name in ("t3_mca.perfetto.json", "sequential.perfetto.json"):
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        assert any(event.get("ph") == "X" for event in events), name
    spans = [event for event in json.loads((tmp_path / "t3_mca.perfetto.json").read_text())["traceEvents"]
             if event.get("ph") == "X"]
    gemm = next(event for event in spans if event["name"].startswith("gemm_rs_"))
    steps = [event for event in spans if event["name"].startswith("rs step")]
    assert len(steps) >= 7 and min(event["ts"] for event in steps) < gemm["ts"] + gemm["dur"]  # the overlap shows
