"""The host thread that issues a rank's kernels runs ahead of the GPU (gpusim/sched/executor.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.trace import Trace, compare, read_kineto
from tests.conftest import shared_data

H100 = gpusim.load_system("h100-sxm5")
LAUNCH_S = H100.gpu.kernel_launch_ns * 1e-9
GAP_S = H100.gpu.dependent_launch_ns * 1e-9
MI250 = "traces/kineto/mi250_minitoy_train_kineto.json.gz"


def _kernels(result):
    return result.kernels.sort_values("start_s").reset_index(drop=True)


def test_short_kernels_are_bound_by_the_host():
    """Kernels far shorter than a launch call start one launch cost apart."""
    kernels = _kernels(gpusim.run(H100, [ops.Elementwise("add", 2**14, "fp16") for _ in range(6)]))
    assert np.diff(kernels["start_s"]) == pytest.approx([LAUNCH_S] * 5)
    assert kernels["start_s"].iloc[0] == pytest.approx(LAUNCH_S)


def test_long_kernels_follow_each_other_at_the_dispatch_gap():
    """The host has issued the next kernel long before the previous ends: only the GPU's gap is left."""
    kernels = _kernels(gpusim.run(H100, [ops.Gemm(4096, 4096, 4096) for _ in range(3)]))
    gaps = kernels["start_s"].iloc[1:].to_numpy() - kernels["end_s"].iloc[:-1].to_numpy()
    assert gaps == pytest.approx([GAP_S] * 2)


def test_one_host_issues_every_stream_of_its_rank_in_turn():
    """Three streams with CUs of their own: their kernels start one launch call after another."""
    streams = [gpusim.Stream(name, cu_mask=tuple(range(40 * i, 40 * i + 40))) for i, name in enumerate("abc")]
    kernels = _kernels(gpusim.run(H100, [ops.Gemm(2048, 2048, 2048) for _ in range(3)], streams=streams))
    assert kernels["start_s"].to_numpy() == pytest.approx([LAUNCH_S, 2 * LAUNCH_S, 3 * LAUNCH_S])



def test_a_kernel_completes_the_gpu_s_own_cost_after_its_last_workgroup():
    """A kernel's span ends ``kernel_device_ns`` after its work; the next kernel of its stream waits
    for that, a kernel on another stream does not."""
    no_host = H100.with_overrides({"gpu.kernel_launch_ns": 0})
    bare = no_host.with_overrides({"gpu.kernel_device_ns": 0})
    device_s = H100.gpu.kernel_device_ns * 1e-9
    assert device_s > 0
    op = ops.Elementwise("add", 2**20, "fp16")
    assert gpusim.run(no_host, op).time_s == pytest.approx(gpusim.run(bare, op).time_s + device_s)
    chain = _kernels(gpusim.run(no_host, [ops.Elementwise("add", 2**20, "fp16") for _ in range(2)]))
    assert chain["start_s"].iloc[1] == pytest.approx(chain["end_s"].iloc[0] + GAP_S)
    halves = [gpusim.Stream(name, cu_mask=tuple(range(66 * i, 66 * i + 66))) for i, name in enumerate("ab")]
    twins = [ops.Elementwise("add", 2**20, "fp16") for _ in range(2)]
    apart = gpusim.run(no_host, twins, streams=halves).time_s
    assert apart < gpusim.run(bare, twins, streams=halves).time_s + 1.5 * device_s

@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(st.integers(10, 23), min_size=1, max_size=6))
def test_a_kernel_starts_when_both_its_launch_and_its_predecessor_allow(sizes):
    """On one stream, kernel i starts at max((i + 1) launch costs, the previous end + the dispatch gap)."""
    kernels = _kernels(gpusim.run(H100, [ops.Elementwise("copy", 2**size, "fp16") for size in sizes]))
    previous_end = None
    for index, row in kernels.iterrows():
        issued = (index + 1) * LAUNCH_S
        ready = issued if previous_end is None else max(issued, previous_end + GAP_S)
        assert row["start_s"] == pytest.approx(ready, rel=1e-9, abs=1e-12)
        previous_end = row["end_s"]


def test_measured_launches_are_replayed_as_the_host_issued_them():
    """The MI250 step is bound by the CPU: with its measured launches the replayed iteration is the
    measured one; with the model's host thread (20 us a call) it is a small part of it."""
    trace = read_kineto(shared_data(MI250), unsupported="delay")
    frame = trace.frame
    launched = frame["issue_s"].notna()
    assert launched.all() and (frame["issue_s"] > 0).all()
    measured_span = trace.metadata["measured_span_s"][0]
    result = gpusim.run("mi210", trace)
    first_kernel = result.kernels.groupby("op_id")["start_s"].min()
    assert (first_kernel >= frame.set_index("op_id")["issue_s"].loc[first_kernel.index] - 1e-12).all()
    iteration = compare(result.ops, measured_span, result.kernels).set_index("kernel_class").loc["iteration"]
    assert iteration["error"] == pytest.approx(0.0, abs=0.02)
    modelled_host = trace.with_modelled_host()
    assert modelled_host.frame["issue_s"].isna().all() and trace.frame["issue_s"].notna().all()
    result = gpusim.run("mi210", modelled_host)
    iteration = compare(result.ops, measured_span, result.kernels).set_index("kernel_class").loc["iteration"]
    assert iteration["simulated_s"] < 0.2 * measured_span


def test_negative_issue_times_are_rejected_naming_the_field():
    trace = read_kineto(shared_data(MI250), unsupported="delay")
    with pytest.raises(gpusim.errors.TraceError, match="issue_s"):
        Trace(trace.frame.assign(issue_s=-1.0), source="bad")


def test_the_host_s_calls_are_on_a_track_of_their_own():
    """One call per kernel on the host lane, one after another, each kernel after its call."""
    result = gpusim.run(H100, [ops.Elementwise("add", 2**20, "fp16") for _ in range(4)], streams=["a", "b", "a", "b"])
    calls = sorted((span for span in result.spans if span.category == "call"), key=lambda span: span.start_ns)
    assert [span.lane for span in calls] == ["host"] * 4
    assert all(later.start_ns >= earlier.end_ns for earlier, later in zip(calls, calls[1:]))
    kernel_start = {span.args["op_id"]: span.start_ns for span in result.spans if span.category == "kernel"}
    assert all(kernel_start[call.args["op_id"]] >= call.end_ns for call in calls)
