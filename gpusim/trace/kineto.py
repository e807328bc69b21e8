"""Import PyTorch profiler (Kineto) traces: GPU kernels become trace rows with measured durations.

Every GPU activity (``kernel``, ``gpu_memcpy``, ``gpu_memset`` events) becomes one row, in start
order per stream, with its measured duration in ``measured_s``.  A kernel is linked to the CPU op
that launched it by its ``External id`` and to its launch call by its ``correlation`` id (AMD
traces keep grid and block on the launch call, NVIDIA traces on the kernel).

How a kernel becomes an op:

* GEMM (cuBLAS/cuBLASLt/CUTLASS/Tensile/rocBLAS names): M, N, K and the dtype from the CPU op's
  ``Input Dims`` and ``Input type`` (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``,
  ``linear``); the macro tile in the kernel name (``MT64x16x32``, ``256x64_16x4``) picks the library
  kernel with the same tile when there is one, and CUTLASS's ``align<N>`` below 16 bytes its
  fallback variant (``_V<bytes>``).  Without recorded shapes (profiling without
  ``record_shapes=True``) grid, block and name fix only the output tiling, never K, so such a GEMM
  cannot be modelled.
* Element-wise: the element count from the CPU op's shapes when it is an element-wise op, else from
  grid x block x elements per thread (the kernel's template argument, e.g.
  ``vectorized_elementwise_kernel<4, ...>``); the function from the op's name.  Device-to-device
  copies and memsets are byte copies/fills.
* Reductions: softmax, layer norm, RMS norm and ``reduce_kernel`` over the op's input shape.
* NCCL/RCCL kernels: the collective, message size, dtype and process group from the kernel's
  ``Collective name``, ``In/Out msg nelems``, ``dtype`` and ``Process Group Ranks`` arguments; an
  all-to-all whose ranks' ``In split size`` differ gets their ``send_bytes``
  (:func:`_resolve_all_to_alls`).

Anything else (host copies, convolutions without shapes, broadcasts...) cannot be modelled: with
``unsupported="error"`` (the default) that is an error naming the event; with
``unsupported="delay"`` it is replayed as a delay of its measured duration and keeps its
``kernel_class`` so reports can leave it out; ``trace.metadata["not_modelled"]`` lists those rows
with the reason.  A field the importer reads whose value has the wrong type or range (``Input Dims``
that are not lists of sizes >= 0, a ``grid`` that is not a list of numbers, a list as a
``correlation`` id, a CPU op without a ``name``...) is a :class:`TraceError` naming the file, the
event and the field, whatever ``unsupported`` says.

A file holds one rank's GPU: GPU activities on several devices (their ``args.device``: one process
driving several GPUs) are an error naming the devices, since gpusim cannot tell which ranks they
were.

Dependencies: kernels on one stream run in order; a kernel that started later than both its launch
and its stream predecessor's end was waiting for another stream, and depends on the kernel of
another stream that ended last before it started (within :data:`WAIT_SLACK_US`).  The host's
time is replayed as measured: each row's ``issue_s`` is when its launch call returned (from the
first launch call of its rank), and the replay issues its kernel then instead of charging the
GPU's ``kernel_launch_ns`` (:mod:`gpusim.sched.executor`); so CPU-side gaps (Python overhead
between launches) stay in the iteration.  A host that waited for the GPU (a synchronisation)
waited as long as the measured GPU took, which a what-if on other hardware keeps.  Several files
(one per rank) can be read together; their collectives are matched by process group and order
(files whose matched collectives differ in type, size, dtype or algorithm are an error naming both
events).
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from gpusim.checks import as_int
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import ConfigError, TraceError, UnsupportedTraceError
from gpusim.ops import ELEMENTWISE_INPUT_WIDTH, ELEMENTWISE_KINDS
from gpusim.trace.schema import MAX_SECONDS, format_ints
from gpusim.trace.trace import Trace

WAIT_SLACK_US = 10.0
"""A kernel counts as having waited for another stream's kernel that ended at most this long before it started, us."""
LAUNCH_SLACK_US = 2.0
"""A kernel that starts later than this after it could have started was waiting for something, us."""

DTYPES = {
    "float": "fp32", "double": "fp64", "c10::half": "fp16", "half": "fp16", "c10::bfloat16": "bf16",
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int": "fp32", "long int": "fp64",
    "int64": "fp64", "long": "fp64", "bool": "int8", "unsigned char": "int8", "signed char": "int8",
}  # fmt: skip
NCCL_DTYPES = {
    "float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64", "int": "fp32", "int32": "fp32",
    "int64": "fp64", "long": "fp64", "int8": "int8", "uint8": "int8", "char": "int8", "byte": "int8",
}  # fmt: skip
NCCL_COLLECTIVES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "reducescatter": "reducescatter",
    "reduce_scatter": "reducescatter", "_reduce_scatter_base": "reducescatter", "reduce_scatter_tensor": "reducescatter",
    "allgather": "allgather", "all_gather": "allgather", "_allgather_base": "allgather",
    "all_gather_into_tensor": "allgather", "all_to_all": "alltoall", "alltoall": "alltoall",
    "all_to_allv": "alltoall", "alltoallv": "alltoall", "alltoall_base": "alltoall",
}  # fmt: skip
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmm_")
ELEMENTWISE_FUNCTIONS = {
    "add": "add", "sub": "add", "rsub": "add", "mul": "mul", "div": "mul", "addcmul": "mul", "addcdiv": "mul",
    "lerp": "mul", "fill": "fill", "zero": "fill", "zeros": "fill", "ones": "fill", "copy": "copy",
    "_to_copy": "copy", "to": "copy", "clone": "copy", "contiguous": "copy", "cat": "cat", "stack": "cat",
    "relu": "relu", "clamp": "relu", "clamp_min": "relu", "threshold": "relu", "threshold_backward": "relu",
    "gelu": "gelu_erf", "gelu_backward": "bias_gelu", "sigmoid": "sigmoid", "tanh": "tanh", "dropout": "dropout",
    "native_dropout": "dropout", "native_dropout_backward": "dropout_backward", "tanh_backward": "mul",
    "sigmoid_backward": "mul", "neg": "scale", "sqrt": "scale", "rsqrt": "scale", "exp": "scale", "pow": "scale",
    "silu": "sigmoid", "where": "add", "masked_fill": "add",
}  # fmt: skip
REDUCED_DIMS_ARGUMENT = {"sum": 1, "mean": 1, "amax": 1, "max": 1, "norm": 2, "linalg_vector_norm": 2}
"""Position of the reduced dimensions among a sum-like op's ``Concrete Inputs`` (blank: all)."""
REDUCTION_OPS = {
    "softmax": "softmax", "_softmax": "softmax", "_log_softmax": "softmax", "log_softmax": "softmax",
    "_softmax_backward_data": "softmax_backward", "_log_softmax_backward_data": "softmax_backward",
    "native_layer_norm": "layernorm", "layer_norm": "layernorm", "native_layer_norm_backward": "layernorm_backward",
    "rms_norm": "rmsnorm", "_fused_rms_norm": "rmsnorm", "sum": "sum", "mean": "sum", "norm": "sum",
    "linalg_vector_norm": "sum", "amax": "sum", "max": "sum", "nll_loss": "sum",
}  # fmt: skip

_ATTENTION_NAME = re.compile(r"flash_fwd|flash_bwd|fmha_cutlass", re.I)
_ATTENTION_HELPER = re.compile(r"combine|dot_do_o|convert_dq", re.I)
ATTENTION_OPS: dict[str, tuple[str, str, int, int]] = {
    "_flash_attention_forward": ("forward", "bshd", 0, 8),
    "_flash_attention_backward": ("backward", "bshd", 1, 11),
    "_efficient_attention_forward": ("forward", "bshd", 0, 8),
    "_efficient_attention_backward": ("backward", "bshd", 1, 12),
    "_scaled_dot_product_flash_attention": ("forward", "bhsd", 0, 4),
    "_scaled_dot_product_efficient_attention": ("forward", "bhsd", 0, 6),
}
"""PyTorch's fused-attention ops: the pass, the layout of their tensors (``[batch, seq, heads,
head_dim]`` or ``[batch, heads, seq, head_dim]``), the argument position of the query and of
``is_causal`` (the key follows the query)."""
_GEMM_NAME = re.compile(r"gemm|gemv|Cijk_|xmma|nvjet|scudnn|cutlass.*(fprop|dgrad|wgrad)|implicit_gemm|_nn_|_tn_|_nt_", re.I)
_REDUCTION_NAME = re.compile(r"reduce|softmax|norm|bn_fw|bn_bw|welford|splitk|nll_loss|cross_entropy|argmax", re.I)
_ELEMENTWISE_NAME = re.compile(
    r"elementwise|vectorized|unrolled|multi_tensor_apply|fill|cat|copy|nchwtonhwc|nhwctonchw|transpose|index|gather|"
    r"scatter|dropout|relu|gelu|where|pool", re.I,
)
_VLLM_ROW_NAME = re.compile(r"vllm::(act_and_mul_kernel|rotary_embedding_kernel)")
"""vLLM's per-row element-wise kernels (:data:`VLLM_ROW_FUNCTIONS`)."""
VLLM_ROW_FUNCTIONS = {"act_and_mul_kernel": "silu_and_mul", "rotary_embedding_kernel": "rope"}
"""The element-wise kind each of vLLM's per-row kernels replays as (``act_and_mul_kernel`` only
with the SiLU, ``silu_kernel`` in its template arguments)."""
_OPAQUE_TYPE = re.compile(r"OpaqueType<(\d+)u?>")
_CAT_RANK = re.compile(r"CatArrayBatchedCopy<.*?OpaqueType<\d+u?>\s*,\s*[\w ]+?\s*,\s*(\d+)\s*,")
OPAQUE_DTYPES = {1: "int8", 2: "fp16", 4: "fp32", 8: "fp64"}
"""The element type the importer gives a kernel that moves elements of this many bytes as opaque words."""
_ITEMS_PER_THREAD = re.compile(r"(?:vectorized_elementwise_kernel|elementwise_kernel|unrolled_elementwise_kernel)<(\d+)(?:,\s*(\d+))?")


class UnsupportedEvent(Exception):
    """A GPU activity that cannot be turned into a simulated op (the message says why)."""


class MalformedEvent(Exception):
    """An ``args`` field of a trace event whose value has the wrong type or range.

    Parameters
    ----------
    event
        The event that holds the field (a GPU activity, its launch call or its CPU op).
    field
        The field's name in the event's ``args``.
    message
        What the value must be and what it is (``"must be ..., got ..."``).
    """

    def __init__(self, event: dict, field: str, message: str):
        super().__init__(message)
        self.event = event
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[dict, str, str], dict]:
        return type(self), (self.event, self.field, self.message), self.__dict__


@dataclass(frozen=True)
class FileRanks:
    """A trace file's rank, its job's size, and the GPUs its ranks are replayed on.

    Attributes
    ----------
    rank
        The file's rank (``distributedInfo.rank``, else its position among the files read).
    world_size
        Ranks of the job (``distributedInfo.world_size``, else 1).
    alone
        Whether the file is read alone: its rank is then replayed on GPU 0, and rank 0 on the
        file's rank (the two swap numbers, so that every process group keeps its members).
    """

    rank: int
    world_size: int
    alone: bool

    def gpu(self, rank: int) -> int:
        """The GPU that ``rank`` is replayed on."""
        if not self.alone or rank not in (0, self.rank):
            return rank
        return self.rank if rank == 0 else 0


def _is_whole(value: object) -> bool:
    """Whether ``value`` is a JSON integer (``true`` and ``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_sizes(value: object) -> bool:
    """Whether ``value`` is one tensor's sizes (or strides): a list of whole numbers >= 0."""
    return isinstance(value, list) and all(_is_whole(size) and size >= 0 for size in value)


def _is_shapes(value: object) -> bool:
    """Whether ``value`` is an ``Input Dims`` (or ``Input Strides``) list: per argument a tensor's sizes
    (``[]`` for a non-tensor), or a list of them for a tensor list."""
    return isinstance(value, list) and all(
        _is_sizes(item) or (isinstance(item, list) and all(_is_sizes(sizes) for sizes in item)) for item in value)


def _is_texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_list(value: object) -> bool:
    return isinstance(value, list)


def _is_geometry(value: object) -> bool:
    """Whether ``value`` is a launch's ``grid`` or ``block``: up to three whole numbers >= 1."""
    return isinstance(value, list) and len(value) <= 3 and all(_is_whole(size) and size >= 1 for size in value)


SHAPES = "a list of each argument's sizes (a list of whole numbers >= 0; a list of such lists for a tensor list)"
STRIDES = "a list of each argument's strides (a list of whole numbers >= 0; a list of such lists for a tensor list)"
TYPES = "a list of type names (text)"
GEOMETRY = "a list of up to three whole numbers >= 1"
CONCRETE = "a list of the arguments' values"


def _shown(value: object) -> str:
    """A JSON value as an error message shows it (at most 80 characters)."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _arg(event: dict | None, field: str, valid: Callable[[object], bool], expected: str, default: object = None):
    """The ``args`` field ``field`` of ``event``; ``default`` when there is no event or no such field.

    Raises
    ------
    MalformedEvent
        The field is there but ``valid`` rejects its value; the message says it must be ``expected``.
    """
    args = event.get("args", {}) if event is not None else {}
    if field not in args:
        return default
    value = args[field]
    if not valid(value):
        raise MalformedEvent(event, field, f"must be {expected}, got {_shown(value)}")
    return value


def kernel_class(name: str, category: str) -> str:
    """``gemm``, ``elementwise``, ``reduction``, ``attention``, ``collective``, ``memcpy`` or ``other``."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    lowered = name.lower()
    if "nccl" in lowered or "rccl" in lowered:
        return "collective"
    if _ATTENTION_NAME.search(name):
        return "attention"
    if _VLLM_ROW_NAME.search(name):
        return "elementwise"
    if _GEMM_NAME.search(name):
        return "gemm"
    if _REDUCTION_NAME.search(name):
        return "reduction"
    if _ELEMENTWISE_NAME.search(name):
        return "elementwise"
    return "other"


def short_name(name: str) -> str:
    """A kernel name without its argument list and template arguments, at most 80 characters."""
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "")
    for stop in ("(", "<"):
        if stop in text:
            text = text[: text.index(stop)]
    return text.strip()[:80]


def _dtype(type_name: str | None) -> str:
    if not type_name:
        return "fp32"
    return DTYPES.get(type_name.strip().lower(), "fp32")


def _numel(dims, type_name: str | None) -> int:
    """Elements of one recorded argument (0 for non-tensors; a 0-d tensor has 1)."""
    if type_name in (None, "", "Scalar", "ScalarList", "GenericList", "Device", "Layout", "Bool"):
        return 0
    if not isinstance(dims, list):
        return 0
    if dims and isinstance(dims[0], list):  # a tensor list
        return sum(_numel(d, "float") for d in dims)
    return math.prod(int(d) for d in dims)


def _op_base(op_name: str) -> str:
    base = op_name.split("::")[-1]
    return base.rstrip("_") if base not in ("_to_copy",) else base


_TILE_PATTERNS = (
    re.compile(r"MT(\d+)x(\d+)x(\d+)"),  # Tensile (rocBLAS, hipBLASLt): MT<m>x<n>x<depth>
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)"),  # cuDNN/cuBLAS xmma kernels
    re.compile(r"_(\d+)x(\d+)_(\d+)x\d+_"),  # CUTLASS and cuBLAS's sm90 nvjet kernels: <m>x<n>_<k>x<stages>
    re.compile(r"_(\d+)x(\d+)_(?:nn|nt|tn|tt)_align()"),  # CUTLASS 2.x sm75 kernels: <m>x<n>_<layouts>_align<N>
    re.compile(r"gemm_(\d+)x(\d+)()"),  # cuBLAS SIMT: sgemm_<m>x<n>
)

_ALIGN = re.compile(r"_align(\d+)")
"""CUTLASS's alignment in elements: the vector width of its kernel's accesses."""


def library_kernel_of(kernel_name: str, threads: int | None, dtype_bytes: int | None = None) -> str:
    """The gpusim library kernel with the measured kernel's macro tile (and K depth, where it is one of
    :data:`gpusim.kernels.gemm.K_TILE_DEPTHS`), or ``""`` when the library has no such tile.

    BLAS libraries are column-major: a tile ``a x b`` of their C is ``b x a`` of the row-major
    product gpusim models (PyTorch's ``mm(A, B)`` runs as ``C^T = B^T A^T``).  A CUTLASS kernel
    whose ``align<N>`` elements of ``dtype_bytes`` each make less than 16 bytes is a fallback
    kernel, the ``_V<bytes>`` variant of the tile (:mod:`gpusim.kernels.gemm`).
    """
    from gpusim.kernels.gemm import FALLBACK_WIDTHS, K_TILE_DEPTHS, KNOWN_TILES

    for pattern in _TILE_PATTERNS:
        match = pattern.search(kernel_name)
        if match:
            column_tile, row_tile = int(match.group(1)), int(match.group(2))
            depth = int(match.group(3)) if match.group(3) else None
            same_tile = [spec for spec in KNOWN_TILES if (spec.tile_m, spec.tile_n) == (row_tile, column_tile)]
            if not same_tile:
                return ""
            best = max(same_tile, key=lambda spec: (spec.tile_k == depth, spec.threads == threads))
            if depth in K_TILE_DEPTHS:
                best = replace(best, tile_k=depth)
            align = _ALIGN.search(kernel_name)
            if align and dtype_bytes and int(align.group(1)) * dtype_bytes in FALLBACK_WIDTHS:
                best = replace(best, vector_bytes=int(align.group(1)) * dtype_bytes)
            return best.name
    return ""


def _gemm_fields(cpu_op: dict | None, kernel_name: str) -> dict:
    if cpu_op is None or cpu_op.get("name") not in GEMM_OPS:
        op = cpu_op.get("name") if cpu_op else "no CPU op"
        raise UnsupportedEvent(f"a GEMM kernel launched by {op}, whose shapes gpusim cannot read")
    dims = _arg(cpu_op, "Input Dims", _is_shapes, SHAPES)
    types = _arg(cpu_op, "Input type", _is_texts, TYPES, [])
    if not dims:
        raise UnsupportedEvent("GEMM shapes were not recorded (profile with record_shapes=True); grid, block and "
                               "kernel name give the output tiling but not K")
    name = cpu_op["name"]
    tensors = [(d, t) for d, t in zip(dims, types + [None] * len(dims)) if d and not isinstance(d[0], list)]
    if name in ("aten::addmm", "aten::addmm_", "aten::baddbmm"):
        tensors = tensors[1:]
    if len(tensors) < 2:
        raise UnsupportedEvent(f"{name} with input shapes {dims} has fewer than two matrices")
    (a, a_type), (b, _) = tensors[0], tensors[1]
    if name == "aten::linear":
        k, n = a[-1], b[0]
        m, batch = math.prod(a[:-1]), 1
    elif len(a) >= 3 and len(b) >= 3:
        batch, m, k, n = math.prod(a[:-2]), a[-2], a[-1], b[-1]
    elif len(a) >= 2 and len(b) == 2:
        m, k, n, batch = math.prod(a[:-1]), a[-1], b[-1], 1
    else:
        raise UnsupportedEvent(f"{name} with input shapes {dims} is not a matrix product gpusim models")
    if min(m, n, k, batch) == 0:
        raise UnsupportedEvent(f"{name} with input shapes {dims} multiplies empty matrices")
    dtype = _dtype(a_type)
    if dtype == "fp32" and "tf32" in kernel_name.lower():
        dtype = "tf32"
    return {"kind": "gemm", "m": int(m), "n": int(n), "k": int(k), "batch": int(batch), "dtype": dtype}


def _grid_elements(kernel_name: str, grid, block) -> int:
    match = _ITEMS_PER_THREAD.search(kernel_name)
    if not match or not grid or not block:
        raise UnsupportedEvent("element count unknown (no recorded shapes, and no elements-per-thread in the name)")
    first, second = int(match.group(1)), match.group(2)
    per_thread = int(second) if second else first
    if "unrolled" in kernel_name:
        per_thread = 4
    return math.prod(grid) * math.prod(block) * per_thread


def _operand_layouts(dims: list, strides: list, types: list) -> list[tuple[list[int], list[int]]]:
    """``(sizes, strides)`` of every tensor argument recorded with both (a tensor list gives each of
    its tensors)."""
    layouts = []
    for size, stride, type_name in zip(dims, strides, types + [None] * len(dims)):
        if _numel(size, type_name) == 0 or len(stride) != len(size):
            continue
        if size and isinstance(size[0], list):
            layouts.extend((list(s), list(t)) for s, t in zip(size, stride) if _is_sizes(t) and len(t) == len(s))
        elif _is_sizes(stride):
            layouts.append((list(size), list(stride)))
    return layouts


def coalesced_dims(layouts: list[tuple[list[int], list[int]]]) -> int:
    """Dimensions left once adjacent ones that are contiguous in every tensor are merged, as
    PyTorch's ``TensorIterator`` merges them before it computes offsets.

    ``layouts`` are ``(sizes, strides)`` per tensor, in elements; they are broadcast to the largest
    shape (a broadcast dimension has stride 0), the output is taken as a new contiguous tensor of
    that shape, and dimensions of size 1 drop out.  At least 1.
    """
    rank = max((len(sizes) for sizes, _ in layouts), default=0)
    if rank == 0:
        return 1
    shape = [max([1] + [sizes[len(sizes) - rank + d] for sizes, _ in layouts if len(sizes) - rank + d >= 0])
             for d in range(rank)]
    operand_strides = []
    for sizes, strides in layouts:
        offset = rank - len(sizes)
        operand_strides.append([0 if d < offset or sizes[d - offset] == 1 else strides[d - offset]
                                for d in range(rank)])
    contiguous = [math.prod(shape[d + 1:]) for d in range(rank)]
    operand_strides.append(contiguous)
    kept = [d for d in range(rank) if shape[d] > 1]
    if not kept:
        return 1
    count = 1
    for outer, inner in zip(kept, kept[1:]):
        if any(strides[outer] != shape[inner] * strides[inner] for strides in operand_strides):
            count += 1
    return count


def _index_dims(kernel_name: str, cpu_op: dict | None) -> int:
    """:attr:`gpusim.ops.Elementwise.index_dims` of an element-wise kernel: 0 for PyTorch's vectorized
    and contiguous kernels, 1 for its unrolled kernel, and for its offset-calculator kernel (and the
    concatenation of strided tensors) the dimensions its tensors' recorded strides leave, at least 2
    (2 when the strides are not recorded)."""
    if "vectorized" in kernel_name:
        return 0
    if "unrolled_elementwise_kernel" in kernel_name:
        return 1
    # the contiguous concatenations are CatArrayBatchedCopy_contig and _aligned16_contig
    if "elementwise_kernel<" not in kernel_name and "CatArrayBatchedCopy<" not in kernel_name:
        return 0
    rank = _CAT_RANK.search(kernel_name)
    if rank:  # the concatenation walks every dimension of its tensors, merging none
        return max(2, int(rank.group(1)))
    layouts = _operand_layouts(_arg(cpu_op, "Input Dims", _is_shapes, SHAPES, []),
                               _arg(cpu_op, "Input Strides", _is_shapes, STRIDES, []),
                               _arg(cpu_op, "Input type", _is_texts, TYPES, []))
    return max(2, coalesced_dims(layouts))


def _vllm_row_fields(cpu_op: dict | None, kernel_name: str) -> dict:
    """A vLLM per-row kernel's fields from its op's recorded shapes: ``silu_and_mul`` reads the
    largest tensor (``[tokens, 2 x width]``) and writes half of it; ``rope`` rotates the query and
    key tensors (its op's second and third arguments, after the positions), a row per token."""
    kernel = _VLLM_ROW_NAME.search(kernel_name).group(1)
    function = VLLM_ROW_FUNCTIONS[kernel]
    if function == "silu_and_mul" and "silu_kernel" not in kernel_name:
        raise UnsupportedEvent("vLLM's act_and_mul_kernel with an activation other than SiLU is not modelled")
    dims = _arg(cpu_op, "Input Dims", _is_shapes, SHAPES, [])
    types = _arg(cpu_op, "Input type", _is_texts, TYPES, [])
    tensors = [(i, d) for i, d in enumerate(dims) if d and not isinstance(d[0], list)]
    if not tensors:
        raise UnsupportedEvent(f"vLLM's {kernel} without its op's recorded shapes")
    if function == "silu_and_mul":
        index, shape = max(tensors, key=lambda item: math.prod(int(v) for v in item[1]))
        rows = math.prod(int(v) for v in shape[:-1])
        elements = math.prod(int(v) for v in shape) // 2
    else:
        if len(tensors) < 3:
            raise UnsupportedEvent(f"vLLM's {kernel} needs its positions, query and key shapes, got {dims}")
        (_, positions), (index, query), (_, key) = tensors[:3]
        rows = math.prod(int(v) for v in positions)
        elements = math.prod(int(v) for v in query) + math.prod(int(v) for v in key)
    if rows <= 0 or elements <= 0 or elements % rows:
        raise UnsupportedEvent(f"vLLM's {kernel}: {elements} values do not split into {rows} rows")
    return {"kind": "elementwise", "function": function, "elements": int(elements), "rows": int(rows),
            "dtype": _dtype(types[index] if index < len(types) else None), "index_dims": 0}


def _elementwise_fields(cpu_op: dict | None, kernel_name: str, grid, block) -> dict:
    """An element-wise kernel's fields: its function and element count from the op's recorded shapes
    (the largest tensor), else from the kernel's launch geometry.  A two-input function whose other
    operand is a scalar, a 0-d tensor or a broadcast of at most half the output's elements (``x *
    0.5``, an attention mask over the heads) reads one full tensor, so it runs as ``scale``."""
    base = _op_base(cpu_op["name"]) if cpu_op else ""
    if base.startswith("_foreach_"):
        base = base[len("_foreach_"):]
    function = ELEMENTWISE_FUNCTIONS.get(base)
    dims = _arg(cpu_op, "Input Dims", _is_shapes, SHAPES) if function is not None else None
    types = _arg(cpu_op, "Input type", _is_texts, TYPES, []) if function is not None else []
    if function is not None and dims:
        sizes = [_numel(d, t) for d, t in zip(dims, types + [None] * len(dims))]
        largest = max(range(len(sizes)), key=sizes.__getitem__)
        elements = sizes[largest]
        dtype = _dtype(types[largest] if largest < len(types) else None)
        opaque = _OPAQUE_TYPE.search(kernel_name)
        if opaque and (largest >= len(types) or types[largest] == "TensorList"):
            # a tensor list records no element type; the kernel's OpaqueType<bytes> has the size
            dtype = OPAQUE_DTYPES.get(int(opaque.group(1)), dtype)
        full_inputs = sum(1 for size in sizes if 2 * size > elements)
        if ELEMENTWISE_KINDS[function][0] == 2 and full_inputs < 2:
            function = "scale"
    else:
        elements = _grid_elements(kernel_name, grid, block)
        lowered = kernel_name.lower()
        dtype = "fp16" if "half" in lowered else "bf16" if "bfloat16" in lowered else "fp32"
        function = function or "copy"
    if elements <= 0:
        raise UnsupportedEvent(f"element count {elements} from shapes {dims}")
    if function == "gelu_erf" and _gelu_approximation(cpu_op) == "tanh":
        function = "gelu"
    return {"kind": "elementwise", "function": function, "elements": int(elements), "dtype": dtype,
            "index_dims": _index_dims(kernel_name, cpu_op)}


def _gelu_approximation(cpu_op: dict | None) -> str:
    """``aten::gelu``'s ``approximate`` argument from its recorded ``Concrete Inputs`` (``none``,
    PyTorch's default, where it is not recorded)."""
    concrete = _arg(cpu_op, "Concrete Inputs", _is_list, CONCRETE, [])
    texts = [str(value).strip().strip("'\"") for value in concrete]
    return "tanh" if "tanh" in texts else "none"


def _reduced_dims(base: str, cpu_op: dict, ndim: int) -> list[int] | None:
    """The dimensions a sum-like op reduces, from its recorded arguments (``None``: not recorded)."""
    position = REDUCED_DIMS_ARGUMENT.get(base)
    concrete = _arg(cpu_op, "Concrete Inputs", _is_list, CONCRETE, [])
    if position is None or len(concrete) <= position:
        return None
    text = str(concrete[position]).strip().strip("[]")
    try:
        dims = [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        return None
    return sorted({dim % ndim for dim in dims}) if dims else list(range(ndim))


def _reduction_fields(cpu_op: dict | None) -> dict:
    base = _op_base(cpu_op["name"]) if cpu_op else ""
    function = REDUCTION_OPS.get(base)
    dims = _arg(cpu_op, "Input Dims", _is_shapes, SHAPES, []) if function is not None else []
    if not dims or not dims[0] or isinstance(dims[0][0], list):
        op = cpu_op.get("name") if cpu_op else "no CPU op"
        raise UnsupportedEvent(f"a reduction kernel of {op} whose input shape is not recorded or not modelled")
    types = _arg(cpu_op, "Input type", _is_texts, TYPES, [])
    shape = dims[0]
    cols = shape[-1]
    rows = max(1, math.prod(shape) // max(cols, 1))
    reduced = _reduced_dims(base, cpu_op, len(shape)) if function == "sum" else None
    if reduced is not None and reduced == list(range(len(reduced))) and len(reduced) < len(shape):
        # leading dimensions: each output sums a column of the matrix the rest of the shape makes
        function, rows = "colsum", math.prod(shape[: len(reduced)])
        cols = math.prod(shape) // max(rows, 1)
    elif reduced is not None and reduced == list(range(len(shape) - len(reduced), len(shape))):
        cols = math.prod(shape[len(shape) - len(reduced):])  # trailing dimensions (all of them: one sum)
        rows = max(1, math.prod(shape) // max(cols, 1))
    if rows == 0 or cols == 0:
        raise UnsupportedEvent(f"{cpu_op['name']} over an empty tensor of shape {shape}")
    return {"kind": "reduction", "function": function, "rows": rows, "cols": cols,
            "dtype": _dtype(types[0] if types else None)}


def _attention_fields(cpu_op: dict | None, kernel_name: str) -> dict:
    """An attention row from the fused-attention op that launched the kernel.  The pass's helper
    kernels (split-KV combination, ``D = rowsum(dO O)``, the ``dQ`` conversion) are part of the
    row of its main kernel, which simulates them: they become zero-length delays."""
    if _ATTENTION_HELPER.search(kernel_name):
        return {"kind": "delay", "delay_s": 0.0}
    base = _op_base(cpu_op["name"]) if cpu_op else ""
    if base not in ATTENTION_OPS:
        op = cpu_op.get("name") if cpu_op else "no CPU op"
        raise UnsupportedEvent(f"a fused attention kernel launched by {op}, whose shapes gpusim cannot read")
    direction, layout, query, causal_at = ATTENTION_OPS[base]
    dims = _arg(cpu_op, "Input Dims", _is_shapes, SHAPES, [])
    types = _arg(cpu_op, "Input type", _is_texts, TYPES, [])
    concrete = _arg(cpu_op, "Concrete Inputs", _is_list, CONCRETE, [])
    if len(dims) <= query + 1 or len(concrete) <= causal_at or str(concrete[causal_at]) not in ("True", "False"):
        raise UnsupportedEvent(f"{cpu_op['name']}: shapes or is_causal not recorded (profile with record_shapes=True)")
    q, k = dims[query], dims[query + 1]
    if not (len(q) == 4 and len(k) == 4 and _is_sizes(q) and _is_sizes(k)):
        raise UnsupportedEvent(f"{cpu_op['name']} with input shapes {dims}: not four-dimensional queries and keys")
    if 0 in q or 0 in k:
        raise UnsupportedEvent(f"{cpu_op['name']} with input shapes {dims}: empty queries or keys")
    if layout == "bhsd":
        q, k = [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]]
    dtype = _dtype(types[query] if len(types) > query else None)
    if dtype not in ("fp16", "bf16"):
        raise UnsupportedEvent(f"{cpu_op['name']} on {dtype} tensors (the fused kernels take fp16 or bf16)")
    return {"kind": "attention", "function": direction, "batch": int(q[0]), "q_len": int(q[1]), "heads": int(q[2]),
            "head_dim": int(q[3]), "kv_len": int(k[1]), "kv_heads": int(k[2]), "causal": str(concrete[causal_at]) == "True",
            "dtype": dtype}


def _json_value(raw: object) -> object:
    """An argument the profiler may write as JSON text (``"[0, 1]"``) or as the value itself: the
    value; ``None`` for text that is not JSON."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


def _process_group(event: dict) -> list[int]:
    """The ranks of a collective's ``Process Group Ranks`` (JSON text such as ``"[0, 1]"``, or a list);
    ``[]`` when they are not recorded."""
    raw = event.get("args", {}).get("Process Group Ranks", "[]")
    ranks = _json_value(raw)
    if not _is_sizes(ranks) or len(set(ranks)) != len(ranks):
        raise MalformedEvent(event, "Process Group Ranks",
                             f"must list distinct ranks >= 0 (JSON text such as \"[0, 1]\"), got {_shown(raw)}")
    return ranks


def _collective_fields(event: dict, kernel_name: str, ranks: FileRanks, grid: list | None) -> dict:
    """A collective's fields from its NCCL kernel's arguments.  Its group is its ``Process Group Ranks``,
    which must contain the file's rank, on the GPUs :meth:`FileRanks.gpu` gives them (in increasing
    order when the file is read alone); where they are not recorded, the first ``Group size`` GPUs
    (else the whole job).  Its ``channels`` are the kernel's blocks (``grid``'s x), one per NCCL
    channel, where the trace records them."""
    raw = _arg(event, "Collective name", _is_text, "text", "").lower()
    collective = NCCL_COLLECTIVES.get(raw)
    if collective is None:
        raise UnsupportedEvent(f"collective {raw or short_name(kernel_name)!r} has no gpusim op")
    dtype_name = _arg(event, "dtype", _is_text, "text", "")
    dtype = NCCL_DTYPES.get(dtype_name.lower())
    if dtype is None:
        raise UnsupportedEvent(f"collective dtype {dtype_name!r} unknown" if dtype_name
                               else "collective dtype not recorded")
    count = "Out msg nelems" if collective == "allgather" else "In msg nelems"
    elements = _arg(event, count, lambda value: _is_whole(value) and value >= 0, "a whole number of elements >= 0", 0)
    if elements == 0:
        raise UnsupportedEvent("collective message size not recorded")
    group = _process_group(event)
    if group and ranks.rank not in group:
        raise MalformedEvent(event, "Process Group Ranks", f"must contain the file's rank {ranks.rank} (its "
                             f"distributedInfo.rank, else its position among the files), got {_shown(group)}")
    if group and ranks.alone:
        group = sorted(ranks.gpu(rank) for rank in group)
    if not group:
        size = _arg(event, "Group size", lambda value: _is_whole(value) and value >= 1, "a whole number >= 1")
        group = list(range(size or ranks.world_size))
    fields = {"kind": "collective", "collective": collective, "bytes": elements * DTYPE_BYTES[dtype],
              "dtype": dtype, "group": format_ints(group),
              "algorithm": "ring" if "ring" in kernel_name.lower() else "auto"}
    if grid:  # an NCCL/RCCL kernel runs one block per channel
        fields["channels"] = int(grid[0])
    if collective == "alltoall":
        sizes = DTYPE_BYTES[dtype]
        fields["_sends"] = _split_bytes(event, "In split size", elements, len(group), sizes)
        received = _arg(event, "Out msg nelems", lambda value: _is_whole(value) and value >= 0,
                        "a whole number of elements >= 0", 0)
        fields["_receives"] = _split_bytes(event, "Out split size", received, len(group), sizes) if received else None
    return fields


def _split_bytes(event: dict, field: str, elements: int, ranks: int, element_bytes: int) -> list[int] | None:
    """The bytes of each piece of an all-to-all's ``In split size`` or ``Out split size`` (JSON text
    such as ``"[3, 1]"``: ``all_to_all_single``'s split sizes, in rows of its tensor of ``elements``
    elements, one per rank of the group); ``None`` when not recorded (an even exchange).

    Raises
    ------
    UnsupportedEvent
        The profiler cut the list short (it keeps 30 sizes), so the pieces are unknown.
    MalformedEvent
        Sizes that are not whole numbers >= 0, not one per rank, or that do not divide the tensor
        into rows.
    """
    raw = event.get("args", {}).get(field)
    if raw in (None, "", "[]", []):
        return None
    if isinstance(raw, str) and "..." in raw:
        raise UnsupportedEvent(f"an all-to-all whose '{field}' the profiler cut short ({raw}): its pieces are unknown")
    splits = _json_value(raw)
    if not _is_sizes(splits) or len(splits) != ranks or not sum(splits) or elements % sum(splits):
        raise MalformedEvent(event, field, f"must list one whole number >= 0 of rows per rank of the group ({ranks}), "
                             f"adding up to a divisor of the {elements} elements exchanged, got {_shown(raw)}")
    row = elements // sum(splits)
    return [split * row * element_bytes for split in splits]


def _memcpy_fields(event: dict) -> dict:
    name = event.get("name", "")
    nbytes = _arg(event, "bytes", lambda value: _is_whole(value) and value >= 0, "a whole number of bytes >= 0", 0)
    if event.get("cat") == "gpu_memset":
        if nbytes == 0:
            raise UnsupportedEvent("memset size not recorded")
        return {"kind": "elementwise", "function": "fill", "elements": nbytes, "dtype": "int8"}
    if "DtoD" not in name and "Device -> Device" not in name:
        raise UnsupportedEvent("host-device copies are not modelled")
    if nbytes == 0:
        raise UnsupportedEvent("copy size not recorded")
    return {"kind": "elementwise", "function": "copy", "elements": nbytes, "dtype": "int8"}


def lower_event(event: dict, cpu_op: dict | None, launch: dict | None, ranks: FileRanks) -> dict:
    """Trace fields of one GPU activity.

    Raises
    ------
    UnsupportedEvent
        The activity cannot be modelled.
    MalformedEvent
        A field it reads (of the activity, its launch call or its CPU op) has the wrong type or range.
    """
    name = event.get("name", "")
    category = event.get("cat", "")
    klass = kernel_class(name, category)
    grid = _arg(event, "grid", _is_geometry, GEOMETRY) or _arg(launch, "grid", _is_geometry, GEOMETRY)
    block = _arg(event, "block", _is_geometry, GEOMETRY) or _arg(launch, "block", _is_geometry, GEOMETRY)
    if klass == "memcpy":
        return _memcpy_fields(event)
    if klass == "collective":
        return _collective_fields(event, name, ranks, grid)
    if klass == "gemm":
        fields = _gemm_fields(cpu_op, name)
        fields["kernel"] = library_kernel_of(name, math.prod(block) if block else None, DTYPE_BYTES[fields["dtype"]])
        return fields
    if klass == "reduction":
        fields = _reduction_fields(cpu_op)
        fields["kernel"] = "inductor" if name.startswith("triton") else "vllm" if "vllm::" in name else "pytorch"
        if fields["function"] == "colsum" and fields["kernel"] == "inductor":
            raise UnsupportedEvent("a Triton kernel summing columns (Inductor's column reductions are not modelled)")
        return fields
    if klass == "elementwise" and _VLLM_ROW_NAME.search(name):
        return _vllm_row_fields(cpu_op, name)
    if klass == "elementwise":
        return _elementwise_fields(cpu_op, name, grid, block)
    if klass == "attention":
        return _attention_fields(cpu_op, name)
    raise UnsupportedEvent("a kernel of no class gpusim models")


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""Trace event categories of GPU activities."""
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""Trace event categories of the host calls that launch them (HIP's too, under these names)."""


def launch_calls(events: list[dict]) -> dict:
    """The launch calls of a trace's events, by ``correlation`` id (a GPU activity carries the same id)."""
    return {e["args"]["correlation"]: e for e in events
            if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}


def load_json(path: Path) -> dict:
    """The parsed JSON of a Kineto trace (plain or gzipped), its events checked (:func:`_check_events`);
    :class:`TraceError` names the file (and the event) if it is not one."""
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable Kineto JSON trace: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    _check_events(data["traceEvents"], path)
    return data


def _event_error(path: Path, index: int, field: str, message: str, name: str | None = None) -> TraceError:
    event = f"event {index} ('{short_name(name)}')" if name else f"event {index}"
    return TraceError(f"{path}: {event}: field '{field}' {message}")


def _micros(event: dict, index: int, field: str, path: Path) -> float:
    """The timestamp or duration ``field`` of an event: a finite number (a duration >= 0), us."""
    if field not in event:
        raise _event_error(path, index, field, "is missing")
    value = event[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _event_error(path, index, field, f"must be a finite number of microseconds, got {value!r}")
    if field == "dur" and value < 0:
        raise _event_error(path, index, field, f"must be a duration >= 0 us, got {value!r}")
    if field == "dur" and value > MAX_SECONDS * 1e6:
        raise _event_error(path, index, field, f"must be a duration of at most {MAX_SECONDS * 1e6:g} us, got {value!r}")
    return float(value)


def _check_events(events: list, path: Path) -> None:
    """Check the events' structure; raises :class:`TraceError` naming the first bad event and field.

    Every event must be an object, with a text ``name`` and an object ``args`` when it has them.
    CPU ops, launch calls and GPU activities (the events the importer links) need whole-number
    ``External id`` and ``correlation`` ids where they have them, CPU ops a ``name``, and launch
    calls and GPU activities a finite ``ts`` (and a launch call's ``dur``, when it has one, a
    duration: :func:`_micros`).
    """
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(f"{path}: event {index}: must be a JSON object, got {json.dumps(event)[:80]}")
        if not isinstance(event.get("name", ""), str):
            raise _event_error(path, index, "name", f"must be text, got {event['name']!r}")
        if not isinstance(event.get("args", {}), dict):
            raise _event_error(path, index, "args", f"must be a JSON object, got {event['args']!r}")
        category = event.get("cat")
        if category not in ("cpu_op", *GPU_CATEGORIES, *LAUNCH_CATEGORIES):
            continue
        if category == "cpu_op" and "name" not in event:
            raise _event_error(path, index, "name", "is missing (a CPU op needs its operator's name)")
        args = event.get("args", {})
        for field in ("External id", "correlation"):
            if field in args and not _is_whole(args[field]):
                raise _event_error(path, index, field, f"must be a whole number (an id), got {_shown(args[field])}",
                                   event.get("name"))
        if category != "cpu_op":
            _micros(event, index, "ts", path)
        if category in LAUNCH_CATEGORIES and "dur" in event:
            _micros(event, index, "dur", path)


def _rank_field(info: dict, field: str, default: int, minimum: int, path: Path) -> int:
    value = info.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{path}: field 'distributedInfo.{field}' must be a whole number >= {minimum}, got {value!r}")
    return value


def _iteration_window(events: list[dict], iteration: int, path: Path) -> tuple[float, float]:
    name = f"ProfilerStep#{iteration}"
    for index, event in enumerate(events):
        if event.get("name") == name and event.get("cat") in ("user_annotation", "cpu_op") and "dur" in event:
            start = _micros(event, index, "ts", path)
            return start, start + _micros(event, index, "dur", path)
    steps = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    raise TraceError(f"{path}: no {name} annotation; the trace has {', '.join(steps) or 'none'}")


def _rows_of_file(path: Path, default_rank: int, alone: bool, unsupported: str,
                  iteration: int | None) -> tuple[list[dict], int]:
    """The rows of one file and its rank (``alone``: the only file read, see :class:`FileRanks`)."""
    data = load_json(path)
    events = data["traceEvents"]
    info = data.get("distributedInfo") or {}
    if not isinstance(info, dict):
        raise TraceError(f"{path}: field 'distributedInfo' must be a JSON object, got {info!r}")
    ranks = FileRanks(_rank_field(info, "rank", default_rank, 0, path), _rank_field(info, "world_size", 1, 1, path),
                      alone)
    try:
        rows = _rows_of_events(events, path, ranks, unsupported, iteration)
    except MalformedEvent as exc:
        index = next(index for index, event in enumerate(events) if event is exc.event)
        raise _event_error(path, index, exc.field, exc.message, exc.event.get("name")) from None
    return rows, ranks.rank


def _check_one_device(gpu_events: list[tuple[int, dict]], path: Path) -> None:
    """Raise :class:`TraceError` naming the devices when the GPU activities ran on more than one
    ``args.device`` (raises :class:`MalformedEvent` for a ``device`` that is not a GPU index)."""
    counts: dict[int, int] = {}
    for _, event in gpu_events:
        device = _arg(event, "device", lambda value: _is_whole(value) and value >= 0, "a GPU index (a whole number >= 0)")
        if device is not None:
            counts[device] = counts.get(device, 0) + 1
    if len(counts) > 1:
        found = ", ".join(f"{device} ({count} activit{'y' if count == 1 else 'ies'})"
                          for device, count in sorted(counts.items()))
        raise TraceError(f"{path}: field 'device': the GPU activities ran on devices {found}; a file is one rank's "
                         "trace on one GPU (PyTorch's profiler writes one per process), and gpusim cannot tell which "
                         "ranks these devices were: profile one process per GPU and read their files together")


def _rows_of_events(events: list[dict], path: Path, ranks: FileRanks, unsupported: str,
                    iteration: int | None) -> list[dict]:
    """The rows of a file's GPU activities (raises :class:`MalformedEvent` for a field of the wrong type)."""
    cpu_ops = {e["args"]["External id"]: e for e in events
               if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    launches = launch_calls(events)
    gpu_events = [(index, e) for index, e in enumerate(events)
                  if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X"]
    if iteration is not None:
        begin, end = _iteration_window(events, iteration, path)

        def launched_in(event: dict) -> bool:
            launch = launches.get(event.get("args", {}).get("correlation"))
            moment = float(launch["ts"]) if launch else float(event["ts"])
            return begin <= moment <= end

        gpu_events = [(index, e) for index, e in gpu_events if launched_in(e)]
    if not gpu_events:
        if iteration is not None:
            raise TraceError(f"{path}: no GPU kernels in that iteration")
        found = sorted({str(e.get("cat")) for e in events if e.get("ph") == "X"})
        shown = ", ".join(found[:8]) + (", ..." if len(found) > 8 else "") if found else "none"
        raise TraceError(f"{path}: no GPU kernels (events of category {', '.join(repr(c) for c in GPU_CATEGORIES)}); "
                         f"its complete events' categories: {shown}. Profile with "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    _check_one_device(gpu_events, path)
    gpu_events.sort(key=lambda item: float(item[1]["ts"]))
    rows = []
    for index, event in gpu_events:
        args = event.get("args", {})
        cpu_op = cpu_ops.get(args.get("External id"))
        launch = launches.get(args.get("correlation"))
        klass = kernel_class(event.get("name", ""), event.get("cat", ""))
        label = f"{cpu_op['name']} | {short_name(event.get('name', ''))}" if cpu_op else short_name(event.get("name", ""))
        start, duration = float(event["ts"]), _micros(event, index, "dur", path)
        stream = _arg(event, "stream", _is_whole, "a whole number (the stream's id)", 0)
        row = {"gpu": ranks.gpu(ranks.rank), "stream": f"stream{stream}", "name": label,
               "measured_s": duration * 1e-6, "kernel_class": klass, "_event": index,
               "_start_us": start, "_end_us": start + duration,
               "_launch_us": float(launch["ts"]) if launch else start,
               "_return_us": float(launch["ts"]) + float(launch.get("dur", 0.0)) if launch else math.nan}
        try:
            row.update(lower_event(event, cpu_op, launch, ranks))
        except UnsupportedEvent as exc:
            if unsupported == "error":
                raise UnsupportedTraceError(
                    f"{path}: event {index} ('{short_name(event.get('name', ''))}' at ts {event.get('ts')} us): "
                    f"field 'name': cannot be modelled: {exc}", "such kernels as delays of their measured duration",
                    "read_kineto(..., unsupported='delay')",
                ) from None
            row.update(kind="delay", delay_s=row["measured_s"], _reason=str(exc))
        rows.append(row)
    return rows


def _tensor_bytes(row: dict) -> tuple[int | None, int | None]:
    """Bytes of the main tensor a modelled row reads and of the tensor it writes (``None``: none
    that a neighbouring kernel could share; :func:`_infer_dataflow`)."""
    kind = row.get("kind")
    if kind not in ("gemm", "elementwise", "reduction"):
        return None, None
    size = DTYPE_BYTES[row["dtype"]]
    if kind == "gemm":
        return None, row["m"] * row["n"] * row.get("batch", 1) * size
    if kind == "elementwise":
        nbytes = row["elements"] * size
        reads = nbytes * ELEMENTWISE_INPUT_WIDTH.get(row["function"], 1)
        return (reads if ELEMENTWISE_KINDS[row["function"]][0] else None), nbytes
    nbytes = row["rows"] * row["cols"] * size
    return nbytes, row["rows"] * size if row["function"] == "sum" else nbytes


def _infer_dataflow(rows: list[dict]) -> None:
    """Name the tensors that consecutive kernels of a stream share.

    A profiler trace records shapes, not tensors.  Eager PyTorch mostly runs a kernel on the output
    of the kernel just before it on the same stream (an activation function's chain of element-wise
    ops, a normalisation after a GEMM), which a real GPU then reads from its L2.  So every GEMM,
    element-wise and reduction row writes a named tensor (``t<op_id>``), and an element-wise or
    reduction row whose main input has exactly the byte size of its stream predecessor's output reads
    that tensor (its first input); any other input is private.  A row of another kind breaks the
    chain.  Without it (the default of :func:`read_kineto`) every input is private.
    """
    previous: dict[str, tuple[str, int] | None] = {}  # stream -> (name, bytes) of its last output
    for row in rows:
        stream = row["stream"]
        reads, writes = _tensor_bytes(row)
        if writes is None:
            previous[stream] = None
            continue
        before = previous.get(stream)
        if reads is not None and before is not None and before[1] == reads:
            row["inputs"] = before[0]
        # a rotary embedding rotates its input in place: its output is the tensor it read
        in_place = row.get("function") == "rope" and row.get("inputs")
        row["output"] = row["inputs"] if in_place else f"t{row['op_id']}"
        previous[stream] = (row["output"], writes)


def _infer_dependencies(rows: list[dict]) -> None:
    """Give each row the op_id of the other stream's kernel it waited for (see the module doc)."""
    by_stream: dict[str, list[dict]] = {}
    for row in rows:
        row["deps"] = ""
        by_stream.setdefault(row["stream"], []).append(row)
    ends = {stream: [row["_end_us"] for row in lane] for stream, lane in by_stream.items()}
    for stream, lane in by_stream.items():
        previous_end = -math.inf
        for row in lane:
            could_start = max(row["_launch_us"], previous_end)
            previous_end = max(previous_end, row["_end_us"])
            if row["_start_us"] - could_start <= LAUNCH_SLACK_US:
                continue
            best = None
            for other, other_lane in by_stream.items():
                if other == stream:
                    continue
                index = bisect.bisect_right(ends[other], row["_start_us"] + 1e-9) - 1
                if index >= 0 and (best is None or other_lane[index]["_end_us"] > best["_end_us"]):
                    best = other_lane[index]
            if best is not None and row["_start_us"] - best["_end_us"] <= WAIT_SLACK_US:
                row["deps"] = str(best["op_id"])


COLLECTIVE_SOURCES = {"collective": "Collective name", "dtype": "dtype", "bytes": "In msg nelems", "algorithm": "name"}
"""The kernel field each collective field of a row comes from (an all-gather's bytes: ``Out msg nelems``)."""


def _check_same_collective(path: Path, row: dict, first_path: Path, first: dict, count: int) -> None:
    """Raise :class:`TraceError` unless a collective ``row`` of ``path`` has the fields of the same
    collective (the ``count``-th of its group) in the first file that ran it, ``first_path``."""
    for column, source in COLLECTIVE_SOURCES.items():
        if column == "bytes" and (row.get("_sends") or first.get("_sends")):
            continue  # an all-to-all's ranks may send different amounts: _resolve_all_to_alls checks them
        if row[column] != first[column]:
            if column == "bytes" and row["collective"] == "allgather":
                source = "Out msg nelems"
            raise TraceError(
                f"{path}: event {row['_event']} ('{row['name']}'): field '{source}': "
                f"collective {count + 1} of group {row['group']} has {column} {row[column]!r} here, but "
                f"{first[column]!r} in {first_path} (event {first['_event']}); every rank runs the same collectives, "
                "of the same sizes, in the same order"
            )


def _resolve_all_to_alls(all_to_alls: dict[int, list[tuple[Path, dict]]], alone: bool) -> list[dict]:
    """Give the all-to-alls whose ranks' split sizes differ (all-to-allv) their ``send_bytes``,
    taking each rank's ``In split size`` in the group's order, and as ``bytes`` the most any rank
    sends or receives; an exchange whose every rank sends equal pieces stays an even one.  Pops
    the rows' private ``_sends`` and ``_receives``.

    Returns
    -------
    list of dict
        The uneven all-to-alls replayed as even exchanges of their rank's total because only one
        rank's file was read (``op_id``, ``gpu``, ``name``, ``send_bytes``): every rank then does
        what the file's rank did, as in symmetric replay.

    Raises
    ------
    TraceError
        An uneven exchange with a rank whose split sizes were not recorded, or whose received pieces
        (``Out split size``) are not what the others sent it, naming the file, event and field.
    """
    even = []
    for op_id, members in all_to_alls.items():
        sends = {row["gpu"]: row.pop("_sends") for _, row in members}
        receives = {row["gpu"]: row.pop("_receives") for _, row in members}
        if len({piece for sent in sends.values() if sent is not None for piece in sent}) < 2:
            continue  # every recorded piece alike: an even exchange
        if alone:
            row = members[0][1]
            even.append({"op_id": op_id, "gpu": row["gpu"], "name": row["name"], "send_bytes": sends[row["gpu"]]})
            continue
        group = [int(rank) for rank in members[0][1]["group"].split()]
        for path, row in members:
            if sends[row["gpu"]] is None:
                raise TraceError(f"{path}: event {row['_event']} ('{row['name']}'): field 'In split size' is not "
                                 f"recorded, but other ranks of this all-to-all send uneven pieces; every rank's are needed")
        missing = sorted(set(group) - set(sends))
        if missing:
            path, row = members[0]
            raise TraceError(f"{path}: event {row['_event']} ('{row['name']}'): field 'Process Group Ranks': an uneven "
                             f"all-to-all needs every rank's file, but ranks {format_ints(missing)} of its group were not read")
        matrix = [sends[rank] for rank in group]
        for path, row in members:
            column = [sent[group.index(row["gpu"])] for sent in matrix]
            received = receives[row["gpu"]]
            if received is not None and received != column:
                raise TraceError(f"{path}: event {row['_event']} ('{row['name']}'): field 'Out split size': this rank "
                                 f"receives {format_ints(received)} bytes from the ranks {format_ints(group)}, but they "
                                 f"send it {format_ints(column)} (their 'In split size')")
        largest = max(max(sum(sent) for sent in matrix), max(sum(column) for column in zip(*matrix)))
        for _, row in members:
            row["send_bytes"] = format_ints(sends[row["gpu"]])
            row["bytes"] = largest
    return even


def read_kineto(paths: str | os.PathLike | Sequence[str | os.PathLike], *, unsupported: str = "error",
                iteration: int | None = None, dataflow: bool = True) -> Trace:
    """Read PyTorch profiler traces (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Parameters
    ----------
    paths
        One trace, or one per rank (ranks from ``distributedInfo``, else the list order).  A single
        file's kernels are put on GPU 0 whatever its rank, to be replayed in symmetric mode: its rank
        and rank 0 swap numbers in its collectives' process groups, which keeps every group's members
        (rank 2's group ``[2, 3]`` becomes ``0 3``; ``[0, 1, 2, 3]`` stays ``0 1 2 3``).  A
        collective's recorded group must contain its file's rank.  Each file holds one GPU's
        activities (one ``args.device``); several devices in a file are an error naming them.
    unsupported
        ``"error"``: a kernel that cannot be modelled is an error naming it; ``"delay"``: it is
        replayed as a delay of its measured duration (``kind == "delay"``, its ``kernel_class``
        kept).
    iteration
        Keep only the kernels launched during ``ProfilerStep#iteration``.
    dataflow
        Let a kernel read its stream predecessor's output where the sizes match
        (:func:`_infer_dataflow`), so that it finds that tensor in the L2 where the model's L2
        holds it (the default since stop 20, when the Hopper presets' L2 learned the capacity it
        keeps for shared data: docs/traces.md); ``False``: every kernel reads private, cold inputs.

    Returns
    -------
    Trace
        Rows with ``measured_s``; a single-rank trace of a multi-rank job replays in symmetric mode.

    Raises
    ------
    gpusim.errors.ConfigError
        ``unsupported``, ``iteration`` or ``dataflow`` is not one of the values above.
    gpusim.errors.TraceError
        A file that is not a Kineto trace, or a malformed event (naming the file, event and field).
    gpusim.errors.UnsupportedTraceError
        With ``unsupported="error"``, a kernel that cannot be modelled.
    """
    if unsupported not in ("error", "delay"):
        raise ConfigError(f"read_kineto(): unsupported must be 'error' or 'delay', got {unsupported!r}")
    if iteration is not None and as_int(iteration) is None:
        raise ConfigError(f"read_kineto(): iteration must be the whole number N of a ProfilerStep#N or None, "
                          f"got {iteration!r}")
    if not isinstance(dataflow, bool):
        raise ConfigError(f"read_kineto(): dataflow must be True or False, got {dataflow!r}")
    many = isinstance(paths, Sequence) and not isinstance(paths, (str, bytes))
    files = [Path(p) for p in (paths if many else [paths])]
    if not files:
        raise TraceError("read_kineto(): no trace files given")
    rows: list[dict] = []
    collectives: dict[tuple[str, int], tuple[Path, dict]] = {}  # (group, count): the first file's row
    all_to_alls: dict[int, list[tuple[Path, dict]]] = {}  # op_id: each file's row
    next_id = 0
    for order, path in enumerate(files):
        file_rows, rank = _rows_of_file(path, order, len(files) == 1, unsupported, iteration)
        if len(files) > 1:
            ranks = {row["gpu"] for row in rows}
            if rank in ranks:
                raise TraceError(f"{path}: rank {rank} appears in two files")
        seen: dict[str, int] = {}
        for row in file_rows:
            if row.get("kind") == "collective":
                group = row["group"]
                count = seen.get(group, 0)
                seen[group] = count + 1
                key = (group, count)
                if key in collectives:
                    _check_same_collective(path, row, *collectives[key], count)
                    row["op_id"] = collectives[key][1]["op_id"]
                else:
                    next_id += 1
                    row["op_id"] = next_id
                    collectives[key] = (path, row)
                if row["collective"] == "alltoall":
                    all_to_alls.setdefault(row["op_id"], []).append((path, row))
            else:
                next_id += 1
                row["op_id"] = next_id
        _infer_dependencies(file_rows)
        if dataflow:
            _infer_dataflow(file_rows)
        rows.extend(file_rows)
    even_all_to_alls = _resolve_all_to_alls(all_to_alls, alone=len(files) == 1)
    not_modelled = [{"op_id": row["op_id"], "gpu": row["gpu"], "name": row["name"], "kernel_class": row["kernel_class"],
                     "reason": row.pop("_reason")} for row in rows if "_reason" in row]
    frame = pd.DataFrame(rows)
    spans = frame.groupby("gpu").agg(start=("_start_us", "min"), end=("_end_us", "max"))
    measured_span_s = {int(gpu): (row.end - row.start) * 1e-6 for gpu, row in spans.iterrows()}
    first_launch = frame["_launch_us"].where(frame["_return_us"].notna()).groupby(frame["gpu"]).transform("min")
    frame["issue_s"] = (frame["_return_us"] - first_launch) * 1e-6
    frame = frame.drop(columns=["_start_us", "_end_us", "_launch_us", "_return_us", "_event"])
    source = str(files[0]) if len(files) == 1 else f"{files[0]} (+{len(files) - 1} ranks)"
    metadata = {"importer": "kineto", "files": [str(f) for f in files], "unsupported": unsupported,
                "iteration": iteration, "dataflow": dataflow, "measured_span_s": measured_span_s, "not_modelled": not_modelled,
                "even_all_to_alls": even_all_to_alls}
    return Trace(frame, source=source, metadata=metadata)
