"""PyTorch's element-at-a-time kernels (gpusim.ops.Elementwise.index_dims): one element per access,
offsets computed per element on the CU's integer lanes."""

import pytest

import gpusim
from gpusim import ops
from gpusim.kernels.elementwise import INSTRUCTION_MIXES, offset_instructions

H200 = gpusim.load_system("h200-sxm", {"gpu.kernel_launch_ns": 0})
HEADS = 8 * 12 * 512 * 64  # GPT-2's attention heads, transposed by a copy


def time_of(system, op):
    return gpusim.run(system, op).time_s


def test_offset_arithmetic_grows_with_the_dimensions_and_the_tensors():
    assert offset_instructions(1, 2) == 3 * 2 + 2  # an address and an access per tensor, the index and its check
    assert offset_instructions(4, 2) == 4 * (4 + 2) + 3 * 2 + 2  # a division and a multiply-add per tensor per dim
    assert offset_instructions(3, 3) > offset_instructions(3, 2) > offset_instructions(2, 2)


def test_a_strided_concatenation_divides_at_run_time_for_both_offsets():
    assert offset_instructions(4, 2, "cat") == 3 * 2 + 2 + 2 * 3 * (16 + 1)
    assert offset_instructions(4, 2, "cat") > 2 * offset_instructions(4, 2)
    assert offset_instructions(0, 2, "cat") == offset_instructions(0, 2)  # contiguous: a copy
    cat, copy = (time_of(H200, ops.Elementwise(kind, HEADS, "fp16", index_dims=4)) for kind in ("cat", "copy"))
    assert cat > 1.5 * copy


def test_element_at_a_time_copies_are_slower_the_more_dimensions_they_walk():
    vector, unrolled, two, four = (time_of(H200, ops.Elementwise("copy", HEADS, "fp16", index_dims=dims))
                                   for dims in (0, 1, 2, 4))
    assert vector < min(unrolled, two) and two < four and four > 2 * vector
    gpu = H200.config.gpu
    issue_s = HEADS * offset_instructions(4, 2) / (gpu.num_cus * gpu.cu.int32_ops_per_cycle * gpu.clock_hz)
    assert four > issue_s  # the integer lanes bound it


def test_integer_lanes_pace_only_the_strided_kernels():
    wider = H200.with_overrides({"gpu.cu.int32_ops_per_cycle": 128})
    strided = ops.Elementwise("copy", HEADS, "fp16", index_dims=4)
    vectorized = ops.Elementwise("copy", HEADS, "fp16")
    assert time_of(wider, strided) < 0.8 * time_of(H200, strided)
    assert time_of(wider, vectorized) == time_of(H200, vectorized)


def test_half_precision_elements_keep_half_the_bytes_in_flight():
    """One 2-byte element per access: a thread's four loads hold 8 bytes against a 16-byte vector,
    so on a GPU whose few CUs are bound by their loads in flight a scalar fp16 copy is slower than
    the vectorized one; four fp32 elements are 16 bytes, as fast."""
    few_cus = H200.with_overrides({"gpu.num_cus": 4, "gpu.cu.int32_ops_per_cycle": 4096})  # no arithmetic bound

    def ratio(dtype):
        scalar, vector = (time_of(few_cus, ops.Elementwise("copy", 2**20, dtype, index_dims=dims)) for dims in (1, 0))
        return scalar / vector

    assert ratio("fp16") > 1.4 and ratio("fp32") == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("dims", [-1, 26, 2.5, "two"])
def test_index_dims_out_of_range_is_an_error_naming_the_field(dims):
    with pytest.raises(gpusim.OpError, match="Elementwise: field 'index_dims' must be an integer from 0 to 25"):
        ops.Elementwise("copy", 1024, index_dims=dims)


@pytest.mark.parametrize("elements", [2**22, 2**24])
def test_workgroups_resident_together_stream_neighbouring_rows(elements):
    """Logical workgroups take their chunks round by round, as the hardware dispatches workgroups in
    order: the chunks in flight together are neighbours, so a copy opens each DRAM row once (it
    opened 2-2.6 of them per row's worth of data while each logical workgroup walked a stretch of
    its own)."""
    result = gpusim.run(H200, ops.Elementwise("copy", elements, "fp16"))
    hbm = H200.config.gpu.hbm
    row_bytes = hbm.row_bytes * hbm.lockstep_channels  # a simulated channel's row
    assert result.dram["bytes"].sum() / result.counters["gpu0.dram_activations"] > 0.9 * row_bytes


@pytest.mark.parametrize("preset", ["h100-sxm5", "a100-sxm4"])
def test_the_exact_gelu_is_bound_by_its_instructions(preset):
    """PyTorch's exact GeLU issues about 30 instructions per value (its SASS): on an H100 or an A100
    it cannot stream faster than the CUs issue them, while the tanh GeLU's FLOPs keep up with the
    memory; the A100's narrower FP32 pipe does not bind at this kernel's FMA share."""
    system = gpusim.load_system(preset, {"gpu.kernel_launch_ns": 0})
    elements = 2**25
    exact, tanh = (time_of(system, ops.Elementwise(kind, elements, "fp16")) for kind in ("gelu_erf", "gelu"))
    gpu, mix = system.config.gpu, INSTRUCTION_MIXES["gelu_erf"]
    issue_s = elements * (mix.ops + mix.transcendentals) / (
        gpu.num_cus * gpu.cu.issue_lanes_per_cycle * gpu.clock_hz * gpu.vector_efficiency)
    assert exact > issue_s
    assert exact < 1.3 * issue_s
    assert exact > 1.2 * tanh


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_dropout_mask_takes_one_byte_per_element(dtype):
    """PyTorch's ``native_dropout`` keeps a bool mask: the forward pass writes it beside its output
    and the backward pass reads it beside the gradient, one byte per element whatever the dtype."""
    system = gpusim.load_system("v100-sxm2")
    elements = 1 << 22
    size = 4 if dtype == "fp32" else 2
    forward = gpusim.run(system, ops.Elementwise("dropout", elements, dtype))
    backward = gpusim.run(system, ops.Elementwise("dropout_backward", elements, dtype))
    product = gpusim.run(system, ops.Elementwise("mul", elements, dtype))
    assert forward.ops["bytes"].iloc[0] == backward.ops["bytes"].iloc[0] == elements * (2 * size + 1)
    assert product.ops["bytes"].iloc[0] == 3 * elements * size
    assert backward.time_s < product.time_s
