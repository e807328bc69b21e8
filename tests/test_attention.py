"""Fused attention (``gpusim.kernels.attention``): FlashAttention-2's forward, split-KV and backward kernels."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.cli import parse_op
from gpusim.errors import OpError
from gpusim.kernels.attention import (
    AttentionProblem,
    AttentionTiling,
    choose_splits,
    forward_plan,
    problem_of,
    shared_memory_bytes,
)

A100 = gpusim.load_system("a100-sxm4")
H100 = gpusim.load_system("h100-sxm5")


def _kernel_s(result) -> float:
    """From the first kernel's start to the last one's end, s."""
    kernels = result.kernels
    return float(kernels["end_s"].max() - kernels["start_s"].min())


@pytest.mark.parametrize("fields, message", [
    ({"dtype": "fp32"}, "'dtype' must be one of fp16, bf16"),
    ({"head_dim": 320}, "'head_dim' must be a multiple of 8 up to 256 (FlashAttention-2's kernels), got 320"),
    ({"head_dim": 3}, "'head_dim' must be a multiple of 8 up to 256 (FlashAttention-2's kernels), got 3"),
    ({"kv_heads": 3}, "'kv_heads' must divide heads (8)"),
    ({"direction": "sideways"}, "'direction' must be one of forward, backward"),
    ({"q_len": 0}, "'q_len' must be a positive integer"),
])
def test_bad_fields_are_named(fields, message):
    with pytest.raises(OpError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ops.Attention(**{"batch": 1, "heads": 8, "q_len": 16, "kv_len": 16, "head_dim": 64, **fields})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300))
def test_the_causal_score_count_is_the_sum_over_rows_of_their_keys(q_len, kv_len):
    problem = AttentionProblem(2, 3, 3, q_len, kv_len, 64, "fp16", causal=True)
    assert problem.scores == 2 * 3 * sum(problem.keys_of(row) for row in range(q_len))
    assert problem.keys_of(q_len - 1) == kv_len  # the last query sees every key


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 4), st.sampled_from([(8, 8), (8, 2), (4, 1)]), st.integers(1, 700), st.integers(1, 700),
       st.sampled_from([32, 64, 80, 128, 256]), st.booleans(), st.sampled_from(["forward", "backward"]))
def test_attention_is_never_faster_than_its_rooflines(batch, heads, q_len, kv_len, head_dim, causal, direction):
    op = ops.Attention(batch, heads[0], q_len, kv_len, head_dim, kv_heads=heads[1], causal=causal, direction=direction)
    result = gpusim.run(H100, op)
    gpu = H100.gpu
    elapsed = _kernel_s(result)
    assert elapsed > 0
    assert _attention_flops(batch, heads[0], q_len, kv_len, head_dim, causal, direction) / elapsed <= \
        gpu.matrix_flops_per_s("fp16")
    assert result.ops.iloc[0]["bytes"] / elapsed <= gpu.hbm.bandwidth_bytes_per_s + gpu.l2.bandwidth_bytes_per_s


def _attention_flops(batch, heads, q_len, kv_len, head_dim, causal, direction) -> float:
    """FLOPs counted apart from the model: two matrix products of 2 d FLOPs per score forward
    (Q K^T and P V), five backward (FlashAttention-2: 2.5x); a causal query row r sees the keys up
    to kv_len - q_len + r (the mask aligned to the bottom right)."""
    scores = sum(max(0, min(kv_len, kv_len - q_len + row + 1)) for row in range(q_len)) if causal else q_len * kv_len
    return 4 * batch * heads * scores * head_dim * (2.5 if direction == "backward" else 1.0)


@pytest.mark.parametrize(("causal", "direction"), [(False, "forward"), (True, "backward")])
def test_a_long_attention_is_bound_by_its_matrix_flops(causal, direction):
    """Long sequences are compute-bound: the FLOP roofline nearly binds, so a model that ran the
    matrix products too fast (or too slowly) shows here, not only in the published efficiencies."""
    shape = (4, 16, 4096, 4096, 128)
    elapsed = _kernel_s(gpusim.run(H100, ops.Attention(*shape, causal=causal, direction=direction)))
    achieved = _attention_flops(*shape, causal, direction) / elapsed / H100.gpu.matrix_flops_per_s("fp16")
    assert 0.2 < achieved < 0.5  # 0.32 forward, 0.25 causal backward (FlashAttention-2 on an H100: about 0.35)


def test_long_prompts_run_at_flashattention_2s_published_efficiency():
    """FlashAttention-2 (Dao, 2023) reaches 50-73% of the A100's peak in its forward pass; on the
    H100 it reaches about 35% (FlashAttention-3, Shah et al., 2024: its warp-level ``mma.sync``
    and the exponentials on the special-function units).  Nothing the A100's forward pass uses is
    fitted on attention; the H100's mma.sync rate is, in part (``attention-h100-published``)."""
    op = ops.Attention(2, 16, 4096, 4096, 128)
    a100 = op.flops / _kernel_s(gpusim.run(A100, op)) / A100.gpu.matrix_flops_per_s("fp16")
    h100 = op.flops / _kernel_s(gpusim.run(H100, op)) / H100.gpu.matrix_flops_per_s("fp16")
    assert 0.50 <= a100 <= 0.73
    assert 0.35 * 0.8 <= h100 <= 0.35 * 1.2


def test_a_causal_mask_skips_the_tiles_past_the_diagonal():
    full = _kernel_s(gpusim.run(A100, ops.Attention(1, 16, 8192, 8192, 128)))
    causal = _kernel_s(gpusim.run(A100, ops.Attention(1, 16, 8192, 8192, 128, causal=True)))
    assert 0.5 < causal / full < 0.65  # half the scores, plus the diagonal tiles and the grid's tail (0.59)


def test_decoding_splits_the_keys_when_the_grid_is_small_and_streams_the_cache():
    small = ops.Attention(1, 32, 1, 8192, 128)
    tiling = forward_plan(problem_of(small), A100.gpu)
    assert tiling.splits > 1 and tiling.block_m == 64
    result = gpusim.run(A100, small)
    assert list(result.kernels["name"]) == [tiling.name("fwd"), "flash_fwd_splitkv_combine"]
    cache = 2 * 32 * 8192 * 128 * 2
    rate = cache / _kernel_s(result)
    assert 0.6 * A100.gpu.hbm.sustained_bandwidth_bytes_per_s < rate <= A100.gpu.hbm.bandwidth_bytes_per_s
    # a grid that fills the GPU is not split
    assert forward_plan(problem_of(ops.Attention(8, 32, 1, 8192, 128)), A100.gpu).splits == 1


def test_split_counts_fill_the_waves():
    assert choose_splits(200, 64, 216) == 1
    assert choose_splits(32, 64, 216) == 6  # 192 workgroups: 0.89 of a wave, the first count within 0.85 of 27's 1.0
    assert choose_splits(1, 3, 216) == 3  # never more splits than key tiles


def test_one_query_with_grouped_keys_reads_each_key_head_once():
    """A decoding step of grouped-query attention runs each group's queries as the rows of one
    key/value head, so it costs what attention over the key/value heads alone costs."""
    grouped = ops.Attention(4, 32, 1, 4096, 128, kv_heads=8)
    assert problem_of(grouped) == AttentionProblem(4, 8, 8, 4, 4096, 128, "fp16", False)
    alone = ops.Attention(4, 8, 1, 4096, 128)
    assert _kernel_s(gpusim.run(A100, grouped)) == pytest.approx(_kernel_s(gpusim.run(A100, alone)), rel=0.05)


def test_shared_memory_traffic_follows_flashattention_2s_warp_layouts():
    problem = AttentionProblem(1, 1, 1, 128, 128, 128, "fp16", False)
    # forward 128 x 64, 4 warps: Q (128 rows) once, K and V (64 rows) by every warp, K and V stored: 768 rows of 128
    assert shared_memory_bytes(AttentionTiling(128, 64, 4), problem, backward=False) == 768 * 128 * 2
    # backward 64 x 128, 8 warps of 32 output rows: S and dP 64 Ki values each, dV and dK 48 Ki, dQ 64 Ki, the P,
    # dS, Q and dO stores 32 Ki: 640 KiB
    assert shared_memory_bytes(AttentionTiling(64, 128, 8), problem, backward=True) == 640 * 1024


def test_a_lone_workgroup_exposes_part_of_its_shared_memory_traffic():
    """The backward kernel holds an SM alone (one 8-warp workgroup): without the exposed share of
    its shared-memory reads it would run faster; the forward kernel, two workgroups per SM, does not
    pay it."""
    hidden = gpusim.load_system("h100-sxm5", {"gpu.cu.lone_workgroup_lds_exposure": 0.0})
    for direction, slower in (("backward", True), ("forward", False)):
        op = ops.Attention(1, 16, 2048, 2048, 128, direction=direction)
        exposed, overlapped = _kernel_s(gpusim.run(H100, op)), _kernel_s(gpusim.run(hidden, op))
        assert (exposed > 1.1 * overlapped) if slower else exposed == overlapped


def test_the_backward_pass_runs_its_four_kernels_and_reads_its_inputs():
    op = ops.Attention(2, 8, 1024, 1024, 64, kv_heads=2, causal=True, direction="backward")
    result = gpusim.run(A100, op)
    assert list(result.kernels["name"]) == ["flash_bwd_dot_do_o", "flash_bwd_128x128_w8", "flash_bwd_convert_dq",
                                            "flash_bwd_sum_groups"]
    q_bytes = 2 * 1024 * 8 * 64 * 2
    # Q, dO and O (the prologue's) at least once from DRAM, on a cold L2
    assert float(result.dram_totals().query("direction == 'read'")["bytes"].sum()) >= 3 * q_bytes
    forward = _kernel_s(gpusim.run(A100, ops.Attention(2, 8, 1024, 1024, 64, kv_heads=2, causal=True)))
    assert 1.5 < _kernel_s(result) / forward < 5  # 2.5 times the matrix work, and three more kernels


def test_attention_consumes_named_tensors_from_the_op_before():
    """The output of a projection GEMM is in the L2 when the attention reads it as Q."""
    tokens, width = 2048, 2048
    program = [ops.Gemm(tokens, width, width, out="q"), ops.Attention(1, 16, tokens, tokens, 128, q="q")]
    warm = gpusim.run(A100, program)
    cold = gpusim.run(A100, [ops.Gemm(tokens, width, width, out="x"), ops.Attention(1, 16, tokens, tokens, 128)])
    assert warm.counters["gpu0.l2_hits"] > cold.counters["gpu0.l2_hits"]


def test_the_command_line_parses_attention():
    op = parse_op("attention batch=2 heads=32 kv_heads=8 q_len=1 kv_len=4096 head_dim=128 causal=true")
    assert (op.batch, op.heads, op.kv_heads, op.q_len, op.kv_len, op.head_dim, op.causal) == (2, 32, 8, 1, 4096, 128,
                                                                                              True)
    assert op.describe() == "attention forward 2x32/8 heads 1x4096x128 causal fp16"


def test_gpus_with_less_shared_memory_run_smaller_tiles():
    """The MI210's 64 KiB of LDS holds no backward tile of head dimension 128 (96 KiB): the keys'
    tile is halved, as FlashAttention-2 takes smaller tiles on GPUs with less shared memory."""
    mi210 = gpusim.load_system("mi210")
    backward = gpusim.run(mi210, ops.Attention(1, 8, 1024, 1024, 128, direction="backward"))
    assert backward.ops.iloc[0]["impl"] == "flash_bwd_64x64_w8"
    assert gpusim.run(A100, ops.Attention(1, 8, 1024, 1024, 128, direction="backward")).ops.iloc[0]["impl"] == (
        "flash_bwd_64x128_w8")


def test_a_gpu_that_holds_no_tile_is_an_op_error_naming_it():
    tiny = gpusim.load_system("a100-sxm4", {"gpu.cu.lds_bytes": "8 KiB"})
    with pytest.raises(OpError, match=r"prefill: no FlashAttention tile at head dimension 256 fits on a CU of a100"):
        gpusim.run(tiny, ops.Attention(1, 8, 512, 512, 256, name="prefill"))
