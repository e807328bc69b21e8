"""The command processor: queue heads, concurrency policies, decision time, CU masks and partitions."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config import load_gpu_config
from gpusim.kernels.gemm_tuning import parse_kernel
from gpusim.sched.command_processor import (
    CommandProcessor,
    CommandProcessorTiming,
    DegreeLimit,
    DispatchAll,
    KernelPacket,
    PredictedDegree,
)
from gpusim.sched.partitions import cu_masks, resource_partition_overrides
from gpusim.simulate import finish, prepare

SYSTEM = gpusim.load_system("t3-table8.1")
SMALL = parse_kernel("MT64x64x32_T256")
LARGE = parse_kernel("MT128x128x32_T256")


def simulate(policy, gemms, streams=None, timing=None):
    """Submit packets at time 0; return the result (kernels with op_id) and the processor."""
    system, sim, machine, executor = prepare(SYSTEM)
    processor = CommandProcessor(executor, 0, policy, timing)
    packets = []
    for index, gemm in enumerate(gemms):
        stream = gpusim.Stream(streams[index] if streams else f"s{index}")
        packet = KernelPacket(gemm, stream, {1: SMALL, 2: LARGE}, features=np.array([2.0]))
        processor.submit(packet)
        packets.append(packet)
    result = finish(system, sim, machine, executor, len(gemms), time.perf_counter())
    return result, processor, packets


def gemms(count, m=1024, n=1024, k=512):
    return [ops.Gemm(m, n, k, a=f"a{i}", b=f"b{i}", out=f"c{i}") for i in range(count)]


def test_decision_time_follows_section_7_4_4_2():
    timing = CommandProcessorTiming()
    assert timing.queue_pass_ns == pytest.approx(32 * 31 / 1.5)  # 32 queues x 31 cycles at 1.5 GHz
    assert timing.decision_ns == pytest.approx(8000.0, rel=0.01)
    with pytest.raises(ValueError, match="clock_hz"):
        CommandProcessorTiming(clock_hz=0)


def test_dispatch_all_starts_every_head_at_once():
    result, processor, _ = simulate(DispatchAll(), gemms(3))
    launch = SYSTEM.gpu.kernel_launch_ns * 1e-9
    assert result.ops["start_s"].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert result.kernels["start_s"].min() == pytest.approx(launch)
    assert set(result.ops["degree"]) == {1}  # Default: isolation-tuned kernels
    assert set(result.ops["impl"]) == {SMALL.name}
    assert processor.busy_ns == 0.0


def test_dispatch_all_tuned_for_degree_rewrites_the_packets():
    result, _, _ = simulate(DispatchAll(tuned_for_degree=True), gemms(3))
    assert set(result.ops["degree"]) == {3}
    assert set(result.ops["impl"]) == {LARGE.name}  # the kernel of the largest tuned degree <= 3


def test_degree_limit_waits_for_a_kernel_to_finish_dispatching():
    result, _, packets = simulate(DegreeLimit(1), gemms(3, m=2048, n=2048, k=1024))
    released = sorted(packet.released_ns for packet in packets)
    dispatched = sorted(packet.dispatched_ns for packet in packets)
    assert released[0] == 0.0
    for previous_done, next_release in zip(dispatched, released[1:]):
        assert next_release == pytest.approx(previous_done)  # the next head goes when the last WG is placed
    ends = sorted(result.kernels["end_s"])
    starts = sorted(result.kernels["start_s"])
    assert starts[1] < ends[0]  # ...so its workgroups fill the previous kernel's tail


def test_a_stream_is_in_order():
    result, _, _ = simulate(DispatchAll(), gemms(2), streams=["same", "same"])
    first, second = result.ops.sort_values("start_s").itertuples()
    assert second.start_s >= first.end_s


def test_predicted_degree_limits_concurrency_and_costs_decision_time():
    timing = CommandProcessorTiming()
    result, processor, packets = simulate(PredictedDegree(lambda features: int(features[0])), gemms(4), timing=timing)
    assert result.kernels["start_s"].min() == pytest.approx((timing.decision_ns + SYSTEM.gpu.kernel_launch_ns) * 1e-9)
    assert sorted(packet.degree for packet in packets)[-1] == 2
    assert processor.busy_ns >= timing.decision_ns
    events = sorted([(p.released_ns, 1) for p in packets] + [(p.dispatched_ns, -1) for p in packets])
    dispatching = np.cumsum([change for _, change in events])
    assert dispatching.max() <= 2


def mixed(degrees, order):
    """Two GEMM shapes, 4 copies each, queued on their own streams in ``order`` (``"w"``: the wider
    shape, ``"n"``: the narrower), predicted at ``degrees[shape]``; return the packets after the
    simulation (no decision time)."""
    system, sim, machine, executor = prepare(SYSTEM)
    free = CommandProcessorTiming(predictor_ns=0.0, memory_latency_cycles=1e-9)
    processor = CommandProcessor(executor, 0, PredictedDegree(lambda features: int(features[0])), free)
    counts = {"w": 0, "n": 0}
    packets = []
    for index, shape in enumerate(order):
        i = counts[shape]
        counts[shape] += 1
        size = (1024, 1024, 512) if shape == "w" else (512, 512, 256)
        gemm = ops.Gemm(*size, a=f"{shape}a{i}", b=f"{shape}b{i}", out=f"{shape}c{i}")
        packet = KernelPacket(gemm, gpusim.Stream(f"s{index}"), {1: SMALL, 2: LARGE},
                              features=np.array([float(degrees[shape])]), label=f"{shape}{i}")
        processor.submit(packet)
        packets.append(packet)
    finish(system, sim, machine, executor, len(order), time.perf_counter())
    return packets


def test_predicted_degree_runs_shapes_that_disagree_as_homogeneous_sets():
    """Section 7.5.7: when the shapes queued together do not all prefer running together, the CP
    treats each shape's GEMMs as a homogeneous set and serves the sets one after another, each at
    its own ``min(predicted, available)``: the shape of the first head, 4 at a time, then the
    other one by one, never a kernel of both shapes dispatching at once."""
    packets = mixed({"w": 4, "n": 1}, "wnwnwnwn")
    by_label = {packet.label: packet for packet in packets}
    assert {by_label[f"w{i}"].degree for i in range(4)} == {4}
    assert {by_label[f"n{i}"].degree for i in range(4)} == {1}
    last_wide = max(by_label[f"w{i}"].dispatched_ns for i in range(4))
    assert min(by_label[f"n{i}"].released_ns for i in range(4)) >= last_wide
    narrow = sorted((by_label[f"n{i}"].released_ns, by_label[f"n{i}"].dispatched_ns) for i in range(4))
    for (_, dispatched), (released, _) in zip(narrow, narrow[1:]):
        assert released >= dispatched  # one at a time


def test_predicted_degree_runs_shapes_together_when_all_prefer_it():
    packets = mixed({"w": 8, "n": 16}, "wnwnwnwn")
    assert {packet.degree for packet in packets} == {8}
    assert len({packet.released_ns for packet in packets}) == 1  # one decision releases all eight


def test_decision_time_is_hidden_behind_running_kernels():
    """The same degree chosen with and without decision cost: the first decision delays the first
    kernel by its full cost; the second batch's decision overlaps the first batch, so the makespan
    grows by about one decision, not two (the shifted kernels contend a little differently for the
    L2 and memory, by up to half a decision here)."""
    free = CommandProcessorTiming(predictor_ns=0.0, memory_latency_cycles=1e-9)
    costly = CommandProcessorTiming()
    quick, _, _ = simulate(PredictedDegree(lambda features: 2), gemms(4, m=2048, n=2048, k=256), timing=free)
    slow, _, _ = simulate(PredictedDegree(lambda features: 2), gemms(4, m=2048, n=2048, k=256), timing=costly)
    decision_s = costly.decision_ns * 1e-9
    first_delay = slow.kernels["start_s"].min() - quick.kernels["start_s"].min()
    assert first_delay == pytest.approx(decision_s, rel=0.01)
    makespan_growth = slow.kernels["end_s"].max() - quick.kernels["end_s"].max()
    assert 0.5 * decision_s < makespan_growth < 1.5 * decision_s


def test_packets_need_the_isolation_tuned_kernel():
    with pytest.raises(ValueError, match="degree 1"):
        KernelPacket(ops.Gemm(8, 8, 8), gpusim.Stream("s"), {2: SMALL})
    packet = KernelPacket(ops.Gemm(8, 8, 8), gpusim.Stream("s"), {1: SMALL, 4: LARGE})
    assert packet.kernel_for(1) == SMALL
    assert packet.kernel_for(3) == SMALL
    assert packet.kernel_for(16) == LARGE


def test_cu_masked_streams_stay_in_their_partitions():
    system, sim, machine, executor = prepare(SYSTEM)
    processor = CommandProcessor(executor, 0, DispatchAll())
    masks = cu_masks(SYSTEM.gpu.num_cus, 2)
    used = {0: set(), 1: set()}
    dispatcher = machine.gpu(0).dispatcher
    place = dispatcher._place

    def spy(run, cu):
        used[0 if run.kernel.cu_mask == masks[0] else 1].add(cu.index)
        place(run, cu)

    dispatcher._place = spy
    for index, mask in enumerate(masks):
        processor.submit(KernelPacket(gemms(1)[0], gpusim.Stream(f"s{index}", mask), {1: SMALL}))
    finish(system, sim, machine, executor, 2, time.perf_counter())
    assert used[0] <= set(masks[0]) and used[1] <= set(masks[1])
    assert used[0] and used[1]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16))
def test_cu_masks_partition_every_cu(cus, parts):
    if parts > cus:
        with pytest.raises(ValueError, match=rf"cu_masks: parts must be between 1 and the {cus} CUs, got {parts}"):
            cu_masks(cus, parts)
        return
    masks = cu_masks(cus, parts)
    flat = [cu for mask in masks for cu in mask]
    assert sorted(flat) == list(range(cus))
    sizes = [len(mask) for mask in masks]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("parts", [2, 4, 8, 16])
def test_resource_partition_has_its_share_of_everything(parts):
    gpu = load_gpu_config("mi100")
    part = gpusim.load_system("mi100", resource_partition_overrides(gpu, parts)).gpu
    assert part.num_cus == gpu.num_cus // parts
    assert part.l2.capacity_bytes == gpu.l2.capacity_bytes / parts
    assert part.l2.bandwidth_bytes_per_s == pytest.approx(gpu.l2.bandwidth_bytes_per_s / parts)
    assert part.hbm.bandwidth_bytes_per_s == pytest.approx(gpu.hbm.bandwidth_bytes_per_s / parts)


def test_resource_partition_rejects_uneven_channels():
    with pytest.raises(ValueError, match="cannot be split into 3 equal parts"):
        resource_partition_overrides(load_gpu_config("mi100"), 3)
