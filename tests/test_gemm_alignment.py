"""GEMMs whose operand rows are not 16-byte aligned: cuBLAS's fallback kernels (``_V<bytes>``).

On a GPU with a fallback family (Hopper, and the A100 by assumption) such a GEMM can only run in
register-staged kernels with narrow accesses; elsewhere (the V100, measured) the library's own
kernels take it.
"""

import pandas as pd
import pytest

import gpusim
from gpusim import ops, validation
from gpusim.config import load_gpu_config
from gpusim.errors import ConfigError
from gpusim.hw.compute import occupancy
from gpusim.kernels.gemm import (
    ALIGNED_ROW_BYTES,
    GemmKernelSpec,
    GemmProblem,
    candidates,
    choose_kernel,
    estimate_ns,
    find_spec,
    for_operands,
    library_for,
    pipelined,
)
from gpusim.kernels.gemm_tuning import parse_kernel, tuning_candidates

HOPPER = load_gpu_config("h200-sxm")
VOLTA = load_gpu_config("v100-sxm2")
H200 = gpusim.load_system("h200-sxm")


def duration(system, op) -> float:
    return gpusim.run(system, op).ops.iloc[0].duration_s


@pytest.mark.parametrize("shape, alignment", [
    ((64, 64, 64, "fp16", False, False), 16),
    ((64, 64, 63, "fp16", False, False), 2),  # A's rows: k = 63 halves
    ((64, 64, 63, "fp16", True, False), 16),  # A stored [k, m], B [k, n]: no row is k long
    ((64, 62, 64, "fp16", False, True), 4),  # C's rows: n = 62 halves, 124 bytes
    ((64, 7133, 64, "fp16", False, True), 2),  # only C's rows
    ((36, 64, 64, "fp16", True, False), 8),  # A stored [k, m]: rows of m = 36 halves
    ((64, 64, 66, "fp32", False, False), 8),
    ((64, 64, 65, "fp32", True, True), 4),  # B stored [n, k]: rows of 65 floats
])
def test_row_alignment_is_that_of_the_least_aligned_operand_row(shape, alignment):
    assert GemmProblem(*shape).row_alignment == alignment


def test_row_alignment_agrees_with_the_validation_filter():
    rows = pd.read_csv(validation.MEASURED_DIR / "h200" / "gemm.csv")
    ours = [GemmProblem(r.m, r.n, r.k, r.dtype, bool(r.trans_a), bool(r.trans_b)).row_alignment == ALIGNED_ROW_BYTES
            for r in rows.itertuples()]
    assert ours == validation.aligned_rows(rows).tolist()
    assert sum(not aligned for aligned in ours) == 32


@pytest.mark.parametrize("n", [7133, 7134, 7136, 7140, 7144])
def test_hopper_picks_a_fallback_kernel_exactly_when_a_row_is_misaligned(n):
    problem = GemmProblem(1760, n, 1760, trans_a=True)
    spec = choose_kernel(problem, HOPPER)
    assert spec.fallback == (problem.row_alignment < ALIGNED_ROW_BYTES)
    assert spec.vector_bytes == problem.row_alignment
    assert not choose_kernel(problem, VOLTA).fallback  # the V100 runs them in its library's kernels


def test_fallback_family_is_the_library_tiles_with_narrow_register_staged_loads():
    family = library_for(HOPPER, "fp16", 2)
    assert {spec.vector_bytes for spec in family} == {2}
    assert {spec.tile_k for spec in family} == {32, 64}  # the library's own depths, not TMA's 128-byte rows
    assert library_for(VOLTA, "fp16", 2) == library_for(VOLTA, "fp16")
    spec = find_spec("MT256x128x32_T256_V2")
    assert pipelined(spec, HOPPER, "fp16") == spec  # no asynchronous copies: two LDS stages, 48 KiB
    assert spec.shape("fp16").lds_bytes == 48 * 1024
    # 128 accumulators + 48 staged 2-byte loads + 40: 216 registers (the trace's align1 kernels: 226-236), one per SM
    assert spec.shape("fp16").registers_per_thread == 216
    assert occupancy(spec.shape("fp16"), HOPPER.cu) == 1
    assert spec.shape("fp16").registers_per_thread > find_spec("MT256x128x32_T256").shape("fp16").registers_per_thread


def test_fallback_kernels_split_k_only_when_k_is_deeper_than_the_output():
    names = {spec.name for spec in candidates(GemmProblem(35, 8457, 4096, trans_b=True), library_for(HOPPER, "fp16", 2))}
    assert not any("_SK" in name for name in names)
    deep = candidates(GemmProblem(4096, 768, 50257), library_for(HOPPER, "fp16", 2))
    assert any(spec.split_k > 1 for spec in deep)
    assert any(spec.split_k > 1 for spec in candidates(GemmProblem(35, 8448, 4096, trans_b=True), library_for(HOPPER, "fp16")))


@pytest.mark.parametrize("m, n, k", [(1760, 7133, 1760), (512, 2398, 1530), (35, 8457, 1024), (1024, 700, 512)])
def test_an_unaligned_gemm_is_never_faster_than_its_larger_aligned_neighbour(m, n, k):
    def padded(size: int) -> int:
        return -(-size // 8) * 8

    unaligned = duration(H200, ops.Gemm(m, n, k, trans_a=True))
    aligned = duration(H200, ops.Gemm(padded(m), padded(n), padded(k), trans_a=True))
    assert unaligned > aligned


def test_narrower_accesses_are_slower_and_the_fallback_is_slower_than_the_library():
    times = {name: duration(H200, ops.Gemm(1024, 2048, 1024, kernel=name))
             for name in ("MT128x128x32_T256", "MT128x128x32_T256_V8", "MT128x128x32_T256_V4", "MT128x128x32_T256_V2")}
    assert list(times.values()) == sorted(times.values())
    problem = GemmProblem(1024, 2048, 1024)
    assert estimate_ns(problem, find_spec("MT128x128x32_T256_V2"), HOPPER) > estimate_ns(
        problem, find_spec("MT128x128x32_T256"), HOPPER)


def test_without_a_fallback_family_unaligned_rows_cost_nothing():
    volta = gpusim.load_system("v100-sxm2")
    assert volta.gpu.gemm_fallback is None
    row = gpusim.run(volta, ops.Gemm(1760, 7133, 1760, trans_a=True)).ops.iloc[0]
    assert not row.impl.endswith(("_V2", "_V4", "_V8"))
    # the same tile forced on H200's hardware without its fallback family runs at the library's rate
    plain = H200.with_overrides({"gpu.gemm_fallback": None})
    assert duration(plain, ops.Gemm(1760, 7133, 1760, trans_a=True)) < duration(H200, ops.Gemm(1760, 7133, 1760, trans_a=True)) / 3


def test_t3_study_shapes_keep_the_library_kernels_on_the_dissertation_gpu():
    t3 = load_gpu_config("t3-table8.1")
    problem = GemmProblem(532 * 3, 4096, 4256, trans_a=True)  # T-NLG's QKV projection sliced 8 ways
    assert problem.row_alignment == 8
    assert not choose_kernel(problem, t3).fallback


def test_a_named_kernel_runs_as_its_fallback_variant_on_unaligned_rows():
    row = gpusim.run(H200, ops.Gemm(1024, 700, 512, kernel="MT128x128x64_T256")).ops.iloc[0]
    assert row.impl == "MT128x128x64_T256_V8"  # C's rows: 700 halves = 1400 bytes
    assert for_operands(find_spec("MT64x64x32_T256_V2"), GemmProblem(64, 64, 64), HOPPER).vector_bytes == 2
    assert gpusim.run(H200, ops.Gemm(1024, 1024, 512, kernel="MT128x128x64_T256")).ops.iloc[0].impl.startswith(
        "MT128x128x64_T256_LB")


def test_tuning_candidates_of_an_unaligned_gemm_are_fallback_kernels():
    options = tuning_candidates(GemmProblem(1024, 700, 512), HOPPER)
    assert options and all(spec.vector_bytes == 8 for spec in options)
    assert all(not spec.fallback for spec in tuning_candidates(GemmProblem(1024, 700, 512), VOLTA))


def test_kernel_names_carry_the_access_width():
    spec = GemmKernelSpec(128, 64, 32, 256, split_k=4, vector_bytes=4)
    assert spec.name == "MT128x64x32_T256_V4_SK4"
    assert find_spec(spec.name) == spec
    assert parse_kernel(spec.name) == spec
    assert parse_kernel("MT128x64x32_T256_LB1_V2").vector_bytes == 2


def test_a_bad_access_width_is_an_error_naming_the_field():
    with pytest.raises(gpusim.OpError, match="Gemm: field 'kernel': unknown GEMM kernel 'MT128x128x32_T256_V3'.*_V1/_V2/_V4/_V8"):
        ops.Gemm(256, 256, 256, kernel="MT128x128x32_T256_V3")
    with pytest.raises(ValueError, match="access width _V<bytes> is one of 1, 2, 4, 8, not 16"):
        parse_kernel("MT128x64x32_T256_V16")


@pytest.mark.parametrize("override, message", [
    ({"gpu.gemm_fallback.mma_fraction": 1.5}, r"gpu\.gemm_fallback\.mma_fraction.*less than or equal to 1"),
    ({"gpu.gemm_fallback.access_cycles": -0.1}, r"gpu\.gemm_fallback\.access_cycles.*greater than or equal to 0"),
    ({"gpu.gemm_fallback.acces_cycles": 0.1}, r"acces_cycles"),
])
def test_bad_fallback_parameters_are_errors_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        gpusim.load_system("h200-sxm", override)


def test_every_preset_states_its_fallback_family():
    from gpusim.config.loader import hwconfig_dirs

    for path in sorted((hwconfig_dirs()[-1] / "gpus").glob("*.yaml")):
        text = path.read_text()
        assert "gemm_fallback:" in text or "base:" in text, path.name
