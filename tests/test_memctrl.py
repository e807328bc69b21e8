"""Arbitration policies as pure functions, admission rules, and controller micro-scenarios."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.config import McaConfig, load_gpu_config
from gpusim.engine import Join, Simulation
from gpusim.hw.gpu import Gpu
from gpusim.hw.memctrl import Arbiter, compute_first, fcfs, fr_fcfs, round_robin_streams
from gpusim.hw.request import MemRequest


def request(stream="compute", bank=0, row=0):
    r = MemRequest(0, 0, 64, "read", stream, 0.0)
    r.bank, r.row = bank, row
    return r


def view(open_rows, last=None, last_group=-1, banks_per_group=4):
    return SimpleNamespace(open_row=open_rows, last_stream=last, last_group=last_group, banks_per_group=banks_per_group)


def test_fcfs_picks_oldest():
    assert fcfs([request(), request()], 0.0, view([0])) == 0


def test_fr_fcfs_prefers_row_hits():
    queue = [request(row=1), request(row=2), request(row=1)]
    assert fr_fcfs(queue, 0.0, view([2])) == 1
    assert fr_fcfs(queue, 0.0, view([7])) == 0


def test_fr_fcfs_alternates_bank_groups():
    """Banks 0-3 are group 0, 4-7 group 1: after a group-0 request, a row hit in group 1 goes first,
    then a group-1 miss (it opens its row while group 0 finishes), and a group-0 hit only last."""
    rows = [1, -1, -1, -1, 5, -1, -1, -1]
    hit_here, miss_there, hit_there = request(bank=0, row=1), request(bank=5, row=3), request(bank=4, row=5)
    assert fr_fcfs([hit_here, miss_there, hit_there], 0.0, view(rows, last_group=0)) == 2
    assert fr_fcfs([hit_here, miss_there], 0.0, view(rows, last_group=0)) == 1
    assert fr_fcfs([hit_here, request(bank=1, row=2)], 0.0, view(rows, last_group=0)) == 0
    assert fr_fcfs([hit_here, miss_there], 0.0, view(rows, last_group=1)) == 0  # a hit in the other group


def test_round_robin_alternates_streams_and_falls_back():
    queue = [request("comm"), request("compute")]
    assert round_robin_streams(queue, 0.0, view([-1], last="comm")) == 1
    assert round_robin_streams(queue, 0.0, view([-1], last="compute")) == 0
    assert round_robin_streams([request("comm")], 0.0, view([-1], last="comm")) == 0


def test_compute_first():
    queue = [request("comm"), request("comm"), request("compute")]
    assert compute_first(queue, 0.0, view([-1])) == 2


def test_mca_admission_threshold_and_starvation():
    arbiter = Arbiter("t3-mca", McaConfig(starvation_limit_ns=1000.0))
    arbiter.mca.threshold = 0.25
    assert arbiter.may_admit("compute", 15, 16, 0.0)
    assert not arbiter.may_admit("compute", 16, 16, 0.0)
    assert arbiter.may_admit("comm", 3, 16, 0.0)
    assert not arbiter.may_admit("comm", 4, 16, 0.0)
    assert arbiter.may_admit("comm", 4, 16, 1000.0)
    arbiter.mca.release()
    assert arbiter.may_admit("comm", 15, 16, 0.0)


def test_mca_threshold_from_intensity():
    arbiter = Arbiter("t3-mca", McaConfig())
    state = arbiter.mca
    state.observe()
    for _ in range(10):
        state.sample(0.9)
    assert state.choose() == McaConfig().thresholds[0]
    state.observe()
    state.sample(0.0)
    assert state.choose() is None


def test_unknown_policy():
    with pytest.raises(ValueError, match="known: fcfs"):
        Arbiter("lottery", McaConfig())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 24), st.integers(1, 1 << 16), st.sampled_from(["read", "write"])),
                min_size=1, max_size=60))
def test_queues_never_exceed_capacity_and_bytes_are_conserved(accesses):
    sim = Simulation()
    gpu = Gpu(sim, None, 0, load_gpu_config("t3-table8.1"))
    join = Join(sim.env)
    for addr, nbytes, kind in accesses:
        if kind == "read":
            gpu.memory.dram(addr, nbytes, "read", "compute", completion=join)
        else:
            gpu.memory.dram(addr, nbytes, "write", "comm", admission=join)
    join.close()
    sim.run()
    assert join.event.processed
    for controller in gpu.controllers:
        assert controller.max_occupancy <= controller.capacity
        assert not controller.queue
    moved = sum(ch.stats.bytes_read + ch.stats.bytes_written for ch in gpu.channels)
    assert moved == sum(n for _, n, _ in accesses)
    assert sum(sim.recorder.dram.values()) == moved
