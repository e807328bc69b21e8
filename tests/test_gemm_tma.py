"""Hopper's TMA GEMM kernels: clusters that multicast a shared panel, loads bounded by the kernel's
stages rather than the CU's load slots, and stages that fill the shared memory."""

from __future__ import annotations

import pytest

import gpusim
from gpusim import ops
from gpusim.hw.compute import occupancy
from gpusim.kernels.gemm import (
    GemmProblem,
    Multicast,
    choose_kernel,
    find_spec,
    l2_read_bytes,
    multicast,
    num_workgroups,
    pipelined,
    workgroup_shape,
)

H200 = gpusim.load_system("h200-sxm")


def l2_and_dram_reads(system, gemm):
    result = gpusim.run(system, gemm)
    dram = result.dram_totals().query("direction == 'read'")["bytes"].sum()
    return result.counters["gpu0.l2_bytes_read"], dram


def test_a_cluster_reads_its_shared_panel_from_the_l2_once():
    # 512 x 512 x 1024 in 256 x 128 tiles: 2 x 4 tiles; clusters of two along N share A's 256-row panels
    gemm = ops.Gemm(512, 512, 1024, kernel="MT256x128x64_T256")
    unclustered = H200.with_overrides({"gpu.gemm_tma.cluster_size": 1})
    a_panels, b_panels = 2 * 4 * 256 * 1024 * 2, 2 * 4 * 128 * 1024 * 2
    assert l2_and_dram_reads(unclustered, gemm) == (a_panels + b_panels, 512 * 1024 * 2 * 2)
    # each workgroup requests half of the A panel it shares: the L2 serves A once per cluster, DRAM is unchanged
    assert l2_and_dram_reads(H200, gemm) == (a_panels / 2 + b_panels, 512 * 1024 * 2 * 2)
    problem, spec = GemmProblem(512, 512, 1024), find_spec("MT256x128x64_T256")
    assert l2_read_bytes(problem, spec, H200.gpu) == a_panels / 2 + b_panels


def test_clusters_share_the_larger_panel_where_there_are_two_tiles_to_share_it():
    gpu = H200.gpu
    problem = GemmProblem(1024, 1024, 1024)
    assert multicast(problem, find_spec("MT128x256x64_T256"), gpu) == Multicast("b", 2)  # along M, B's 256 columns
    assert multicast(problem, find_spec("MT256x128x64_T256"), gpu) == Multicast("a", 2)  # along N, A's 256 rows
    assert multicast(GemmProblem(2048, 1024, 64), find_spec("MT128x128x64_T256"), gpu).operand == "b"  # more rows
    assert multicast(GemmProblem(128, 4096, 64), find_spec("MT128x256x64_T256"), gpu).operand == "a"  # one row
    assert multicast(GemmProblem(128, 128, 4096), find_spec("MT128x128x64_T256"), gpu) == Multicast()
    assert multicast(problem, find_spec("MT256x128x32_T256_V2"), gpu) == Multicast()  # fallback kernels: no TMA
    assert multicast(problem, find_spec("MT128x256x32_T256"), gpusim.load_system("a100-sxm4").gpu) == Multicast()


def test_the_last_cluster_of_an_odd_tile_count_has_one_member():
    clusters = Multicast("b", 2)
    assert [clusters.members(row, 0, tiles_m=3, tiles_n=1) for row in range(3)] == [2, 2, 1]
    assert Multicast().members(0, 0, 3, 1) == 1
    # 3 x 1 tiles of 128 x 128 sharing B: the pair reads B once, the third tile on its own
    problem, spec = GemmProblem(384, 128, 256), find_spec("MT128x128x64_T256")
    assert l2_read_bytes(problem, spec, H200.gpu) == (3 * 128 + 2 * 128) * 256 * 2


def test_tma_loads_are_bounded_by_the_kernels_stages_not_by_the_cus_load_slots():
    """A 2048^3 GEMM, one wave of 128 tiles: with TMA the CU's per-thread in-flight limit does not
    matter; with per-thread loads (no TMA) a small limit starves every workgroup."""
    def kernel_us(overrides):
        result = gpusim.run(H200.with_overrides(overrides), ops.Gemm(2048, 2048, 2048, kernel="MT256x128x64_T256"))
        return result.kernels["duration_s"].sum() * 1e6

    few_slots = {"gpu.cu.max_inflight_bytes": 4096}
    assert kernel_us(few_slots) == kernel_us({})
    assert kernel_us({"gpu.gemm_tma": None, **few_slots}) > 3 * kernel_us({"gpu.gemm_tma": None})


@pytest.mark.parametrize("tile, stages", [("MT256x128x64_T256", 4), ("MT128x128x64_T256", 7), ("MT128x64x64_T256", 8)])
def test_hopper_kernels_fill_the_shared_memory_with_stages(tile, stages):
    """cuBLAS's sm90 kernels in the H200 trace: 256x128_64x4, 192x128_64x5, 64x128_64x8, 128x64_64x8:
    as many 64-deep stages as fit, at most 8, so one workgroup per SM."""
    spec = pipelined(find_spec(tile), H200.gpu, "fp16")
    assert spec.lds_buffers == stages
    assert occupancy(spec.shape("fp16"), H200.gpu.cu) == 1


@pytest.mark.parametrize("m, n, k, workgroups", [
    (1024, 1024, 1024, 128),  # cuBLAS: 128 CTAs of 128 x 64 (nvjet 128x64_64x8_1x2), not 64 of 128 x 128
    (128, 12288, 4096, 128),  # cuBLAS: 128 CTAs of 64 x 192 (nvjet 192x64_64x6_1x2), not 96 of 128 x 128
    (8192, 8192, 8192, 1664),  # cuBLAS: 128 x 320 (nvjet 320x128_64x3_1x2)
])
def test_the_heuristic_fills_the_sms_as_cublas_does(m, n, k, workgroups):
    """concurrency_graph_kernels.csv's kernel names give cuBLAS's tiles on the H200; a grid that leaves
    SMs idle leaves their share of the L2's bandwidth unused (stop 22)."""
    problem = GemmProblem(m, n, k)
    assert num_workgroups(problem, choose_kernel(problem, H200.gpu)) == workgroups


def test_a_split_k_gemm_spreads_over_the_gpu_instead_of_half_of_it():
    problem = GemmProblem(256, 256, 16384)
    assert num_workgroups(problem, choose_kernel(problem, H200.gpu)) >= H200.gpu.num_cus * 0.9


def test_the_heuristic_does_not_pad_a_skinny_output_with_a_wide_tile():
    """Among near-equal estimates the tile that covers the most of the output wins: 16 columns do not get the
    320-wide tile although it is the largest."""
    spec = choose_kernel(GemmProblem(1024, 16, 500000, trans_b=True), H200.gpu)
    assert spec.tile_n <= 128


@pytest.mark.parametrize("kernel", ["MT256x128x64_T256", "MT128x320x64_T256", "MT128x64x64_T256", "MT64x64x64_T128"])
def test_a_warp_specialized_workgroup_holds_the_whole_register_file(kernel):
    """cuBLAS's nvjet kernels run 384 threads at 168 registers, one CTA per SM, whatever their tile (the
    profiler's fields in validation/measured/h200/gpt2_2layers_train_step.json.gz): the consumers and a
    producer warpgroup, each thread with the most registers that fit."""
    spec = find_spec(kernel)
    shape = workgroup_shape(spec, "fp16", H200.gpu)
    assert shape.threads == spec.threads + 128
    assert shape.registers_per_thread == 65536 // shape.threads // 8 * 8
    assert shape.register_bytes() <= H200.gpu.cu.register_file_bytes
    assert occupancy(shape, H200.gpu.cu) == 1
    if kernel in ("MT256x128x64_T256", "MT128x320x64_T256"):  # 168 and 200 registers for the consumers
        assert (shape.threads, shape.registers_per_thread) == (384, 168)
    # a tile whose consumers need more than setmaxnreg can give them (240 each) fits no CU
    assert occupancy(workgroup_shape(find_spec("MT256x256x64_T256"), "fp16", H200.gpu), H200.gpu.cu) == 0
    # a GPU without TMA keeps the kernel's own registers, and a fallback kernel on the H200 too
    a100 = gpusim.load_system("a100-sxm4").gpu
    assert workgroup_shape(spec, "fp16", a100) == spec.shape("fp16")
    fallback = find_spec(kernel + "_V2")
    assert workgroup_shape(fallback, "fp16", H200.gpu) == fallback.shape("fp16")


def test_the_heuristic_splits_k_where_the_reduction_kernel_pays_for_itself():
    """A split's reduction is a second kernel: the gap after the GEMM, the GPU's cost of a kernel and a
    round trip to memory (1.39 us on the H200). cuBLAS runs 1760 x 16 x 1760 unsplit (64 x 8 tiles on 56
    CTAs) and splits 256 x 256 x 16384 six ways (validation/measured/h200/gemm_kernels.csv); so does the
    heuristic (it split the first in two when a split cost only the gap)."""
    from gpusim.kernels.gemm import split_k_fixed_ns

    gpu = H200.gpu
    assert split_k_fixed_ns(gpu) == pytest.approx(gpu.dependent_launch_ns + gpu.kernel_device_ns
                                                  + gpu.unloaded_miss_latency_ns)
    assert choose_kernel(GemmProblem(1760, 16, 1760, "fp16", True, True), gpu).split_k == 1
    assert choose_kernel(GemmProblem(256, 256, 16384), gpu).split_k > 1
