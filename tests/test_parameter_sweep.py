"""Hardware what-ifs over a grid of configuration values (gpusim.parameter_sweep, ``gpusim sweep``)."""

import math
import warnings

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.cli import main
from gpusim.errors import ConfigError, NoEffectWarning, SweepError
from gpusim.parameter_sweep import elasticities, parameter_grid, point_totals, points_in_ms, sweep_parameters
from gpusim.trace import transformer

GEMM = ops.Gemm(1024, 1024, 1024)
TINY_PROMPT = {"phase": "prompt", "tp": 8, "layers": 1, "batch": 1, "seq_len": 128, "head": False}
ALLREDUCE = ops.AllReduce(16 * 2**20)


def sweep(system, op_list, vary, **kwargs):
    """A sweep in this process, without a progress bar."""
    return sweep_parameters(system, op_list, vary, workers=1, progress=False, **kwargs)


def test_grid_is_every_combination_last_parameter_fastest():
    assert parameter_grid({"a": [1, 2], "b": ["x", "y", "z"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"},
        {"a": 2, "b": "x"}, {"a": 2, "b": "y"}, {"a": 2, "b": "z"},
    ]


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.sampled_from(["gpu.num_cus", "links.bandwidth", "gpu.l2.capacity", "gpu.clock"]),
                       st.lists(st.integers(0, 1000), min_size=1, max_size=4, unique=True), min_size=1))
def test_grid_points_are_distinct_and_cover_the_product(vary):
    points = parameter_grid(vary)
    assert len(points) == math.prod(len(values) for values in vary.values())
    assert len({tuple(point.items()) for point in points}) == len(points)
    assert all(point[path] in vary[path] for point in points for path in vary)


@pytest.mark.parametrize("vary, message", [
    ({}, "vary must map"),
    ([("gpu.num_cus", [1])], "vary must map"),
    ({"gpu.num_cus": []}, "non-empty list"),
    ({"gpu.num_cus": "80,160"}, "non-empty list"),
    ({"gpu.num_cus": 80}, "non-empty list"),
    ({"gpu.num_cus": [80, 80]}, "80 is given more than once"),
    ({"topology.edges": [[[0, 1]], [[0, 1]]]}, r"\[\[0, 1\]\] is given more than once"),
    ({"x": [frozenset({1}), {1}]}, r"\{1\} is given more than once"),
    ({"x": [{1}, frozenset({1})]}, r"frozenset\(\{1\}\) is given more than once"),
    ({"": [1]}, "keys must be override paths"),
])
def test_bad_grids_are_refused(vary, message):
    with pytest.raises(ConfigError, match=message):
        parameter_grid(vary)


def test_a_grid_too_large_to_list_is_refused_before_it_is_listed():
    huge = {"gpu.num_cus": range(1, 2001), "gpu.clock": range(1, 2001)}  # 4 million points
    with pytest.raises(ConfigError, match=r"the grid has 4,000,000 points \(2000 \(gpu.num_cus\) x 2000 \(gpu.clock\)\); "
                                          r"at most 1,000,000"):
        parameter_grid(huge)
    assert len(parameter_grid({"gpu.num_cus": list(range(100_000)), "gpu.clock": [1, 2]})) == 200_000


def test_one_row_per_point_and_op_with_resolved_fields():
    table = sweep("t3-ring8", [GEMM, ALLREDUCE], {"links.bandwidth": ["75 GB/s", "300 GB/s"], "gpu.num_cus": [40, 80]})
    assert list(table.columns[:4]) == ["point", "links.bandwidth_bytes_per_s", "gpu.num_cus", "op_index"]
    assert len(table) == 8
    assert table["links.bandwidth_bytes_per_s"].tolist() == [75e9] * 4 + [300e9] * 4
    assert table["gpu.num_cus"].tolist() == [40, 40, 80, 80] * 2
    assert table["op_index"].tolist() == [0, 1] * 4
    assert set(table["mode"]) == {"symmetric"}  # auto: the ops run alike on every GPU of one ring


def test_what_each_field_changes():
    table = sweep("t3-ring8", [GEMM, ALLREDUCE], {"links.bandwidth": ["75 GB/s", "300 GB/s"], "gpu.num_cus": [40, 80]})
    gemm = table[table["op_index"] == 0].set_index(["links.bandwidth_bytes_per_s", "gpu.num_cus"])["duration_s"]
    ring = table[table["op_index"] == 1].set_index(["links.bandwidth_bytes_per_s", "gpu.num_cus"])["duration_s"]
    # the GEMM sends nothing over the links, and twice the CUs make it faster
    assert gemm[(75e9, 40)] == pytest.approx(gemm[(300e9, 40)], rel=1e-9)
    assert gemm[(75e9, 80)] < 0.8 * gemm[(75e9, 40)]
    # a 16 MiB all-reduce is bound by the links
    assert ring[(300e9, 80)] < 0.5 * ring[(75e9, 80)]
    totals = point_totals(table)
    assert totals["total_s"].to_numpy() == pytest.approx(totals[["0: " + GEMM.label, "1: " + ALLREDUCE.label]]
                                                         .sum(axis=1).to_numpy(), rel=1e-9)


def test_parallel_processes_give_the_same_rows():
    vary = {"gpu.num_cus": [40, 80]}
    alone = sweep("t3-ring8", [GEMM, ALLREDUCE], vary)
    parallel = sweep_parameters("t3-ring8", [GEMM, ALLREDUCE], vary, workers=2, progress=False)
    pd.testing.assert_frame_equal(alone.drop(columns="sim_wall_s"), parallel.drop(columns="sim_wall_s"))


def test_a_dask_cluster_gives_the_same_rows():
    distributed = pytest.importorskip("dask.distributed")
    vary = {"gpu.num_cus": [40, 80]}
    alone = sweep("t3-ring8", [GEMM, ALLREDUCE], vary)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        on_dask = sweep_parameters("t3-ring8", [GEMM, ALLREDUCE], vary, scheduler=cluster.scheduler_address,
                                   progress=False)
    pd.testing.assert_frame_equal(alone.drop(columns="sim_wall_s"), on_dask.drop(columns="sim_wall_s"))


def test_elasticities_say_which_value_moves_the_time():
    """A large GEMM is compute-bound: its time is about inversely proportional to the CUs, and the
    links do not touch it; the systems and a field given one value have no elasticity."""
    with pytest.warns(NoEffectWarning):
        table = sweep(None, ops.Gemm(4096, 4096, 4096),
                      {"system": ["t3-ring8"], "gpu.num_cus": [40, 80, 160], "links.bandwidth": ["75 GB/s", "300 GB/s"],
                       "gpu.clock": ["1.4 GHz"]})
    frame = elasticities(table).set_index("field")
    assert list(frame.index) == ["gpu.num_cus", "links.bandwidth_bytes_per_s"]
    assert -1.1 < frame.loc["gpu.num_cus", "median"] < -0.6 and frame.loc["gpu.num_cus", "pairs"] == 4
    assert frame.loc["links.bandwidth_bytes_per_s", ["min", "max"]].tolist() == [0.0, 0.0]


def test_a_system_keeps_its_overrides_and_overrides_apply_everywhere():
    narrow = gpusim.load_system("t3-ring8", {"gpu.num_cus": 40})
    kept = sweep(narrow, GEMM, {"links.bandwidth": ["75 GB/s", "150 GB/s"]})
    given = sweep("t3-ring8", GEMM, {"links.bandwidth": ["75 GB/s", "150 GB/s"]}, overrides={"gpu.num_cus": 40})
    pd.testing.assert_series_equal(kept["duration_s"], given["duration_s"])
    wide = sweep("t3-ring8", GEMM, {"links.bandwidth": ["75 GB/s"]})
    assert wide["duration_s"].iloc[0] < kept["duration_s"].iloc[0]


def test_whole_systems_can_be_varied():
    table = sweep(None, GEMM, {"system": ["a100-sxm4", "h100-sxm5"], "gpu.clock": ["1 GHz"]})
    assert list(table.columns[:4]) == ["point", "system", "gpu.clock_hz", "op_index"]
    assert table["system"].tolist() == ["a100-sxm4", "h100-sxm5"]
    a100, h100 = table["duration_s"]
    assert h100 < a100  # more SMs at the same clock


@pytest.mark.parametrize("system, vary, message", [
    ("t3-ring8", {"system": ["t3-ring16"]}, "either as the argument or as the values"),
    (None, {"gpu.num_cus": [80]}, "either as the argument or as the values"),
    (None, {"system": [8]}, "expected preset names or YAML paths, got 8"),
])
def test_the_system_is_given_once(system, vary, message):
    with pytest.raises(ConfigError, match=message):
        sweep(system, GEMM, vary)


def test_a_function_of_workload_parameters_makes_each_points_ops():
    table = sweep("t3-ring8", lambda nbytes, n=1024: [ops.Gemm(n, n, n), ops.AllReduce(nbytes)],
                  {"nbytes": [2**20, 2**24], "gpu.num_cus": [40, 80]})
    assert list(table.columns[:4]) == ["point", "nbytes", "gpu.num_cus", "op_index"]
    ring = table[table["op_index"] == 1]
    assert ring["bytes"].tolist() == [2**20, 2**20, 2**24, 2**24]
    assert ring["duration_s"].iloc[2] > 2 * ring["duration_s"].iloc[0]  # 16 times the bytes
    totals = point_totals(table)
    assert list(totals.columns[-5:]) == ["0: " + GEMM.label, "1: allreduce",  # the all-reduce's name changes
                                         "energy_per_gpu_j", "average_w", "over_tdp"]


def test_a_workload_function_makes_traces_too():
    table = sweep("t3-ring8", lambda seq_len: transformer("megatron-gpt2", **{**TINY_PROMPT, "seq_len": seq_len}),
                  {"seq_len": [128, 256]})
    assert list(table.columns[:3]) == ["point", "seq_len", "gpu"]
    assert table["compute_s"].iloc[1] > table["compute_s"].iloc[0]


@pytest.mark.parametrize("make, vary, error, message", [
    (lambda nbytes: ops.AllReduce(nbytes), {"gpu.num_cus": [80]}, ConfigError, "vary must give its 'nbytes'"),
    (lambda nbytes: ops.AllReduce(nbytes), {"nbytes": [-1]}, gpusim.OpError,
     r"sweep point 0 \(\{'nbytes': -1\}\): AllReduce: field 'nbytes' must be a positive integer"),
    (lambda nbytes: nbytes, {"nbytes": [1]}, ConfigError, r"sweep point 0 \(\{'nbytes': 1\}\): what ops made must be"),
    (lambda trace: transformer("megatron-gpt2", **TINY_PROMPT) if trace else GEMM, {"trace": [True, False]}, ConfigError,
     "ops made ops, point 0 a trace"),
])
def test_bad_workload_functions_are_refused(make, vary, error, message):
    with pytest.raises(error, match=message):
        sweep("t3-ring8", make, vary)


def test_a_field_that_changes_nothing_is_reported():
    make = {"nbytes": [2**24]}
    with pytest.warns(NoEffectWarning, match=r"links.bandwidth \(links.bandwidth_bytes_per_s\) changed no point"):
        sweep("dgx-a100", lambda nbytes: ops.AllReduce(nbytes), {**make, "links.bandwidth": ["100 GB/s", "300 GB/s"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)  # the switch's ports are what a switched node uses
        sweep("dgx-a100", lambda nbytes: ops.AllReduce(nbytes), {**make, "switch.port_bandwidth": ["100 GB/s", "300 GB/s"]})


def test_a_point_that_fails_to_simulate_is_named_by_its_values(capsys):
    with pytest.raises(SweepError, match=r"^sweep over gpu.num_cus: point 0 \{'gpu.num_cus': 40\} failed: OpError: "
                                         r"allreduce 1.0 MiB: rank 1 does not exist; a100-sxm4 has ranks 0..0$"):
        sweep("a100-sxm4", ops.AllReduce(2**20, ranks=[0, 1]), {"gpu.num_cus": [40]}, mode="full")
    assert main(["sweep", "--system", "a100-sxm4", "--op", "allreduce nbytes=1MiB ranks=0,1", "--mode", "full",
                 "--vary", "gpu.num_cus=40", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: sweep over gpu.num_cus: point 0 {'gpu.num_cus': '40'} failed: OpError")
    assert "'config'" not in err and len(err.splitlines()) == 1


def test_a_bad_point_fails_before_anything_runs(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"sweep point 1 \(\{'gpu.num_cus': 'many'\}\): override 'gpu.num_cus'"):
        sweep("t3-ring8", GEMM, {"gpu.num_cus": [80, "many"]}, cache=cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_a_field_is_set_once_whether_varied_or_overridden():
    with pytest.raises(ConfigError, match="'gpu.num_cus' is both varied and overridden"):
        sweep(gpusim.load_system("t3-ring8", {"gpu.num_cus": 40}), GEMM, {"gpu.num_cus": [80, 160]})
    with pytest.raises(ConfigError, match=r"sweep point 0 .*: override 'links.bandwidth_bytes_per_s': field "
                                          r"'links.bandwidth_bytes_per_s' is set by override 'links.bandwidth' too"):
        sweep("t3-ring8", GEMM, {"links.bandwidth": ["75 GB/s"], "links.bandwidth_bytes_per_s": ["150 GB/s"]})


@pytest.mark.parametrize(("vary", "message"), [
    ({"gpu.clock": ["1 GHz", "1000 MHz"]}, r"vary 'gpu.clock': '1 GHz' and '1000 MHz' are one value \(1000000000.0\)"),
    ({"gpu.num_cus": [80, "80"]}, r"vary 'gpu.num_cus': 80 and '80' are one value \(80\); give each value once"),
])
def test_two_values_of_a_field_that_are_one_are_an_error(tmp_path, vary, message):
    with pytest.raises(ConfigError, match=message):
        sweep("t3-ring8", GEMM, vary, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # refused before running


@pytest.mark.parametrize("kwargs, message", [
    ({"overrides": {"gpu.num_cus": 80}}, "both varied and overridden"),
    ({"mode": "fast"}, "mode must be one of"),
    ({"overrides": ["gpu.num_cus=80"]}, "overrides must be a mapping"),
    ({"within_power_limit": "yes"}, "within_power_limit must be True or False"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        sweep("t3-ring8", GEMM, {"gpu.num_cus": [80]}, **kwargs)


def test_streams_run_ops_side_by_side_at_every_point():
    vary = {"gpu.num_cus": [66, 132]}
    one = sweep("h200-sxm", [GEMM, GEMM], vary)
    two = sweep("h200-sxm", [GEMM, GEMM], vary, streams=["a", "b"])
    assert (two.groupby("point")["total_s"].first() < one.groupby("point")["total_s"].first()).all()
    halves = [gpusim.Stream("a", cu_mask=tuple(range(66))), gpusim.Stream("b", cu_mask=tuple(range(66, 132)))]
    masked = sweep("h200-sxm", [GEMM, GEMM], {"gpu.clock": ["1.98 GHz"]}, streams=halves)
    assert masked["start_s"].max() < masked["end_s"].min()  # side by side, each on its half
    with pytest.raises(ConfigError, match=r"streams gives 1 stream name\(s\) for 2 ops"):
        sweep("h200-sxm", [GEMM, GEMM], vary, streams=["a"])
    with pytest.raises(ConfigError, match="streams must be a list of stream names or gpusim.Stream"):
        sweep("h200-sxm", [GEMM, GEMM], vary, streams="ab")
    with pytest.raises(ConfigError, match="for a trace"):
        sweep("t3-ring8", transformer("megatron-gpt2", **TINY_PROMPT), vary, streams=["a"])


@pytest.mark.parametrize("op_list", [[], ["gemm m=1 n=1 k=1"], "gemm", None])
def test_ops_must_be_ops(op_list):
    with pytest.raises(ConfigError, match="ops must be an op, a non-empty list of gpusim.ops ops or a trace"):
        sweep("t3-ring8", op_list, {"gpu.num_cus": [80]})


def test_the_cache_is_keyed_by_the_resolved_description(tmp_path):
    cache = tmp_path / "cache"
    what_if = tmp_path / "what_if.yaml"
    what_if.write_text("base: t3-ring8\ngpu: {num_cus: 40}\n")
    first = sweep(what_if, GEMM, {"links.bandwidth": ["75 GB/s", "150 GB/s"]}, cache=cache)
    stored = sorted(cache.iterdir())
    assert len(stored) == 2
    again = sweep(what_if, GEMM, {"links.bandwidth": ["75 GB/s", "150 GB/s"]}, cache=cache)
    assert sorted(cache.iterdir()) == stored
    pd.testing.assert_frame_equal(first, again)  # the stored rows, wall time included
    what_if.write_text("base: t3-ring8\ngpu: {num_cus: 80}\n")  # the same path, other hardware
    edited = sweep(what_if, GEMM, {"links.bandwidth": ["75 GB/s", "150 GB/s"]}, cache=cache)
    assert len(list(cache.iterdir())) == 4
    assert (edited["duration_s"] < first["duration_s"]).all()


def test_point_totals_refuses_other_tables():
    with pytest.raises(ConfigError, match="expected a sweep_parameters table"):
        point_totals(pd.DataFrame({"point": [0]}))
    with pytest.raises(ConfigError, match="expected a sweep_parameters table"):
        point_totals(pd.DataFrame({"point": [0], "total_s": [1.0], "mode": ["full"], "sim_wall_s": [1.0]}))


def test_a_trace_gives_its_breakdown_per_point_and_gpu():
    trace = transformer("megatron-gpt2", **TINY_PROMPT)
    table = sweep("t3-ring8", trace, {"links.bandwidth": ["75 GB/s", "300 GB/s"]})
    assert list(table.columns[:3]) == ["point", "links.bandwidth_bytes_per_s", "gpu"]
    assert table["gpu"].tolist() == [0, 0] and set(table["mode"]) == {"symmetric"}
    slow, fast = table.itertuples()
    assert fast.compute_s == pytest.approx(slow.compute_s, rel=1e-9)  # faster links leave the GEMMs alone
    assert fast.exposed_comm_s < slow.exposed_comm_s
    for row in (slow, fast):
        assert row.compute_s + row.exposed_comm_s + row.idle_s == pytest.approx(row.total_s, rel=1e-9)
    # one stream: the compute is the compute ops' busy time, the communication the collectives'
    busy = table.filter(like="busy_")
    assert set(busy.columns) == {"busy_gemm_s", "busy_elementwise_s", "busy_reduction_s", "busy_collective_s"}
    compute = busy.drop(columns="busy_collective_s").sum(axis=1)
    assert table["compute_s"].to_numpy() == pytest.approx(compute.to_numpy(), rel=1e-9)
    communication = table["exposed_comm_s"] + table["overlapped_comm_s"]
    assert communication.to_numpy() == pytest.approx(table["busy_collective_s"].to_numpy(), rel=1e-9)
    shown = points_in_ms(point_totals(table))
    assert list(shown.columns[:8]) == ["point", "links.bandwidth_bytes_per_s", "total (ms)", "mode", "compute (ms)",
                                       "exposed_comm (ms)", "overlapped_comm (ms)", "idle (ms)"]
    assert shown["busy_gemm (ms)"].tolist() == pytest.approx((table["busy_gemm_s"] * 1e3).tolist(), abs=1e-6)
    assert shown["total (ms)"].tolist() == pytest.approx((table["total_s"] * 1e3).tolist(), abs=1e-6)


def test_a_trace_sweep_may_simulate_every_layer():
    """Two identical layers: with layer caching the second is timed from the first; without, both
    are simulated, and the iteration takes about as long."""
    trace = transformer("megatron-gpt2", **{**TINY_PROMPT, "layers": 2})
    rows = int((trace.frame["gpu"] == 0).sum())
    cached = sweep("t3-ring8", trace, {"gpu.num_cus": [80]})
    every = sweep("t3-ring8", trace, {"gpu.num_cus": [80]}, cache_layers=False)
    assert every["total_s"].iloc[0] == pytest.approx(cached["total_s"].iloc[0], rel=0.02)
    assert every["simulated_rows"].iloc[0] == rows > cached["simulated_rows"].iloc[0]


def test_a_power_capping_sweep_lowers_the_clock_with_the_cap():
    """Each point runs at the highest clock its own limit allows: the varied limit, not the preset's."""
    caps = [450.0, 550.0, 700.0]
    points = point_totals(sweep("h200-sxm", ops.Gemm(2048, 2048, 2048, "tf32"), {"gpu.power.tdp_watts": caps},
                                within_power_limit=True))
    assert (points["average_w"] <= points["gpu.power.tdp_watts"]).all()
    assert (points["average_w"] > 0.9 * points["gpu.power.tdp_watts"]).all()  # the highest clock that fits
    assert points["clock_hz"].is_monotonic_increasing and points["total_s"].is_monotonic_decreasing
    free = point_totals(sweep("h200-sxm", ops.Gemm(2048, 2048, 2048, "tf32"), {"gpu.power.tdp_watts": [700.0]}))
    assert "clock_hz" not in free.columns and free["average_w"].iloc[0] > 700  # the 700 W point above did throttle
    assert free["over_tdp"].iloc[0] and not points["over_tdp"].any()


def test_a_power_capped_trace_point_simulates_every_row():
    trace = transformer("megatron-gpt2", **{**TINY_PROMPT, "layers": 2})
    capped = sweep("t3-ring8", trace, {"gpu.power.tdp_watts": [85.0]}, within_power_limit=True)
    assert capped["simulated_rows"].iloc[0] == int((trace.frame["gpu"] == 0).sum())  # layer caching off: the limit is checked on exact energy
    assert capped["average_w"].max() <= 85.0 and capped["clock_hz"].iloc[0] < 1.4e9  # 91 W at its 1.4 GHz


def test_a_traces_cache_key_is_its_contents():
    one, same = transformer("megatron-gpt2", **TINY_PROMPT), transformer("megatron-gpt2", **TINY_PROMPT)
    longer = transformer("megatron-gpt2", **{**TINY_PROMPT, "seq_len": 256})
    assert one.sweep_key() == same.sweep_key() != longer.sweep_key()
    assert one.source == longer.source  # the name alone would have mixed them up


def test_cli_sweep_writes_tables_and_plot(tmp_path, capsys):
    code = main(["sweep", "--system", "t3-ring8", "--op", "gemm m=1024 n=1024 k=1024", "--op", "allreduce nbytes=4MiB",
                 "--vary", "links.bandwidth=75GB/s,300GB/s", "--vary", "gpu.num_cus=40,80", "--workers", "1",
                 "--quiet", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "total (ms)" in out and "4 points" in out
    points = pd.read_csv(tmp_path / "points.csv")
    assert len(points) == 4 and len(pd.read_csv(tmp_path / "sweep.csv")) == 8
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "elasticity of the total time" in out and "  gpu.num_cus: -" in out
    assert list(pd.read_csv(tmp_path / "elasticities.csv")["field"]) == ["links.bandwidth_bytes_per_s", "gpu.num_cus"]


def test_cli_sweep_within_the_power_limit_reports_the_clock(tmp_path, capsys):
    code = main(["sweep", "--system", "h200-sxm", "--op", "gemm m=2048 n=2048 k=2048 dtype=tf32", "--vary",
                 "gpu.power.tdp_watts=450,700", "--within-power-limit", "--workers", "1", "--quiet", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "clock_hz" in out and "power limit (over_tdp)" not in out
    points = pd.read_csv(tmp_path / "points.csv")
    assert points["clock_hz"].iloc[0] < points["clock_hz"].iloc[1] <= 1.98e9
    assert main(["sweep", "--system", "h200-sxm", "--op", "gemm m=2048 n=2048 k=2048 dtype=tf32", "--vary",
                 "gpu.power.tdp_watts=450,700", "--workers", "1", "--quiet"]) == 0
    assert "2 of 2 points average more than the GPUs' power limit (over_tdp)" in capsys.readouterr().out


def test_cli_simulate_vary_replays_at_every_point(tmp_path, capsys):
    code = main(["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--tp", "8", "--layers", "1", "--batch",
                 "1", "--seq-len", "128", "--system", "t3-ring8", "--vary", "gpu.num_cus=40,80", "--workers", "1",
                 "--quiet", "--out", str(tmp_path)])
    assert code == 0
    assert "exposed_comm (ms)" in capsys.readouterr().out
    points = pd.read_csv(tmp_path / "points.csv")
    assert points["gpu.num_cus"].tolist() == [40, 80]
    assert points["compute_s"].iloc[1] < points["compute_s"].iloc[0]
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_cli_sweep_compares_systems(capsys):
    assert main(["sweep", "--op", "gemm m=1024 n=1024 k=1024", "--vary", "system=a100-sxm4,h100-sxm5",
                 "--set", "gpu.clock=1GHz", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "a100-sxm4" in out and "h100-sxm5" in out
    assert main(["sweep", "--op", "gemm m=1024 n=1024 k=1024", "--vary", "gpu.num_cus=40", "--quiet"]) == 2
    assert "give --system, or the systems to compare as --vary system=" in capsys.readouterr().err
    assert main(["sweep", "--system", "a100-sxm4", "--op", "gemm m=1024 n=1024 k=1024", "--vary",
                 "system=a100-sxm4,h100-sxm5", "--quiet"]) == 2
    assert capsys.readouterr().err == ("gpusim: error: sweep: give --system, or the systems to compare as --vary "
                                       "system=NAME,NAME (one of the two, not both)\n")


def test_cli_simulate_varies_model_options(tmp_path):
    code = main(["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--layers", "1", "--batch", "1",
                 "--system", "t3-ring8", "--vary", "tp=4,8", "--vary", "seq-len=128,256", "--workers", "1", "--quiet",
                 "--out", str(tmp_path)])
    assert code == 0
    points = pd.read_csv(tmp_path / "points.csv").set_index(["tp", "seq_len"])
    assert list(points.index) == [(4, 128), (4, 256), (8, 128), (8, 256)]
    assert points.loc[(8, 256), "compute_s"] < points.loc[(4, 256), "compute_s"]  # half the work per GPU
    assert points.loc[(4, 256), "compute_s"] > points.loc[(4, 128), "compute_s"]


@pytest.mark.parametrize("extra, message", [
    (["--model", "megatron-gpt2", "--vary", "tp=2,x"], "--vary tp: expected whole numbers, got 'x'"),
    (["--model", "megatron-gpt2", "--tp", "2", "--vary", "tp=2,4"], "--tp and --vary tp both give it"),
    (["--trace", "t.csv", "--vary", "batch=1,2"], "--vary batch varies an option of a generated model; it needs --model"),
])
def test_cli_simulate_bad_model_option_sweeps(capsys, extra, message):
    assert main(["simulate", "--system", "t3-ring8", "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--system", "t3-ring8", "--workers", "2"], "apply to a sweep (--vary)"),
    (["--system", "t3-ring8", "--sweep-cache", "c"], "apply to a sweep (--vary)"),
    (["--system", "t3-ring8", "--vary", "system=t3-ring8"], "either as the argument or as the values"),
    (["--vary", "gpu.num_cus=40,80"], "give --system (or, with --vary, the systems to compare"),
])
def test_cli_simulate_sweep_options(capsys, extra, message):
    arguments = ["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--tp", "8", "--layers", "1", "--quiet",
                 *extra]
    assert main(arguments) == 2
    assert message in capsys.readouterr().err


def test_cli_sweep_workload_placeholders(tmp_path, capsys):
    assert main(["sweep", "--system", "t3-ring8", "--op", "allreduce nbytes={size}", "--vary", "size=1MiB,16MiB",
                 "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert table["size"].tolist() == [2**20, 2**24] and table["bytes"].tolist() == [2**20, 2**24]
    elasticity = pd.read_csv(tmp_path / "elasticities.csv")
    assert set(elasticity["field"]) == {"size"}   # a size with a unit is a number, so it has an elasticity
    assert main(["sweep", "--system", "t3-ring8", "--op", "allreduce nbytes={size}", "--vary", "gpu.num_cus=80",
                 "--quiet"]) == 2
    assert "the ops use {size}; give its values with --vary size=" in capsys.readouterr().err
    assert main(["sweep", "--system", "t3-ring8", "--op", "allreduce nbytes={0}", "--vary", "gpu.num_cus=80",
                 "--quiet"]) == 2
    assert "a placeholder must be a name such as {size}, got {0}" in capsys.readouterr().err
    assert main(["sweep", "--system", "t3-ring8", "--op", "allreduce nbytes=1MiB", "--vary", "size=1MiB,2MiB",
                 "--quiet"]) == 2
    assert capsys.readouterr().err == ("gpusim: error: sweep: --vary size is neither a field (such as gpu.num_cus) "
                                       "nor a placeholder {size} of the ops\n")
    assert main(["sweep", "--system", "a100-sxm4", "--op", "allreduce nbytes=1MiB", "--vary", "clock=1GHz,2GHz",
                 "--quiet"]) == 2
    assert capsys.readouterr().err.endswith("nor a placeholder {clock} of the ops; the GPU's field is gpu.clock\n")
    assert main(["sweep", "--system", "a100-sxm4", "--op", "allreduce nbytes=1MiB", "--vary", "n=1,2", "--quiet"]) == 2
    assert capsys.readouterr().err.endswith("nor a placeholder {n} of the ops\n")  # no GPU field is n


@pytest.mark.parametrize("spec, message", [
    ("allreduce nbytes={size", "op 'allreduce nbytes={size': expected '}' before end of string; a placeholder is a name"),
    ("allreduce nbytes=size}", "op 'allreduce nbytes=size}': Single '}' encountered in format string; a placeholder"),
    ("allreduce nbytes={size!z}", "a placeholder must be a name such as {size}, got {size!z}"),
    ("allreduce nbytes={size:>9}", "a placeholder must be a name such as {size}, got {size:>9}"),
])
def test_cli_sweep_placeholders_that_do_not_read_are_one_error_line(tmp_path, capsys, spec, message):
    out = tmp_path / "out"
    assert main(["sweep", "--system", "t3-ring8", "--op", spec, "--vary", "size=1MiB,2MiB", "--quiet",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: ") and message in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("vary, message", [
    (["gpu.num_cus"], "--vary expects PATH=VALUE,VALUE"),
    (["gpu.num_cus=80,"], "--vary expects PATH=VALUE,VALUE"),
    (["gpu.num_cus=80", "gpu.num_cus=160"], "given more than once"),
    (["gpu.num_cus=80,lots"], "sweep point 1"),
    (["links.bandwidth=75GB/s", "links.bandwidth_bytes_per_s=150GB/s"], "is set by override 'links.bandwidth' too"),
])
def test_cli_sweep_bad_vary(tmp_path, capsys, vary, message):
    arguments = ["sweep", "--system", "t3-ring8", "--op", "gemm m=64 n=64 k=64", "--quiet", "--out", str(tmp_path / "out")]
    for spec in vary:
        arguments += ["--vary", spec]
    assert main(arguments) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_an_unknown_memory_policy_is_refused_before_anything_runs(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"sweep_parameters: memory_policy must be one of fcfs, fr-fcfs, .*"
                                          r"got 'nosuch'"):
        sweep("t3-ring8", GEMM, {"gpu.num_cus": [40]}, memory_policy="nosuch", cache=cache)
    assert not cache.exists()


def test_a_failed_point_is_named_by_its_values_not_its_whole_description(capsys):
    allreduce = ops.AllReduce(2**20, ranks=list(range(8)))
    with pytest.raises(SweepError) as info:
        sweep(None, allreduce, {"system": ["t3-ring8", "a100-4-nvlink"]}, mode="full")
    message = str(info.value)
    assert message.startswith("sweep over system: point 1 {'system': 'a100-4-nvlink'} failed: OpError: ")
    assert "rank 4 does not exist; a100-4-nvlink has ranks 0..3" in message
    assert "'config'" not in message and len(message) < 300
    status = main(["sweep", "--op", "allreduce nbytes=1MiB ranks=0,1,2,3,4,5,6,7", "--vary",
                   "system=t3-ring8,a100-4-nvlink", "--mode", "full", "--workers", "1", "--quiet"])
    error = capsys.readouterr().err
    assert status == 2 and error.startswith("gpusim: error: sweep over system: point 1 {'system': 'a100-4-nvlink'} "
                                            "failed: OpError: ") and len(error) < 300


@pytest.mark.parametrize("command", [
    ["sweep", "--op", "gemm m=64 n=64 k=64", "--cache"],
    ["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--tp", "8", "--layers", "1", "--sweep-cache"],
])
@pytest.mark.parametrize(("cache", "message"), [
    ("", "{option}: expected a folder, got an empty path"),  # not the current folder
    ("afile", "{option} afile: afile is a file, not a folder"),
    ("afile/sub", "{option} afile/sub: afile is a file, not a folder"),
])
def test_cli_sweep_a_bad_cache_is_one_error_line_before_anything_runs(tmp_path, capsys, monkeypatch, command, cache,
                                                                       message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    assert main([*command, cache, "--system", "t3-ring8", "--vary", "gpu.num_cus=40", "--quiet", "--out", "out"]) == 2
    assert capsys.readouterr() == ("", f"gpusim: error: {message.format(option=command[-1])}\n")
    assert [path.name for path in tmp_path.iterdir()] == ["afile"]


@pytest.mark.parametrize("command", [
    ["sweep", "--op", "gemm m=64 n=64 k=64"],
    ["simulate", "--model", "megatron-gpt2", "--phase", "prompt", "--tp", "8", "--layers", "1"],
])
def test_cli_a_varied_field_may_not_be_set_too(tmp_path, capsys, command):
    out = tmp_path / "out"
    assert main([*command, "--system", "t3-ring8", "--set", "gpu.num_cus=40", "--vary", "gpu.num_cus=80,160",
                 "--quiet", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("gpusim: error: sweep_parameters: 'gpu.num_cus' is both varied and overridden; "
                                       "give it in one of them\n")
    assert not out.exists()
