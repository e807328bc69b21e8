"""The study pipeline on a tiny GEMM set: consistency of the configurations, caching, Dask."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpusim.errors import ConfigError
from gpusim.studies.concurrency import GO_PROPERTY_COLUMNS, ConcurrencyStudy, gemm_point, geomean, impact, packets_point
from gpusim.studies.concurrency_workloads import systematic_sample, with_shapes
from gpusim.sweep import point_key

SYSTEM = "t3-table8.1"


def tiny_gemms() -> pd.DataFrame:
    rows = [
        {"app": "a", "layer": "transformer", "hidden": 256, "inputs": 256, "linear": "x", "pass": "forward",
         "m": 256, "n": 512, "k": 256, "trans_a": False, "trans_b": True, "batch": 1, "dtype": "fp16", "role": "evaluate"},
        {"app": "a", "layer": "transformer", "hidden": 256, "inputs": 256, "linear": "x", "pass": "input-grad",
         "m": 256, "n": 256, "k": 512, "trans_a": False, "trans_b": False, "batch": 1, "dtype": "fp16", "role": "evaluate"},
        {"app": "b", "layer": "lstm", "hidden": 128, "inputs": 64, "linear": "gates", "pass": "forward",
         "m": 64, "n": 512, "k": 128, "trans_a": False, "trans_b": True, "batch": 1, "dtype": "fp16", "role": "evaluate"},
    ]
    return pd.DataFrame(rows)


def study(cache=None, scheduler=None):
    return ConcurrencyStudy(SYSTEM, degrees=(2, 4), cu_partition_degrees=(2,), resource_partition_degrees=(2,),
                            rc_fractions=(1, 2), shortlist_size=1, workers=1, scheduler=scheduler, cache=cache, progress=False)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    return folder, study(folder).run(tiny_gemms(), folds=2)


def test_configurations_are_consistent(cached):
    _, result = cached
    table = result.speedups.pivot_table(index=["label", "concurrency"], columns="config", values="speedup")
    assert (table["go-kernels"] >= table["default"] - 1e-12).all()  # the isolation-tuned kernel is a GO candidate
    assert set(result.summary["config"]) == {"default", "go-kernels", "goldyloc", "oracle", "cu-partition", "resource-partition"}
    assert set(result.summary["concurrency"]) == {2, 4}
    degrees = result.speedups[result.speedups["config"].isin(["goldyloc", "oracle"])]
    assert (degrees["degree"] <= degrees["concurrency"]).all() and (degrees["degree"] >= 1).all()
    assert result.predictor["accuracy"].between(0, 1).all()
    shapes = result.shapes
    assert (shapes["seq4_s"] > shapes["seq2_s"]).all()
    assert len(shapes) == 3 and shapes["shape"].str.contains("_01_").sum() == 2  # transposes are part of the shape
    overall = result.summary.set_index(["concurrency", "config"])["geomean_speedup"]
    distinct = result.speedups.drop_duplicates(["label", "concurrency", "config"])
    expected = geomean(distinct[(distinct["concurrency"] == 2) & (distinct["config"] == "default")]["speedup"])
    assert overall[(2, "default")] == pytest.approx(expected)


def test_goldyloc_pays_only_the_decision_time_a_batch_cannot_hide(cached):
    _, result = cached
    runner = study()
    row = result.shapes.iloc[0]
    decision = runner.timing.decision_ns * 1e-9
    assert runner.goldyloc_time(row, 2, 4) == pytest.approx(2 * (row["go2_s"] + max(0.0, decision - row["go2_s"])))
    assert runner.goldyloc_time(row, 1, 2) == pytest.approx(row["seq2_s"] + 2 * max(0.0, decision - row["next_s"]))


def test_a_rerun_takes_everything_from_the_cache(cached):
    folder, result = cached
    files = sorted(p.name for p in folder.glob("*.pkl"))
    again = study(folder).run(tiny_gemms(), folds=2)
    assert sorted(p.name for p in folder.glob("*.pkl")) == files
    pd.testing.assert_frame_equal(again.summary, result.summary)
    assert again.cpu_s == pytest.approx(result.cpu_s)  # cached points keep the CPU time they took


def test_cache_keys_follow_the_hardware():
    """A point's key holds its overrides; the presets and the simulator's code are in every sweep key
    (``sweep.simulator_fingerprint``, tested in test_sweep)."""
    shape = {"m": 64, "n": 64, "k": 64, "trans_a": False, "trans_b": False, "batch": 1, "dtype": "fp16"}
    plain = study()._point(shape, "MT64x64x32_T256", 1, "isolated")
    assert point_key(gemm_point, plain) == point_key(gemm_point, study()._point(shape, "MT64x64x32_T256", 1, "isolated"))
    smaller = study()._point(shape, "MT64x64x32_T256", 1, "isolated", {"gpu.num_cus": 40})
    assert point_key(gemm_point, plain) != point_key(gemm_point, smaller)


def test_points_run_on_a_local_dask_cluster():
    distributed = pytest.importorskip("dask.distributed")
    gemms = with_shapes(tiny_gemms().iloc[:1])
    local = study().measure(gemms)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        remote = study(scheduler=cluster.scheduler_address).measure(gemms)
    columns = ["isolated_kernel", "seq2_s", "default2_s", "go4_s", "preferred"]
    pd.testing.assert_frame_equal(local.shapes[columns], remote.shapes[columns])


def test_an_unreachable_scheduler_is_a_config_error_before_any_simulation(tmp_path):
    dask = pytest.importorskip("dask")
    pytest.importorskip("dask.distributed")
    gemms = with_shapes(tiny_gemms().iloc[:1])
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):  # Dask's default waits 30 s
        with pytest.raises(ConfigError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:1 "):
            study(tmp_path, scheduler="tcp://127.0.0.1:1").measure(gemms)
    assert not any(tmp_path.iterdir())  # nothing simulated


def test_gemm_point_arrangements():
    point = {"system": SYSTEM, "overrides": {}, "m": 512, "n": 512, "k": 256, "trans_a": False, "trans_b": False,
             "batch": 1, "dtype": "fp16", "kernel": "MT64x64x32_T256"}
    alone = gemm_point(**point, copies=1, arrangement="isolated")
    sequential = gemm_point(**point, copies=2, arrangement="sequential")
    shared = gemm_point(**point, copies=2, arrangement="shared")
    masked = gemm_point(**point, copies=2, arrangement="cu-partition")
    assert sequential["first_s"] == pytest.approx(alone["span_s"])
    assert shared["span_s"] < sequential["first_s"] + sequential["next_s"]  # the two share the GPU
    assert masked["span_s"] > alone["span_s"]  # each gets half the CUs
    with pytest.raises(ValueError, match="arrangement"):
        gemm_point(**point, copies=2, arrangement="nowhere")


def test_systematic_sample_keeps_each_app_spread_over_sizes():
    gemms = with_shapes(pd.concat([tiny_gemms()] * 1, ignore_index=True))
    assert len(systematic_sample(gemms, 1)) == len(gemms)
    sample = systematic_sample(gemms, 2, minimum=1)
    assert set(sample["app"]) == {"a", "b"}
    with pytest.raises(ValueError, match="every"):
        systematic_sample(gemms, 0)
    assert np.isfinite(sample["flops"]).all()


def test_go_properties_keep_their_columns_when_no_go_kernel_differs(cached):
    _, result = cached
    assert list(result.go_properties.columns) == GO_PROPERTY_COLUMNS
    none_differ = study().go_properties(pd.DataFrame(), pd.DataFrame({"rc": [], "shape": [], "kernel": []}))
    assert none_differ.empty and list(none_differ.columns) == GO_PROPERTY_COLUMNS


@pytest.mark.parametrize("arguments, message", [
    ({"degrees": (2, 3)}, r"degrees must be a non-empty list of distinct degrees among 2, 4, 8, 16, got \(2, 3\)"),
    ({"degrees": (2, 32)}, "degrees must be a non-empty list of distinct degrees among 2, 4, 8, 16, got"),
    ({"degrees": ()}, r"degrees must be a non-empty list of .*, got \(\)"),
    ({"degrees": (2, 2)}, "degrees must be .* distinct degrees"),
    ({"degrees": "2"}, "degrees must be .*, got '2'"),
    ({"degrees": (2.0, 4)}, "degrees must be"),
    ({"degrees": (2, 4), "cu_partition_degrees": (8,)}, r"cu_partition_degrees must be distinct degrees among the "
                                                         r"study's degrees \(2, 4\), at most the 80 CUs, got \(8,\)"),
    ({"degrees": (2, 4), "resource_partition_degrees": (2, 16)}, r"resource_partition_degrees must be distinct degrees "
                                                                 r"among the study's degrees \(2, 4\), got \(2, 16\)"),
    ({"overrides": {"gpu.hbm.channels_per_stack": 6}, "resource_partition_degrees": (2, 16)},
     r"resource_partition_degrees: .*24 HBM channels cannot be split into 16 equal parts; leave 16 out"),
    ({"rc_fractions": (2, 4)}, r"rc_fractions must include 1 \(the full GPU"),
    ({"rc_fractions": (1, 0)}, "rc_fractions must be a non-empty list of distinct integers from 1 to the 80 CUs"),
    ({"rc_fractions": (1, 200)}, "rc_fractions must be .* from 1 to the 80 CUs"),
    ({"shortlist_size": 0}, "shortlist_size must be a positive integer, got 0"),
    ({"shortlist_size": 2.5}, "shortlist_size must be a positive integer, got 2.5"),
    ({"workers": 0}, r"workers must be a positive integer \(or None for every CPU\), got 0"),
    ({"workers": "2"}, "workers must be a positive integer"),
    ({"scheduler": 8786}, "scheduler must be a Dask scheduler address such as tcp://host:8786, got 8786"),
    ({"timing": 8000}, "timing must be a CommandProcessorTiming or None, got 8000"),
    ({"progress": "no"}, "progress must be True or False, got 'no'"),
    ({"overrides": ["gpu.num_cus=60"]}, r"overrides must map setting paths to values, e.g. \{'gpu.num_cus': 60\}"),
    ({"system": None}, "system must be a preset name or a YAML path, got None"),
    ({"system": "mi1000"}, "unknown hardware preset 'mi1000'"),
])
def test_bad_study_arguments_are_config_errors_naming_them(arguments, message):
    options = {"system": SYSTEM, **arguments}
    with pytest.raises(ConfigError, match=f"^(ConcurrencyStudy: )?{message}"):
        ConcurrencyStudy(**options)


def test_a_file_for_a_cache_is_refused_up_front(tmp_path):
    afile = tmp_path / "cache"
    afile.write_text("")
    with pytest.raises(ConfigError, match="cache must be a folder"):
        ConcurrencyStudy(SYSTEM, cache=afile)


def test_partition_degrees_default_to_those_among_the_studys_degrees():
    default = ConcurrencyStudy(SYSTEM)
    assert (default.degrees, default.cu_partition_degrees, default.resource_partition_degrees) == \
        ((2, 4, 8, 16), (2, 4), (2, 4, 8, 16))
    fewer = ConcurrencyStudy(SYSTEM, degrees=[4, 2])
    assert (fewer.degrees, fewer.cu_partition_degrees, fewer.resource_partition_degrees) == ((2, 4), (2, 4), (2, 4))
    sixteen = ConcurrencyStudy(SYSTEM, degrees=np.array([16]))
    assert (sixteen.cu_partition_degrees, sixteen.resource_partition_degrees) == ((), (16,))
    unsplittable = ConcurrencyStudy(SYSTEM, overrides={"gpu.hbm.channels_per_stack": 6})  # 24 channels
    assert unsplittable.resource_partition_degrees == (2, 4, 8)


def test_bad_gemm_sets_and_method_arguments_are_config_errors(cached):
    _, result = cached
    tiny = study()
    gemms = tiny_gemms()
    for bad, message in [
        (gemms.iloc[:0], r"ConcurrencyStudy.run: gemms: no GEMM given \(an empty table"),
        (gemms.drop(columns=["dtype"]), "the GEMM table lacks the column.s. dtype"),
        (gemms.assign(dtype="fp24"), "column 'dtype' must hold fp64, .*, got fp24"),
        (gemms.assign(k=0), "column 'k' must hold positive integers, got 0"),
        (gemms.iloc[:1], "cross-validation needs at least 2 distinct GEMM shapes, got 1 "),
        (gemms.drop(columns=["app"]), "gemms needs an 'app' column"),
        ([("m", 1)], "expected a DataFrame of GEMMs .*, got list"),
    ]:
        with pytest.raises(ConfigError, match=message):
            tiny.run(bad)
    with pytest.raises(ConfigError, match="folds must be an integer of at least 2, got 1"):
        tiny.run(gemms, folds=1)
    with pytest.raises(ConfigError, match="ConcurrencyStudy.measure: gemms needs 'shape' and 'flops' columns"):
        tiny.measure(gemms)
    with pytest.raises(ConfigError, match="model must be a fitted ConcurrencyPredictor"):
        tiny.evaluate(gemms, None)
    shapes = result.shapes
    key = shapes["shape"].iloc[0]
    for arguments, message in [
        ({"mixes": []}, "mixes must be a non-empty list of .shape, shape. pairs"),
        ({"mixes": [(key, "nope")]}, r"every mix must be a pair of shape keys of the shapes table, got \('.*', 'nope'\)"),
        ({"mixes": [(key, key)], "policies": ("fastest",)}, "policies must be a non-empty list among sequential, default"),
        ({"mixes": [(key, key)], "degrees": (8,)}, r"degrees must be a non-empty list among the study's degrees \(2, 4\), "
                                                   r"got \(8,\)"),
        ({"mixes": [(key, key)], "shapes": shapes.drop(columns=["predicted"])}, "shapes must be a shape table with predictions"),
    ]:
        with pytest.raises(ConfigError, match=message):
            tiny.mixes(**{"shapes": shapes, **arguments})
    for arguments, message in [
        ({"shapes": ()}, r"shapes must be a non-empty list of \(m, n, k\)"),
        ({"shapes": [(64, 64)]}, r"every shape must be \(m, n, k\) of positive integers, got \(64, 64\)"),
        ({"shapes": [(64, -1, 64)]}, "every shape must be"),
        ({"degrees": (3,)}, r"degrees must be a non-empty list among 2, 4, 8, 16, got \(3,\)"),
        ({"dtype": "float32"}, "dtype must be one of fp64, .*, got 'float32'"),
    ]:
        with pytest.raises(ConfigError, match=f"^ConcurrencyStudy.size_trend: {message}"):
            tiny.size_trend(**arguments)
    with pytest.raises(ConfigError, match="band must be a fraction from 0 to below 1, got 2"):
        impact(result.speedups, band=2)
    with pytest.raises(ConfigError, match=r"^impact: speedups lacks the columns label, concurrency, config, speedup"):
        impact(pd.DataFrame())
    with pytest.raises(ConfigError, match="^impact: speedups needs rows of the configurations goldyloc and default"):
        impact(result.speedups[result.speedups["config"] != "goldyloc"])


def test_point_functions_refuse_unknown_arrangements_policies_and_copies():
    point = {"system": SYSTEM, "overrides": {}, "m": 64, "n": 64, "k": 64, "trans_a": False, "trans_b": False,
             "batch": 1, "dtype": "fp16", "kernel": "MT64x64x32_T256"}
    with pytest.raises(ConfigError, match="unknown arrangement 'nowhere'; known: isolated, sequential, shared"):
        gemm_point(**point, copies=2, arrangement="nowhere")
    with pytest.raises(ConfigError, match="copies must be a positive integer, got 0"):
        gemm_point(**point, copies=0, arrangement="shared")
    with pytest.raises(ConfigError, match="an isolated run has one copy, got copies=2"):
        gemm_point(**point, copies=2, arrangement="isolated")
    with pytest.raises(ConfigError, match="unknown policy 'fastest'; known: sequential, default, go-kernels, goldyloc"):
        packets_point(SYSTEM, {}, [], "fastest")


def load_predictor_variants():
    path = Path(__file__).resolve().parents[1] / "validation" / "concurrency" / "predictor_variants.py"
    spec = importlib.util.spec_from_file_location("predictor_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_features_and_the_predictor_variants_follow_from_a_shapes_csv(cached, tmp_path):
    """shapes.csv drops the feature arrays: they are recomputed from its kernels as the study made
    them, and the study's own variant of the predictor reproduces the run's accuracy."""
    _, result = cached
    result.shapes.drop(columns=["features"]).to_csv(tmp_path / "shapes.csv", index=False)
    table = pd.read_csv(tmp_path / "shapes.csv")
    mine = study()
    for (_, row), expected in zip(table.iterrows(), result.shapes["features"]):
        np.testing.assert_allclose(mine.features(row), expected)
    variants = load_predictor_variants().variants(mine, table, folds=2)
    first = variants.iloc[0]
    assert first["variant"] == "study (l2 = 1/samples)"
    assert [first[f"accuracy_{d}"] for d in (2, 4)] == result.predictor["accuracy"].tolist()
    assert variants["variant"].iloc[-1].startswith("always ") and variants.filter(like="accuracy").le(1).all().all()
