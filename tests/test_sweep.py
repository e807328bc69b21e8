"""The sweep layer: parallel points, caching and resumption, Dask."""

import pickle
import re
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpusim.errors import ConfigError, SweepError
from gpusim.sweep import point_key, sweep


def square(x, y=1):
    return {"value": x * x * y}


def counted(x, log):
    with open(log, "a") as calls:
        calls.write(f"{x}\n")
    return {"y": x * x}


def gemm_time(m):
    import gpusim
    from gpusim import ops

    return {"time_s": gpusim.run("t3-table8.1", ops.Gemm(m, m, m)).time_s}


def test_sweep_in_this_process_and_in_processes():
    points = [{"x": x} for x in range(5)]
    local = sweep(square, points, workers=1, progress=False)
    parallel = sweep(square, points, workers=2, progress=False)
    pd.testing.assert_frame_equal(local, parallel)
    assert list(local["value"]) == [0, 1, 4, 9, 16]


def test_cache_resumes_without_repeating(tmp_path):
    points = [{"m": 256}, {"m": 512}]
    first = sweep(gemm_time, points, workers=1, cache=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.pkl"))) == 2
    again = sweep(gemm_time, points + [{"m": 384}], workers=1, cache=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.pkl"))) == 3
    assert list(again["time_s"][:2]) == list(first["time_s"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "legacy"])
def test_a_damaged_cache_entry_is_a_miss_and_is_said(tmp_path, damage):
    """An entry altered on disk, cut short, or not written by the cache is never used: the point
    runs again (a warning names the file) and the table is the undamaged run's."""
    points = [{"m": 256}, {"m": 512}]
    first = sweep(gemm_time, points, workers=1, cache=tmp_path, progress=False)
    entry = sorted(tmp_path.glob("*.pkl"))[0]
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(pickle.dumps([{"m": 256, "time_s": 1.0}]))  # a bare pickle: no checksum
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=rf"sweep cache .*{entry.name}: .*; the point is simulated again"):
        again = sweep(gemm_time, points, workers=1, cache=tmp_path, progress=False)
    pd.testing.assert_frame_equal(again, first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the entry was written again, whole
        sweep(gemm_time, points, workers=1, cache=tmp_path, progress=False)


def test_keys_depend_on_function_and_point():
    assert point_key(square, {"x": 1}) != point_key(square, {"x": 2})
    assert point_key(square, {"x": 1}) != point_key(gemm_time, {"x": 1})
    assert point_key(square, {"x": 1, "y": 2}) == point_key(square, {"y": 2, "x": 1})


def a_number(x):
    return x


def a_word(x):
    return "done"


def renames_its_point(x):
    return {"x": 10 * x}


def fails_at_three(x):
    if x == 3:
        raise ValueError("boom")
    return {"value": x}


@pytest.mark.parametrize("fn", [a_number, a_word])
def test_bad_return_type(fn):
    with pytest.raises(SweepError, match=r"point 0 \{'x': 3\} failed: TypeError: a sweep function must return"):
        sweep(fn, [{"x": 3}], workers=1, progress=False)


def test_a_result_may_not_overwrite_its_point():
    with pytest.raises(SweepError, match="returned 'x' = 20, but the point's 'x' is 2"):
        sweep(renames_its_point, [{"x": 2}], workers=1, progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_point_is_named_and_the_finished_ones_are_kept(tmp_path, workers):
    with pytest.raises(SweepError, match=r"point 3 \{'x': 3\} failed: ValueError: boom") as info:
        sweep(fails_at_three, [{"x": x} for x in range(5)], workers=workers, cache=tmp_path, progress=False)
    assert isinstance(info.value.__cause__, ValueError)
    cached = {point_key(fails_at_three, {"x": x}) for x in range(3)}
    assert cached <= {path.stem for path in tmp_path.glob("*.pkl")}  # the points before it need not run again


def test_a_failing_point_may_be_named_by_its_label():
    points = [{"x": x, "config": "a long description"} for x in range(5)]
    with pytest.raises(SweepError, match=r"^sweep: point 3 x=3 failed: ValueError: boom$"):
        sweep(lambda x, config: fails_at_three(x), points, workers=1, progress=False,
              labels=[f"x={point['x']}" for point in points])
    with pytest.raises(ConfigError, match="labels must name each of the 5 points, got 1 labels"):
        sweep(fails_at_three, points, workers=1, progress=False, labels=["x"])


def test_keys_change_with_the_simulator_and_its_presets(tmp_path, monkeypatch):
    """A cached point of a changed model or preset is simulated again (the T3 study reused stale ones)."""
    from gpusim import sweep as sweep_module

    before = point_key(square, {"x": 1})
    preset = tmp_path / "gpus" / "mine.yaml"
    preset.parent.mkdir()
    preset.write_text("base: h100-sxm5\nnum_cus: 100\n")
    monkeypatch.setenv("GPUSIM_HWCONFIGS", str(tmp_path))
    sweep_module.simulator_fingerprint.cache_clear()
    try:
        assert point_key(square, {"x": 1}) != before
    finally:
        monkeypatch.delenv("GPUSIM_HWCONFIGS")
        sweep_module.simulator_fingerprint.cache_clear()
    assert point_key(square, {"x": 1}) == before
    assert sweep_module.code_of("x = 1  # a comment\n") == sweep_module.code_of('"""Docs."""\nx = 1\n')


def test_numpy_values_share_keys_with_python_numbers_but_not_with_text():
    assert point_key(square, {"x": np.int64(1)}) == point_key(square, {"x": 1})
    assert point_key(square, {"x": np.int64(1)}) != point_key(square, {"x": "1"})


def test_dask_local_cluster():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        frame = sweep(square, [{"x": x, "y": 2} for x in range(4)], scheduler=cluster.scheduler_address, progress=False)
    assert list(frame["value"]) == [0, 2, 8, 18]


def test_an_unreachable_scheduler_is_a_config_error_naming_it(tmp_path):
    dask = pytest.importorskip("dask")
    pytest.importorskip("dask.distributed")
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):  # Dask's default waits 30 s
        with pytest.raises(ConfigError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:1 \(.*\); "
                                              r"check that a scheduler runs there"):
            sweep(square, [{"x": 1}], scheduler="tcp://127.0.0.1:1", progress=False)
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler at localhost:notaport"):
        sweep(square, [{"x": 1}], scheduler="localhost:notaport", progress=False)
    with pytest.raises(ConfigError, match="expected a Dask scheduler address such as tcp://host:8786, got 8786"):
        sweep(square, [{"x": 1}], scheduler=8786, progress=False)
    sweep(square, [{"x": 1}], cache=tmp_path, progress=False)
    cached = sweep(square, [{"x": 1}], scheduler="tcp://127.0.0.1:1", cache=tmp_path, progress=False)
    assert list(cached["value"]) == [1]  # nothing left to run: no scheduler needed


def test_a_scheduler_without_dask_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # importing it fails as if not installed
    with pytest.raises(ConfigError, match=r"tcp://host:8786: running on a Dask cluster needs dask\.distributed "
                                          r"\(pip install"):
        sweep(square, [{"x": 1}], scheduler="tcp://host:8786", progress=False)


def test_bad_workers_and_a_file_for_a_cache_are_config_errors(tmp_path):
    for workers in (0, -1, 1.5, "2"):
        with pytest.raises(ConfigError, match="workers must be a positive integer"):
            sweep(square, [{"x": 1}], workers=workers, progress=False)
    afile = tmp_path / "cache"
    afile.write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        sweep(square, [{"x": 1}], cache=afile, progress=False)


def test_a_point_given_twice_runs_once(tmp_path):
    calls = tmp_path / "calls"
    table = sweep(counted, [{"x": 2, "log": str(calls)}, {"x": 3, "log": str(calls)}, {"x": 2, "log": str(calls)}],
                  workers=1, progress=False)
    assert list(table["y"]) == [4, 9, 4]
    assert calls.read_text().split() == ["2", "3"]


def test_a_cache_folder_that_cannot_be_created_is_a_config_error_naming_it(tmp_path):
    """(gpusim sweep checks --cache as it checks --out: tests/test_parameter_sweep.py.)"""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=rf"sweep cache {re.escape(str(afile / 'cache'))}: cannot create the folder: "
                                          r"Not a directory"):
        sweep(square, [{"x": 1}], cache=afile / "cache", progress=False)


def replace_folder_by_file(folder: str) -> dict[str, int]:
    """A point that removes the sweep's cache folder and leaves a file in its place (as if the disk
    under the cache had gone away), then returns its row."""
    shutil.rmtree(folder)
    Path(folder).write_text("")
    return {"value": 1}


def test_a_cache_entry_that_cannot_be_written_stops_the_sweep_naming_the_file(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(SweepError, match=rf"point 0 .* failed: ConfigError: {re.escape(str(cache))}/\w+\.pkl: cannot "
                                         rf"write a sweep point's cached rows: {re.escape(str(cache))} is a file"):
        sweep(replace_folder_by_file, [{"folder": str(cache)}], cache=cache, workers=1, progress=False)
    assert [path.name for path in tmp_path.iterdir()] == ["cache"] and cache.is_file()  # no partial entry
