"""vLLM's custom kernels (sarathi's and vidur's layers): the fused SwiGLU activation, the rotary
embedding and the RMS norm, each one workgroup per row striding over it one value at a time."""

import pytest

import gpusim
from gpusim import ops
from gpusim.errors import OpError
from gpusim.kernels.rowreduce import row_kernel, vllm_row_kernel

H100 = gpusim.load_system("h100-sxm5", {"gpu.kernel_launch_ns": 0})
TOKENS, WIDTH = 512, 11008  # Llama-2-7B's MLP width


def run(system, op):
    return gpusim.run(system, op)


def test_silu_and_mul_reads_the_gate_and_up_halves_and_writes_one():
    result = run(H100, ops.Elementwise("silu_and_mul", TOKENS * WIDTH, "fp16", rows=TOKENS))
    values = TOKENS * WIDTH * 2
    assert result.ops["bytes"].iloc[0] == 2 * values + values
    assert result.ops["flops"].iloc[0] == 6.0 * TOKENS * WIDTH
    assert result.dram.query("direction == 'read'")["bytes"].sum() >= 0.99 * 2 * values  # the wide input, from DRAM


def test_per_row_kernels_give_each_row_a_workgroup_of_its_threads():
    gate = vllm_row_kernel("silu_and_mul", WIDTH, 2)
    assert (gate.name, gate.threads, gate.vector_bytes, gate.inputs) == ("act_and_mul_kernel", 1024, 2, 2)
    assert vllm_row_kernel("silu_and_mul", 300, 2).threads == 300
    rope = vllm_row_kernel("rope", 64 * 128, 2)  # one thread per rotated pair, at most 512
    assert (rope.name, rope.threads, rope.vector_bytes) == ("rotary_embedding_kernel", 512, 4)
    assert vllm_row_kernel("rope", 2 * 80, 2).threads == 80
    with pytest.raises(ValueError, match="kind must be one of"):
        vllm_row_kernel("add", 1024, 2)


def test_each_loop_iteration_waits_for_its_loads():
    """The loop loads one value per thread and input, then computes and stores: no prefetch, so a
    row of four times the values (four iterations a thread) takes several memory latencies where
    one iteration takes one; a vectorized multiply of the same bytes does not wait so."""
    short, long = (run(H100, ops.Elementwise("silu_and_mul", 264 * cols, "fp16", rows=264)).time_s
                   for cols in (1024, 4096))
    assert long > 2 * short
    multiply = run(H100, ops.Elementwise("mul", 264 * 4096, "fp16")).time_s
    assert long > 1.5 * multiply


def test_the_same_values_in_one_row_take_one_workgroup_longer():
    """One row is one workgroup of at most 1024 threads; the same values over 512 rows fill the GPU."""
    values = 512 * 1024
    one, many = (run(H100, ops.Elementwise("silu_and_mul", values, "fp16", rows=rows)).time_s for rows in (1, 512))
    assert one > 10 * many


def test_rope_rotates_its_input_in_place():
    result = run(H100, [ops.Elementwise("add", 64 * 12288, "fp16", out="qkv"),
                        ops.Elementwise("rope", 64 * 8192, "fp16", inputs=("qkv",), out="qkv", rows=64)])
    assert result.ops["impl"].iloc[-1] == "rotary_embedding_kernel"
    with pytest.raises(OpError, match="in place"):
        ops.Elementwise("rope", 1024, inputs=("qkv",), out="other", rows=4)


@pytest.mark.parametrize("fields, message", [
    ({"kind": "silu_and_mul", "elements": 1024}, "'rows' is required"),
    ({"kind": "rope", "elements": 1000, "rows": 3}, "multiple of field 'rows'"),
    ({"kind": "add", "elements": 1024, "rows": 4}, "field 'rows' applies"),
    ({"kind": "rope", "elements": 1024, "rows": 4, "index_dims": 1}, "'index_dims'"),
    ({"kind": "silu_and_mul", "elements": 1024, "rows": 4, "inflight_bytes_per_thread": 8}, "do not apply"),
    ({"kind": "rope", "elements": 1024, "rows": 0}, "rows"),
])
def test_bad_rows_are_errors_naming_the_field(fields, message):
    with pytest.raises(OpError, match=message):
        ops.Elementwise(**fields)


def test_vllm_rms_norm_strides_one_value_per_thread_over_a_row_twice():
    spec = row_kernel("rmsnorm", 64, 4096, "fp16", H100.config.gpu, library="vllm")
    assert (spec.name, spec.threads, spec.vector_bytes, len(spec.passes)) == ("rms_norm_kernel", 1024, 2, 2)
    assert all(p.source == "memory" for p in spec.passes) and spec.passes[-1].writes
    assert row_kernel("rmsnorm", 64, 640, "fp16", H100.config.gpu, library="vllm").threads == 640


@pytest.mark.parametrize("kind", ["softmax", "rmsnorm_backward"])
def test_vllm_runs_only_the_rms_norm(kind):
    with pytest.raises(ValueError, match="library 'vllm' runs kind 'rmsnorm' only"):
        row_kernel(kind, 64, 4096, "fp16", H100.config.gpu, library="vllm")


def test_vllm_rms_norm_reads_its_rows_twice_but_from_dram_once():
    rows, cols = 4096, 4096
    result = run(H100, ops.RowReduce("rmsnorm", rows, cols, "fp16", library="vllm"))
    reads = result.dram.query("direction == 'read'")["bytes"].sum()
    assert rows * cols * 2 <= reads < 1.2 * rows * cols * 2  # the second pass finds the row in the L2


def test_rope_without_a_named_input_rotates_the_tensor_its_output_names():
    """A trace names a rotary embedding's tensor by its output alone; it is read and written in place."""
    result = run(H100, [ops.Elementwise("fill", 64 * 8192, "fp16", out="qk"),
                        ops.Elementwise("rope", 64 * 8192, "fp16", out="qk", rows=64)])
    written = 64 * 8192 * 2
    assert result.ops["bytes"].iloc[-1] == 2 * written
    assert result.dram.query("direction == 'read'")["bytes"].sum() < 0.1 * written  # the fill's output, in the L2
