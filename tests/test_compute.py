"""Occupancy and the workgroup dispatcher (simpy-style micro-scenarios that log and assert)."""

import pytest

from gpusim.config import load_gpu_config
from gpusim.engine import Simulation
from gpusim.hw.compute import ComputeUnit, Dispatcher, Kernel, WorkgroupShape, occupancy

CU = load_gpu_config("t3-table8.1").cu


def test_occupancy_limited_by_each_resource():
    assert occupancy(WorkgroupShape(256, 0, 32), CU) == 8  # threads: 2048 / 256
    assert occupancy(WorkgroupShape(256, 48 * 1024, 32), CU) == 2  # LDS: 96 KiB / 48 KiB
    assert occupancy(WorkgroupShape(256, 0, 255), CU) == 1  # registers
    assert occupancy(WorkgroupShape(4096, 0, 32), CU) == 0


def run_grid(num_cus, num_wgs, shape, duration=100.0, mask=None, policy="round_robin", kernels=1):
    sim = Simulation()
    cus = [ComputeUnit(i, CU, 0.01) for i in range(num_cus)]
    dispatcher = Dispatcher(sim.env, cus, policy)
    log = []

    def body(kernel_index):
        def wg(index, cu):
            log.append((kernel_index, index, cu.index, sim.now))
            yield sim.timeout(duration)

        return wg

    runs = [dispatcher.launch(Kernel(f"k{i}", num_wgs, shape, body(i), cu_mask=mask)) for i in range(kernels)]
    sim.run()
    return sim, log, runs


def test_waves_follow_occupancy():
    shape = WorkgroupShape(1024, 0, 32)  # two per CU
    sim, log, runs = run_grid(num_cus=2, num_wgs=9, shape=shape)
    assert sim.now == pytest.approx(300.0)  # 4 slots: 9 WGs take 3 waves
    assert [t for *_, t in log].count(0.0) == 4
    assert runs[0].end_ns == pytest.approx(300.0)


def test_first_wave_spreads_over_cus():
    sim, log, _ = run_grid(num_cus=4, num_wgs=4, shape=WorkgroupShape(256, 0, 32))
    assert sorted(cu for _, _, cu, _ in log) == [0, 1, 2, 3]


def test_small_concurrent_kernels_spread_over_idle_cus():
    shape = WorkgroupShape(256, 0, 32)  # eight per CU
    _, log, _ = run_grid(num_cus=8, num_wgs=4, shape=shape, kernels=2)
    first, second = ({cu for k, _, cu, _ in log if k == kernel} for kernel in (0, 1))
    assert len(first) == len(second) == 4 and not first & second  # not both on CUs 0-3


def test_cu_mask_is_respected():
    _, log, _ = run_grid(num_cus=4, num_wgs=8, shape=WorkgroupShape(256, 0, 32), mask=[1, 2])
    assert {cu for _, _, cu, _ in log} == {1, 2}


def test_concurrent_kernels_take_turns_round_robin():
    shape = WorkgroupShape(2048, 0, 32)  # one per CU
    _, log, _ = run_grid(num_cus=2, num_wgs=4, shape=shape, kernels=2)
    assert [k for k, _, _, t in log if t == 0.0] == [0, 0]  # the first launch finds the GPU empty
    assert sorted(k for k, _, _, t in log if t == 100.0) == [0, 1]  # then the kernels alternate


def test_fifo_policy_lets_the_first_kernel_finish_dispatching():
    shape = WorkgroupShape(2048, 0, 32)
    _, log, _ = run_grid(num_cus=2, num_wgs=4, shape=shape, kernels=2, policy="fifo")
    assert [k for k, _, _, t in log if t == 100.0] == [0, 0]


def test_wg_that_fits_nowhere_is_an_error():
    sim = Simulation()
    dispatcher = Dispatcher(sim.env, [ComputeUnit(0, CU, 0.01)])
    with pytest.raises(ValueError, match="fits on no CU"):
        dispatcher.launch(Kernel("huge", 1, WorkgroupShape(8192), lambda i, cu: iter(())))


def test_cu_arithmetic_is_shared_and_small_workgroups_use_a_fraction():
    cu = ComputeUnit(0, CU, 0.01)
    assert cu.compute(0.0, 1000.0, 10.0, 4) == pytest.approx(100.0)
    assert cu.compute(0.0, 1000.0, 10.0, 4) == pytest.approx(200.0)  # queued behind the first
    lone = ComputeUnit(1, CU, 0.01)
    assert lone.compute(0.0, 1000.0, 10.0, 1) == pytest.approx(400.0)  # one wavefront of four SIMDs
