"""Streams and the command processor (CP) that decides which queued GEMM kernels run concurrently.

Software puts *kernel packets* into queues (streams).  The CP inspects the packets at the heads of
all active queues and dispatches as many independent kernels as its policy allows; their
workgroups then share the CUs (interleaved by the GPU's dispatcher), the L2 and HBM.  A queue is
in order: its next packet becomes a head when the previous one has completed.  The CP looks again
whenever a head changes: when work is enqueued, when a kernel has placed its last workgroup
(finished dispatching) and when a kernel completes (dissertation section 7.3.4).

A GEMM packet carries a map from concurrency degree to kernel implementation (GOLDYLOC's
kernel-packet extension): degree 1 is the isolation-tuned kernel a BLAS library returns; the
others are kernels tuned for sharing the GPU.  Policies decide how many heads to dispatch and
for which degree:

* :class:`DispatchAll` — today's CP: every head, at once (optionally with the kernels tuned for
  the resulting degree);
* :class:`DegreeLimit` — at most ``n`` kernels dispatching at once;
* :class:`PredictedDegree` — GOLDYLOC's dynamic logic: a predictor chooses the degree from the
  queued GEMMs' features, ``min(predicted, available)``; GEMMs of different shapes run as
  homogeneous sets, one after another, unless all prefer to run together.

Deciding costs the CP time (:class:`CommandProcessorTiming`): it reads the queue heads, runs the
predictor and rewrites the packets.  The CP does this while earlier kernels run, so the cost is
hidden unless the GPU would otherwise be idle (section 7.5.5).  CU masking (CU-Partition) comes
from the packets' streams (:class:`gpusim.Stream` ``cu_mask``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from simpy.events import Event

from gpusim.hw.compute import KernelRun
from gpusim.kernels.gemm import GemmKernelSpec, execute_gemm
from gpusim.ops import Gemm
from gpusim.sched.executor import Executor, OpContext, Stream


@dataclass(frozen=True)
class CommandProcessorTiming:
    """What a CP decision costs (dissertation section 7.4.4.2).

    Attributes
    ----------
    clock_hz
        The CP's clock (1.5 GHz).
    memory_latency_cycles
        Latency of one CP memory access, cycles (31).
    max_streams
        Software queues the CP scans (32).
    predictor_ns
        Evaluating the concurrency predictor on the CP's core, ns.  Section 7.4.4.2 measured the
        predictor on a CPU like the CP's; with the queue reads and writes the total was about
        8 us, which leaves 8 us - 2 x 0.66 us for the predictor.
    """

    clock_hz: float = 1.5e9
    memory_latency_cycles: float = 31.0
    max_streams: int = 32
    predictor_ns: float = 6680.0

    def __post_init__(self) -> None:
        for name in ("clock_hz", "memory_latency_cycles", "max_streams"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CommandProcessorTiming: field '{name}' must be positive, got {getattr(self, name)!r}")
        if self.predictor_ns < 0:
            raise ValueError(f"CommandProcessorTiming: field 'predictor_ns' must be non-negative, got {self.predictor_ns!r}")

    @property
    def queue_pass_ns(self) -> float:
        """Reading (or writing) one packet in each of the CP's queues, ns."""
        return self.max_streams * self.memory_latency_cycles / self.clock_hz * 1e9

    @property
    def decision_ns(self) -> float:
        """Inspecting the heads, predicting and rewriting the packets, ns."""
        return 2 * self.queue_pass_ns + self.predictor_ns


@dataclass
class TunedGemm(Gemm):
    """A GEMM run with a given kernel implementation (the one its packet was rewritten to).

    Attributes
    ----------
    spec
        The kernel; ``None`` runs the library heuristic's choice, as :class:`gpusim.ops.Gemm` does.
    degree
        Concurrency degree the kernel was chosen for (recorded in results).
    """

    spec: GemmKernelSpec | None = None
    degree: int = 1

    def run_on(self, ctx: OpContext):
        ctx.info["degree"] = self.degree
        return execute_gemm(ctx, self, spec=self.spec)


@dataclass
class KernelPacket:
    """A GEMM in a CP queue, with the kernels it may be rewritten to.

    Attributes
    ----------
    gemm
        The GEMM (its tensor names, if any, decide what it shares with other GEMMs).
    stream
        Its queue; the stream's CU mask confines its kernel.
    kernels
        Kernel per concurrency degree; degree 1 (the isolation-tuned kernel) is required.  A
        GEMM dispatched at degree ``d`` runs the kernel of the largest degree ``<= d``.
    features
        The concurrency predictor's input for this GEMM (GOLDYLOC), if any.
    label
        Name in results (default: the GEMM's).
    """

    gemm: Gemm
    stream: Stream
    kernels: Mapping[int, GemmKernelSpec]
    features: np.ndarray | None = None
    label: str | None = None
    degree: int | None = field(default=None, init=False)
    released_ns: float | None = field(default=None, init=False)
    dispatched_ns: float | None = field(default=None, init=False)
    done: Event | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if 1 not in self.kernels:
            raise ValueError(f"KernelPacket {self.gemm.label}: 'kernels' needs the isolation-tuned kernel under degree 1")
        for degree in self.kernels:
            if not isinstance(degree, int) or degree < 1:
                raise ValueError(f"KernelPacket {self.gemm.label}: degrees in 'kernels' must be positive integers, got {degree!r}")

    def kernel_for(self, degree: int) -> GemmKernelSpec:
        """The kernel of the largest tuned degree not above ``degree``."""
        return self.kernels[max(d for d in self.kernels if d <= max(1, degree))]


class ConcurrencyPolicy(Protocol):
    """How many queue heads the CP dispatches now, and for which concurrency degree.

    Attributes
    ----------
    decides
        Whether the policy runs dynamic logic that costs the CP :attr:`CommandProcessorTiming.decision_ns`.
    """

    decides: bool

    def select(self, heads: Sequence[KernelPacket], dispatching: Sequence[KernelPacket]) -> tuple[list[KernelPacket], int]:
        """Return ``(packets, degree)``: dispatch ``packets`` (some of ``heads``) with kernels for ``degree``.

        ``heads`` are the packets at the heads of the queues not yet dispatched, in queue order;
        ``dispatching`` are the packets the CP dispatched whose kernels are still placing workgroups.
        """
        ...


@dataclass(frozen=True)
class DispatchAll:
    """Today's CP: dispatch every head at once.

    Attributes
    ----------
    tuned_for_degree
        ``False``: every GEMM runs its isolation-tuned kernel (*Default*); ``True``: the kernel
        tuned for the resulting degree (*GO-Kernels*).
    """

    tuned_for_degree: bool = False
    decides: bool = False

    def select(self, heads: Sequence[KernelPacket], dispatching: Sequence[KernelPacket]) -> tuple[list[KernelPacket], int]:
        return list(heads), (len(heads) + len(dispatching)) if self.tuned_for_degree else 1


@dataclass(frozen=True)
class DegreeLimit:
    """Keep at most ``degree`` kernels dispatching; they run the kernels tuned for ``degree``.

    Attributes
    ----------
    degree
        The concurrency degree (1: one kernel at a time).
    decides
        Whether choosing costs the CP decision time (an oracle that knows the degree in advance
        still inspects and rewrites the packets).
    """

    degree: int
    decides: bool = False

    def __post_init__(self) -> None:
        if self.degree < 1:
            raise ValueError(f"DegreeLimit: degree must be at least 1, got {self.degree}")

    def select(self, heads: Sequence[KernelPacket], dispatching: Sequence[KernelPacket]) -> tuple[list[KernelPacket], int]:
        return list(heads[:max(0, self.degree - len(dispatching))]), self.degree


@dataclass(frozen=True)
class PredictedDegree:
    """GOLDYLOC's dynamic logic: degree ``min(predicted, available GEMMs)``.

    Each distinct GEMM (by shape and dtype) among the queued and dispatching ones gets the
    predictor's degree. GEMMs of one shape run at ``min(predicted, available)``. Several shapes
    together (section 7.5.7) run all at once only if every one of them prefers at least that many;
    otherwise the CP treats each shape's GEMMs as a homogeneous set of their own and serves the
    sets one at a time (the set of the kernels still dispatching, else that of the first head),
    each at ``min(its predicted degree, its GEMMs available)``.

    Attributes
    ----------
    predict
        ``predict(features) -> degree`` (e.g. :meth:`gpusim.sched.goldyloc.ConcurrencyPredictor.predict_degree`).
    """

    predict: Callable[[np.ndarray], int]
    decides: bool = True

    def select(self, heads: Sequence[KernelPacket], dispatching: Sequence[KernelPacket]) -> tuple[list[KernelPacket], int]:
        if not heads:
            return [], max(1, len(dispatching))
        predictions: dict[tuple, int] = {}
        for packet in [*dispatching, *heads]:
            key = _shape_key(packet)
            if key not in predictions:
                if packet.features is None:
                    raise ValueError(f"PredictedDegree: packet {packet.label or packet.gemm.label} has no features to "
                                     "predict from")
                predictions[key] = int(self.predict(packet.features))
        available = len(heads) + len(dispatching)
        if len(predictions) == 1 or min(predictions.values()) >= available:
            degree = max(1, min(min(predictions.values()), available))
            return list(heads[:max(0, degree - len(dispatching))]), degree
        served = _shape_key(dispatching[0] if dispatching else heads[0])
        members = [packet for packet in heads if _shape_key(packet) == served]
        running = sum(1 for packet in dispatching if _shape_key(packet) == served)
        degree = max(1, min(predictions[served], len(members) + running))
        return members[:max(0, degree - len(dispatching))], degree


def _shape_key(packet: KernelPacket) -> tuple:
    """What makes two queued GEMMs the same GEMM for the predictor: shape, batch and dtype."""
    gemm = packet.gemm
    return gemm.m, gemm.n, gemm.k, gemm.batch, gemm.dtype


class CommandProcessor:
    """The CP of one GPU: queues of kernel packets, a policy, and the time its decisions take.

    Parameters
    ----------
    executor
        The run's executor (see :func:`gpusim.simulate.prepare`).
    rank
        The GPU it serves.
    policy
        Decides which heads to dispatch and for which degree.
    timing
        Cost of a decision.
    """

    def __init__(self, executor: Executor, rank: int, policy: ConcurrencyPolicy,
                 timing: CommandProcessorTiming | None = None):
        self.executor = executor
        self.rank = rank
        self.policy = policy
        self.timing = timing or CommandProcessorTiming()
        self.env = executor.sim.env
        self.queues: dict[str, deque[KernelPacket]] = {}
        self.dispatching: dict[int, KernelPacket] = {}
        self.decisions = 0
        self.busy_ns = 0.0
        self._deciding = False
        self._again = False
        executor.machine.gpu(rank).dispatcher.dispatch_observers.append(self._on_dispatched)

    def submit(self, packet: KernelPacket) -> Event:
        """Put ``packet`` at the end of its stream's queue now; return the event of its completion."""
        if packet.done is not None:
            raise ValueError(f"packet {packet.label or packet.gemm.label} was already submitted")
        packet.done = self.env.event()
        queue = self.queues.setdefault(packet.stream.name, deque())
        queue.append(packet)
        if len(queue) == 1:
            self._reconsider()
        return packet.done

    def _heads(self) -> list[KernelPacket]:
        return [queue[0] for queue in self.queues.values() if queue and queue[0].released_ns is None]

    def _reconsider(self) -> None:
        """A head changed: inspect the queues (once everything happening now has happened)."""
        if self._deciding:
            self._again = True
            return
        self._deciding = True
        self.env.timeout(0.0).callbacks.append(self._inspect)

    def _inspect(self, _event) -> None:
        heads = self._heads()
        if not heads:
            self._deciding = False
            return
        if self.policy.decides and len(heads) + len(self.dispatching) > 1:
            self.busy_ns += self.timing.decision_ns
            self.env.timeout(self.timing.decision_ns).callbacks.append(self._decide)
        else:
            self._decide(None)

    def _decide(self, _event) -> None:
        heads = self._heads()
        chosen, degree = self.policy.select(heads, list(self.dispatching.values()))
        self.decisions += 1
        for packet in chosen:
            self._release(packet, degree)
        self._deciding = False
        if self._again:
            self._again = False
            self._reconsider()

    def _release(self, packet: KernelPacket, degree: int) -> None:
        gemm = packet.gemm
        op = TunedGemm(
            gemm.m, gemm.n, gemm.k, dtype=gemm.dtype, trans_a=gemm.trans_a, trans_b=gemm.trans_b, batch=gemm.batch,
            a=gemm.a, b=gemm.b, out=gemm.out, name=packet.label or gemm.name, ranks=[self.rank],
            spec=packet.kernel_for(degree), degree=degree,
        )
        packet.degree = degree
        packet.released_ns = self.env.now
        self.dispatching[op.uid] = packet
        finished = self.executor.submit(op, self.rank, packet.stream, preissued=True)
        finished.callbacks.append(lambda _event, packet=packet, uid=op.uid: self._on_done(packet, uid))

    def _on_dispatched(self, run: KernelRun) -> None:
        packet = self.dispatching.pop(run.kernel.info.get("op_id"), None)
        if packet is not None:
            packet.dispatched_ns = self.env.now
            self._reconsider()

    def _on_done(self, packet: KernelPacket, uid: int) -> None:
        if self.dispatching.pop(uid, None) is not None:
            packet.dispatched_ns = self.env.now
        queue = self.queues[packet.stream.name]
        queue.popleft()
        packet.done.succeed()
        self._reconsider()
