"""Streams share a GPU's hardware queues: kernels of one queue run one after another."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.hw.queues import HardwareQueues

ONE = gpusim.load_system("t3-table8.1", {"gpu.kernel_launch_ns": 0})
"""Without the host's launch costs, kernels issued together are ready together (tiny GEMMs would
otherwise end before the host has issued the next)."""


def _gemms(count: int) -> list[ops.Gemm]:
    return [ops.Gemm(256, 256, 256, a=f"a{i}", b=f"b{i}", out=f"c{i}") for i in range(count)]


def _most_at_once(kernels) -> int:
    """Largest number of kernels whose [start, end) intervals overlap."""
    edges = sorted([(s, 1) for s in kernels["start_s"]] + [(e, -1) for e in kernels["end_s"]], key=lambda x: (x[0], x[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_later_streams_share_the_least_used_queue_in_creation_order():
    queues = HardwareQueues(simpy.Environment(), count=4)
    first = [queues.queue(f"s{i}") for i in range(4)]
    assert len(set(map(id, first))) == 4
    assert queues.queue("s4") is first[0] and queues.queue("s5") is first[1]
    assert queues.queue("s0") is first[0]  # a stream keeps its queue


def test_a_masked_stream_gets_a_queue_of_its_own():
    queues = HardwareQueues(simpy.Environment(), count=1)
    shared = queues.queue("a")
    assert queues.queue("masked", masked=True) is not shared
    assert queues.queue("b") is shared


def test_streams_on_one_queue_run_one_after_another():
    one_queue = ONE.with_overrides({"gpu.hardware_queues": 1})
    serial = gpusim.run(one_queue, _gemms(2), streams=["a", "b"]).kernels.sort_values("start_s")
    assert serial["start_s"].iloc[1] >= serial["end_s"].iloc[0]
    overlapped = gpusim.run(ONE, _gemms(2), streams=["a", "b"]).kernels
    assert _most_at_once(overlapped) == 2


def test_masked_streams_are_not_held_back_by_the_shared_queues():
    one_queue = ONE.with_overrides({"gpu.hardware_queues": 1})
    half, other = tuple(range(40)), tuple(range(40, 80))
    streams = [gpusim.Stream("x", cu_mask=half), gpusim.Stream("y", cu_mask=other)]
    assert _most_at_once(gpusim.run(one_queue, _gemms(2), streams=streams).kernels) == 2


def test_bad_queue_count_is_rejected():
    with pytest.raises(ValueError, match="hardware_queues"):
        ONE.with_overrides({"gpu.hardware_queues": 0})


@settings(max_examples=8, deadline=None)
@given(queues=st.integers(1, 4), streams=st.integers(1, 6), kernels=st.integers(1, 8))
def test_never_more_kernels_at_once_than_queues_and_all_finish(queues, streams, kernels):
    system = ONE.with_overrides({"gpu.hardware_queues": queues})
    names = [f"s{i % streams}" for i in range(kernels)]
    result = gpusim.run(system, _gemms(kernels), streams=names)
    assert len(result.kernels) == kernels
    assert _most_at_once(result.kernels) <= min(queues, streams)
    # each stream's kernels keep their order
    for name in set(names):
        starts = result.kernels[result.kernels["stream"] == name].sort_values("op_id")["start_s"].to_numpy()
        assert np.all(np.diff(starts) > 0)
