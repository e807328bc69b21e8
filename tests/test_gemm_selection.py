"""How a GEMM's kernel is selected when its op names none: the library heuristic or tuning by simulation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.errors import ConfigError
from gpusim.kernels.gemm import choose_kernel, estimate_ns, problem_of
from gpusim.kernels.gemm_selection import TUNED_CANDIDATES, benchmarked_kernels, isolated_time_s, select_kernel

V100 = gpusim.load_system("v100-sxm2")


def lone_gemm(system, op, **run_options):
    """The kernel and duration (s) of ``op`` run alone on ``system``."""
    row = gpusim.run(system, op, **run_options).ops.iloc[0]
    return row["impl"], row["duration_s"]


def test_the_presets_pick_by_the_heuristic():
    op = ops.Gemm(1024, 1024, 1024)
    assert V100.gpu.gemm_selection == "heuristic"
    assert lone_gemm(V100, op)[0] == choose_kernel(problem_of(op), V100.gpu).name


def test_tuning_undoes_the_heuristics_slower_pick_on_what_if_hardware():
    """On t3-ring8 with twice the CUs and a 2 GHz HBM the heuristic picks a 4-way split 256 x 128
    tile for 1024^3 that simulates slower than the stock GPU's GEMM; a tuned library does not."""
    wide = {"gpu.num_cus": 160, "gpu.hbm.clock_hz": "2 GHz"}
    op = ops.Gemm(1024, 1024, 1024)
    stock_kernel, stock = lone_gemm(gpusim.load_system("t3-ring8"), op, mode="symmetric")
    picked_kernel, picked = lone_gemm(gpusim.load_system("t3-ring8", wide), op, mode="symmetric")
    tuned_kernel, tuned = lone_gemm(gpusim.load_system("t3-ring8", {**wide, "gpu.gemm_selection": "tuned"}), op,
                                    mode="symmetric")
    assert picked > stock  # the heuristic's inversion that tuning is for
    assert tuned_kernel != picked_kernel
    assert tuned < stock


@settings(max_examples=6, deadline=None)
@given(m=st.sampled_from([64, 256, 1024, 3072]), n=st.sampled_from([128, 512, 2048]),
       k=st.sampled_from([256, 1024, 4096]))
def test_a_tuned_gemm_is_never_slower_than_the_heuristics_pick(m, n, k):
    """The heuristic's pick is among the kernels tuning benchmarks, and a lone GEMM runs as its
    benchmark did."""
    op = ops.Gemm(m, n, k)
    tuned = V100.with_overrides({"gpu.gemm_selection": "tuned"})
    heuristic_kernel, heuristic = lone_gemm(V100, op)
    tuned_kernel, tuned_s = lone_gemm(tuned, op)
    assert tuned_s <= heuristic * (1 + 1e-9)
    kernels = [spec.name for spec in benchmarked_kernels(problem_of(op), tuned.gpu)]
    assert kernels[0] == heuristic_kernel and tuned_kernel in kernels


def test_the_benchmarked_kernels_are_distinct_trade_offs():
    problem = problem_of(ops.Gemm(2048, 2048, 2048))
    gpu = V100.gpu
    kernels = benchmarked_kernels(problem, gpu)
    assert len(kernels) == TUNED_CANDIDATES + 1
    keys = {(estimate_ns(problem, spec, gpu), spec.tile_m * spec.tile_n, spec.split_k) for spec in kernels}
    assert len(keys) == len(kernels)


def test_tuning_on_part_of_the_gpu_benchmarks_on_those_cus():
    problem = problem_of(ops.Gemm(2048, 2048, 2048))
    gpu = V100.gpu.model_copy(update={"gemm_selection": "tuned"})
    spec = select_kernel(problem, gpu, cus=20)
    assert isolated_time_s(problem, spec, gpu, 20) > 2 * isolated_time_s(problem, spec, gpu, gpu.num_cus)


def test_a_fused_gemm_takes_the_tuned_kernel_of_its_gemm():
    system = gpusim.load_system("t3-ring8", {"gpu.gemm_selection": "tuned"})
    op = ops.GemmReduceScatter(1024, 2048, 1024)
    fused = gpusim.run(system, op, mode="symmetric").ops
    problem = problem_of(op)
    assert fused["impl"].iloc[0].endswith("_" + select_kernel(problem, system.gpu).name)
    assert not fused["impl"].iloc[0].endswith("_" + choose_kernel(problem, system.gpu).name)  # 256 x 128


def test_an_unknown_selection_is_refused_with_its_field():
    with pytest.raises(ConfigError, match="gemm_selection"):
        gpusim.load_system("v100-sxm2", {"gpu.gemm_selection": "fastest"})
