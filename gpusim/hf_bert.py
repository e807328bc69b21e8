"""Hugging Face's ``BertLayer`` in training, kernel by kernel, as PyTorch's eager mode runs it.

The op lists follow ``transformers``' ``modeling_bert`` (``BertSelfAttention``, ``BertSelfOutput``,
``BertIntermediate``, ``BertOutput``) in training mode, with every kernel PyTorch launches for it:

- a ``nn.Linear`` over a contiguous ``[batch, seq, in]`` input is one ``addmm``, which first writes
  the bias broadcast over its output (a ``fill`` here: the bias itself is a few KiB) and then runs
  the GEMM onto it; its backward pass is the input-gradient GEMM, the weight-gradient GEMM and the
  bias gradient's column sum;
- the heads' ``view`` + ``permute`` cost nothing, but ``torch.matmul`` of the permuted query, key
  and value folds ``batch x heads`` into one batch dimension, which those strides do not allow, so
  each operand is first copied contiguous (a strided copy over four dimensions); so is the context
  after ``permute(0, 2, 1, 3).contiguous()``, and each head gradient on its way back;
- the scores are divided by ``sqrt(head_dim)`` and the broadcast mask is added (one tensor read and
  one written each: ``scale``), then softmax, then dropout, which keeps a one-byte mask;
- each sub-layer ends in dropout, a residual ``add`` and ``LayerNorm``; the MLP's GeLU is the exact
  (erf) one;
- in the backward pass the gradients of the residual branches and of the query, key and value
  inputs are summed by ``add`` kernels as autograd accumulates them.

Not modelled: cuBLAS reading the bias-filled output back (``beta = 1``), the layer norms' separate
weight and bias gradient kernels, and autograd's host-side work (the GPU is assumed busy).
"""

from __future__ import annotations

from gpusim.ops import Elementwise, Gemm, Op, RowReduce

LIBRARY = "pytorch-2.0"
"""Row-reduction kernels of the PyTorch release the layer ran on (before the register-cached softmax)."""
PERMUTED_DIMS = 4
"""Dimensions of a ``[batch, heads, seq, head_dim]`` tensor's offsets in a strided copy."""
BERT_BASE = {"hidden": 768, "heads": 12, "ffn": 3072}
"""BERT-Base's layer (Devlin et al. 2019): hidden size, attention heads, feed-forward width."""


def _linear(tokens: int, inputs: int, outputs: int, dtype: str, name: str) -> list[Op]:
    """``nn.Linear(inputs, outputs)`` over ``tokens`` rows: the bias broadcast, then ``x @ W^T``."""
    return [Elementwise("fill", tokens * outputs, dtype, name=f"{name}.bias"),
            Gemm(tokens, outputs, inputs, dtype, trans_b=True, name=name)]


def _linear_backward(tokens: int, inputs: int, outputs: int, dtype: str, name: str) -> list[Op]:
    """The gradients of :func:`_linear`: of its input (``dy @ W``), its weight (``dy^T @ x``) and its bias."""
    return [Gemm(tokens, inputs, outputs, dtype, name=f"{name}.dgrad"),
            Gemm(outputs, inputs, tokens, dtype, trans_a=True, name=f"{name}.wgrad"),
            RowReduce("colsum", tokens, outputs, dtype, library=LIBRARY, name=f"{name}.bias_grad")]


def _copy_heads(elements: int, dtype: str, name: str) -> Elementwise:
    return Elementwise("copy", elements, dtype, index_dims=PERMUTED_DIMS, name=name)


def bert_layer_ops(direction: str, batch: int, seq_len: int, dtype: str = "fp32", hidden: int = BERT_BASE["hidden"],
                   heads: int = BERT_BASE["heads"], ffn: int = BERT_BASE["ffn"]) -> list[Op]:
    """The kernels of one ``BertLayer`` pass in training, in launch order.

    Parameters
    ----------
    direction
        ``forward`` or ``backward``.
    batch, seq_len
        Sequences and tokens per sequence.
    dtype
        Element dtype of every tensor (``fp32``: training without mixed precision).
    hidden, heads, ffn
        Hidden size, attention heads and feed-forward width (default BERT-Base's).

    Returns
    -------
    list of Op
        To run on one stream, one after another.
    """
    if direction not in ("forward", "backward"):
        raise ValueError(f"bert_layer_ops: direction must be 'forward' or 'backward', got {direction!r}")
    tokens, head_dim, pairs = batch * seq_len, hidden // heads, batch * heads
    scores, activations = pairs * seq_len * seq_len, tokens * hidden
    if direction == "forward":
        layer: list[Op] = []
        for part in ("query", "key", "value"):
            layer += _linear(tokens, hidden, hidden, dtype, part)
        layer += [_copy_heads(activations, dtype, "query.contiguous"),
                  _copy_heads(activations, dtype, "key_t.contiguous"),
                  Gemm(seq_len, seq_len, head_dim, dtype, batch=pairs, name="scores"),
                  Elementwise("scale", scores, dtype, name="scores.div"),
                  Elementwise("scale", scores, dtype, index_dims=2, name="scores.mask_add"),
                  RowReduce("softmax", pairs * seq_len, seq_len, dtype, library=LIBRARY, name="softmax"),
                  Elementwise("dropout", scores, dtype, name="probs.dropout"),
                  _copy_heads(activations, dtype, "value.contiguous"),
                  Gemm(seq_len, head_dim, seq_len, dtype, batch=pairs, name="context"),
                  _copy_heads(activations, dtype, "context.contiguous")]
        layer += _linear(tokens, hidden, hidden, dtype, "attention.output")
        layer += _dropout_add_norm(tokens, hidden, dtype, "attention")
        layer += _linear(tokens, hidden, ffn, dtype, "intermediate")
        layer += [Elementwise("gelu_erf", tokens * ffn, dtype, name="intermediate.gelu")]
        layer += _linear(tokens, ffn, hidden, dtype, "output")
        return layer + _dropout_add_norm(tokens, hidden, dtype, "output")
    layer = [RowReduce("layernorm_backward", tokens, hidden, dtype, library=LIBRARY, name="output.norm_grad"),
             Elementwise("dropout_backward", activations, dtype, name="output.dropout_grad")]
    layer += _linear_backward(tokens, ffn, hidden, dtype, "output")
    layer += [Elementwise("bias_gelu", tokens * ffn, dtype, name="intermediate.gelu_grad")]
    layer += _linear_backward(tokens, hidden, ffn, dtype, "intermediate")
    layer += [Elementwise("add", activations, dtype, name="attention.residual_grad"),
              RowReduce("layernorm_backward", tokens, hidden, dtype, library=LIBRARY, name="attention.norm_grad"),
              Elementwise("dropout_backward", activations, dtype, name="attention.dropout_grad")]
    layer += _linear_backward(tokens, hidden, hidden, dtype, "attention.output")
    layer += [_copy_heads(activations, dtype, "context_grad.contiguous"),
              Gemm(seq_len, seq_len, head_dim, dtype, trans_b=True, batch=pairs, name="probs_grad"),
              Gemm(seq_len, head_dim, seq_len, dtype, trans_a=True, batch=pairs, name="value_grad"),
              Elementwise("dropout_backward", scores, dtype, name="probs.dropout_grad"),
              RowReduce("softmax_backward", pairs * seq_len, seq_len, dtype, library=LIBRARY, name="softmax_grad"),
              Elementwise("scale", scores, dtype, name="scores.div_grad"),
              Gemm(seq_len, head_dim, seq_len, dtype, trans_b=True, batch=pairs, name="query_grad"),
              Gemm(head_dim, seq_len, seq_len, dtype, trans_a=True, batch=pairs, name="key_t_grad")]
    for part in ("query", "key", "value"):
        layer += [_copy_heads(activations, dtype, f"{part}_grad.contiguous")]
        layer += _linear_backward(tokens, hidden, hidden, dtype, part)
        layer += [Elementwise("add", activations, dtype, name=f"{part}.input_grad_sum")]
    return layer


def _dropout_add_norm(tokens: int, hidden: int, dtype: str, name: str) -> list[Op]:
    """A sub-layer's end: ``LayerNorm(dropout(x) + residual)``."""
    return [Elementwise("dropout", tokens * hidden, dtype, name=f"{name}.dropout"),
            Elementwise("add", tokens * hidden, dtype, name=f"{name}.residual_add"),
            RowReduce("layernorm", tokens, hidden, dtype, library=LIBRARY, name=f"{name}.norm")]
