"""Hugging Face's BertLayer, kernel by kernel (gpusim.hf_bert), and the seeds/000 V100 timings it
is validated against (the ``bert-layer-v100`` data set)."""

from __future__ import annotations

import pytest

from gpusim import ops, validation
from gpusim.hf_bert import bert_layer_ops

BATCH, SEQ, HIDDEN, HEADS, FFN = 2, 128, 768, 12, 3072


def _gemm_flops(layer: list[ops.Op]) -> float:
    return sum(op.flops for op in layer if isinstance(op, ops.Gemm))


def test_the_forward_gemms_are_the_layers_flops():
    """Four hidden x hidden projections, the two MLP GEMMs and the two attention products."""
    tokens = BATCH * SEQ
    expected = 2 * tokens * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN) + 2 * 2 * BATCH * SEQ * SEQ * HIDDEN
    assert _gemm_flops(bert_layer_ops("forward", BATCH, SEQ)) == expected


def test_the_backward_pass_runs_twice_the_forward_gemm_flops():
    forward, backward = (bert_layer_ops(direction, BATCH, SEQ) for direction in ("forward", "backward"))
    assert _gemm_flops(backward) == 2 * _gemm_flops(forward)
    # every linear layer's bias gets its gradient
    assert sum(isinstance(op, ops.RowReduce) and op.kind == "colsum" for op in backward) == 6


def test_eager_pytorch_kernels_of_the_forward_pass():
    layer = bert_layer_ops("forward", BATCH, SEQ)
    kinds = [op.kind for op in layer if isinstance(op, (ops.Elementwise, ops.RowReduce))]
    assert kinds.count("fill") == 6  # every nn.Linear's addmm writes its bias first
    assert kinds.count("copy") == 4  # query, key^T, value and the context made contiguous
    assert kinds.count("layernorm") == 2 and kinds.count("softmax") == 1 and kinds.count("dropout") == 3


def test_an_unknown_direction_is_an_error():
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward'"):
        bert_layer_ops("sideways", BATCH, SEQ)


def test_a_kernel_the_pass_does_not_run_is_an_error_naming_the_ones_it_does():
    with pytest.raises(ValueError, match="runs no kernel 'nope'.*softmax_warp_forward"):
        validation.simulate_point("bert_layer", "v100-pcie", direction="forward", batch=1, seq_len=64, dtype="fp32",
                                  kernel="nope")


def test_seed_000_bert_layer_on_a_v100_pcie_within_tolerance():
    """Held out: nothing was fitted on these five timings (softmax, layer norm, and one layer's
    forward and backward pass of BERT-Base in fp32)."""
    dataset = validation.get("bert-layer-v100")
    frame = validation.compare(dataset, workers=1, progress=False)
    assert len(frame) == 5
    assert not validation.violations(frame, dataset), validation.error_stats(frame)
