"""Dispatch latencies measured in Kineto traces, and the presets that rest on them."""

import json

import numpy as np
import pytest

import gpusim
from gpusim.trace.launch_gaps import GAP_COLUMNS, SUMMARY_COLUMNS, stream_gaps, summarize
from tests.conftest import shared_data

A100 = "traces/kineto/a100_2rank_cnn_nccl_kineto.json.gz"
MI250 = "traces/kineto/mi250_minitoy_train_kineto.json.gz"


def _event(cat, name, ts, dur, correlation, stream=7):
    args = {"correlation": correlation} | ({"stream": stream} if cat == "kernel" else {})
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_queued_and_idle_kernels_are_told_apart(tmp_path):
    events = [
        _event("cuda_runtime", "cudaLaunchKernel", 0.0, 5.0, 1), _event("kernel", "gemm", 10.0, 50.0, 1),
        _event("cuda_runtime", "cudaLaunchKernel", 20.0, 5.0, 2), _event("kernel", "splitKreduce", 61.5, 4.0, 2),
        _event("cuda_runtime", "cudaLaunchKernel", 100.0, 5.0, 3), _event("kernel", "add", 108.0, 2.0, 3),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    gaps = stream_gaps(path).set_index("name")
    assert gaps.loc["splitKreduce", "kind"] == "queued" and gaps.loc["splitKreduce", "wait_us"] == pytest.approx(1.5)
    assert gaps.loc["add", "kind"] == "idle" and gaps.loc["add", "wait_us"] == pytest.approx(3.0)
    assert gaps.loc["gemm", "kind"] == "idle" and gaps.loc["gemm", "wait_us"] == pytest.approx(5.0)
    assert summarize(gaps).loc["idle", "count"] == 2


def test_a100_preset_gap_is_the_measured_one():
    gaps = stream_gaps(shared_data(A100))
    queued = gaps[gaps["kind"] == "queued"]
    split_k = queued[queued["name"].str.contains("splitk", case=False)]  # cuBLASLt's and CUTLASS's reductions
    assert len(split_k) > 20
    preset_us = gpusim.load_system("a100-sxm4").gpu.dependent_launch_ns * 1e-3
    assert preset_us == pytest.approx(split_k["wait_us"].median(), rel=0.15)
    assert queued["wait_us"].median() < gaps.loc[gaps["kind"] == "idle", "wait_us"].median()


def _write(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("events", [
    [],
    [_event("cuda_runtime", "cudaDeviceSynchronize", 0.0, 5.0, 1)],
    [_event("kernel", "gemm", 10.0, 50.0, 1)],  # no launch call
])  # fmt: skip
def test_a_trace_without_launched_gpu_work_has_an_empty_summary(tmp_path, events):
    gaps = stream_gaps(_write(tmp_path, events))
    assert gaps.empty and list(gaps.columns) == GAP_COLUMNS
    summary = summarize(gaps)
    assert summary.empty and list(summary.columns) == SUMMARY_COLUMNS and summary.index.name == "kind"


def test_work_that_starts_before_its_launch_returns_has_no_wait(tmp_path):
    events = [  # a synchronous copy returns after the copy ended; then a kernel on the idle stream
        _event("cuda_runtime", "hipMemcpyWithStream", 0.0, 60.0, 1), _event("kernel", "copy", 16.0, 22.0, 1),
        _event("cuda_runtime", "hipLaunchKernel", 70.0, 5.0, 2), _event("kernel", "add", 81.0, 2.0, 2),
        _event("cuda_runtime", "hipLaunchKernel", 76.0, 5.0, 3), _event("kernel", "mul", 82.0, 2.0, 3),
    ]  # fmt: skip
    gaps = stream_gaps(_write(tmp_path, events)).set_index("name")
    assert gaps.loc["copy", "kind"] == "in_call" and np.isnan(gaps.loc["copy", "wait_us"])
    assert gaps.loc["add", "kind"] == "idle" and gaps.loc["add", "wait_us"] == pytest.approx(6.0)
    assert gaps.loc["mul", "kind"] == "overlap" and np.isnan(gaps.loc["mul", "wait_us"])
    summary = summarize(gaps.reset_index())
    assert summary.loc["in_call", "count"] == 1 and np.isnan(summary.loc["in_call", "median_us"])


def test_streams_of_different_devices_are_apart(tmp_path):
    events = [_event("cuda_runtime", "cudaLaunchKernel", 0.0, 5.0, 1) | {"pid": 0},
              _event("kernel", "a", 10.0, 50.0, 1) | {"pid": 0},
              _event("cuda_runtime", "cudaLaunchKernel", 20.0, 5.0, 2) | {"pid": 0},
              _event("kernel", "b", 30.0, 4.0, 2) | {"pid": 1}]  # same stream id, another GPU
    gaps = stream_gaps(_write(tmp_path, events)).set_index("name")
    assert gaps.loc["b", "kind"] == "idle" and gaps.loc["b", "previous"] == "" and gaps.loc["b", "device"] == 1


def test_shared_traces_have_no_negative_waits():
    for trace in (A100, MI250):
        gaps = stream_gaps(shared_data(trace))
        waits = gaps["wait_us"]
        assert (waits.dropna() >= 0).all()
        assert waits.isna().equals(gaps["kind"].isin(["in_call", "overlap"]))
    copies = gaps[gaps["name"].str.startswith("Memcpy HtoD")]  # MI250: hipMemcpyWithStream blocks
    assert len(copies) == 2 and (copies["kind"] == "in_call").all()
