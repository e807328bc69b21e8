"""Row reductions as the framework's kernels run them (gpusim.kernels.rowreduce)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.errors import OpError
from gpusim.hw.compute import WorkgroupShape, occupancy
from gpusim.kernels import rowreduce
from gpusim.kernels.rowreduce import reduction_cycles, row_kernel

H200 = gpusim.load_system("h200-sxm")
MI210 = gpusim.load_system("mi210")


def kernel(kind, rows, cols, system=H200, library="pytorch", dtype="fp16"):
    return row_kernel(kind, rows, cols, dtype, system.config.gpu, library)


def test_softmax_kernels_follow_pytorch_dispatch():
    assert kernel("softmax", 4096, 1024).name == "softmax_warp_forward"
    short = kernel("softmax", 4096, 64)
    assert short.rows_per_workgroup == 8 and short.threads == 128  # two 64-element rows per warp
    reg = kernel("softmax", 4096, 4096)
    assert reg.name == "cunn_SoftMaxForwardReg" and reg.threads == 1024 and reg.vector_bytes == 4 * 2
    assert kernel("softmax", 4096, 9216).name == "cunn_SoftMaxForwardReg"  # 9 elements per thread
    smem = kernel("softmax", 4096, 16384)
    assert smem.name == "cunn_SoftMaxForwardSmem" and [p.source for p in smem.passes] == ["memory", "lds", "lds"]
    assert kernel("softmax", 4096, 32768).name == "cunn_SoftMaxForward"  # 64 KiB: over the 48 KiB default
    assert [p.source for p in kernel("softmax", 4096, 32768).passes] == ["memory"] * 3


def test_pytorch_2_0_softmax_rereads_rows_with_half_the_vectors_per_thread():
    old = kernel("softmax", 4096, 4096, library="pytorch-2.0")
    assert old.name == "cunn_SoftMaxForward" and old.threads == 256  # 512 vectors of 16 B, halved
    assert kernel("softmax", 4096, 2048, system=MI210, library="pytorch-2.0").threads == 128
    assert kernel("softmax", 4096, 1024, library="pytorch-2.0").name == "softmax_warp_forward"


def test_norm_kernels_load_four_elements_per_thread_and_iteration():
    norm = kernel("layernorm", 4096, 4096)
    assert (norm.threads, norm.rows_per_workgroup, norm.vector_bytes) == (128, 1, 8)
    assert [p.source for p in norm.passes] == ["memory", "memory"]
    assert kernel("rmsnorm", 4096, 4098).vector_bytes == 2  # not a multiple of 4: one element at a time
    assert kernel("layernorm", 8, 4096).passes[0].transcendentals_per_element == 1  # Welford's reciprocal


def test_sum_follows_setreduceconfig():
    short = kernel("sum", 4096, 32)
    assert (short.threads, short.rows_per_workgroup, short.split) == (512, 16, 1)  # a warp per row, 4 at a time
    assert short.vector_bytes == 4 * 2
    rows_of_4096 = kernel("sum", 32, 4096)
    assert (rows_of_4096.threads, rows_of_4096.rows_per_workgroup) == (512, 16)  # 128 values per lane: a warp per row
    assert rows_of_4096.vector_bytes == 16 and kernel("sum", 512, 2048, dtype="fp32").vector_bytes == 16
    long = kernel("sum", 4096, 32768)
    assert (long.rows_per_workgroup, long.split, long.passes[0].reduction) == (1, 1, "block")  # the block shares a row
    assert kernel("sum", 16, 65536).split == 1  # 128 values per thread: no need to spread the row
    few_long = kernel("sum", 16, 262144)
    assert few_long.split == 32 and few_long.rows_per_workgroup == 1  # 512 values per thread, 16 blocks on 132 SMs


@pytest.mark.parametrize(("rows", "cols", "grid"), [(4096, 768, (6, 64)), (4096, 3072, (24, 64)),
                                                (4096, 2304, (18, 64)), (8, 512 * 768, (768, 1))])
def test_column_sums_launch_the_grids_of_the_h200_trace(rows, cols, grid):
    # GPT-2's bias gradients in validation/measured/h200/gpt2_2layers_train_step.json.gz: reduce_kernel<128, 4>,
    # blocks of 32 x 4 threads, each lane 4 columns, 64 blocks sharing the columns of 4096 rows
    spec = kernel("colsum", rows, cols)
    assert spec.columns and spec.threads == 128 and spec.registers_per_thread == 48
    assert (-(-cols // spec.rows_per_workgroup), spec.split) == grid


def test_a_column_sum_writes_one_value_per_column():
    result = gpusim.run(H200, ops.RowReduce("colsum", 4096, 768))
    assert result.ops["bytes"].iloc[0] == (4096 + 1) * 768 * 2
    with pytest.raises(OpError, match="field 'library'.*'colsum'"):
        ops.RowReduce("colsum", 8, 1024, library="inductor")


@pytest.mark.parametrize(("kind", "cols", "name"), [("softmax", 512, "softmax_warp_backward"),
                                                 ("softmax", 4096, "cunn_SoftMaxBackwardReg"),
                                                 ("layernorm", 768, "layer_norm_grad_input_kernel_vectorized")])
def test_backward_kernels_read_the_gradient_beside_the_forward_row(kind, cols, name):
    forward, backward = kernel(kind, 4096, cols), kernel(f"{kind}_backward", 4096, cols)
    assert backward.name == name and backward.inputs == 2 and forward.inputs == 1
    assert (backward.threads, backward.rows_per_workgroup, backward.vector_bytes) == \
        (forward.threads, forward.rows_per_workgroup, forward.vector_bytes)
    assert [p.reduction for p in backward.passes] == [forward.passes[0].reduction, None]
    assert backward.passes[-1].writes and backward.passes[-1].transcendentals_per_element == 0


def test_welfords_combinations_cost_the_layer_norm_issue_slots_per_row():
    """vectorized_layer_norm_kernel runs the layer norm and the RMS norm; over 16384 rows of 32 values
    the layer norm took 7.9 us longer on the H200 (20.5 against 12.6 us, reduction_grid.csv): about
    60 ns an SM per row, which every wavefront's Welford combinations (22 instructions a step against
    a sum's 2) take in the issue slots.  As a latency alone, overlapped by 16 resident blocks, they
    cost 3 us."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    layernorm = gpusim.run(system, ops.RowReduce("layernorm", 16384, 32)).time_s
    rmsnorm = gpusim.run(system, ops.RowReduce("rmsnorm", 16384, 32)).time_s
    assert 6e-6 < layernorm - rmsnorm < 11e-6


def test_a_backward_kernel_moves_a_third_more_bytes_than_its_forward():
    # an RMS norm, which is bound by the memory (a layer norm's Welford instructions nearly bind it)
    forward = gpusim.run(H200, ops.RowReduce("rmsnorm", 16384, 4096))
    backward = gpusim.run(H200, ops.RowReduce("rmsnorm_backward", 16384, 4096))
    assert backward.ops["bytes"].iloc[0] == 1.5 * forward.ops["bytes"].iloc[0]
    assert backward.time_s > 1.2 * forward.time_s  # bandwidth-bound: the second input costs its bytes


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 1 << 20), cols=st.integers(1, 1 << 22), dtype=st.sampled_from(["fp16", "bf16", "fp32"]))
def test_sum_blocks_cover_their_rows_within_pytorchs_limits(rows, cols, dtype):
    spec = kernel("sum", rows, cols, dtype=dtype)
    assert spec.threads <= 512 and spec.threads & (spec.threads - 1) == 0  # a power of two
    assert 1 <= spec.rows_per_workgroup <= rows and spec.threads % spec.rows_per_workgroup == 0
    assert spec.threads // spec.rows_per_workgroup <= cols  # no lane without a value of its row
    assert spec.split == 1 or spec.rows_per_workgroup == 1  # only blocks of one row spread it over several


def test_few_row_sums_wait_for_one_memory_latency_per_load():
    # 32 rows of 4096 half-precision values: 32 lanes per row, 128 values each, 16 dependent 16-byte loads
    few = gpusim.run(H200, ops.RowReduce("sum", 32, 4096)).time_s
    short = gpusim.run(H200, ops.RowReduce("sum", 4096, 32)).time_s  # the same bytes, one load per thread
    latency_s = H200.config.gpu.unloaded_miss_latency_ns * 1e-9
    assert short + 14 * latency_s < few < short + 18 * latency_s


def test_inductor_reductions_are_persistent_up_to_1024_columns():
    assert kernel("layernorm", 4096, 1024, library="inductor").name.startswith("triton_per")
    looped = kernel("layernorm", 4096, 4096, library="inductor")
    assert looped.name.startswith("triton_red") and [p.source for p in looped.passes] == ["memory", "memory"]


def test_block_reductions_cost_more_than_wavefront_reductions():
    gpu = H200.config.gpu
    wave = reduction_cycles("wave", 128, gpu)
    block = reduction_cycles("block", 1024, gpu)
    assert wave == 5 * gpu.cu.shuffle_cycles
    assert block == (5 + 1 + 5) * gpu.cu.shuffle_cycles + 2 * gpu.cu.barrier_cycles
    assert reduction_cycles(None, 1024, gpu) == 0.0


def test_unknown_library_is_an_error_naming_the_field():
    with pytest.raises(OpError, match="field 'library'.*pytorch, pytorch-2.0, inductor.*'cudnn'"):
        ops.RowReduce("softmax", 8, 1024, library="cudnn")


def time_of(system, op):
    return gpusim.run(system, op).time_s


def test_long_row_passes_are_latency_bound():
    """A few long rows take one loaded memory latency per loop iteration: doubling the row doubles
    the time, and the same bytes in many short rows (more workgroups at once) take far less."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    one = time_of(system, ops.RowReduce("layernorm", 16, 32768))
    two = time_of(system, ops.RowReduce("layernorm", 16, 65536))
    assert 1.8 < two / one < 2.2
    iterations = 2 * 32768 // (128 * 4)  # two passes of 128 threads x 4 elements
    assert one > iterations * H200.config.gpu.l2.hit_latency_ns * 1e-9
    assert time_of(system, ops.RowReduce("layernorm", 4096, 128)) < 0.2 * one


def test_occupancy_bounds_a_latency_bound_reduction():
    """Fewer resident workgroups per CU make a latency-bound reduction slower: a quarter of them
    leave too few loads in flight to cover the memory's latency."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    quarter = system.with_overrides({"gpu.cu.max_threads": 512})
    op = ops.RowReduce("rmsnorm", 16384, 1024)
    assert time_of(quarter, op) > 1.4 * time_of(system, op)


def test_a_grid_that_overflows_its_slots_pays_only_for_its_tail():
    """Row sums of 2048 fp32 values on the H100: 8192 rows are 512 workgroups of 16 rows, one per
    resident slot (528), bound by the HBM; 9216 rows add a tail of 48 workgroups, which run with the
    memory to themselves (latency-bound), so the time grows far less than a second full wave."""
    system = gpusim.load_system("h100-sxm5", {"gpu.kernel_launch_ns": 0})
    assert kernel("sum", 9216, 2048, system, dtype="fp32").rows_per_workgroup == 16
    full = time_of(system, ops.RowReduce("sum", 8192, 2048, "fp32"))
    overflowing = time_of(system, ops.RowReduce("sum", 9216, 2048, "fp32"))
    iterations = 16  # 16 rows x 2048 values x 4 bytes over 512 threads x 16 bytes
    tail = iterations * system.config.gpu.unloaded_miss_latency_ns * 1e-9
    assert full + 0.8 * tail < overflowing < full + 1.5 * tail


def test_barrier_latency_slows_block_softmax_but_not_warp_softmax():
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    slow = system.with_overrides({"gpu.cu.barrier_cycles": 400})
    block = ops.RowReduce("softmax", 128, 4096)  # a block per SM: nothing issues while it waits
    assert time_of(slow, block) > 1.1 * time_of(system, block)
    warp = ops.RowReduce("softmax", 4096, 512)
    assert time_of(slow, warp) == time_of(system, warp)


def test_transcendentals_on_the_vector_alu_take_its_issue_slots():
    """On CDNA the exponentials and reciprocals of a softmax are quarter-rate VALU instructions: they
    add to the other instructions' time instead of running beside them (NVIDIA's SFUs), which an
    issue-bound softmax (the register kernel, 16384 rows) shows; a layer norm, with one reciprocal
    square root per row, does not notice."""
    separate = gpusim.load_system("mi210", overrides={"gpu.kernel_launch_ns": 0,
                                                      "gpu.cu.transcendentals_on_vector_alu": False})
    shared = separate.with_overrides({"gpu.cu.transcendentals_on_vector_alu": True})
    softmax = ops.RowReduce("softmax", 16384, 4096, library="pytorch")
    assert time_of(shared, softmax) > 1.05 * time_of(separate, softmax)
    norm = ops.RowReduce("layernorm", 4096, 1024, library="inductor-2.0")
    assert time_of(shared, norm) == pytest.approx(time_of(separate, norm), rel=1e-6)


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["softmax", "layernorm", "rmsnorm", "sum"]),
       rows=st.integers(1, 3000), cols=st.integers(1, 20000))
def test_a_row_reduction_is_never_faster_than_its_bytes_allow(kind, rows, cols):
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    result = gpusim.run(system, ops.RowReduce(kind, rows, cols))
    nbytes = rows * cols * 2
    out = rows * 2 if kind == "sum" else nbytes
    peak = system.config.gpu.hbm.bandwidth_bytes_per_s
    assert result.time_s >= (nbytes + out) / max(peak, system.config.gpu.l2.bandwidth_bytes_per_s)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm", "sum"])
def test_a_row_reduction_reads_every_input_byte_from_dram(kind):
    result = gpusim.run(H200, ops.RowReduce(kind, 4096, 4096))
    assert result.dram_totals().query("direction == 'read'")["bytes"].sum() >= 4096 * 4096 * 2


def test_softmax_rows_of_2048_run_the_warp_kernel_after_pytorch_2_0():
    """PyTorch's warp softmax takes rows of up to 2048 values of at most 4 bytes in the releases the
    H200 ran (``softmax_warp_forward<..., 11>``), of up to 1024 in 2.0."""
    gpu = H200.config.gpu
    assert row_kernel("softmax", 4096, 2048, "fp16", gpu).name == "softmax_warp_forward"
    assert row_kernel("softmax", 4096, 2048, "fp32", gpu).name == "softmax_warp_forward"
    assert row_kernel("softmax", 4096, 2048, "fp16", gpu, "pytorch-2.0").name == "cunn_SoftMaxForward"
    assert row_kernel("softmax", 4096, 4096, "fp16", gpu).name == "cunn_SoftMaxForwardReg"


@pytest.mark.parametrize(("cols", "registers", "blocks"), [(1024, 48, 10), (2048, 80, 6), (4096, 30, 2), (8192, 37, 1)])
def test_softmax_registers_and_occupancy_are_the_h200s(cols, registers, blocks):
    """Registers per thread as Nsight Compute reports them on the H200 (reduction_counters.csv.gz),
    and the blocks per SM they leave room for."""
    spec = row_kernel("softmax", 4096, cols, "fp16", H200.config.gpu)
    assert spec.registers_per_thread == registers
    assert occupancy(WorkgroupShape(spec.threads, 0, spec.registers_per_thread), H200.config.gpu.cu) == blocks


def test_a_wavefront_waiting_on_its_last_instruction_leaves_the_issue_to_others():
    """A warp issues one instruction every ``cu.dependent_issue_cycles``: the warp softmax, six warps
    per scheduler, slows when that interval grows; the instruction counts issue at the CU's issue
    rate, which the element-wise FLOP efficiency does not scale."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    softmax = ops.RowReduce("softmax", 4096, 2048)
    eager = system.with_overrides({"gpu.cu.dependent_issue_cycles": 1})
    assert time_of(system, softmax) > 1.2 * time_of(eager, softmax)
    assert time_of(system.with_overrides({"gpu.vector_efficiency": 0.3}), softmax) == time_of(system, softmax)


def test_the_fp32_pipe_bounds_issue_where_it_is_narrower_than_the_schedulers():
    """The A100's schedulers issue 128 lanes a cycle but its FP32 (FMA) pipe has 64: PyTorch 2.0's
    global-memory softmax, 60% of whose instructions run there, issues at 64 / 0.6 lanes a cycle,
    and a twice-as-wide pipe would speed it; the warp softmax (40%) and the register softmax (43%)
    are bound by the issue, not the pipe."""
    a100 = gpusim.load_system("a100-sxm4", overrides={"gpu.kernel_launch_ns": 0})
    wide = a100.with_overrides({"gpu.cu.vector_flops_per_cycle.fp32": 256})
    bound = ops.RowReduce("softmax", 16384, 4096, library="pytorch-2.0")
    assert time_of(wide, bound) < 0.97 * time_of(a100, bound)
    for free in (ops.RowReduce("softmax", 16384, 1024), ops.RowReduce("softmax", 16384, 4096)):
        assert time_of(wide, free) == time_of(a100, free)



def test_a_short_row_waits_for_the_memorys_latency_not_its_bandwidth():
    """A norm's block of 128 threads over rows of 32 values gives 8 threads a vector: a loop
    iteration of all resident blocks moves the rows' bytes, not 128 vectors each, so half the
    HBM's bandwidth at the same latency hardly slows 16384 such rows (it did by 22% when every
    thread was charged a vector)."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    narrow = system.with_overrides({"gpu.hbm.stacks": 3})
    short = ops.RowReduce("rmsnorm", 16384, 32)
    assert time_of(narrow, short) < 1.1 * time_of(system, short)


def test_a_norm_finishes_each_row_after_its_reduction(monkeypatch):
    """Each warp of PyTorch's norm kernel turns the block's sums into the row's statistic
    (``NORM_FINISH_OPS`` instructions): many short rows make them visible; the softmax has none."""
    system = H200.with_overrides({"gpu.kernel_launch_ns": 0})
    norm, softmax = ops.RowReduce("rmsnorm", 16384, 64), ops.RowReduce("softmax", 4096, 4096)
    with_finish = time_of(system, norm), time_of(system, softmax)
    monkeypatch.setattr(rowreduce, "NORM_FINISH_OPS", 0.0)
    assert time_of(system, norm) < 0.9 * with_finish[0]
    assert time_of(system, softmax) == with_finish[1]


def test_a_narrow_rows_warp_reduces_over_its_own_lanes():
    """PyTorch's warp softmax gives a row of n <= 16 elements n lanes (the next power of two), and
    reduces it in log2(n) shuffles, the warp's rows side by side: a row of one element needs none."""
    gpu = H200.config.gpu
    for cols, lanes in ((1, 1), (8, 8), (64, 32)):
        spec = kernel("softmax", 4096, cols)
        assert spec.name == "softmax_warp_forward" and (spec.reduction_lanes or 32) == lanes
        assert reduction_cycles("wave", spec.threads, gpu, lanes=spec.reduction_lanes) == \
            pytest.approx(math.log2(lanes) * gpu.cu.shuffle_cycles)
    assert rowreduce.reduction_ops("wave", 128, 256, gpu, 2.0, lanes=1) == 0.0
    assert rowreduce.reduction_ops("wave", 128, 8, gpu, 2.0, lanes=32) == 8 * 5 * 2.0 * 32  # a wave per row


@pytest.mark.parametrize("rows", [1, 8])
def test_a_softmax_is_never_faster_on_wider_rows(rows):
    """More columns is more work: a one-element row used to take 4x a 32-element one, its 256
    nominal rows each reduced across a whole warp."""
    times = [gpusim.run(H200, ops.RowReduce("softmax", rows, cols)).kernels["duration_s"].iloc[0]
             for cols in (1, 2, 4, 8, 16, 32, 64, 256, 1024)]
    assert times == sorted(times)
