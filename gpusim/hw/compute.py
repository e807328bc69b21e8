"""Compute units and the workgroup dispatcher.

A kernel is a grid of workgroups (WGs) with per-WG resources (threads, LDS, registers) that fix how
many fit on a CU at once (occupancy).  The dispatcher places WGs on CUs with room, in a
configurable order, until the kernel's grid is exhausted; the set resident at once is a *stage*
(a *wave*).  Several kernels may be dispatched concurrently (streams); their WGs then share CUs.

A CU's arithmetic is a fluid server: the CU's peak rate is shared by its resident WGs, and one WG
can use at most ``min(1, wavefronts / simds)`` of it.  A CU's memory-level parallelism is a second
fluid server (Little's law): it cannot move bytes faster than ``max_inflight_bytes`` per access
latency, where bytes served by the L2 cost the L2 hit latency and bytes fetched from DRAM the
unloaded miss latency.  A kernel's own memory-level parallelism (the bytes one of its WGs keeps in
flight, e.g. a GEMM's prefetched K-tile) is a per-WG server of the same kind, see
:class:`InflightLimit`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import simpy

from gpusim.config.gpu import CuConfig
from gpusim.engine.primitives import Pipe
from gpusim.errors import ConfigError

DISPATCH_POLICIES = ("round_robin", "fifo")
"""How concurrent kernels take turns placing workgroups (see :class:`Dispatcher`)."""
SIMDS_PER_CU = 4
"""Issue slots of a CU (SIMDs on AMD, SM sub-partitions on NVIDIA); a WG needs this many
wavefronts to use a CU's whole arithmetic rate."""


@dataclass(frozen=True)
class WorkgroupShape:
    """Resources one workgroup holds on its CU.

    Attributes
    ----------
    threads
        Threads per WG.
    lds_bytes
        Local data share per WG, bytes.
    registers_per_thread
        32-bit vector registers per thread.
    """

    threads: int
    lds_bytes: int = 0
    registers_per_thread: int = 64

    def wavefronts(self, wavefront_size: int) -> int:
        """Wavefronts per WG."""
        return -(-self.threads // wavefront_size)

    def register_bytes(self) -> int:
        """Register-file bytes per WG."""
        return self.threads * self.registers_per_thread * 4


def occupancy(shape: WorkgroupShape, cu: CuConfig) -> int:
    """How many WGs of ``shape`` fit on one CU at once (0 if none fits)."""
    limits = [
        cu.max_workgroups,
        cu.max_threads // shape.threads,
        cu.max_wavefronts // shape.wavefronts(cu.wavefront_size),
        int(cu.register_file_bytes) // shape.register_bytes(),
    ]
    if shape.lds_bytes:
        limits.append(int(cu.lds_bytes) // shape.lds_bytes)
    return max(0, min(limits))


def issue_lanes(cu: CuConfig, fma_share: float) -> float:
    """Lane-instructions per cycle a CU issues of a vector instruction mix of which ``fma_share``
    runs on the FP32 FMA pipe: the CU's issue rate, or the FMA pipe's where it has fewer lanes and
    carries that share."""
    fp32_lanes = cu.vector_peak("fp32") / 2
    return min(cu.issue_lanes_per_cycle, fp32_lanes / fma_share)


def issue_slots(cu: CuConfig, lanes: float, ops: float, transcendentals: float) -> float:
    """Lane-instruction slots (at ``lanes`` per cycle) that ``ops`` vector instructions and
    ``transcendentals`` special functions (exp2, reciprocal, square root) take: a special
    function takes its issue slot and its unit's narrower rate (``cu.transcendentals_per_cycle``),
    in the vector ALU's own slots (CDNA), or on separate units whose rate bounds the mix only when
    they are the busier (NVIDIA's SFUs)."""
    weight = lanes / cu.transcendentals_per_cycle
    if cu.transcendentals_on_vector_alu:
        return ops + transcendentals * weight
    return max(ops + transcendentals, transcendentals * weight)


class ComputeUnit:
    """One CU: free resources, a fluid arithmetic server and a fluid memory server.

    Parameters
    ----------
    index
        CU index within the GPU.
    config
        Per-CU resources.
    inflight_ns_per_byte
        Unloaded DRAM (L2 miss) latency divided by the bytes the CU can have in flight, ns/byte.
    hit_latency_ratio
        L2 hit latency divided by the miss latency: a byte served by the L2 occupies in-flight
        capacity for this fraction of the time a DRAM byte does.
    """

    __slots__ = (
        "index", "config", "free_threads", "free_wgs", "free_waves", "free_lds", "free_regs", "math", "mem",
        "hit_latency_ratio",
    )  # fmt: skip

    def __init__(self, index: int, config: CuConfig, inflight_ns_per_byte: float, hit_latency_ratio: float = 1.0):
        self.index = index
        self.hit_latency_ratio = hit_latency_ratio
        self.config = config
        self.free_threads = config.max_threads
        self.free_wgs = config.max_workgroups
        self.free_waves = config.max_wavefronts
        self.free_lds = int(config.lds_bytes)
        self.free_regs = int(config.register_file_bytes)
        self.math = Pipe(1.0)
        self.mem = Pipe(inflight_ns_per_byte)

    def fits(self, shape: WorkgroupShape) -> bool:
        """Whether a WG of ``shape`` fits now."""
        return (
            self.free_wgs > 0
            and self.free_threads >= shape.threads
            and self.free_waves >= shape.wavefronts(self.config.wavefront_size)
            and self.free_lds >= shape.lds_bytes
            and self.free_regs >= shape.register_bytes()
        )

    def take(self, shape: WorkgroupShape) -> None:
        """Reserve a WG's resources."""
        self.free_wgs -= 1
        self.free_threads -= shape.threads
        self.free_waves -= shape.wavefronts(self.config.wavefront_size)
        self.free_lds -= shape.lds_bytes
        self.free_regs -= shape.register_bytes()

    def give(self, shape: WorkgroupShape) -> None:
        """Release a WG's resources."""
        self.free_wgs += 1
        self.free_threads += shape.threads
        self.free_waves += shape.wavefronts(self.config.wavefront_size)
        self.free_lds += shape.lds_bytes
        self.free_regs += shape.register_bytes()

    def compute(self, now: float, flops: float, flops_per_ns: float, wavefronts: int) -> float:
        """Run ``flops`` at a CU peak of ``flops_per_ns``; return the finishing time, ns."""
        full = flops / flops_per_ns
        share = wavefronts / SIMDS_PER_CU
        if share > 1.0:
            share = 1.0
        reserved = self.math.reserve(now, full)
        alone = now + full / share
        return alone if alone > reserved else reserved

    def miss_equivalent(self, nbytes: float, missed: float | None = None) -> float:
        """Bytes at DRAM latency that occupy in-flight capacity as long as ``nbytes`` of which
        ``missed`` came from DRAM and the rest from the L2 (``None``: all from DRAM)."""
        if missed is None:
            return nbytes
        return missed + (nbytes - missed) * self.hit_latency_ratio

    def memory(self, now: float, nbytes: float, missed: float | None = None) -> float:
        """Earliest time the CU can have moved ``nbytes`` (``missed`` of them from DRAM, the rest
        from the L2; ``None``: all from DRAM) given its memory-level parallelism, ns."""
        return self.mem.reserve(now, self.miss_equivalent(nbytes, missed))


class InflightLimit:
    """The memory-level parallelism of one workgroup: it keeps at most ``inflight_bytes`` in flight.

    With the unloaded miss latency this bounds the WG's own bandwidth (Little's law), whatever the
    CU could do; a kernel that prefetches one K-tile, or whose threads load 16 bytes each, cannot
    stream faster than that tile (or those bytes) per memory latency.

    Parameters
    ----------
    cu
        The CU the WG runs on (for the hit/miss latency ratio).
    inflight_bytes
        Bytes the WG keeps in flight.
    miss_latency_ns
        Unloaded DRAM latency, ns.
    """

    __slots__ = ("cu", "pipe")

    def __init__(self, cu: ComputeUnit, inflight_bytes: float, miss_latency_ns: float):
        self.cu = cu
        self.pipe = Pipe(miss_latency_ns / max(1.0, inflight_bytes))

    def memory(self, now: float, nbytes: float, missed: float | None = None) -> float:
        """Earliest time the WG (and its CU) can have moved ``nbytes``, ``missed`` of them from DRAM, ns."""
        cu = self.cu
        equivalent = cu.miss_equivalent(nbytes, missed)
        own = self.pipe.reserve(now, equivalent)
        shared = cu.mem.reserve(now, equivalent)  # cu.memory(now, nbytes, missed)
        return own if own > shared else shared


WorkgroupBody = Callable[[int, ComputeUnit], Generator]


@dataclass
class Kernel:
    """A grid launch.

    Attributes
    ----------
    name
        Shown in results and timelines.
    num_wgs
        Workgroups in the grid.
    shape
        Per-WG resources.
    body
        ``body(wg_index, cu)`` returns the generator a WG runs.
    cu_mask
        CUs the kernel may use (``None``: all).
    wg_order
        The WG index dispatched ``i``-th (``None``: in index order); used to stagger T3 GEMMs.
    info
        Extra facts for results (FLOPs, bytes, implementation).
    stalls
        Intervals (start, end in ns) in which the kernel's resident WGs all waited for their input
        to arrive, and none worked (:class:`StallClock`); results show them as ``waiting`` spans.
    math_units, peak_flops_per_cu_cycle
        The units (``"matrix"`` or ``"vector"``) that run the FLOPs of ``info["flops"]``, and one
        CU's peak FLOPs per cycle on those units for the kernel's type (``None`` and 0: the
        kernel's arithmetic is not counted).  The kernel's row in ``Result.kernels`` gains
        ``math_units`` and ``math_cu_cycles``, ``flops / peak``: the CU-cycles the units would be
        busy at their full rate, which the energy model prices (:mod:`gpusim.energy`).
    """

    name: str
    num_wgs: int
    shape: WorkgroupShape
    body: WorkgroupBody
    cu_mask: Sequence[int] | None = None
    wg_order: Sequence[int] | None = None
    info: dict = field(default_factory=dict)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    math_units: Literal["matrix", "vector"] | None = None
    peak_flops_per_cu_cycle: float = 0.0


WAITING_PREFIX = "waiting: "
"""Name prefix of the spans (in ``Result.kernels``) of a kernel's :attr:`Kernel.stalls`."""


class StallClock:
    """Times when a kernel whose workgroups may wait for input (a consumer the tracker triggers) does
    nothing else: at least one resident WG waits and none works.  The intervals go to
    :attr:`Kernel.stalls`.

    Parameters
    ----------
    kernel
        The kernel whose WGs report here.
    """

    def __init__(self, kernel: Kernel):
        self.stalls = kernel.stalls
        self.working = 0
        self.waiting = 0
        self.since: float | None = None

    def _update(self, now_ns: float) -> None:
        stalled = self.waiting > 0 and self.working == 0
        if stalled and self.since is None:
            self.since = now_ns
        elif not stalled and self.since is not None:
            if now_ns > self.since:
                self.stalls.append((self.since, now_ns))
            self.since = None

    def starts(self, now_ns: float, waits: bool) -> None:
        """A WG is resident, and ``waits`` for its input or works."""
        if waits:
            self.waiting += 1
        else:
            self.working += 1
        self._update(now_ns)

    def resumes(self, now_ns: float) -> None:
        """A waiting WG's input arrived: it works."""
        self.waiting -= 1
        self.working += 1
        self._update(now_ns)

    def ends(self, now_ns: float) -> None:
        """A working WG finished."""
        self.working -= 1
        self._update(now_ns)


class KernelRun:
    """A kernel being dispatched: progress, and an event that fires when its last WG ends."""

    __slots__ = ("kernel", "cus", "indices", "allowed", "dispatched", "finished", "done", "start_ns", "end_ns")

    def __init__(self, env: simpy.Environment, kernel: Kernel, cus: list[ComputeUnit]):
        self.kernel = kernel
        self.cus = sorted(cus, key=lambda cu: cu.index)
        self.indices = [cu.index for cu in self.cus]
        self.allowed = None if kernel.cu_mask is None else frozenset(kernel.cu_mask)
        self.dispatched = 0
        self.finished = 0
        self.done = env.event()
        self.start_ns: float | None = None
        self.end_ns: float | None = None


class Dispatcher:
    """Places workgroups of the running kernels on CUs with room.

    Parameters
    ----------
    env
        The simpy environment.
    cus
        The GPU's CUs.
    policy
        ``"round_robin"``: concurrent kernels take turns placing one WG each;
        ``"fifo"``: the earliest kernel places all it can first.

    Placement walks the CUs round robin with one cursor for all kernels (as the hardware's
    workgroup dispatcher balances WGs over the CUs), so concurrent kernels spread over idle CUs
    instead of piling onto the same ones.
    """

    def __init__(self, env: simpy.Environment, cus: list[ComputeUnit], policy: str = "round_robin"):
        if policy not in DISPATCH_POLICIES:
            raise ConfigError(f"dispatch_policy: unknown dispatch policy {policy!r}; known: {', '.join(DISPATCH_POLICIES)}")
        self.env = env
        self.cus = cus
        self.policy = policy
        self.active: list[KernelRun] = []
        self.dispatch_observers: list[Callable[[KernelRun], None]] = []
        """Called with a kernel's run when its last workgroup has been placed (its queue's head
        changes: a command processor may then dispatch the next kernel).  An observer must not
        launch a kernel synchronously; it may schedule one."""
        self._turn = 0
        self._next_cu = 0

    def launch(self, kernel: Kernel) -> KernelRun:
        """Start dispatching ``kernel``; the returned run's ``done`` event fires when it ends."""
        if kernel.num_wgs <= 0:
            raise ValueError(f"kernel {kernel.name!r} has no workgroups")
        allowed = self.cus if kernel.cu_mask is None else [self.cus[i] for i in kernel.cu_mask]
        if not allowed:
            raise ValueError(f"kernel {kernel.name!r} has an empty CU mask")
        if not any(occupancy(kernel.shape, cu.config) for cu in allowed):
            raise ValueError(f"a workgroup of kernel {kernel.name!r} ({kernel.shape}) fits on no CU")
        run = KernelRun(self.env, kernel, allowed)
        self.active.append(run)
        self._dispatch(None)
        return run

    def _place(self, run: KernelRun, cu: ComputeUnit) -> None:
        kernel = run.kernel
        sequence = run.dispatched
        wg = sequence if kernel.wg_order is None else kernel.wg_order[sequence]
        run.dispatched += 1
        cu.take(kernel.shape)
        if run.start_ns is None:
            run.start_ns = self.env.now
        self.env.process(self._run(run, wg, cu))
        if run.dispatched == kernel.num_wgs:
            for observer in self.dispatch_observers:
                observer(run)

    def _run(self, run: KernelRun, wg: int, cu: ComputeUnit):
        yield from run.kernel.body(wg, cu)
        cu.give(run.kernel.shape)
        run.finished += 1
        if run.finished == run.kernel.num_wgs:
            run.end_ns = self.env.now
            run.done.succeed(run)
        self._dispatch(cu)

    def _find_cu(self, run: KernelRun) -> ComputeUnit | None:
        """The first CU with room for one of ``run``'s WGs at or after the dispatcher's cursor."""
        cus = run.cus
        count = len(cus)
        shape = run.kernel.shape
        start = bisect_left(run.indices, self._next_cu)
        for step in range(count):
            cu = cus[(start + step) % count]
            if cu.fits(shape):
                self._next_cu = cu.index + 1 if cu.index + 1 < len(self.cus) else 0
                return cu
        return None

    def _dispatch(self, freed: ComputeUnit | None) -> None:
        """Place WGs while any fit; after a WG ends only its CU can have gained room."""
        active = self.active
        placed = True
        while placed and active:
            placed = False
            start = 0 if self.policy == "fifo" else self._turn % len(active)
            runs = active[start:] + active[:start]
            for position, run in enumerate(runs):
                if run.dispatched >= run.kernel.num_wgs:
                    continue
                if freed is not None:
                    if (run.allowed is not None and freed.index not in run.allowed) or not freed.fits(
                        run.kernel.shape
                    ):
                        continue
                    cu = freed
                else:
                    cu = self._find_cu(run)
                    if cu is None:
                        continue
                self._place(run, cu)
                placed = True
                self._turn = start + position + 1
                break
            self.active = active = [run for run in active if run.dispatched < run.kernel.num_wgs]
