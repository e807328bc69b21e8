"""Optimizer steps (SGD with momentum, Adam/AdamW, LAMB, Adan) on the GPU's CUs or on near-bank ALUs.

On the GPU an optimizer is a list of *passes* over the model's parameter tensors; a pass is a list
of element-wise *steps* (a step reads and writes whole arrays: parameters ``p``, gradients ``g``,
optimizer state, temporaries) and L2 norms.  A pass ends before the next begins (LAMB needs the
norm of all gradients before any update).  Four implementations, as PyTorch and apex run them:

* ``unfused``: eager PyTorch with ``foreach=False``: one kernel per step and tensor;
* ``fused``: the fused kernel(s) of each tensor plus the steps left outside them;
* ``multi_unfused``: each step over tensor lists (``torch._foreach_*``);
* ``multi_fused``: the fused kernel(s) over tensor lists (apex, ``fused_adan``).

Tensor lists are launched by ``multi_tensor_apply`` (apex ``csrc/multi_tensor_apply.cuh``, PyTorch
``ATen/native/cuda/MultiTensorApply.cuh``, and the copy in sail-sg/Adan ``fused_adan``): chunks of
65536 elements, one 512-thread block per chunk, a launch whenever it holds 320 blocks, or the
maximum number of tensors for the list depth and the current tensor is complete, or the last chunk
is reached.  Kernels are real kernels on the simulated GPU (:class:`StreamingKernel` for a single
tensor, :class:`TensorListKernel` for a launch), so launch overhead, small grids and per-CU memory
parallelism decide how fast small tensors go; nothing here is a per-case constant.

On near-memory ALUs (``nmc``) each tensor is one broadcast of the algorithm's
:class:`~gpusim.hw.nmc.NmcProgram` (:mod:`gpusim.hw.nmc` times it).  Cross-bank reductions (LAMB's
per-tensor norms) leave partial sums in the banks; the GPU reads them in a small kernel, reduces
them and sends the results back as immediates of the next broadcast.  LAMB's global gradient norm
is computed the same way by default, or by a GPU kernel that reads all gradients
(``grad_norm="gpu"``); dissertation section 6.3 leaves room for both readings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.engine.primitives import Join
from gpusim.engine.simulation import Span
from gpusim.errors import OpError
from gpusim.hw import nmc as near_memory
from gpusim.hw.compute import ComputeUnit, InflightLimit, Kernel, WorkgroupShape, occupancy
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.hw.nmc import NearMemoryUnits, NmcProgram
from gpusim.kernels.elementwise import MAX_CHUNKS, StreamingKernel, pipelined, read_ranges

CHUNK_ELEMENTS = 65536
"""Elements per block of a multi_tensor_apply launch (apex and PyTorch ``kChunkSize``)."""
MAX_BLOCKS = 320
"""Blocks per multi_tensor_apply launch (``depth_to_max_blocks``)."""
MAX_TENSORS = (110, 64, 48, 36, 30, 24)
"""Tensors per multi_tensor_apply launch by list depth 1..6 (``depth_to_max_tensors``; depth 6
from sail-sg/Adan ``fused_adan/include/multi_tensor_apply.cuh``)."""
LIST_BLOCK = WorkgroupShape(threads=512, lds_bytes=0, registers_per_thread=32)
"""A multi_tensor_apply block (``BLOCK_SIZE`` 512)."""
NORM_BYTES = 4
"""Bytes of one partial or final norm (fp32)."""


@dataclass(frozen=True)
class Step:
    """One element-wise step (or L2 norm) of an optimizer, applied to every parameter tensor.

    Attributes
    ----------
    name
        Kernel name (the PyTorch op or fused kernel).
    reads, writes
        Arrays read and written (``p``, ``g``, state and temporaries).
    flops
        FLOPs per element.
    lists
        Tensor lists of the multi-tensor launch (default: the distinct arrays).
    norm
        ``""`` for an element-wise step; ``"tensor"`` for a norm per tensor; ``"global"`` for one
        norm over all tensors.  A norm writes partial sums, not arrays; on tensor lists a cleanup
        kernel finishes it, and unfused a global norm ends with one kernel combining the tensors'.
    """

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...] = ()
    flops: float = 1.0
    lists: int = 0
    norm: str = ""

    @property
    def depth(self) -> int:
        """Tensor lists of a multi-tensor launch."""
        return self.lists or len(set(self.reads) | set(self.writes))


def _step(name: str, reads: str, writes: str = "", flops: float = 1.0, lists: int = 0, norm: str = "") -> Step:
    return Step(name, tuple(reads.split()), tuple(writes.split()), flops, lists, norm)


@dataclass(frozen=True)
class NmcPlan:
    """How an optimizer runs with near-memory ALUs.

    Attributes
    ----------
    gpu_passes
        GPU passes before the first broadcast (LAMB's global gradient norm).
    programs
        Broadcast phases in order; after a program with accumulators the GPU reduces the partial
        sums before the next phase.
    """

    gpu_passes: tuple[tuple[Step, ...], ...]
    programs: tuple[NmcProgram, ...]


@dataclass(frozen=True)
class Algorithm:
    """An optimizer: its GPU passes (eager and fused) and its near-memory programs.

    Attributes
    ----------
    name
        ``sgd``, ``adam``, ``adamw``, ``lamb`` or ``adan``.
    eager
        Passes of single PyTorch ops (``unfused``, ``multi_unfused``).
    fused
        Passes of fused kernels (``fused``, ``multi_fused``); also the minimum traffic of a GPU.
    nmc
        The near-memory plan by placement of the global gradient norm (``"banks"`` or ``"gpu"``).
    immediates
        ``immediates(hyper, step, scalars)``: values of the programs' immediates from the
        hyperparameters, the step number and the GPU's reductions (``clip``, ``ratio``).
    """

    name: str
    eager: tuple[tuple[Step, ...], ...]
    fused: tuple[tuple[Step, ...], ...]
    nmc: Mapping[str, NmcPlan]
    immediates: Callable[[Mapping[str, float], int, Mapping[str, float]], dict[str, float]] = field(repr=False)

    def min_bytes_per_element(self, dtype_bytes: int) -> int:
        """Bytes per parameter that the fused GPU kernels read and write, each array once per kernel
        (a norm's partial sums are not counted)."""
        accesses = sum(len(s.reads) + (0 if s.norm else len(s.writes)) for passes in self.fused for s in passes)
        return dtype_bytes * accesses


def _program(name: str, text: str) -> NmcProgram:
    lines = [line.split(";")[0].strip() for line in text.strip().splitlines()]
    return NmcProgram.from_text(name, [line for line in lines if line])


# -- SGD with momentum (PyTorch SGD, dampening d, no weight decay) -------------------------------
SGD_EAGER = ((_step("mul_", "buf", "buf"), _step("add_", "buf g", "buf", 2), _step("add_", "p buf", "p", 2)),)
SGD_FUSED = ((_step("sgd_fused", "p g buf", "p buf", 4),),)
SGD_PROGRAM = _program(
    "sgd",
    """
    mul r0 buf #momentum      ; read buf
    fma r0 g #1-dampening r0  ; read g
    mov buf r0                ; write buf
    fma p r0 #-lr p           ; op-and-store p
    """,
)


def _sgd_immediates(hyper: Mapping[str, float], step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    return {"momentum": hyper["momentum"], "1-dampening": 1 - hyper.get("dampening", 0.0), "-lr": -hyper["lr"]}


# -- Adam and AdamW (PyTorch single-tensor Adam/AdamW) ----------------------------------------
def _adam_eager(decoupled: bool) -> tuple[tuple[Step, ...], ...]:
    decay = (_step("mul_", "p", "p"),) if decoupled else ()
    return (
        decay
        + (
            _step("lerp_", "m g", "m", 3),
            _step("mul_", "v", "v"),
            _step("addcmul_", "v g", "v", 3, lists=3),
            _step("sqrt", "v", "denom"),
            _step("div_", "denom", "denom"),
            _step("add_", "denom", "denom"),
            _step("addcdiv_", "p m denom", "p", 3),
        ),
    )


ADAM_FUSED = ((_step("adam_fused", "g p m v", "p m v", 14),),)
ADAM_PROGRAM = _program(
    "adam",
    """
    mov r0 g                          ; read g
    mul r1 m #beta1                   ; read m
    fma r1 r0 #1-beta1 r1
    mov m r1                          ; write m
    mul r0 r0 r0
    mul r2 v #beta2                   ; read v
    fma r2 r0 #1-beta2 r2
    mov v r2                          ; write v
    sqrt r2 r2
    fma r2 r2 #1/sqrt(bc2) #eps       ; sqrt(v_hat) + eps
    div r1 r1 r2
    mul r1 r1 #-lr/bc1
    fma p p #1-lr*wd r1               ; op-and-store p (decoupled weight decay)
    """,
)


def _adam_immediates(hyper: Mapping[str, float], step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    beta1, beta2, lr = hyper["beta1"], hyper["beta2"], hyper["lr"]
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    return {
        "beta1": beta1,
        "1-beta1": 1 - beta1,
        "beta2": beta2,
        "1-beta2": 1 - beta2,
        "1/sqrt(bc2)": 1 / math.sqrt(bc2),
        "eps": hyper["eps"],
        "-lr/bc1": -lr / bc1,
        "1-lr*wd": 1 - lr * hyper.get("weight_decay", 0.0),
    }


# -- LAMB (NVIDIA apex FusedLAMB; dissertation Figure 2.7 and section 6.3) ------------------------
LAMB_EAGER = (
    (_step("norm", "g", norm="global"),),
    (
        _step("mul_", "g", "g"),
        _step("mul_", "m", "m"),
        _step("add_", "m g", "m", 2),
        _step("mul_", "v", "v"),
        _step("addcmul_", "v g", "v", 3, lists=3),
        _step("div", "m", "mhat"),
        _step("div", "v", "denom"),
        _step("sqrt_", "denom", "denom"),
        _step("add_", "denom", "denom"),
        _step("div", "mhat denom", "u"),
        _step("add_", "u p", "u", 2),
        _step("norm", "p", flops=2, norm="tensor"),
        _step("norm", "u", flops=2, norm="tensor"),
        _step("add_", "p u", "p", 2),
    ),
)
LAMB_FUSED = (
    (_step("l2norm", "g", flops=2, norm="global"),),
    (
        _step("lamb_stage1", "g p m v", "m v u", 16),
        _step("l2norm", "p", flops=2, norm="tensor"),
        _step("l2norm", "u", flops=2, norm="tensor"),
        _step("lamb_stage2", "p u", "p", 2),
    ),
)
LAMB_GRAD_NORM = _program(
    "lamb_grad_norm",
    """
    mov r0 g                                  ; read g
    fma a0 r0 r0 a0                           ; partial ||g||^2
    """,
)
LAMB_STAGE1 = _program(
    "lamb_stage1",
    """
    mul r0 g #clip                            ; read g: clipped gradient
    mul r1 m #beta1                           ; read m
    fma r1 r0 #1-beta1 r1
    mov m r1                                  ; write m
    mul r0 r0 r0
    mul r2 v #beta2                           ; read v
    fma r2 r0 #1-beta2 r2
    mov v r2                                  ; write v
    sqrt r2 r2
    fma r2 r2 #bc1/sqrt(bc2) #bc1*eps         ; bc1 (sqrt(v_hat) + eps)
    div r1 r1 r2                              ; m_hat / (sqrt(v_hat) + eps)
    mov r0 p                                  ; read p
    fma r1 r0 #wd r1                          ; update u
    mov u r1                                  ; write u
    fma a0 r1 r1 a0                           ; partial ||u||^2
    fma a1 r0 r0 a1                           ; partial ||p||^2
    """,
)
LAMB_STAGE2 = _program(
    "lamb_stage2",
    """
    mul r0 u #-lr*ratio                       ; read u; trust ratio from the GPU
    add p p r0                                ; op-and-store p
    """,
)


def _lamb_immediates(hyper: Mapping[str, float], step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    beta1, beta2 = hyper["beta1"], hyper["beta2"]
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    return {
        "clip": scalars.get("clip", 1.0),
        "beta1": beta1,
        "1-beta1": 1 - beta1,
        "beta2": beta2,
        "1-beta2": 1 - beta2,
        "bc1/sqrt(bc2)": bc1 / math.sqrt(bc2),
        "bc1*eps": bc1 * hyper["eps"],
        "wd": hyper.get("weight_decay", 0.0),
        "-lr*ratio": -hyper["lr"] * scalars.get("ratio", 1.0),
    }


# -- Adan (sail-sg/Adan adan.py, no_prox=False, max_grad_norm=0) ----------------------------------
ADAN_EAGER = (
    (
        _step("mul_", "g", "g"),
        _step("add_", "neg g", "neg", 1),
        _step("mul_", "m", "m"),
        _step("add_", "m g", "m", 2),
        _step("mul_", "d", "d"),
        _step("add_", "d neg", "d", 2),
        _step("mul_", "neg", "neg"),
        _step("add_", "neg g", "neg", 1),
        _step("mul_", "n", "n"),
        _step("addcmul_", "n neg", "n", 3, lists=3),
        _step("sqrt", "n", "denom"),
        _step("div_", "denom", "denom"),
        _step("add_", "denom", "denom"),
        _step("addcdiv_", "p m denom", "p", 3),
        _step("addcdiv_", "p d denom", "p", 3),
        _step("div_", "p", "p"),
        _step("zero_", "", "neg", 0),
        _step("add_", "neg g", "neg", 2),
    ),
)
ADAN_FUSED = (
    (
        _step("adan_fused", "p g m n d neg", "p m n d", 24, lists=6),
        _step("zero_", "", "neg", 0),
        _step("add_", "neg g", "neg", 2),
    ),
)
ADAN_PROGRAM = _program(
    "adan",
    """
    mul r0 g #clip                            ; read g
    add r1 neg r0                             ; read neg: g - g_prev
    mul r2 m #beta1                           ; read m
    fma r2 r0 #1-beta1 r2
    mov m r2                                  ; write m
    mul r3 d #beta2                           ; read d
    fma r3 r1 #1-beta2 r3
    mov d r3                                  ; write d
    fma r1 r1 #beta2 r0                       ; g + beta2 (g - g_prev)
    mul r1 r1 r1
    mul neg r0 #-1                            ; write neg (next step's -g_prev)
    mul r0 n #beta3                           ; read n
    fma r0 r1 #1-beta3 r0
    mov n r0                                  ; write n
    sqrt r0 r0
    fma r0 r0 #1/sqrt(bc3) #eps
    mul r2 r2 #1/bc1
    fma r2 r3 #beta2/bc2 r2
    div r2 r2 r0
    mul r2 r2 #-lr/(1+lr*wd)
    fma p p #1/(1+lr*wd) r2                   ; op-and-store p
    """,
)


def _adan_immediates(hyper: Mapping[str, float], step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    beta1, beta2, beta3, lr = hyper["beta1"], hyper["beta2"], hyper["beta3"], hyper["lr"]
    decay = 1 + lr * hyper.get("weight_decay", 0.0)
    return {
        "clip": scalars.get("clip", 1.0),
        "beta1": beta1,
        "1-beta1": 1 - beta1,
        "beta2": beta2,
        "1-beta2": 1 - beta2,
        "beta3": beta3,
        "1-beta3": 1 - beta3,
        "-1": -1.0,
        "1/sqrt(bc3)": 1 / math.sqrt(1 - beta3**step),
        "eps": hyper["eps"],
        "1/bc1": 1 / (1 - beta1**step),
        "beta2/bc2": beta2 / (1 - beta2**step),
        "-lr/(1+lr*wd)": -lr / decay,
        "1/(1+lr*wd)": 1 / decay,
    }


def _only_nmc(program: NmcProgram) -> dict[str, NmcPlan]:
    plan = NmcPlan((), (program,))
    return {"banks": plan, "gpu": plan}


ALGORITHMS: dict[str, Algorithm] = {
    "sgd": Algorithm("sgd", SGD_EAGER, SGD_FUSED, _only_nmc(SGD_PROGRAM), _sgd_immediates),
    "adam": Algorithm("adam", _adam_eager(False), ADAM_FUSED, _only_nmc(ADAM_PROGRAM), _adam_immediates),
    "adamw": Algorithm("adamw", _adam_eager(True), ADAM_FUSED, _only_nmc(ADAM_PROGRAM), _adam_immediates),
    "lamb": Algorithm(
        "lamb",
        LAMB_EAGER,
        LAMB_FUSED,
        {
            "banks": NmcPlan((), (LAMB_GRAD_NORM, LAMB_STAGE1, LAMB_STAGE2)),
            "gpu": NmcPlan((LAMB_FUSED[0],), (LAMB_STAGE1, LAMB_STAGE2)),
        },
        _lamb_immediates,
    ),
    "adan": Algorithm("adan", ADAN_EAGER, ADAN_FUSED, _only_nmc(ADAN_PROGRAM), _adan_immediates),
}
"""The optimizers by name."""


# -- multi_tensor_apply ----------------------------------------------------------------------------
def multi_tensor_launches(sizes: Sequence[int], depth: int) -> list[list[tuple[int, int]]]:
    """The launches multi_tensor_apply makes over tensors of ``sizes`` elements with ``depth`` lists.

    Returns
    -------
    list of launches, each a list of blocks ``(tensor index, chunk index)``.
    """
    if not 1 <= depth <= len(MAX_TENSORS):
        raise ValueError(f"multi_tensor_apply supports 1 to {len(MAX_TENSORS)} tensor lists, got {depth}")
    max_tensors = MAX_TENSORS[depth - 1]
    launches: list[list[tuple[int, int]]] = []
    blocks: list[tuple[int, int]] = []
    tensors = 0
    last = len(sizes) - 1
    for index, size in enumerate(sizes):
        tensors += 1
        chunks = max(1, math.ceil(size / CHUNK_ELEMENTS))
        for chunk in range(chunks):
            blocks.append((index, chunk))
            final_chunk = chunk == chunks - 1
            if (tensors == max_tensors and final_chunk) or len(blocks) == MAX_BLOCKS or (index == last and final_chunk):
                launches.append(blocks)
                blocks = []
                tensors = 0 if final_chunk else 1
    return launches


def count_kernels(algorithm: str, sizes: Sequence[int], impl: str, grad_norm: str = "banks") -> int:
    """GPU kernels one step launches (near-memory: the GPU's reductions), without simulating it."""
    definition = ALGORITHMS[algorithm]
    if impl in ("unfused", "fused"):
        passes = definition.eager if impl == "unfused" else definition.fused
        return sum(len(steps) * len(sizes) + sum(s.norm == "global" for s in steps) for steps in passes)
    if impl in ("multi_unfused", "multi_fused"):
        passes = definition.eager if impl == "multi_unfused" else definition.fused
        return sum(len(multi_tensor_launches(sizes, s.depth)) + bool(s.norm) for steps in passes for s in steps)
    plan = definition.nmc[grad_norm]
    gpu = sum(len(multi_tensor_launches(sizes, s.depth)) + bool(s.norm) for steps in plan.gpu_passes for s in steps)
    return gpu + sum(bool(program.accumulators) for program in plan.programs)


@dataclass
class _Piece:
    reads: list[tuple[Buffer, int, int]]
    writes: list[tuple[Buffer, int, int]]
    flops: float


class TensorListKernel:
    """One multi_tensor_apply launch: a 512-thread block per chunk, over several tensor lists.

    Parameters
    ----------
    gpu
        The GPU.
    name
        Kernel name.
    blocks
        Per block: ``(reads, writes, flops)`` with reads and writes as ``(buffer, offset, nbytes)``.
    dtype
        Compute dtype of the FLOPs.
    cus
        CUs the kernel may use (its stream's CU mask; default: all of the GPU's).

    As :class:`~gpusim.kernels.elementwise.StreamingKernel`, the simulation runs at most one
    logical workgroup per resident slot; each handles consecutive blocks in a few pieces and
    prefetches the next piece while it computes and writes the current one.  A block keeps
    ``streaming_inflight_bytes_per_thread`` per thread and read list in flight, as the framework's
    other streaming kernels (16 B by default: ``ILP`` 4 fp32 loads per thread).
    """

    def __init__(
        self,
        gpu: Gpu,
        name: str,
        blocks: list[tuple[list[tuple[Buffer, int, int]], list[tuple[Buffer, int, int]], float]],
        dtype: str = "fp32",
        cus: int | None = None,
    ):
        self.gpu = gpu
        self.blocks = blocks
        self.flops_per_ns = gpu.vector_flops_per_ns(dtype)
        slots = (cus or gpu.config.num_cus) * max(1, occupancy(LIST_BLOCK, gpu.config.cu))
        self.workgroups = min(len(blocks), slots)
        self.wavefronts = LIST_BLOCK.wavefronts(gpu.config.cu.wavefront_size)
        lists = max(1, max(len(reads) for reads, _, _ in blocks))
        self.inflight_bytes = LIST_BLOCK.threads * gpu.config.streaming_inflight_bytes_per_thread * lists
        self.miss_latency_ns = gpu.unloaded_memory_latency_ns
        total_flops = sum(flops for _, _, flops in blocks)
        total_bytes = sum(n for reads, writes, _ in blocks for _, _, n in reads + writes)
        self.kernel = Kernel(
            name=name,
            num_wgs=self.workgroups,
            shape=LIST_BLOCK,
            body=self._workgroup,
            info={"flops": total_flops, "bytes": total_bytes, "blocks": len(blocks)},
        )
        self.kernel.math_units, self.kernel.peak_flops_per_cu_cycle = gpu.config.vector_math(dtype)

    def _pieces(self, wg: int) -> list[_Piece]:
        count = len(self.blocks)
        first = wg * count // self.workgroups
        last = (wg + 1) * count // self.workgroups
        mine = self.blocks[first:last]
        parts = max(1, MAX_CHUNKS // len(mine))
        pieces = []
        for reads, writes, flops in mine:
            for part in range(parts):
                pieces.append(
                    _Piece(
                        [_slice(item, part, parts) for item in reads],
                        [_slice(item, part, parts) for item in writes],
                        flops / parts,
                    )
                )
        return pieces

    def _fetch(self, limit: InflightLimit, piece: _Piece) -> Join:
        return read_ranges(self.gpu, limit, piece.reads)

    def _workgroup(self, wg: int, cu: ComputeUnit):
        limit = InflightLimit(cu, self.inflight_bytes, self.miss_latency_ns)
        pieces = self._pieces(wg)

        def fetch(index: int) -> Join:
            return self._fetch(limit, pieces[index])

        reads = any(piece.reads for piece in pieces)
        yield from pipelined(self.gpu, cu, len(pieces), fetch if reads else None, lambda index: pieces[index].flops,
                             lambda index: pieces[index].writes, self.flops_per_ns, self.wavefronts)


def _slice(item: tuple[Buffer, int, int], part: int, parts: int) -> tuple[Buffer, int, int]:
    buffer, offset, nbytes = item
    start = offset + nbytes * part // parts
    stop = offset + nbytes * (part + 1) // parts
    return buffer, start, stop - start


# -- running an Optimizer op -------------------------------------------------------------------
class _Run:
    """State of one Optimizer op on one rank: its buffers and what it launched."""

    def __init__(self, ctx, op):
        self.ctx = ctx
        self.op = op
        self.gpu: Gpu = ctx.gpu
        self.algorithm = ALGORITHMS[op.algorithm]
        self.sizes = list(op.sizes)
        self.elem = DTYPE_BYTES[op.dtype]
        self.buffers: dict[tuple[str, int], Buffer] = {}
        self.kernels = 0
        self.flops = 0.0
        self.bytes = 0.0

    def buffer(self, array: str, index: int) -> Buffer:
        key = (array, index)
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = self.ctx.tensor(f"{self.op.prefix}.{array}{index}", self.sizes[index] * self.elem)
        return buffer

    def scratch(self, name: str, nbytes: int, cached: bool = True) -> Buffer:
        return self.ctx.tensor(f"{self.op.prefix}.{name}", max(1, nbytes), cached)

    def launch(self, kernel: Kernel):
        self.kernels += 1
        self.flops += kernel.info.get("flops", 0.0)
        self.bytes += kernel.info.get("bytes", 0.0)
        yield from self.ctx.launch(kernel)

    # -- one tensor at a time --------------------------------------------------------------
    def single(self, passes: Sequence[Sequence[Step]]):
        for steps in passes:
            for index, size in enumerate(self.sizes):
                nbytes = size * self.elem
                for step in steps:
                    reads = [(self.buffer(array, index), nbytes) for array in step.reads]
                    if step.norm:
                        writes = [(self.scratch(f"norm.{step.name}.{index}", NORM_BYTES), NORM_BYTES)]
                    else:
                        writes = [(self.buffer(array, index), nbytes) for array in step.writes]
                    kernel = StreamingKernel(
                        self.gpu, f"{self.algorithm.name}.{step.name}", reads, writes, step.flops * size, "fp32",
                        cus=self.ctx.cus,
                    )
                    yield from self.launch(kernel.kernel)
            for step in steps:
                if step.norm == "global":
                    yield from self.combine(step, len(self.sizes))

    def combine(self, step: Step, partials: int):
        """The kernel that finishes a norm from ``partials`` partial sums."""
        nbytes = partials * NORM_BYTES
        source = self.scratch(f"partials.{step.name}", nbytes)
        out = self.scratch(f"norms.{step.name}", len(self.sizes) * NORM_BYTES)
        kernel = StreamingKernel(
            self.gpu, f"{self.algorithm.name}.{step.name}_cleanup", [(source, nbytes)], [(out, out.nbytes)], partials,
            cus=self.ctx.cus,
        )
        yield from self.launch(kernel.kernel)

    # -- tensor lists ------------------------------------------------------------------------
    def multi(self, passes: Sequence[Sequence[Step]]):
        for steps in passes:
            for step in steps:
                yield from self.multi_step(step)

    def multi_step(self, step: Step):
        chunk_bytes = CHUNK_ELEMENTS * self.elem
        launches = multi_tensor_launches(self.sizes, step.depth)
        total_blocks = sum(len(blocks) for blocks in launches)
        partials = self.scratch(f"partials.{step.name}", total_blocks * NORM_BYTES) if step.norm else None
        block_number = 0
        for number, blocks in enumerate(launches):
            work = []
            for index, chunk in blocks:
                size = self.sizes[index]
                offset = chunk * chunk_bytes
                nbytes = min(size * self.elem, offset + chunk_bytes) - offset
                reads = [(self.buffer(array, index), offset, nbytes) for array in step.reads]
                if partials is not None:
                    writes = [(partials, block_number * NORM_BYTES, NORM_BYTES)]
                else:
                    writes = [(self.buffer(array, index), offset, nbytes) for array in step.writes]
                work.append((reads, writes, step.flops * nbytes / self.elem))
                block_number += 1
            kernel = TensorListKernel(self.gpu, f"{self.algorithm.name}.multi_{step.name}.{number}", work,
                                      cus=self.ctx.cus)
            yield from self.launch(kernel.kernel)
        if step.norm:
            yield from self.combine(step, total_blocks)

    # -- near-memory ALUs ----------------------------------------------------------------------
    def near_memory(self):
        gpu = self.gpu
        plan = self.algorithm.nmc[self.op.grad_norm]
        try:
            units = NearMemoryUnits(gpu.config)
            for program in plan.programs:
                units.check(program)
        except ValueError as exc:  # the GPU's near-memory units cannot run this optimizer
            raise OpError(f"{self.op.label}: impl='nmc' cannot run on {gpu.config.name}: {exc}") from None
        yield from self.multi(plan.gpu_passes)
        lane = self.ctx.stream.name
        env = gpu.env
        broadcasts = 0
        for program in plan.programs:
            timings = [
                (f"{program.name}[{index}]", units.broadcast(program, size * self.elem))
                for index, size in enumerate(self.sizes)
            ]
            broadcasts += len(timings)
            yield from near_memory.execute(gpu, timings, lane, issue_ns=gpu.config.memctrl.latency_ns)
            if program.accumulators:
                start = env.now
                nbytes = units.partial_bytes(program) * len(self.sizes)
                source = self.scratch(f"partials.{program.name}", nbytes, cached=False)
                out = self.scratch(f"scalars.{program.name}", len(self.sizes) * NORM_BYTES)
                kernel = StreamingKernel(
                    gpu, f"{program.name}_reduce", [(source, nbytes)], [(out, out.nbytes)], nbytes / self.elem,
                    cus=self.ctx.cus,
                )
                yield from self.launch(kernel.kernel)
                self.ctx.sim.recorder.span(
                    Span(f"{program.name} sync", "sync", gpu.index, lane, start, env.now, {"partial_bytes": nbytes})
                )
        self.ctx.info["broadcasts"] = broadcasts


def execute_optimizer(ctx, op):
    """Run a :class:`gpusim.ops.Optimizer` on ``ctx``'s rank.

    Raises
    ------
    OpError
        A parameter tensor larger than the GPU's memory, before any work over it is planned (a
        tensor list's launches enumerate its 64 Ki-element chunks: 2**34 of them for 2**50 values).
    """
    run = _Run(ctx, op)
    for index, size in enumerate(run.sizes):
        run.gpu.check_fits(f"{op.prefix}.p{index}", size * run.elem)
    algorithm = run.algorithm
    if op.impl == "unfused":
        yield from run.single(algorithm.eager)
    elif op.impl == "fused":
        yield from run.single(algorithm.fused)
    elif op.impl == "multi_unfused":
        yield from run.multi(algorithm.eager)
    elif op.impl == "multi_fused":
        yield from run.multi(algorithm.fused)
    else:
        yield from run.near_memory()
    ctx.info.update(
        impl=f"{op.algorithm}_{op.impl}",
        kernels=run.kernels,
        flops=run.flops,
        bytes=run.bytes,
        parameters=sum(run.sizes),
        tensors=len(run.sizes),
    )
