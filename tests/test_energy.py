"""The energy model: activity priced per component, against the presets' power sections and the
H100/H200 power samples measured in this project."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config.gpu import VoltageScalingConfig
from gpusim.config.loader import list_presets
from gpusim.energy import ENERGY_COLUMNS, describe, energy, power, power_timeline
from gpusim.errors import ConfigError, SimulationError
from gpusim.trace.generator import transformer

ROOT = Path(__file__).resolve().parents[1]
H200 = gpusim.load_system("h200-sxm")
T3 = gpusim.load_system("t3-table8.1")
BERT_BASE = [768 * 768] * 24 + [768 * 3072] * 12 + [768] * 100  # a BERT-base-like mix of tensor sizes
VOLTAGE = {"gpu.power.voltage_scaling.reference_clock_hz": "1.98 GHz", "gpu.power.voltage_scaling.slope": 0.6,
           "gpu.power.voltage_scaling.floor": 0.7}


def by_component(result) -> dict[str, float]:
    return energy(result).set_index("component")["energy_j"].to_dict()


def test_the_parts_add_up_and_idle_power_lasts_the_whole_run():
    result = gpusim.run(H200, ops.Gemm(2048, 2048, 2048, "fp16"))
    parts = energy(result)
    assert list(parts.columns) == ENERGY_COLUMNS
    totals = power(result).iloc[0]
    assert totals["energy_j"] == pytest.approx(parts["energy_j"].sum())
    assert totals["average_w"] == pytest.approx(totals["energy_j"] / result.time_s)
    idle = parts.set_index("component").loc["idle"]
    assert idle["energy_j"] == pytest.approx(125.0 * result.time_s)


def test_a_flop_costs_the_units_power_over_their_peak():
    """TF32 GEMMs run on Hopper's tensor cores at half the fp16 peak: twice the energy per FLOP;
    fp32 ones (no TF32) on the vector units."""
    half = by_component(gpusim.run(H200, ops.Gemm(1024, 1024, 1024, "fp16")))
    tf32 = by_component(gpusim.run(H200, ops.Gemm(1024, 1024, 1024, "tf32")))
    single = by_component(gpusim.run(H200, ops.Gemm(1024, 1024, 1024, "fp32")))
    deeper = by_component(gpusim.run(H200, ops.Gemm(1024, 1024, 2048, "fp16")))
    assert tf32["matrix"] == pytest.approx(2 * half["matrix"])
    assert single["matrix"] == 0 and single["vector"] > half["matrix"]
    assert deeper["matrix"] == pytest.approx(2 * half["matrix"])
    flops = 2 * 1024**3
    assert half["matrix"] / flops == pytest.approx(1680e-12 / 4096)  # the preset's pJ per SM-cycle over its FLOPs


@pytest.mark.parametrize("override", [{"gpu.clock_hz": "1.2 GHz"}, {"gpu.num_cus": 66}])
def test_a_flop_costs_the_same_at_another_clock_or_cu_count(override):
    """Energy per operation is a property of the units, not of how fast or how many they are."""
    base = by_component(gpusim.run(H200, ops.Gemm(2048, 2048, 2048, "fp16")))
    other = by_component(gpusim.run(H200.with_overrides(override), ops.Gemm(2048, 2048, 2048, "fp16")))
    assert other["matrix"] == pytest.approx(base["matrix"])
    assert other["idle"] > base["idle"]  # slower: idle power for longer


def test_near_memory_lamb_saves_the_data_movement():
    gpu = by_component(gpusim.run(T3, ops.Optimizer("lamb", BERT_BASE, impl="multi_fused")))
    nmc = by_component(gpusim.run(T3, ops.Optimizer("lamb", BERT_BASE, impl="nmc")))
    assert nmc["dram_io"] < gpu["dram_io"] / 10
    assert nmc["l2"] < gpu["l2"] / 10
    assert nmc["nmc_bank"] > 0 and gpu["nmc_bank"] == 0
    assert sum(nmc.values()) < sum(gpu.values())


def test_more_temporary_storage_opens_fewer_rows():
    """Each activation is paid for; 4x the storage per ALU reads more columns per row opened."""
    small = gpusim.load_system("t3-table8.1", {"gpu.nmc.temp_storage_bytes": "256B"})
    large = gpusim.load_system("t3-table8.1", {"gpu.nmc.temp_storage_bytes": "1KiB"})
    spent = [by_component(gpusim.run(system, ops.Optimizer("lamb", BERT_BASE, impl="nmc")))
             for system in (small, large)]
    assert spent[1]["nmc_activate"] < 0.7 * spent[0]["nmc_activate"]


def test_every_gpu_of_a_ring_pays_for_what_it_sends():
    result = gpusim.run("t3-ring8", ops.AllReduce(8 * 2**20), mode="full")
    links = energy(result).query("component == 'links'")
    assert len(links) == 8
    assert links["amount"].min() == pytest.approx(links["amount"].max())
    assert links["amount"].iloc[0] == pytest.approx(result.links.query("src == 0")["bytes"].sum())


@pytest.mark.parametrize(
    ("system", "op", "mode"),
    [
        ("h200-sxm", ops.Gemm(2048, 2048, 4096, "fp16"), "full"),
        ("t3-table8.1", ops.Optimizer("lamb", BERT_BASE, impl="nmc"), "symmetric"),
        ("t3-ring8", ops.AllReduce(4 * 2**20), "full"),
        ("t3-ring8", ops.GemmReduceScatter(4096, 2048, 1024, "fp16"), "symmetric"),
    ],
)
def test_the_timeline_spends_the_energy_of_the_table(system, op, mode):
    result = gpusim.run(system, op, mode=mode, memory_policy="t3-mca" if isinstance(op, ops.GemmReduceScatter) else None)
    table = energy(result)
    for gpu, parts in table.groupby("gpu"):
        timeline = power_timeline(result, gpu)
        dynamic = (timeline["total_w"] - timeline["idle_w"]).sum() * result.bin_s
        assert dynamic == pytest.approx(parts.query("component != 'idle'")["energy_j"].sum(), rel=1e-9)
        assert (timeline["total_w"] >= timeline["idle_w"]).all()


def test_the_perfetto_timeline_shows_power_where_there_is_a_model(tmp_path):
    with_model = gpusim.run(H200, ops.Gemm(1024, 1024, 1024, "fp16"))
    without = gpusim.run(H200.with_overrides({"gpu.power": None}), ops.Gemm(1024, 1024, 1024, "fp16"))
    assert '"power W"' in with_model.to_perfetto(tmp_path / "a.json").read_text()
    assert '"power W"' not in without.to_perfetto(tmp_path / "b.json").read_text()


@settings(max_examples=8, deadline=None)
@given(elements=st.integers(min_value=2**12, max_value=2**21))
def test_priced_bytes_are_the_bytes_the_memory_moved(elements):
    result = gpusim.run(H200, ops.Elementwise("add", elements, "fp16"))
    parts = energy(result).set_index("component")
    assert (parts["energy_j"] >= 0).all()
    assert parts.at["dram_io", "amount"] == pytest.approx(result.dram["bytes"].sum())
    assert parts.at["l2", "amount"] >= 3 * elements * 2  # two inputs and an output pass the L2


def test_every_preset_has_a_power_model():
    for name in list_presets()["gpus"]:
        assert gpusim.load_system(name).config.gpu.power is not None, name


def test_a_gpu_without_a_power_model_says_how_to_add_one(tmp_path):
    (tmp_path / "bare.yaml").write_text("base: mi210\nname: bare\npower: null\n")
    result = gpusim.run(gpusim.load_system(tmp_path / "bare.yaml"), ops.Gemm(256, 256, 256, "fp16"))
    with pytest.raises(ConfigError, match=r"'bare'.*no 'power' section.*h100-sxm5.yaml"):
        energy(result)
    assert describe(result) is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"gpu.power.l2_pj_per_byte": -1}, r"l2_pj_per_byte"),
        ({"gpu.power.idle_watts": 800}, r"idle_watts \(800\) must be below tdp_watts \(700\)"),
        ({**VOLTAGE, "gpu.power.voltage_scaling.slope": 3}, r"voltage_scaling.slope"),
        ({"gpu.power.voltage_scaling.slope": 0.5, "gpu.power.voltage_scaling.floor": 0.7},
         r"voltage_scaling.reference_clock_hz"),
    ],
)
def test_bad_power_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        gpusim.load_system("h200-sxm", override)


@given(slope=st.floats(0, 2), floor=st.floats(0.05, 1), scale=st.floats(0.1, 1.5))
def test_the_voltage_follows_the_clock_down_to_its_floor(slope, floor, scale):
    scaling = VoltageScalingConfig(reference_clock_hz=2e9, slope=slope, floor=floor)
    assert scaling.factor(2e9) == pytest.approx(1.0)
    factor = scaling.factor(scale * 2e9)
    assert factor >= floor**2 - 1e-12
    assert (factor <= 1.0 + 1e-12) if scale <= 1 else (factor >= 1.0 - 1e-12)


def test_with_voltage_scaling_a_lower_clock_saves_the_units_energy_but_not_the_drams():
    """The SMs' and the L2's prices follow (V/V_ref)^2; idle, DRAM and links keep theirs."""
    slow = {"gpu.clock_hz": "1.4 GHz", "gpu.l2.clock_hz": "1.4 GHz"}
    held = by_component(gpusim.run(H200.with_overrides(slow), ops.Gemm(2048, 2048, 2048, "fp16")))
    scaled = by_component(gpusim.run(H200.with_overrides({**slow, **VOLTAGE}), ops.Gemm(2048, 2048, 2048, "fp16")))
    factor = (1 - 0.6 * (1 - 1.4 / 1.98)) ** 2
    for component in ("matrix", "l2"):
        assert scaled[component] == pytest.approx(factor * held[component])
    for component in ("idle", "dram_array", "dram_io", "dram_activate"):
        assert scaled[component] == pytest.approx(held[component])
    at_reference = gpusim.run(H200.with_overrides(VOLTAGE), ops.Gemm(2048, 2048, 2048, "fp16"))
    assert by_component(at_reference) == by_component(gpusim.run(H200, ops.Gemm(2048, 2048, 2048, "fp16")))


def test_with_voltage_scaling_the_power_limit_allows_a_higher_clock():
    from gpusim.power_limit import run_within_power_limit

    gemm = ops.Gemm(4096, 4096, 4096, "tf32")
    held = run_within_power_limit(H200, gemm, tolerance=0.02)
    scaled = run_within_power_limit(H200.with_overrides(VOLTAGE), gemm, tolerance=0.02)
    assert held.stats["clock_hz"] < scaled.stats["clock_hz"] < 1.98e9
    assert power(scaled)["average_w"].iloc[0] <= 700


def test_a_layer_cached_replay_prices_the_left_out_layers_as_their_representatives(tmp_path):
    """Layer caching simulates 20 of the 68 rows; the other layers' traffic comes from their
    representative's span, so the energy is the whole replay's within a per cent (DRAM bytes within
    10%: a layer's write-backs fall partly outside its span).  Its traffic is not in the re-timed
    timeline, so it has no power timeline."""
    trace = transformer("megatron-gpt2", phase="prompt", batch=1, seq_len=128, layers=4, tp=8)
    cached = trace.replay("t3-ring8", mode="symmetric")
    whole = trace.replay("t3-ring8", mode="symmetric", cache_layers=False)
    assert cached.stats["simulated_rows"] < cached.stats["trace_rows"] == whole.stats["simulated_rows"]
    assert [window["copies"] for window in cached.stats["replica_windows"]] == [3]  # layer 0 stands for 1-3
    estimated, simulated = (energy(result).set_index("component") for result in (cached, whole))
    assert estimated["energy_j"].sum() == pytest.approx(simulated["energy_j"].sum(), rel=0.01)
    for component, tolerance in (("matrix", 1e-9), ("l2", 0.02), ("links", 0.02), ("dram_io", 0.1)):
        assert estimated.at[component, "amount"] == pytest.approx(simulated.at[component, "amount"], rel=tolerance)
    assert estimated.at["l2", "amount"] > 1.5 * cached.l2["bytes"].sum()  # not just the simulated rows' bytes
    assert "priced as their representatives" in describe(cached)
    with pytest.raises(SimulationError, match="--no-cache"):
        power_timeline(cached)
    events = json.loads(cached.to_perfetto(tmp_path / "cached.json").read_text())["traceEvents"]
    assert not cached.traffic_on_timeline and whole.traffic_on_timeline
    assert not any(event["ph"] == "C" for event in events)  # no traffic drawn against the re-timed ops
    assert any(event["name"] == "power W" for event in json.loads(
        whole.to_perfetto(tmp_path / "whole.json").read_text())["traceEvents"])


def test_with_overlapping_streams_a_left_out_layer_is_priced_as_one_period_of_its_run():
    """Data-parallel training: a layer's gradient all-reduce overlaps the next layer's backward on
    another stream, so one warm-up layer is simulated and the representative's span is one period
    of the run (from its start for as long as the warm-up layer's start preceded it), which holds
    one layer's work and one overlapping all-reduce.  The traffic's energy then matches the whole
    replay's within 2%, and the idle energy follows layer caching's own iteration time."""
    trace = transformer("bert-base", phase="train", batch=8, seq_len=64, layers=4, dp=8)
    cached = trace.replay("hgx-h100", mode="symmetric")
    whole = trace.replay("hgx-h100", mode="symmetric", cache_layers=False)
    windows = cached.stats["replica_windows"]
    assert [window["copies"] for window in windows] == [2, 2]  # forward and backward (the optimizer steps: all)
    assert all(earlier["end_s"] <= later["start_s"] for earlier, later in zip(windows, windows[1:]))
    estimated, simulated = (energy(result).set_index("component") for result in (cached, whole))
    busy = estimated.drop(index="idle")["energy_j"].sum(), simulated.drop(index="idle")["energy_j"].sum()
    assert busy[0] == pytest.approx(busy[1], rel=0.02)
    for component in ("l2", "links", "dram_io"):
        assert estimated.at[component, "amount"] == pytest.approx(simulated.at[component, "amount"], rel=0.03)
    assert estimated.at["idle", "amount"] == pytest.approx(cached.time_s)
    assert estimated["energy_j"].sum() == pytest.approx(simulated["energy_j"].sum(), rel=0.025)


def _calibration():
    path = ROOT / "validation" / "calibration" / "power_hopper.py"
    spec = importlib.util.spec_from_file_location("power_hopper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hopper_power_against_the_measured_samples():
    """The H200's large fp16 GEMMs held the 700 W limit (at clocks the fitted GEMM efficiency
    absorbs), its tf32 ones too at a lower clock, and its streaming section stayed below it; the
    H100's streaming section and FP32 GEMMs took no part in the fit
    (validation/calibration/power_hopper.py)."""
    calibration = _calibration()
    gemm = power(gpusim.run(H200, ops.Gemm(8192, 8192, 8192, "fp16"))).iloc[0]
    assert gemm["average_w"] == pytest.approx(700, rel=0.02)
    assert power(gpusim.run(H200, ops.Gemm(4096, 4096, 4096, "tf32")))["over_tdp"].iloc[0]
    copy = gpusim.run(H200, ops.Elementwise("copy", 2**28, "fp16"))
    assert not power(copy)["over_tdp"].iloc[0]
    measured = calibration.section_power("h100", "streaming")
    modelled = power(gpusim.run("h100-sxm5", ops.Elementwise("copy", 2**28, "fp16")))["average_w"].iloc[0]
    assert modelled == pytest.approx(measured, rel=0.2)
    measured = statistics.median(watts for _, watts in calibration.at_limit("h100", simt=True))
    modelled = power(gpusim.run("h100-sxm5", ops.Gemm(8192, 8192, 8192, "fp32")))["average_w"].iloc[0]
    assert modelled == pytest.approx(measured, rel=0.05)


def test_a_run_within_the_power_limit_lowers_the_clock_until_it_fits():
    from gpusim.power_limit import run_within_power_limit

    gemm = ops.Gemm(4096, 4096, 4096, "tf32")
    free = gpusim.run(H200, gemm)
    capped = run_within_power_limit(H200, gemm, tolerance=0.02)
    scale = capped.stats["clock_scale"]
    assert 0.6 < scale < 1.0 and capped.stats["clock_hz"] == pytest.approx(scale * 1.98e9)
    assert not power(capped)["over_tdp"].any()
    assert power(capped)["average_w"].iloc[0] > 0.95 * 700  # the highest clock that fits, not just any
    assert capped.time_s > free.time_s
    copy = run_within_power_limit(H200, ops.Elementwise("copy", 2**22, "fp16"))
    assert copy.stats["clock_scale"] == 1.0
    with pytest.raises(ConfigError, match="progress must be True or False"):
        run_within_power_limit(H200, ops.Elementwise("copy", 2**22, "fp16"), progress="yes")
    tight = H200.with_overrides({"gpu.power.tdp_watts": 130})
    with pytest.raises(SimulationError, match="lowering the clock cannot bring it within"):
        run_within_power_limit(tight, ops.Elementwise("copy", 2**22, "fp16"))
    with pytest.raises(ConfigError, match="no 'power' section"):
        run_within_power_limit(H200.with_overrides({"gpu.power": None}), gemm)


def test_a_throttled_gpu_runs_the_kernels_its_library_picks_for_its_rated_clock():
    """cuBLAS picks kernels for the GPU it knows, not for the clock a power limit has lowered: the
    capped run keeps the unthrottled run's kernel, where a GPU built for the lower clock (another
    what-if) would get another."""
    from gpusim.power_limit import run_within_power_limit

    gemm = ops.Gemm(256, 1024, 4096, "tf32")
    free = gpusim.run(H200, gemm)
    capped = run_within_power_limit(H200.with_overrides({"gpu.power.tdp_watts": 300}), gemm)
    scale = capped.stats["clock_scale"]
    assert scale < 0.8
    assert capped.kernels["name"].tolist() == free.kernels["name"].tolist()
    assert capped.config["gpu"]["rated_clock_hz"] == H200.config.gpu.clock_hz
    built_slower = gpusim.run(H200.with_overrides({"gpu.clock_hz": scale * 1.98e9, "gpu.l2.clock_hz": scale * 1.98e9}), gemm)
    assert built_slower.kernels["name"].tolist() != free.kernels["name"].tolist()


def test_the_power_limited_search_shows_its_runs(capsys):
    from gpusim.power_limit import run_within_power_limit

    capped = run_within_power_limit(H200, ops.Gemm(2048, 2048, 2048, "tf32"), progress=True)
    shown = capsys.readouterr().err
    assert "h200-sxm within its power limit" in shown
    assert f"{capped.stats['clock_hz'] / 1e9:.3f} GHz" in shown  # the run it settles on was among those shown
    quiet = run_within_power_limit(H200, ops.Gemm(2048, 2048, 2048, "tf32"))
    assert capsys.readouterr().err == "" and quiet.time_s == capped.time_s


def test_a_run_that_takes_no_time_has_no_average_power_to_report():
    idle = gpusim.run(H200, ops.Delay(0.0))
    assert describe(idle) is None
    waiting = gpusim.run(H200, ops.Delay(1e-6))
    assert power(waiting)["energy_j"].iloc[0] == pytest.approx(125.0 * 1e-6)
    assert describe(waiting).startswith("energy 0.000125 J")


def test_the_energy_line_says_how_many_of_the_simulated_gpus_sat_idle():
    one_rank = gpusim.run("t3-ring8", ops.Gemm(512, 512, 512, ranks=[0]), mode="full")
    assert " over 8 simulated GPU(s), 7 of them idle (priced at idle power); " in describe(one_rank)
    every_rank = gpusim.run("t3-ring8", ops.Gemm(512, 512, 512), mode="full")
    assert "idle" not in describe(every_rank).split(";")[0]
