"""Operators that gpusim can simulate: the public vocabulary of ``gpusim.run``.

Every op validates its parameters on construction and raises :class:`gpusim.errors.OpError`
naming the field and what was expected.  Ops name tensors by string (``out="c"``); a later op that
names the same tensor reads the same memory (and may hit in the L2).  Unnamed tensors are private.
Compute ops run on every rank in ``ranks`` (default: all); collectives span ``ranks``.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from gpusim.checks import as_int, as_real, as_sequence, is_one_of, one_of, positive_int
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import OpError

if TYPE_CHECKING:
    from gpusim.kernels.gemm import GemmKernelSpec
    from gpusim.sched.executor import OpContext

_ids = itertools.count()


def _positive_int(op: str, name: str, value: object) -> int:
    return positive_int(f"field '{name}'", value, op, OpError)


def _bool(op: str, name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise OpError(f"{op}: field '{name}' must be True or False, got {value!r}")
    return bool(value)


def _check_dtype(op: str, dtype: object) -> None:
    one_of("field 'dtype'", dtype, DTYPE_BYTES, op, OpError)


def _check_whole_elements(op: str, field: str, nbytes: int, dtype: str) -> None:
    """A collective moves whole elements (NCCL counts them): ``nbytes`` must be a multiple of the
    dtype's size."""
    size = DTYPE_BYTES[dtype]
    if nbytes % size:
        raise OpError(f"{op}: field {field!r} must be a whole number of {dtype} elements ({size} bytes each), "
                      f"got {nbytes} bytes")


def _ranks(op: str, ranks: object) -> tuple[int, ...] | None:
    if ranks is None:
        return None
    items = as_sequence(ranks)
    if not items:
        raise OpError(f"{op}: field 'ranks' must be a non-empty list of GPU indices, got {ranks!r}")
    indices = [as_int(rank) for rank in items]
    for rank, index in zip(items, indices):
        if index is None or index < 0:
            raise OpError(f"{op}: field 'ranks' must hold non-negative integers, got {rank!r}")
    if len(set(indices)) != len(indices):
        raise OpError(f"{op}: field 'ranks' repeats a GPU: {indices}")
    return tuple(indices)


@dataclass
class Op:
    """Base of all operators.

    Attributes
    ----------
    name
        Label in results (default: derived from the op).
    ranks
        GPUs it runs on (``None``: all GPUs of the system); stored as a tuple of ints.
    category
        (class attribute) ``gemm``, ``elementwise``, ``reduction``, ``collective``... as in results.
    symmetric
        (class attribute) Whether symmetric mode can simulate it, i.e. every rank does the same work.
    uid
        A number that identifies this op object (and its execution in results, see :meth:`copy`).
    """

    name: str | None = field(default=None, kw_only=True)
    ranks: tuple[int, ...] | list[int] | None = field(default=None, kw_only=True)
    category: ClassVar[str] = "op"
    symmetric: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for spec in fields(self):  # the name and the tensor names (and a GEMM's kernel)
            value = getattr(self, spec.name)
            if spec.type == "str | None" and value is not None and not (isinstance(value, str) and value):
                raise OpError(f"{type(self).__name__}: field '{spec.name}' must be a non-empty string or None, "
                              f"got {value!r}")
        self.ranks = _ranks(type(self).__name__, self.ranks)
        self.uid = next(_ids)

    def copy(self) -> Op:
        """The same op with its own :attr:`uid`, for a second execution of this op in one run
        (its own row in results, and collective state that is not shared with the first)."""
        clone = copy.copy(self)
        clone.uid = next(_ids)
        return clone

    @property
    def label(self) -> str:
        """Name shown in results."""
        return self.name or self.describe()

    def describe(self) -> str:
        """A short description of the op's parameters."""
        return self.category

    def run_on(self, ctx: OpContext):
        """The generator that executes this op on one rank (defined by each op)."""
        raise NotImplementedError


def _check_gemm_options(gemm: GemmShape | GroupedGemm) -> GemmKernelSpec | None:
    """Check a GEMM op's dtype, transposes (made bools) and named kernel; return that kernel's spec
    (``None`` when it names none)."""
    op = type(gemm).__name__
    _check_dtype(op, gemm.dtype)
    gemm.trans_a = _bool(op, "trans_a", gemm.trans_a)
    gemm.trans_b = _bool(op, "trans_b", gemm.trans_b)
    if gemm.kernel is None:
        return None
    from gpusim.kernels.gemm import find_spec

    try:
        return find_spec(gemm.kernel)
    except OpError as exc:
        raise OpError(f"{op}: field 'kernel': {exc}") from None


@dataclass
class GemmShape(Op):
    """The operands of a GEMM, C[m, n] = A[m, k] @ B[k, n] (``batch`` times, strided batched):
    the fields, their validation and the FLOP count that :class:`Gemm` and
    fused GEMMs (:class:`GemmReduceScatter`, :class:`GemmAllGather`, :class:`GemmAllToAll`) share.

    Attributes
    ----------
    m, n, k
        Dimensions (positive integers).
    dtype
        Input and output dtype; accumulation is fp32.
    trans_a, trans_b
        Whether A / B are stored transposed (bools), in row-major (PyTorch/NumPy) terms: A is
        ``[m, k]`` or, transposed, ``[k, m]``; B is ``[k, n]`` or ``[n, k]``.  (A column-major
        cuBLAS call with ``op(A) = N`` is ``trans_a=True`` here.)  The layout decides the
        contiguous runs of the panels the GEMM loads, and so its DRAM row activations.
    batch
        Batch count.
    a, b, out
        Tensor names (optional).
    kernel
        Force a kernel implementation by name (e.g. ``"MT128x128x32_T256"``, one of
        :data:`gpusim.kernels.gemm.KNOWN_TILES`, optionally a fallback kernel's access width ``_V1``..``_V8``
        and a split-K suffix ``_SK2``..``_SK16``); default: the library heuristic's choice.  On a GPU
        with a fallback family, a named kernel runs as its fallback variant where the operands'
        rows are not 16-byte aligned (:func:`gpusim.kernels.gemm.for_operands`).  A kernel whose
        workgroup fits on no CU of the GPU is an error when the op runs.
    """

    m: int
    n: int
    k: int
    dtype: str = "fp16"
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    a: str | None = None
    b: str | None = None
    out: str | None = None
    kernel: str | None = None

    def __post_init__(self) -> None:
        op = type(self).__name__
        for name in ("m", "n", "k", "batch"):
            setattr(self, name, _positive_int(op, name, getattr(self, name)))
        _check_gemm_options(self)
        super().__post_init__()

    @property
    def flops(self) -> float:
        """2 m n k batch."""
        return 2.0 * self.m * self.n * self.k * self.batch

    def _shape_text(self) -> str:
        """``m x n x k[x batch] dtype``, and ``A^T`` / ``B^T`` for an operand stored transposed (the
        layout changes the kernel's memory traffic, so two GEMMs that differ only in it differ here)."""
        batch = f"x{self.batch}" if self.batch > 1 else ""
        transposed = "".join(f" {operand}^T" for operand, flag in (("A", self.trans_a), ("B", self.trans_b)) if flag)
        return f"{self.m}x{self.n}x{self.k}{batch} {self.dtype}{transposed}"


@dataclass
class Gemm(GemmShape):
    """C[m, n] = A[m, k] @ B[k, n] (``batch`` times, strided batched); fields as in :class:`GemmShape`."""

    category: ClassVar[str] = "gemm"

    def describe(self) -> str:
        return f"gemm {self._shape_text()}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.gemm import execute_gemm

        return execute_gemm(ctx, self)


@dataclass
class GroupedGemm(Op):
    """Several GEMMs of different shapes in one kernel (CUTLASS's grouped GEMM, as mixture-of-experts
    layers run their experts): problem ``i`` is ``C_i[m, n] = A_i[m, k] @ B_i[k, n]`` for the
    ``i``-th ``(m, n, k)`` of ``shapes``, each with its own operands, packed one after another in
    ``a``, ``b`` and ``out``.  The kernel's workgroups cover every problem's tiles, problem after
    problem, with one tile shape and no K split.

    Attributes
    ----------
    shapes
        ``(m, n, k)`` of every problem (positive integers; at least one problem).
    dtype, trans_a, trans_b, a, b, out
        As :class:`GemmShape`'s, for every problem.
    kernel
        Force the tile by name, as :class:`GemmShape`'s (without a split-K suffix); default: the
        library heuristic's unsplit choice for the group
        (:func:`gpusim.kernels.gemm.choose_grouped_kernel`).
    """

    shapes: tuple[tuple[int, int, int], ...]
    dtype: str = "fp16"
    trans_a: bool = False
    trans_b: bool = False
    a: str | None = None
    b: str | None = None
    out: str | None = None
    kernel: str | None = None
    category: ClassVar[str] = "gemm"

    def __post_init__(self) -> None:
        problems = as_sequence(self.shapes)
        if not problems:
            raise OpError(f"GroupedGemm: field 'shapes' must list the (m, n, k) of at least one problem, "
                          f"got {self.shapes!r}")
        shapes = []
        for i, shape in enumerate(problems):
            dims = as_sequence(shape)
            if dims is None or len(dims) != 3 or any(as_int(dim) is None or dim < 1 for dim in dims):
                raise OpError(f"GroupedGemm: problem {i} of field 'shapes' must be three positive integers "
                              f"(m, n, k), got {shape!r}")
            shapes.append(tuple(int(dim) for dim in dims))
        self.shapes = tuple(shapes)
        spec = _check_gemm_options(self)
        if spec is not None and spec.split_k > 1:
            raise OpError(f"GroupedGemm: field 'kernel' must not split K (a grouped GEMM does not), "
                          f"got {self.kernel!r}")
        super().__post_init__()

    @property
    def flops(self) -> float:
        """2 m n k of every problem."""
        return sum(2.0 * m * n * k for m, n, k in self.shapes)

    def describe(self) -> str:
        rows = sum(m for m, _, _ in self.shapes)
        return f"grouped gemm {len(self.shapes)} problems, {rows} rows, {self.dtype}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.gemm import execute_grouped_gemm

        return execute_grouped_gemm(ctx, self)


FUSED_ALGORITHMS = ("ring", "direct", "auto")
"""Algorithms of T3's fused collectives (``auto`` is ring, or direct for an all-to-all)."""


@dataclass
class FusedGemm(GemmShape):
    """A GEMM fused with a collective of its output over ``ranks`` (T3, dissertation chapter 8): what
    :class:`GemmReduceScatter`, :class:`GemmAllGather` and :class:`GemmAllToAll` share.

    Attributes
    ----------
    algorithm
        One of the subclass's ``algorithms``.
    collective
        (class attribute) The collective fused with the GEMM.
    algorithms
        (class attribute) The algorithms it accepts.
    """

    algorithm: str = "auto"
    category: ClassVar[str] = "fused"
    collective: ClassVar[str] = "collective"
    algorithms: ClassVar[tuple[str, ...]] = FUSED_ALGORITHMS

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("field 'algorithm'", self.algorithm, self.algorithms, type(self).__name__, OpError)

    @property
    def nbytes(self) -> int:
        """Bytes of one rank's GEMM output, C[m, n] (``batch`` times)."""
        return self.m * self.n * self.batch * DTYPE_BYTES[self.dtype]

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.fused import execute_fused_gemm

        return execute_fused_gemm(ctx, self)


@dataclass
class GemmReduceScatter(FusedGemm):
    """A GEMM fused with the reduce-scatter of its output over ``ranks`` (T3, dissertation chapter 8).

    The GEMM's output address space is configured so that its stores start the collective: the
    first chunk each GPU produces goes straight to a peer's memory, later chunks are written
    locally as near-memory updates, counted by the tracker and sent on by pre-programmed DMAs.
    Every rank ends with its reduced chunk of C (``m * n * dtype bytes / len(ranks)``), as after
    :class:`ReduceScatter`; ``nbytes`` is the whole C.  Combine with ``memory_policy="t3-mca"``
    for T3-MCA.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, batch, a, b, out, kernel
        The GEMM, as in :class:`GemmShape`.  A split-K kernel (named, or the heuristic's choice)
        stores each split's partial tile as a near-memory update, with no reduction kernel, and the
        tracker waits for every partial (dissertation section 8.6.7).
    algorithm
        ``ring`` (ring reduce-scatter over the node's ring order), ``direct`` (every GPU updates
        every other's chunk over its own link; fully connected nodes) or ``auto`` (ring).
    stagger
        Rotate each GPU's workgroup order so that GPU i produces the chunk its ring step needs
        (without it every GPU produces chunks in the same order).
    """

    stagger: bool = True
    collective: ClassVar[str] = "reducescatter"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.stagger = _bool("GemmReduceScatter", "stagger", self.stagger)

    def describe(self) -> str:
        return f"gemm+rs {self._shape_text()}"


@dataclass
class GemmAllGather(FusedGemm):
    """A GEMM fused with the all-gather of its output over ``ranks`` (T3's track and trigger
    applied to an all-gather, dissertation sections 8.3 and 8.6).

    Each rank's GEMM computes its own shard, C[m, n] (``nbytes``).  Its stores write the shard into
    the rank's slot of the gathered output and, at once, into the next rank's copy of that slot
    (``ring``) or into every rank's (``direct``).  In a ring, the tracker counts the stores that
    arrive in a slot, and a pre-programmed DMA forwards each complete tile to the next rank until
    the shard has gone round.  Every rank ends with all ``len(ranks)`` shards, in ring (or group)
    order, as after :class:`AllGather`.  Combine with ``memory_policy="t3-mca"`` for T3-MCA.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, batch, a, b, out, kernel
        Each rank's GEMM, as in :class:`GemmShape` (whole output tiles: plain stores cannot add a
        split-K kernel's partials); ``out`` names the gathered output.
    algorithm
        ``ring`` (over the node's ring order), ``direct`` (every GPU stores its shard into every
        other over its own link; fully connected nodes) or ``auto`` (ring).
    """

    collective: ClassVar[str] = "allgather"

    def describe(self) -> str:
        return f"gemm+ag {self._shape_text()}"


@dataclass
class GemmAllToAll(FusedGemm):
    """A GEMM fused with the all-to-all of its output over ``ranks`` (T3's address-space mapping
    applied to an all-to-all, dissertation section 8.6.1; expert parallelism's exchange).

    Each rank's GEMM output C[m, n] (``nbytes``) is cut into ``len(ranks)`` chunks in the order the
    GEMM produces its tiles; chunk ``j`` belongs to rank ``j``.  Its stores go straight into that
    rank's memory (they are not written locally), where they land at the sender's place: every rank
    ends with chunk ``r`` of every rank ``s`` at place ``s`` (``m * n * batch`` elements in all), as
    after :class:`AllToAll`.  Every GPU needs a direct link (or a switch) to every other.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, batch, a, b, out, kernel
        Each rank's GEMM, as in :class:`GemmShape`; ``out`` names the exchanged output.
    algorithm
        ``direct`` or ``auto`` (direct).
    """

    collective: ClassVar[str] = "alltoall"
    algorithms: ClassVar[tuple[str, ...]] = ("direct", "auto")

    def describe(self) -> str:
        return f"gemm+a2a {self._shape_text()}"


@dataclass
class _RowChunkedGemm(GemmShape):
    """A GEMM overlapped with a ring collective whose chunks are cut along M, so ``batch`` must be 1."""

    category: ClassVar[str] = "fused"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch != 1:
            raise OpError(f"{type(self).__name__}: field 'batch' must be 1 (chunks are cut along M), got {self.batch}")


@dataclass
class _DecomposedGemm(_RowChunkedGemm):
    """What a GEMM overlapped with a ring collective by decomposition takes besides the GEMM: the
    ring's ``channels`` and its ``driver``."""

    channels: int | None = None
    driver: str = "cu"

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        one_of("field 'driver'", self.driver, ("cu", "dma"), owner, OpError)
        if self.channels is not None:
            self.channels = _positive_int(owner, "channels", self.channels)


@dataclass
class DecomposedGemmReduceScatter(_DecomposedGemm):
    """A GEMM and the ring reduce-scatter of its output, overlapped in software by decomposition.

    What software can do without T3's hardware (Wang et al., ASPLOS 2023, the dissertation's
    "Google Decomposition"; Transformer Engine's communication overlap), the rival of
    :class:`GemmReduceScatter`: the GEMM is cut along M into one chunk per rank, run as one kernel per
    chunk in the order the ring reduce-scatter needs them, and a CU-driven ring reduce-scatter on
    ``channels`` CUs of its own runs beside them; each of its steps reads its local chunk once that
    chunk's kernel has finished.  The GEMM kernels get the stream's other CUs.  Every rank ends with
    its reduced chunk, as after :class:`ReduceScatter`.  ``m`` must split evenly over the ranks.
    Every channel of the reduce-scatter takes one ring, the order the chunks are produced in (as
    software's ring exchange does): on a fully connected or hybrid cube-mesh node, where a plain
    reduce-scatter spreads its channels over several rings, only that ring's links carry it.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, a, b, kernel
        The whole GEMM, as in :class:`GemmShape` (``batch`` must be 1; a named ``kernel`` runs every
        chunk).  CU-driven, each chunk's kernel is a plain GEMM, which the library may split along K
        (its reduction kernel then writes the chunk before the ring reads it); DMA-driven, the
        kernels store their tiles as near-memory updates, and a K split's partial tiles add in
        place (no reduction kernel).
    out
        Name of the reduce-scatter's output.
    channels
        CUs of the reduce-scatter (default: the node's ``collectives.cus``, fewer for small chunks).
    driver
        ``"cu"``: the reduce-scatter is a kernel on ``channels`` CUs; ``"dma"``: the DMA engines
        send each chunk once its kernel has finished and the previous rank's update of it has
        arrived, and the GEMM's stores and the incoming chunks are near-memory updates (needs
        ``gpu.nmc.enabled``).  The GEMM then keeps every CU: T3 without its tracker, with a
        trigger per kernel instead of per tile.
    splits
        Kernels per chunk (default 1, Wang et al.'s one kernel per rank): each chunk's rows are cut
        into ``splits`` kernels, and the reduce-scatter reads (or sends) a chunk's bytes as soon as
        the kernel that writes them has finished, so its first step starts sooner and its last ends
        sooner, for smaller kernels and more launches.  ``m`` must split evenly into
        ``ranks x splits`` parts.
    """

    splits: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.splits = _positive_int("DecomposedGemmReduceScatter", "splits", self.splits)

    @property
    def nbytes(self) -> int:
        """Bytes of one rank's GEMM output, C[m, n]."""
        return self.m * self.n * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        return f"gemm+rs decomposed {self._shape_text()}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.decomposed import execute_decomposed_gemm_rs

        return execute_decomposed_gemm_rs(ctx, self)


@dataclass
class DecomposedAllGatherGemm(_DecomposedGemm):
    """The ring all-gather of a GEMM's input and the GEMM, overlapped in software by decomposition.

    The consumer-side mirror of :class:`DecomposedGemmReduceScatter`: a sequence-parallel layer
    gathers its activations (``a``, cut along M, a chunk per rank) before a column-parallel GEMM, and
    Transformer Engine's and Wang et al.'s overlap run the GEMM a chunk at a time as the chunks
    arrive.  Each rank computes its own chunk's rows first and then each chunk as the ring delivers
    it, one kernel per chunk; beside them a ring all-gather (on ``channels`` CUs of its own, or on
    the DMA engines) forwards the chunks.  Every rank ends with the gathered ``a`` and the whole
    ``C[m, n]``, as after :class:`AllGather` then :class:`Gemm`.  T3's hardware form of the
    same overlap is :class:`AllGatherGemm`.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, b, out, kernel
        The whole GEMM on the gathered input, as in :class:`GemmShape` (``m``: the gathered rows;
        ``batch`` must be 1; a named ``kernel`` runs every chunk).  Each chunk runs as a plain GEMM,
        so the library's choice may split its K.
    a
        Name of the gathered input (each rank holds its chunk before the op, all of it after).
    channels
        CUs of a CU-driven all-gather (default: the node's ``collectives.cus``, fewer for small chunks).
    driver
        ``"cu"``: the all-gather is a kernel on ``channels`` CUs and the GEMM kernels get the
        others; ``"dma"``: the DMA engines forward each chunk, and the GEMM keeps every CU.
    """

    @property
    def nbytes(self) -> int:
        """Bytes of the gathered input, A[m, k]."""
        return self.m * self.k * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        return f"ag+gemm decomposed {self._shape_text()}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.decomposed import execute_decomposed_ag_gemm

        return execute_decomposed_ag_gemm(ctx, self)


@dataclass
class AllGatherGemm(_RowChunkedGemm):
    """The ring all-gather of a GEMM's input, with T3's tracker on the consumer side (dissertation
    section 8.6.2, "TP with All-gather").

    The tracker counts the gathered input's arrivals and, instead of a DMA, triggers the workgroups of
    the consumer GEMM whose rows have all arrived: one unchanged GEMM kernel over the gathered rows,
    its workgroups dispatched in the order their rows arrive (this rank's own chunk first), beside
    the DMA-driven ring all-gather.  Against :class:`DecomposedAllGatherGemm` there is no kernel per
    chunk, so no launch per chunk and no idle tail of each chunk's last wave.  Every rank ends with
    the gathered ``a`` and the whole ``C[m, n]``, as after :class:`AllGather` then :class:`Gemm`.

    Attributes
    ----------
    m, n, k, dtype, trans_a, trans_b, b, out, kernel
        The GEMM on the gathered input, as in :class:`GemmShape` (``m``: the gathered rows, which
        must split evenly over the ranks; ``batch`` must be 1).  A split-K kernel's partials go to a
        workspace and its reduction kernel follows, as for :class:`Gemm`.
    a
        Name of the gathered input (each rank holds its chunk before the op, all of it after).
    """

    @property
    def nbytes(self) -> int:
        """Bytes of the gathered input, A[m, k]."""
        return self.m * self.k * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        return f"ag+gemm t3 {self._shape_text()}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.tracked_gather import execute_tracked_ag_gemm

        return execute_tracked_ag_gemm(ctx, self)


ELEMENTWISE_KINDS: dict[str, tuple[int, int, float]] = {
    "copy": (1, 1, 0.0),
    "cat": (1, 1, 0.0),
    "add": (2, 1, 1.0),
    "mul": (2, 1, 1.0),
    "scale": (1, 1, 1.0),
    "relu": (1, 1, 1.0),
    "gelu": (1, 1, 14.0),
    "gelu_erf": (1, 1, 20.0),
    "sigmoid": (1, 1, 10.0),
    "tanh": (1, 1, 10.0),
    "dropout": (1, 2, 4.0),
    "dropout_backward": (2, 1, 2.0),
    "bias_gelu": (2, 1, 15.0),
    "residual_dropout": (2, 2, 5.0),
    "fill": (0, 1, 0.0),
    "silu_and_mul": (1, 1, 6.0),
    "rope": (1, 1, 3.0),
}
"""Element-wise kinds: (tensors read, tensors written, FLOPs per element). ``cat`` is a copy into a
concatenation, which over strided tensors computes its offsets differently (``index_dims``).
``silu_and_mul`` is a gated MLP's activation as vLLM's fused kernel runs it: it reads a
``[rows, 2 x width]`` tensor (the gate and up projections side by side,
:data:`ELEMENTWISE_INPUT_WIDTH`) and writes ``silu(gate) * up``, ``elements`` values. ``rope`` is
vLLM's rotary embedding of the query and key heads, in place: ``elements`` values read and written
(the tensor its input or its ``out`` names).
Both run one workgroup per row (``rows``, :func:`gpusim.kernels.rowreduce.vllm_row_kernel`).
``gelu`` is the tanh approximation (``approximate="tanh"``, as this project's H200 and H100
element-wise measurements ran it), ``gelu_erf`` PyTorch's exact GeLU (``F.gelu``,
``torch.nn.GELU()``), whose cost is its measured instructions
(:data:`gpusim.kernels.elementwise.INSTRUCTION_MIXES`), not its FLOPs."""
ELEMENTWISE_INPUT_WIDTH = {"silu_and_mul": 2}
"""Kinds whose read tensor holds this many values per value written (default 1)."""
ELEMENTWISE_MASKS: dict[str, str] = {"dropout": "write", "residual_dropout": "write", "dropout_backward": "read"}
"""Kinds whose last tensor written (``write``) or read (``read``) is a dropout's mask of
:data:`MASK_BYTES` per element whatever the dtype: ``dropout`` writes its output and the mask,
``residual_dropout`` (``residual + dropout(x)``) too, ``dropout_backward`` reads the gradient and the
mask (``grad * mask * scale``), as PyTorch's ``native_dropout`` and its backward do."""
MASK_BYTES = 1
"""Bytes per element of a dropout mask (PyTorch's ``native_dropout`` keeps a ``bool`` tensor)."""
MAX_INDEX_DIMS = 25
"""Most dimensions PyTorch's ``TensorIterator`` handles (``MAX_DIMS``)."""


@dataclass
class Elementwise(Op):
    """An element-wise kernel over ``elements`` values.

    Attributes
    ----------
    kind
        One of :data:`ELEMENTWISE_KINDS`.
    elements
        Elements per tensor.
    dtype
        Element dtype.
    inputs
        Names of the tensors it reads (optional): a tuple of at most as many names as the kind
        reads (:data:`ELEMENTWISE_KINDS`); inputs without a name are private.
    out
        Name of the tensor it writes (optional).
    index_dims
        Dimensions each element's offsets are computed over, as PyTorch's ``TensorIterator``
        leaves them once it has merged the dimensions that are contiguous in every tensor. 0
        (default): contiguous tensors in 16-byte vectors (PyTorch's vectorized kernel). 1:
        contiguous tensors one element per access (its unrolled kernel, for casts and misaligned
        tensors). 2 or more: strided or broadcast tensors, one element per access at offsets that
        take an integer division per dimension (its offset-calculator kernel; for ``cat``, the
        concatenation kernel over tensors of that rank, which divides at run time and computes
        the output's offset too); at most :data:`MAX_INDEX_DIMS`.
    workgroups
        A persistent kernel's grid (optional): this many workgroups, each striding over its share of
        the tensors, as Triton's and NCCL's persistent kernels do; by default PyTorch's grid of one
        workgroup per 16 bytes of every thread.
    inflight_bytes_per_thread
        Bytes of each read tensor a thread keeps in flight (optional; default the GPU's
        ``streaming_inflight_bytes_per_thread``): a kernel that loads a block of 32 fp16 values per
        thread at once keeps 64.
    rows
        Rows of a kernel that gives each row a workgroup (vLLM's custom kernels, the only way
        ``silu_and_mul`` and ``rope`` run; required for them and for no other kind):
        ``elements`` must be a multiple of it.
    """

    kind: str
    elements: int
    dtype: str = "fp16"
    inputs: tuple[str, ...] | None = None
    out: str | None = None
    index_dims: int = 0
    workgroups: int | None = None
    inflight_bytes_per_thread: int | None = None
    rows: int | None = None
    category: ClassVar[str] = "elementwise"

    def __post_init__(self) -> None:
        one_of("field 'kind'", self.kind, ELEMENTWISE_KINDS, "Elementwise", OpError)
        self.elements = _positive_int("Elementwise", "elements", self.elements)
        _check_dtype("Elementwise", self.dtype)
        dims = as_int(self.index_dims)
        if dims is None or not 0 <= dims <= MAX_INDEX_DIMS:
            raise OpError(f"Elementwise: field 'index_dims' must be an integer from 0 to {MAX_INDEX_DIMS}, "
                          f"got {self.index_dims!r}")
        self.index_dims = dims
        for name in ("workgroups", "inflight_bytes_per_thread", "rows"):
            if getattr(self, name) is not None:
                setattr(self, name, _positive_int("Elementwise", name, getattr(self, name)))
        self._check_rows()
        if self.inputs is not None:
            names = as_sequence(self.inputs)
            reads = ELEMENTWISE_KINDS[self.kind][0]
            if names is None or not all(isinstance(name, str) and name for name in names):
                raise OpError(f"Elementwise: field 'inputs' must be a tuple of tensor names, got {self.inputs!r}")
            if len(names) > reads:
                raise OpError(f"Elementwise: field 'inputs' names {len(names)} tensors, but {self.kind!r} reads "
                              f"{reads}: {self.inputs!r}")
            self.inputs = tuple(names)
        super().__post_init__()

    def _check_rows(self) -> None:
        from gpusim.kernels.rowreduce import VLLM_ROW_KINDS

        if self.kind in VLLM_ROW_KINDS:
            if self.rows is None:
                raise OpError(f"Elementwise: kind {self.kind!r} runs one workgroup per row: field 'rows' is required")
            if self.elements % self.rows:
                raise OpError(f"Elementwise: field 'elements' ({self.elements}) must be a multiple of field 'rows' "
                              f"({self.rows})")
            if self.index_dims or self.workgroups or self.inflight_bytes_per_thread:
                raise OpError(f"Elementwise: kind {self.kind!r} is vLLM's per-row kernel; fields 'index_dims', "
                              f"'workgroups' and 'inflight_bytes_per_thread' do not apply to it")
            named = (self.inputs or (None,))[0]
            if self.kind == "rope" and None not in (self.out, named) and self.out != named:
                raise OpError(f"Elementwise: kind 'rope' rotates its input in place: field 'out' ({self.out!r}) "
                              f"must name its input ({named!r}) or the input must be unnamed")
        elif self.rows is not None:
            raise OpError(f"Elementwise: field 'rows' applies to the per-row kinds ({', '.join(VLLM_ROW_KINDS)}), "
                          f"not to {self.kind!r}")

    def describe(self) -> str:
        strided = f" index_dims={self.index_dims}" if self.index_dims else ""
        persistent = f" workgroups={self.workgroups}" if self.workgroups else ""
        inflight = f" inflight_bytes_per_thread={self.inflight_bytes_per_thread}" if self.inflight_bytes_per_thread else ""
        rows = f" rows={self.rows}" if self.rows else ""
        return f"{self.kind} {self.elements} {self.dtype}{strided}{persistent}{inflight}{rows}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.elementwise import execute_elementwise

        return execute_elementwise(ctx, self)


ROW_REDUCE_KINDS: dict[str, float] = {
    "softmax": 5.0,
    "layernorm": 8.0,
    "rmsnorm": 5.0,
    "sum": 1.0,
    "colsum": 1.0,
    "softmax_backward": 3.0,
    "layernorm_backward": 8.0,
    "rmsnorm_backward": 6.0,
}
"""Row-reduction kinds (``colsum``: the sum of each column, as a bias gradient; ``*_backward``: the
input gradient of a softmax, a layer norm or an RMS norm) and their FLOPs per
element (reported in ``Result.ops``; the kernels' passes and instructions are the library's,
:mod:`gpusim.kernels.rowreduce`)."""


@dataclass
class RowReduce(Op):
    """A row-wise reduction over an ``rows x cols`` matrix (softmax, layernorm), output the same size.

    ``sum`` sums each row (``rows`` values out), ``colsum`` each column (``cols`` values out: the
    matrix is read across its rows, as for a bias gradient).

    Attributes
    ----------
    kind
        One of :data:`ROW_REDUCE_KINDS`.
    rows, cols
        Matrix shape.
    dtype
        Element dtype.
    library
        Whose kernel runs it (:data:`gpusim.kernels.rowreduce.LIBRARIES`): PyTorch's eager kernels
        (``pytorch``, 2.5 and later; ``pytorch-2.0``) or ``torch.compile``'s Triton kernels
        (``inductor``).
    """

    kind: str
    rows: int
    cols: int
    dtype: str = "fp16"
    input: str | None = None
    out: str | None = None
    library: str = "pytorch"
    category: ClassVar[str] = "reduction"

    def __post_init__(self) -> None:
        from gpusim.kernels.rowreduce import LIBRARIES

        one_of("field 'kind'", self.kind, ROW_REDUCE_KINDS, "RowReduce", OpError)
        one_of("field 'library'", self.library, LIBRARIES, "RowReduce", OpError)
        if self.library == "vllm" and self.kind != "rmsnorm":
            raise OpError(f"RowReduce: library 'vllm' runs kind 'rmsnorm' only, not {self.kind!r}")
        if self.kind == "colsum" and self.library.startswith("inductor"):
            raise OpError("RowReduce: field 'library' must be a PyTorch eager library for kind 'colsum' "
                          f"(Inductor's column reductions are not modelled), got {self.library!r}")
        self.rows = _positive_int("RowReduce", "rows", self.rows)
        self.cols = _positive_int("RowReduce", "cols", self.cols)
        _check_dtype("RowReduce", self.dtype)
        super().__post_init__()

    def describe(self) -> str:
        return f"{self.kind} {self.rows}x{self.cols} {self.dtype}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.rowreduce import execute_row_reduce

        return execute_row_reduce(ctx, self)


ATTENTION_DIRECTIONS = ("forward", "backward")
"""Passes of :class:`Attention`."""


@dataclass
class Attention(Op):
    """Fused scaled-dot-product attention, ``softmax(Q K^T / sqrt(head_dim)) V``, as
    FlashAttention-2 runs it (:mod:`gpusim.kernels.attention`): the scores never reach memory.

    Attributes
    ----------
    batch, heads
        Sequences and query heads.
    q_len, kv_len
        Query and key/value lengths, tokens (a prompt: equal; a decoding step: ``q_len`` 1 and
        ``kv_len`` the cached tokens).
    head_dim
        Values per head (at most 256).
    dtype
        ``fp16`` or ``bf16``.
    causal
        Whether each query attends only to the keys up to its own position (aligned at the last
        key when ``q_len != kv_len``).
    kv_heads
        Key/value heads (grouped-query or multi-query attention; a divisor of ``heads``); default
        ``heads``.
    direction
        ``forward``, or ``backward`` (the gradients of Q, K and V from those of the output).
    q, k, v, out, lse
        Tensor names: inputs, output and the per-row log-sum-exp the forward saves for the
        backward (all ``[batch, len, heads, head_dim]``; ``lse`` fp32 per query row).
    grad_out, grad_q, grad_k, grad_v
        Backward only: the output's gradient (read) and the inputs' gradients (written).
    """

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    kv_heads: int | None = None
    direction: str = "forward"
    q: str | None = None
    k: str | None = None
    v: str | None = None
    out: str | None = None
    lse: str | None = None
    grad_out: str | None = None
    grad_q: str | None = None
    grad_k: str | None = None
    grad_v: str | None = None
    category: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        from gpusim.kernels.attention import ATTENTION_DTYPES, HEAD_DIMS

        for name in ("batch", "heads", "q_len", "kv_len", "head_dim"):
            setattr(self, name, _positive_int("Attention", name, getattr(self, name)))
        if not is_one_of(self.dtype, ATTENTION_DTYPES):
            raise OpError(f"Attention: field 'dtype' must be one of {', '.join(ATTENTION_DTYPES)} "
                          f"(FlashAttention-2's inputs), got {self.dtype!r}")
        if self.head_dim > HEAD_DIMS[-1] or self.head_dim % 8:
            raise OpError(f"Attention: field 'head_dim' must be a multiple of 8 up to {HEAD_DIMS[-1]} "
                          f"(FlashAttention-2's kernels), got {self.head_dim}")
        self.causal = _bool("Attention", "causal", self.causal)
        if self.kv_heads is not None:
            self.kv_heads = _positive_int("Attention", "kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise OpError(f"Attention: field 'kv_heads' must divide heads ({self.heads}), got {self.kv_heads}")
        one_of("field 'direction'", self.direction, ATTENTION_DIRECTIONS, "Attention", OpError)
        super().__post_init__()

    @property
    def flops(self) -> float:
        """Matrix FLOPs of the attended scores (4 per score and head value forward, 10 backward)."""
        from gpusim.kernels.attention import problem_of

        return problem_of(self).flops(self.direction == "backward")

    def describe(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads and self.kv_heads != self.heads else ""
        mask = " causal" if self.causal else ""
        return (f"attention {self.direction} {self.batch}x{self.heads}{kv} heads {self.q_len}x{self.kv_len}"
                f"x{self.head_dim}{mask} {self.dtype}")

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.attention import execute_attention

        return execute_attention(ctx, self)


COLLECTIVE_ALGORITHMS = ("ring", "direct", "hierarchical", "auto")
"""Every collective algorithm; each collective accepts some of them (``Collective.algorithms``)."""
DMA_ALGORITHMS = ("ring", "auto")
"""Algorithms of DMA-driven collectives."""


@dataclass
class Collective(Op):
    """Base of collectives over ``ranks``.

    Attributes
    ----------
    nbytes
        Size of each rank's input (all-reduce, reduce-scatter, all-to-all) or output (all-gather).
    dtype
        Element dtype (reductions add in this dtype).
    algorithm
        ``ring`` (not for all-to-all; across nodes one ring per channel, each leaving a node
        through a different GPU's NIC), ``direct`` (each rank talks to every other),
        ``hierarchical`` (all-reduce only: reduce-scatter inside each node, all-reduce across
        nodes, all-gather inside each node), or ``auto``: ``direct`` for all-to-all, ``ring``
        for the others, within a node and across nodes alike.
    driver
        ``"cu"`` (a kernel on the configured number of CUs, as NCCL/RCCL) or ``"dma"`` (the DMA
        engines; ``ring`` or ``auto`` algorithm, not all-to-all; a DMA-driven reduction needs
        near-memory op-and-store, ``gpu.nmc.enabled``).
    channels
        CUs a CU-driven collective uses (default: the node's ``collectives.cus``).
    input, out
        Tensor names (optional).
    algorithms
        (class attribute) The algorithms this collective accepts.
    dma
        (class attribute) Whether it can be DMA-driven.
    """

    nbytes: int
    dtype: str = "fp16"
    algorithm: str = "auto"
    driver: str = "cu"
    channels: int | None = None
    input: str | None = None
    out: str | None = None
    category: ClassVar[str] = "collective"
    collective: ClassVar[str] = "collective"
    algorithms: ClassVar[tuple[str, ...]] = ("ring", "direct", "auto")
    dma: ClassVar[bool] = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        self.nbytes = _positive_int(name, "nbytes", self.nbytes)
        _check_dtype(name, self.dtype)
        _check_whole_elements(name, "nbytes", self.nbytes, self.dtype)
        one_of("field 'algorithm'", self.algorithm, self.algorithms, name, OpError)
        if not is_one_of(self.driver, ("cu", "dma")):
            raise OpError(f"{name}: field 'driver' must be 'cu' or 'dma', got {self.driver!r}")
        if self.driver == "dma" and not self.dma:
            raise OpError(f"{name}: driver 'dma' is not supported ({self.collective} runs on CUs); use driver='cu'")
        if self.driver == "dma" and self.algorithm not in DMA_ALGORITHMS:
            raise OpError(f"{name}: driver 'dma' runs the ring algorithm only, got algorithm={self.algorithm!r}; "
                          f"use algorithm='ring' or 'auto', or driver='cu'")
        if self.channels is not None:
            self.channels = _positive_int(name, "channels", self.channels)
        super().__post_init__()

    def describe(self) -> str:
        from gpusim.units import format_bytes

        return f"{self.collective} {format_bytes(self.nbytes)}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.collectives import execute_collective

        return execute_collective(ctx, self)


@dataclass
class AllReduce(Collective):
    """Every rank ends with the element-wise sum of all ranks' ``nbytes`` arrays."""

    collective: ClassVar[str] = "allreduce"
    algorithms: ClassVar[tuple[str, ...]] = COLLECTIVE_ALGORITHMS


@dataclass
class ReduceScatter(Collective):
    """Rank i ends with the sum of chunk i (``nbytes / n``) of every rank's array."""

    collective: ClassVar[str] = "reducescatter"


@dataclass
class AllGather(Collective):
    """Every rank ends with all ranks' chunks; ``nbytes`` is the gathered (output) size."""

    collective: ClassVar[str] = "allgather"


@dataclass
class AllToAll(Collective):
    """Rank i sends chunk j of its ``nbytes`` array to rank j (``direct`` algorithm, on CUs).

    Attributes
    ----------
    send_bytes
        Uneven exchange (all-to-allv, as ``torch.distributed.all_to_all_single`` with split sizes):
        ``send_bytes[i][j]`` bytes go from the ``i``-th rank of ``ranks`` to the ``j``-th, each
        sender's pieces packed in its input in rank order, each receiver's in its output in sender
        order; the diagonal stays in place (not sent).  Every rank's sends and receives must fit in
        ``nbytes``.  ``None``: ``nbytes / n`` to every rank.  An uneven exchange runs in full mode
        only (its ranks do different work); ``ranks`` must be given, one row and column each.
    """

    send_bytes: tuple[tuple[int, ...], ...] | None = None
    collective: ClassVar[str] = "alltoall"
    algorithms: ClassVar[tuple[str, ...]] = ("direct", "auto")
    dma: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.send_bytes is None:
            return
        rows = as_sequence(self.send_bytes)
        if rows is None or self.ranks is None or len(rows) != len(self.ranks):
            ranks = "no ranks" if self.ranks is None else f"{len(self.ranks)} ranks"
            raise OpError(f"AllToAll: field 'send_bytes' must be a square matrix with a row and a column per rank "
                          f"of 'ranks' ({ranks}), got {self.send_bytes!r}")
        matrix = []
        for i, row in enumerate(rows):
            values = as_sequence(row)
            if values is None or len(values) != len(rows) or any(as_int(v) is None or v < 0 for v in values):
                raise OpError(f"AllToAll: row {i} of field 'send_bytes' must be {len(rows)} non-negative integers "
                              f"(bytes to each rank), got {row!r}")
            matrix.append(tuple(int(v) for v in values))
        for i, row in enumerate(matrix):
            for value in row:
                _check_whole_elements("AllToAll", f"send_bytes[{i}]", value, self.dtype)
        self.send_bytes = tuple(matrix)
        sent = max(sum(row) for row in matrix)
        received = max(sum(column) for column in zip(*matrix))
        if max(sent, received) > self.nbytes:
            raise OpError(f"AllToAll: every rank's sends and receives must fit in field 'nbytes' ({self.nbytes}), "
                          f"but one rank sends {sent} and one receives {received} bytes of 'send_bytes'")

    @property
    def symmetric(self) -> bool:
        """Whether symmetric mode can simulate it: an even exchange."""
        return self.send_bytes is None

    def describe(self) -> str:
        if self.send_bytes is None:
            return super().describe()
        from gpusim.units import format_bytes

        return f"alltoallv {format_bytes(max(sum(row) for row in self.send_bytes))} most sent"


@dataclass
class SendRecv(Op):
    """Rank ``src`` sends ``nbytes`` to rank ``dst`` (pipeline-parallel activations).

    It runs on exactly the two ranks ``src`` and ``dst``, in full mode only: ``ranks`` is
    ``(src, dst)``; giving other ranks is an error.  As NCCL's send/receive, the sender's kernel
    moves the data on ``collectives.cus`` CUs (fewer for a small message), each reading its part
    and writing it over the links into the receiver's memory, slice by slice; ``driver="dma"``
    has the sender's first DMA engine copy it instead (``cudaMemcpyPeerAsync``).

    Attributes
    ----------
    nbytes
        Message size.
    src, dst
        Sender and receiver ranks.
    input, out
        Names of the sent tensor on ``src`` and of the received one on ``dst`` (optional).
    driver
        ``"cu"`` (default) or ``"dma"``.
    """

    nbytes: int
    src: int = 0
    dst: int = 1
    input: str | None = None
    out: str | None = None
    driver: str = "cu"
    category: ClassVar[str] = "sendrecv"
    symmetric: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.nbytes = _positive_int("SendRecv", "nbytes", self.nbytes)
        for field_name in ("src", "dst"):
            value = getattr(self, field_name)
            rank = as_int(value)
            if rank is None or rank < 0:
                raise OpError(f"SendRecv: field '{field_name}' must be a non-negative integer, got {value!r}")
            setattr(self, field_name, rank)
        if self.src == self.dst:
            raise OpError(f"SendRecv: 'src' and 'dst' must differ, both are {self.src}")
        if not is_one_of(self.driver, ("cu", "dma")):
            raise OpError(f"SendRecv: field 'driver' must be 'cu' or 'dma', got {self.driver!r}")
        super().__post_init__()
        if self.ranks is not None and set(self.ranks) != {self.src, self.dst}:
            raise OpError(f"SendRecv: field 'ranks' must be the two ranks src and dst, {self.src} and {self.dst} "
                          f"(or be left out), got {list(self.ranks)}")
        self.ranks = (self.src, self.dst)

    def describe(self) -> str:
        from gpusim.units import format_bytes

        return f"send {self.src}->{self.dst} {format_bytes(self.nbytes)}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.collectives import execute_sendrecv

        return execute_sendrecv(ctx, self)


@dataclass
class Delay(Op):
    """A fixed amount of time on a stream (e.g. a measured duration that is not simulated).

    Attributes
    ----------
    seconds
        Duration (a finite non-negative number), s.
    """

    seconds: float = 0.0
    category: ClassVar[str] = "delay"

    def __post_init__(self) -> None:
        seconds = as_real(self.seconds)
        if seconds is None or seconds < 0:
            raise OpError(f"Delay: field 'seconds' must be a finite non-negative number of seconds, got {self.seconds!r}")
        self.seconds = seconds
        super().__post_init__()

    def describe(self) -> str:
        return f"delay {self.seconds * 1e6:.3g} us"

    def run_on(self, ctx: OpContext):
        yield from ctx.wait_for_issue()
        yield ctx.sim.timeout(self.seconds * 1e9)


OPTIMIZER_ALGORITHMS = ("sgd", "adam", "adamw", "lamb", "adan")
"""Optimizers: SGD with momentum, Adam, AdamW, LAMB, Adan."""
OPTIMIZER_IMPLS = ("unfused", "fused", "multi_unfused", "multi_fused", "nmc")
"""Where and how an optimizer runs (see :class:`Optimizer`)."""


@dataclass
class Optimizer(Op):
    """One optimizer step over a model's parameter tensors, on the GPU or on near-memory ALUs.

    Attributes
    ----------
    algorithm
        One of :data:`OPTIMIZER_ALGORITHMS`.
    sizes
        Elements of every parameter tensor (each has a gradient and the optimizer's state).
    impl
        ``unfused``: one GPU kernel per element-wise step and tensor (eager PyTorch);
        ``fused``: fused kernel(s) per tensor; ``multi_unfused``: each step over tensor lists
        (``torch._foreach_*``); ``multi_fused``: fused kernel(s) over tensor lists (apex);
        ``nmc``: near-bank ALUs, with the GPU reducing partial sums across banks.
    dtype
        Dtype of parameters, gradients and state.
    grad_norm
        For LAMB on ``nmc``: how the global gradient norm is computed: ``banks`` (partial sums in
        the banks, reduced by the GPU, as the other norms) or ``gpu`` (a GPU kernel reads all
        gradients).
    prefix
        Prefix of the tensor names (``prefix.p0``, ``prefix.g0``...), so that steps share memory.
    """

    algorithm: str
    sizes: tuple[int, ...] | list[int]
    impl: str = "multi_fused"
    dtype: str = "fp32"
    grad_norm: str = "banks"
    prefix: str = "optimizer"
    category: ClassVar[str] = "optimizer"

    def __post_init__(self) -> None:
        one_of("field 'algorithm'", self.algorithm, OPTIMIZER_ALGORITHMS, "Optimizer", OpError)
        one_of("field 'impl'", self.impl, OPTIMIZER_IMPLS, "Optimizer", OpError)
        sizes = as_sequence(self.sizes)
        if not sizes:
            raise OpError(f"Optimizer: field 'sizes' must be a non-empty list of tensor sizes, got {self.sizes!r}")
        self.sizes = tuple(_positive_int("Optimizer", "sizes", size) for size in sizes)
        _check_dtype("Optimizer", self.dtype)
        if not is_one_of(self.grad_norm, ("banks", "gpu")):
            raise OpError(f"Optimizer: field 'grad_norm' must be 'banks' or 'gpu', got {self.grad_norm!r}")
        if not isinstance(self.prefix, str) or not self.prefix:
            raise OpError(f"Optimizer: field 'prefix' must be a non-empty string, got {self.prefix!r}")
        super().__post_init__()

    @property
    def parameters(self) -> int:
        """Parameters updated."""
        return sum(self.sizes)

    def describe(self) -> str:
        return f"{self.algorithm} {self.impl} {len(self.sizes)} tensors {self.parameters / 1e6:.1f}M {self.dtype}"

    def run_on(self, ctx: OpContext):
        from gpusim.kernels.optimizer import execute_optimizer

        return execute_optimizer(ctx, self)


__all__ = [
    "AllGather",
    "AllGatherGemm",
    "AllReduce",
    "AllToAll",
    "Collective",
    "DecomposedAllGatherGemm",
    "DecomposedGemmReduceScatter",
    "Delay",
    "ELEMENTWISE_KINDS",
    "Elementwise",
    "FusedGemm",
    "Gemm",
    "GemmAllGather",
    "GemmAllToAll",
    "GemmReduceScatter",
    "GroupedGemm",
    "OPTIMIZER_ALGORITHMS",
    "OPTIMIZER_IMPLS",
    "Op",
    "Optimizer",
    "ROW_REDUCE_KINDS",
    "ReduceScatter",
    "RowReduce",
    "SendRecv",
]
