"""Dispatch latencies measured in Kineto traces, and the presets that rest on them."""

import json

import pytest

import gpusim
from gpusim.trace.launch_gaps import stream_gaps, summarize
from tests.conftest import shared_data

A100 = "traces/kineto/a100_2rank_cnn_nccl_kineto.json.gz"


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
