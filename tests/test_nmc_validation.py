"""Validation of the near-memory optimizer study against the dissertation (chapter 6, Figure 6.4)
and of the GPU optimizer kernels against V100 measurements (seed 000, Tables 4.3-4.5).

The reference numbers are read from validation/nmc_optimizer/*.csv (with their sources); the
tolerances are the issue's.  Known deviations are strict xfails: they fail when the model starts
to agree, so that docs/nmc.md and the report are updated.
"""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

import gpusim
from gpusim.studies import nmc_optimizer as study
from gpusim.trace.models import load_model

VALIDATION = Path(__file__).resolve().parents[1] / "validation" / "nmc_optimizer"
REFERENCE = pd.read_csv(VALIDATION / "reference_lamb.csv")
ADAN = pd.read_csv(VALIDATION / "reference_adan_v100.csv").set_index("impl")
LAMB_TOLERANCE, DATA_TOLERANCE, ADAN_TOLERANCE = 0.15, 0.20, 0.25
T3 = gpusim.load_system("t3-table8.1")


@pytest.fixture(scope="module")
def lamb():
    return study.lamb_speedups(model="bert-large").set_index(["baseline", "temp_storage"])


TOO_LITTLE_STORAGE = (
    "known deviation (docs/nmc.md): with HBM-PIM's 256 B of temporary storage per bank as 1x, LAMB's "
    "3 tile registers leave 2 columns per row activation (8 at 4x) and NMC is activation-bound; an "
    "iterative divide and square root cost ~20% more at 4x; the dissertation states neither its "
    "storage size nor how it divides"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "baseline, storage",
    [
        pytest.param("gpu-peak", "1x", marks=pytest.mark.xfail(strict=True, reason=TOO_LITTLE_STORAGE)),
        pytest.param("gpu-peak", "4x", marks=pytest.mark.xfail(strict=True, reason=TOO_LITTLE_STORAGE)),
        pytest.param("gpu-80", "4x", marks=pytest.mark.xfail(strict=True, reason=TOO_LITTLE_STORAGE)),
    ],
)
def test_lamb_speedup_against_figure_6_4(lamb, baseline, storage):
    reference = REFERENCE.query("quantity == 'speedup' and baseline == @baseline and temp_storage == @storage")
    assert lamb.loc[(baseline, storage), "speedup"] == pytest.approx(reference["value"].iloc[0], rel=LAMB_TOLERANCE)


@pytest.mark.slow
def test_lamb_speedups_golden(lamb):
    """The model's own LAMB results (regression guard; see docs/nmc.md for their explanation)."""
    speedup = lamb["speedup"]
    assert speedup[("gpu-peak", "1x")] == pytest.approx(1.43, rel=0.03)
    assert speedup[("gpu-peak", "4x")] == pytest.approx(3.06, rel=0.03)
    assert speedup[("gpu-80", "4x")] == pytest.approx(speedup[("gpu-peak", "4x")] / 0.8)
    assert speedup[("gpu-peak", "4x")] > 2 * speedup[("gpu-peak", "1x")]  # activation-bound at 1x


@pytest.mark.slow
def test_data_movement_reduction_of_13x_is_the_gpu_reading_the_gradients(lamb):
    reference = REFERENCE.query("quantity == 'data_reduction'")["value"].iloc[0]
    sizes = study.model_parameter_sizes("bert-base")  # the ratio does not depend on the model's size
    step = study.simulate_step(gpusim.load_system("t3-table8.1"), "lamb", sizes, "nmc", grad_norm="gpu")
    reduction = study.min_gpu_bytes("lamb", sizes) / step["dram_traffic_bytes"]
    assert reduction == pytest.approx(reference, rel=DATA_TOLERANCE)
    # with the gradient norm in the banks as well, only partial sums cross: far less traffic still
    assert lamb["data_reduction"].min() > 20 * reference


@pytest.mark.slow
def test_adan_multi_tensor_fused_step_on_v100_matches_the_measurement():
    step = study.gpu_step_point("v100-sxm2", "bert-base-classifier", "adan", "multi_fused")
    assert step["kernels"] == ADAN.loc["multi_fused", "kernels_measured"]
    assert step["time_s"] * 1e3 == pytest.approx(ADAN.loc["multi_fused", "measured_ms"], rel=ADAN_TOLERANCE)


def test_a_bert_iteration_gains_exactly_what_lamb_gains_on_nmc():
    """A simulated BERT-base iteration with LAMB on near-memory ALUs: everything but LAMB takes
    the same time as with LAMB on the GPU and LAMB itself is faster, so the iteration gains
    exactly LAMB's saving (the share comes from the simulation, not from an assumption)."""
    common = {"system": "t3-table8.1", "model": "bert-base", "batch": 4, "seq_len": 64, "dtype": "fp16"}
    gpu = study.iteration_point(**common, impl="multi_fused")
    nmc = study.iteration_point(**common, impl="nmc")
    assert 0 < nmc["lamb_s"] < gpu["lamb_s"] < gpu["iteration_s"]
    rest_gpu, rest_nmc = gpu["iteration_s"] - gpu["lamb_s"], nmc["iteration_s"] - nmc["lamb_s"]
    assert rest_nmc == pytest.approx(rest_gpu, rel=1e-6)


MODEL_NAMES = "model must be one of bert-base-classifier, bert-base, bert-large,"
POSITIVE_SCALES = "temp_storage_scales must be a non-empty list of positive integers, got"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: study.parameter_sizes("bert-base"), "model must be a ModelConfig .*, got 'bert-base'"),
    (lambda: study.parameter_sizes(load_model("bert-base"), style="gpt"), "style must be one of bert, decoder, got 'gpt'"),
    (lambda: study.parameter_sizes(load_model("bert-base"), positions=0), "positions must be a positive .*, got 0"),
    (lambda: study.parameter_sizes(load_model("bert-base"), labels=-1), "labels must be a positive integer, got -1"),
    (lambda: study.model_parameter_sizes("bert"), MODEL_NAMES + ".* got 'bert'"),
    (lambda: study.min_gpu_bytes("lion", [10]), "algorithm must be one of sgd, adam, adamw, lamb, adan, got 'lion'"),
    (lambda: study.min_gpu_bytes("lamb", [10, -1]), r"sizes must be a non-empty list of positive integers .*, got \[10, -1\]"),
    (lambda: study.min_gpu_bytes("lamb", [10], dtype="fp7"), "dtype must be one of .*, got 'fp7'"),
    (lambda: study.ideal_gpu_time_s(T3, "lamb", [10], fraction=0), "fraction must be .* above 0 and at most 1, got 0"),
    (lambda: study.ideal_gpu_time_s(T3, "lamb", [10], fraction=90), "fraction must be .*, got 90"),
    (lambda: study.simulate_step(T3, "lamb", [10], "nmcx"), "impl must be one of unfused, .*, got 'nmcx'"),
    (lambda: study.lamb_speedups(model="bert"), MODEL_NAMES),
    (lambda: study.lamb_speedups(temp_storage_scales=(0,)), POSITIVE_SCALES + r" \(0,\)"),
    (lambda: study.lamb_speedups(temp_storage_scales=(1.5,)), POSITIVE_SCALES + r" \(1.5,\)"),
    (lambda: study.lamb_speedups(grad_norm="cpu"), "grad_norm must be one of banks, gpu, got 'cpu'"),
    (lambda: study.lamb_speedups(system="t3"), "unknown hardware preset 't3'"),
    (lambda: study.nmc_breakdown(algorithm="lion"), "algorithm must be one of .*, got 'lion'"),
    (lambda: study.nmc_breakdown(grad_norm="x"), "grad_norm must be one of banks, gpu, got 'x'"),
    (lambda: study.end_to_end(0), "speedup must be a positive finite number, got 0"),
    (lambda: study.end_to_end(2.0, (0.1, 1.5)), r"lamb_shares must be a non-empty list of fractions between 0 and 1, got \(0.1, 1.5\)"),
    (lambda: study.bert_iterations(model="bert-xl"), "model must be one of bert-base, bert-large, .*, got 'bert-xl'"),
    (lambda: study.bert_iterations(configs=("Ph3",)), r"configs must be a non-empty list of names among Ph1-B32-FP16, .*, got \('Ph3',\)"),
    (lambda: study.bert_iterations(configs="Ph1-B32-FP16"), "configs must be a non-empty list of .*, got 'Ph1-B32-FP16'"),
    (lambda: study.bert_iterations(temp_storage_scales=()), POSITIVE_SCALES + r" \(\)"),
    (lambda: study.gpu_steps("v100-sxm2", "bert-base", "adan", cases=("nmc",)), "cases must be a non-empty list of names among unfused"),
    (lambda: study.gpu_steps("v100", "bert-base", "adan"), "unknown hardware preset 'v100'"),
    (lambda: study.nmc_point(grad_norm="x"), "grad_norm must be one of banks, gpu, got 'x'"),
    (lambda: study.sweep_temp_storage((256, 0)), r"storage_bytes must be a non-empty list of positive integers \(bytes\), got \(256, 0\)"),
    (lambda: study.sweep_temp_storage(grad_norms=("bank",)), r"grad_norms must be .* among banks, gpu, got \('bank',\)"),
    (lambda: study.sweep_temp_storage(system="nope"), "unknown hardware preset 'nope'"),
    (lambda: study.sweep_banks_per_alu((1, 3)), r"banks_per_alu must be a non-empty list of divisors of the 16 banks of a channel, got \(1, 3\)"),
    (lambda: study.sweep_banks_per_alu(temp_storage_scales=(-1,)), POSITIVE_SCALES),
    (lambda: study.sweep_models("bert-large"), "models must be a non-empty list of names among bert-base-classifier, .*, got 'bert-large'"),
    (lambda: study.sweep_models(("bert-large", "gpt4")), "models must be a non-empty list of names among .*'gpt4'"),
    (lambda: study.sweep_models(temp_storage_scales=[]), POSITIVE_SCALES),
    (lambda: study.sweep_hbm(["h100-sxm5"]), "generations must be a non-empty mapping of labels to hardware presets"),
    (lambda: study.sweep_hbm({"HBM9": None}), r"generations\['HBM9'\] must be the name of a hardware preset, got None"),
    (lambda: study.sweep_hbm(model="gpt4"), MODEL_NAMES),
    (lambda: study.sweep_divide_cost((0,)), r"cycles must be a non-empty list of positive numbers of ALU cycles .*, got \(0,\)"),
    (lambda: study.sweep_divide_cost((float("nan"),)), "cycles must be .*, got \\(nan,\\)"),
    (lambda: study.optimizers_on_nmc(("sgd", "lion")), r"algorithms must be a non-empty list of names among sgd, .*'lion'"),
])
def test_bad_study_arguments_are_config_errors_naming_them(call, message):
    """Every public function of the study checks its arguments before it simulates anything: a bad
    one is a ConfigError that names it, its value and what was expected (not a KeyError, a
    ZeroDivisionError or an empty table)."""
    with pytest.raises(gpusim.ConfigError, match=message):
        call()


MEASURED_ADAM = {
    system: pd.read_csv(VALIDATION.parent / "measured" / folder / "optimizer.csv").query(
        "model == 'bert-base-classifier' and algorithm == 'adam'").set_index("impl")
    for folder, system in (("h200", "h200-sxm"), ("h100", "h100-sxm5"))
}
"""PyTorch's multi-tensor Adam steps measured on the H200 and (held out) the H100."""
BUSY_TOLERANCE = 0.15
TORCH_STEP_COUNTER_LAUNCHES = 2
"""PyTorch's fused Adam adds one to every tensor's step counter on the GPU (a multi-tensor launch
per 110 tensors) before its update launches; the modeled optimizer keeps the step on the host."""


@pytest.mark.parametrize("system", list(MEASURED_ADAM))
def test_adam_multi_tensor_steps_on_hopper_launch_and_take_what_pytorch_measured(system):
    """Multi-tensor Adam on BERT-base (201 fp32 tensors) on the H200 and the H100: the model makes
    the launches PyTorch made, and their kernels are busy as long as the profiler measured (H100:
    2.82 / 1.06 ms against 2.90 / 1.14, nothing fitted on it)."""
    measured = MEASURED_ADAM[system]
    for impl, extra in (("multi_unfused", 0), ("multi_fused", TORCH_STEP_COUNTER_LAUNCHES)):
        step = study.gpu_step_point(system, "bert-base-classifier", "adam", impl)
        assert step["kernels"] + extra == measured.loc[impl, "kernels_per_step"], impl
        assert step["kernel_busy_s"] * 1e3 == pytest.approx(measured.loc[impl, "kernel_busy_ms"],
                                                            rel=BUSY_TOLERANCE), impl


def test_a_column_means_the_same_in_the_lamb_table_and_in_the_sweeps():
    """lamb.csv (``lamb_speedups``) and sweep_*.csv (``nmc_point``) describe the same near-memory
    step alike: every column they share holds the same value for the same point, and the bytes
    say where they move (between DRAM and the GPU, or inside the banks)."""
    lamb = study.lamb_speedups(model="bert-base", temp_storage_scales=(1,)).set_index("baseline").loc["gpu-peak"]
    point = study.nmc_point(model="bert-base")
    shared = (set(lamb.index) & set(point)) - {"wall_s"}
    for column in shared:
        assert point[column] == pytest.approx(lamb[column]), column
    assert {"speedup", "dram_bytes_gpu", "dram_bytes_nmc", "nmc_bank_internal_bytes",
            "data_reduction"} <= shared
    sizes = study.model_parameter_sizes("bert-base")
    assert point["dram_bytes_gpu"] == study.min_gpu_bytes("lamb", sizes)
    assert 0 < point["dram_bytes_nmc"] < point["dram_bytes_gpu"]
    assert point["nmc_bank_internal_bytes"] > 100 * point["dram_bytes_nmc"]  # the arrays stay in the banks


def load_reproduce():
    spec = importlib.util.spec_from_file_location("nmc_reproduce", VALIDATION / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_tables_name_their_model(monkeypatch):
    """lamb.csv, breakdown.csv and end_to_end.csv say which model they simulated, with or without
    --quick (the sweeps carry it as a point's key)."""
    assert set(study.lamb_speedups(model="bert-base", temp_storage_scales=(4,))["model"]) == {"bert-base"}
    assert set(study.nmc_breakdown(model="bert-base")["model"]) == {"bert-base"}

    def iteration_point(**point):  # the sweep's own columns without a simulation
        return {"iteration_s": 2.0 if point["impl"] == "nmc" else 3.0, "lamb_s": 0.5, "wall_s": 0.0}

    monkeypatch.setattr(study, "iteration_point", iteration_point)
    frame = study.bert_iterations(model="bert-base", configs=("Ph1-B4-FP32",), temp_storage_scales=(1,), workers=1,
                                  progress=False)
    assert list(frame[["system", "model"]].iloc[0]) == ["t3-table8.1", "bert-base"]


def test_the_reproduction_tables_name_their_model(monkeypatch):
    """The Adan, Adam and checks tables of reproduce.py name the model of every row: checks.csv
    mixes BERT-base-classifier's Adan step with the LAMB model (BERT-base under --quick)."""
    def gpu_steps(system, model, algorithm, cases, workers):
        return pd.DataFrame({"system": system, "model": model, "algorithm": algorithm, "impl": cases, "simulated_ms": 1.0,
                             "simulated_busy_ms": 1.0, "kernels": 1, "wall_s": 0.0})

    def lamb_speedups(model, grad_norm):
        return pd.DataFrame({"model": model, "grad_norm": grad_norm, "baseline": ["gpu-peak", "gpu-80"],
                             "temp_storage": "4x", "speedup": 3.0, "data_reduction": 13.0})

    monkeypatch.setattr(study, "gpu_steps", gpu_steps)
    monkeypatch.setattr(study, "lamb_speedups", lamb_speedups)
    reproduce = load_reproduce()
    adan = reproduce.adan_table(quick=True, workers=1)
    adam = reproduce.adam_h200_table(quick=True, workers=1)
    assert set(adan["model"]) == set(adam["model"]) == {"bert-base-classifier"}
    lamb = reproduce.lamb_table("bert-base")
    end_to_end = pd.DataFrame({"model": ["bert-base"], "config": ["Ph1-B32-FP16"], "temp_storage": ["1x"],
                               "iteration_speedup": [1.1], "reference_low": [1.09], "within_reference": [True]})
    checks = reproduce.checks_table(lamb, adan, end_to_end).set_index("check")["model"]
    assert checks["adan multi-tensor fused step on v100-sxm2 (ms)"] == "bert-base-classifier"
    assert checks.drop("adan multi-tensor fused step on v100-sxm2 (ms)").eq("bert-base").all()
