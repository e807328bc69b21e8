"""Matrix-vector products: the BLAS's GEMV kernels for GEMMs with one output row or column.

A GEMM whose output has one row (``m == 1``: a vector times a matrix, as a decoding step's
attention scores against the cached keys) or one column (``n == 1``) is a matrix-vector product
per batch entry.  cuBLAS on Volta, Turing and Ampere runs such calls, batched or not, as GEMV
kernels (``gemv2T_kernel_val``, ``gemvx::kernel``, with ``cublasGemvTensorStridedBatched`` for
batches), not as tile kernels (:attr:`gpusim.config.GpuConfig.gemv_kernels`).  A GEMV kernel reads
the matrix once, each element once, in coalesced loads along its contiguous dimension, and keeps
its sums in registers: it is a streaming kernel over the matrix
(:class:`gpusim.kernels.elementwise.StreamingKernel`), not a tile kernel staging operands through
the local data share, so unaligned rows cost it no register-staged fallback accesses
(:data:`gpusim.kernels.gemm.ALIGNED_ROW_BYTES`).

Simplifications (docs/model.md): the vector, which every workgroup re-reads, is read once (its
re-reads hit in the L2 and are small beside the matrix); the matrix is streamed in the order of its
storage whichever dimension the sums run along, so a product with few outputs and a long sum (which
cuBLAS splits over workgroups and combines) streams as fast as one with many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpusim.config.gpu import GpuConfig
from gpusim.kernels.elementwise import StreamingKernel

if TYPE_CHECKING:
    from gpusim.kernels.gemm import GemmProblem

GEMV_THREADS = 128
"""Threads per workgroup of cuBLAS's GEMV kernels (``gemv2T_kernel_val<..., 128, ...>``)."""


def runs_as_gemv(problem: GemmProblem, gpu: GpuConfig) -> bool:
    """Whether the BLAS of ``gpu`` runs ``problem`` as a matrix-vector kernel: a GEMM with one
    output row or column, on a GPU whose BLAS has GEMV kernels for them (``gpu.gemv_kernels``)."""
    return gpu.gemv_kernels and (problem.m == 1 or problem.n == 1)


def gemv_orientation(problem: GemmProblem) -> str:
    """``"t"`` where each output is a dot product along the matrix's contiguous dimension
    (cuBLAS's ``gemv2T``: the weights of ``x W^T``), ``"n"`` where the sums run across its
    contiguous rows (each thread owns outputs along a row, as for ``q K^T`` with ``K^T`` stored)."""
    if problem.m == 1:
        return "t" if problem.trans_b else "n"
    return "n" if problem.trans_a else "t"


def execute_gemv(ctx, op, problem: GemmProblem):
    """Run a one-row (or one-column) :class:`gpusim.ops.Gemm` as a GEMV kernel on ``ctx``'s rank
    (a generator for the op's stream)."""
    size = problem.dtype_bytes
    batch = problem.batch
    a_bytes = batch * problem.m * problem.k * size
    b_bytes = batch * problem.k * problem.n * size
    out_bytes = batch * problem.m * problem.n * size
    a = ctx.tensor(op.a, a_bytes)
    b = ctx.tensor(op.b, b_bytes)
    c = ctx.tensor(op.out, out_bytes)
    # the matrix is the operand the output's long side comes from; the other is the vector
    matrix, vector = ((b, b_bytes), (a, a_bytes)) if problem.m == 1 else ((a, a_bytes), (b, b_bytes))
    name = f"gemv_{gemv_orientation(problem)}"
    kernel = StreamingKernel(
        ctx.gpu,
        name=name,
        reads=[matrix, vector],
        writes=[(c, out_bytes)],
        flops=problem.flops,
        dtype="fp32",
        threads=GEMV_THREADS,
        cus=ctx.cus,
    )
    yield from ctx.launch(kernel.kernel)
    ctx.info.update(impl=name, flops=problem.flops, workgroups=kernel.kernel.num_wgs, bytes=problem.min_bytes)
