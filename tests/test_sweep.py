"""The sweep layer: parallel points, caching and resumption, Dask."""

import pandas as pd
import pytest

from gpusim.sweep import point_key, sweep


def square(x, y=1):
    return {"value": x * x * y}


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


def test_keys_depend_on_function_and_point():
    assert point_key(square, {"x": 1}) != point_key(square, {"x": 2})
    assert point_key(square, {"x": 1}) != point_key(gemm_time, {"x": 1})
    assert point_key(square, {"x": 1, "y": 2}) == point_key(square, {"y": 2, "x": 1})


def a_number(x):
    return x


def test_bad_return_type():
    with pytest.raises(TypeError, match="must return"):
        sweep(a_number, [{"x": 3}], workers=1, progress=False)


def test_dask_local_cluster():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        frame = sweep(square, [{"x": x, "y": 2} for x in range(4)], scheduler=cluster.scheduler_address, progress=False)
    assert list(frame["value"]) == [0, 2, 8, 18]
