"""The study plots label every axis of a quantity with its unit (validation/nmc_optimizer and
validation/t3 reproduce.py): each plot function draws small made-up tables and every Axes it
saves is inspected.  Categorical axes (bars by case, configuration, optimizer) carry no unit."""

import importlib.util
import re
from pathlib import Path

import pandas as pd
import pytest

from gpusim import plot

REPO = Path(__file__).resolve().parents[1]
UNIT = re.compile(r"\(.+\)$")
"""A label ends with its unit in parentheses: ``time (ms)``, ``speedup over Sequential (x)``."""


def load(script: str):
    spec = importlib.util.spec_from_file_location(script.replace("/", "_"), REPO / "validation" / script / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def saved(monkeypatch):
    """The figures the plot functions save, by file name (drawn, not written)."""
    figures = {}

    def save_figure(fig, path, dpi: int = 120) -> None:
        fig.canvas.draw()
        figures[Path(path).name] = fig

    monkeypatch.setattr(plot, "save_figure", save_figure)
    yield figures
    for fig in figures.values():
        plot.plt.close(fig)


def _numbers(labels) -> bool:
    """Whether an axis's tick labels are numbers (not categories)."""
    texts = [label.get_text().replace("\N{MINUS SIGN}", "-") for label in labels if label.get_text()]
    try:
        [float(text) for text in texts]
    except ValueError:
        return False
    return bool(texts)


def unlabelled(figures) -> list[str]:
    """``file: axis 'label'`` for every axis of a quantity without a unit (a log axis is always one)."""
    missing = []
    for name, fig in figures.items():
        for ax in fig.axes:
            axes = [("y", ax.get_ylabel(), ax.get_yscale(), ax.get_yticklabels()),
                    ("x", ax.get_xlabel(), ax.get_xscale(), ax.get_xticklabels())]
            for axis, label, scale, ticks in axes:
                quantity = scale == "log" or _numbers(ticks)
                if quantity and not UNIT.search(label):
                    missing.append(f"{name}: {axis} {label!r}")
    return missing


def test_the_nmc_study_plots_label_their_axes_with_units(saved, tmp_path):
    nmc = load("nmc_optimizer")
    storage = ["1x", "4x", "1x", "4x"]
    lamb = pd.DataFrame({"model": "bert-base", "grad_norm": ["banks"] * 2 + ["gpu"] * 2, "baseline": "gpu-peak",
                         "temp_storage": storage, "speedup": [1.4, 3.0, 1.3, 2.5], "reference_speedup": [3.8, 4.7] * 2})
    nmc.plot_lamb(lamb, tmp_path)
    nmc.plot_end_to_end(pd.DataFrame({"model": "bert-base", "config": "Ph1-B32-FP16", "temp_storage": ["1x", "4x"],
                                      "iteration_speedup": [1.06, 1.11], "reference_low": 1.09,
                                      "reference_high": 1.2}), tmp_path)
    steps = {"measured_ms": [24.6, 9.5], "simulated_ms": [27.0, 8.7]}
    nmc.plot_adan(pd.DataFrame({"model": "bert-base-classifier", "case": ["multi_unfused", "multi_fused"],
                                "measured_active_ms": [24.5, 9.5], **steps}), tmp_path)
    nmc.plot_adam_h200(pd.DataFrame({"model": "bert-base-classifier", "impl": ["multi_unfused", "multi_fused"],
                                     "measured_busy_ms": [2.1, 0.8], "simulated_busy_ms": [2.1, 0.8], **steps}), tmp_path)
    sweep = {"model": "bert-base", "speedup": [1.4, 3.0], "temp_storage": ["1x", "4x"]}
    nmc.plot_sweeps({
        "temp_storage": pd.DataFrame({**sweep, "grad_norm": "banks", "temp_storage_bytes": [256, 1024]}),
        "banks_per_alu": pd.DataFrame({**sweep, "banks_per_alu": [1, 4]}),
        "models": pd.DataFrame({**sweep, "model": ["bert-base", "bert-large"], "parameters": [1.1e8, 3.4e8]}),
        "hbm": pd.DataFrame({**sweep, "hbm": "HBM2 (t3-table8.1)"}),
        "divide_cost": pd.DataFrame({**sweep, "divide_cycles": [1, 8]}),
        "optimizers": pd.DataFrame({**sweep, "algorithm": ["sgd", "lamb"]}),
    }, tmp_path)
    assert set(saved) == {"lamb.png", "end_to_end.png", "adan_v100.png", "adam_h200.png", "sweeps.png"}
    assert unlabelled(saved) == []


def test_the_t3_study_plots_label_their_axes_with_units(saved, tmp_path):
    t3 = load("t3")
    case = {"model": "T-NLG", "tp": 16, "sublayer": "FC-1"}
    configs = ["sequential", "t3-mca"]
    speedups = pd.DataFrame({**case, "config": configs, "time_s": [1e-3, 8e-4], "speedup": [1.0, 1.25],
                             "gemm_s": 6e-4, "rs_s": 3e-4, "ag_s": 1e-4})
    dram = pd.DataFrame({**case, "config": configs, "category": "gemm_read", "bytes": [1e8, 8e7]})
    timeline = pd.DataFrame({"config": ["gemm", "t3"], "t_s": 1e-5, "category": "gemm_read", "gb_per_s": 800.0})
    sharing = pd.DataFrame({"model": "T-NLG", "sublayer": "OP", "split": ["ideal", "72-8"], "speedup": [1.6, 1.3]})
    e2e = pd.DataFrame({**case, "setting": "training", "config": ["t3", "t3-mca"], "speedup": [1.1, 1.12]})
    future = speedups.assign(speedup_1x=[1.0, 1.2])
    t3.write_plots({"speedups": speedups, "dram": dram, "dram_timeline": timeline, "cu_sharing": sharing,
                    "end_to_end": e2e, "future_2x_cus": future}, tmp_path)
    assert set(saved) == {"fig8_14_speedups.png", "fig8_13_breakdown.png", "fig8_16_dram.png",
                          "fig8_15_dram_timeline.png", "fig8_4_cu_sharing.png", "fig8_17_end_to_end.png",
                          "fig8_18_2x_cus.png"}
    assert unlabelled(saved) == []
