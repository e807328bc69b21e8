"""GEMMs with one output row or column: the BLAS's matrix-vector kernels (``gpusim.kernels.gemv``).

cuBLAS on Volta, Turing and Ampere runs them as GEMV kernels that stream the matrix; PyTorch's
cuBLASLt on Hopper runs them as 8-row tiles (measured on the H200), which the model keeps.
"""

import pytest

import gpusim
from gpusim import ops
from gpusim.config import load_gpu_config
from gpusim.kernels.gemm import GemmProblem
from gpusim.kernels.gemv import gemv_orientation, runs_as_gemv

A100 = gpusim.load_system("a100-sxm4")


def _impl(system, op) -> str:
    return str(gpusim.run(system, op).ops.iloc[0]["impl"])


@pytest.mark.parametrize("m, n, trans_a, trans_b, orientation", [
    (1, 4096, False, True, "t"),   # x W^T: dot products along the weights' rows
    (1, 4096, False, False, "n"),  # q K^T with K^T stored: sums across rows of keys
    (4096, 1, False, False, "t"),  # W x
    (4096, 1, True, False, "n"),
])
def test_one_row_or_column_products_run_as_gemv_kernels_on_ampere(m, n, trans_a, trans_b, orientation):
    problem = GemmProblem(m, n, 2048, "fp16", trans_a, trans_b)
    assert gemv_orientation(problem) == orientation
    op = ops.Gemm(m, n, 2048, dtype="fp16", trans_a=trans_a, trans_b=trans_b)
    assert _impl(A100, op) == f"gemv_{orientation}"


def test_other_shapes_and_hopper_keep_tile_kernels():
    assert not runs_as_gemv(GemmProblem(2, 4096, 4096, "fp16", False, True), load_gpu_config("a100-sxm4"))
    # PyTorch's cuBLASLt runs x W^T with one row as nvjet 8-row tiles on the H200 (gemm_kernels.csv)
    assert not runs_as_gemv(GemmProblem(1, 4096, 4096, "fp16", False, True), load_gpu_config("h200-sxm"))
    assert _impl(gpusim.load_system("h200-sxm"), ops.Gemm(1, 4096, 4096, dtype="fp16", trans_b=True)).startswith("MT")


def test_a_named_kernel_is_run_as_named():
    op = ops.Gemm(1, 4096, 4096, dtype="fp16", trans_b=True, kernel="MT16x64x64_T64")
    assert _impl(A100, op).startswith("MT16x64x64_T64")


def test_a_gemv_streams_its_matrix_once_at_memory_speed_whatever_the_row_alignment():
    """LLMCompass's decoding step multiplies each query by its 3073 cached keys (odd rows of 6146
    bytes): the GEMV reads the keys once, at most of the HBM's sustained bandwidth, where 16-row
    tiles with 2-byte fallback accesses were bound by the CU's accesses (1.2 TB/s)."""
    op = ops.Gemm(1, 3073, 128, dtype="fp16", batch=192)
    result = gpusim.run(A100, op)
    keys = 192 * 128 * 3073 * 2
    assert keys <= result.counters["gpu0.l2_bytes_read"] <= 1.02 * keys
    assert float(result.dram_totals().query("direction == 'read'")["bytes"].sum()) > 0.99 * keys
    gpu = A100.gpu
    kernel_s = result.ops.iloc[0].duration_s - gpu.kernel_launch_ns * 1e-9
    assert keys / kernel_s <= gpu.hbm.bandwidth_bytes_per_s
    assert keys / kernel_s > 0.85 * gpu.hbm.sustained_bandwidth_bytes_per_s
