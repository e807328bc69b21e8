"""Executing ops on streams: per-rank stream processes, dependencies, kernel launches, records.

An op runs on a rank inside an :class:`OpContext`, which gives it the rank's GPU, its tensors and a
way to launch kernels.  Ops on one stream of a rank run one after another; ops on different
streams run concurrently and share the GPU.  Collectives additionally share per-op state across
the ranks that take part (flags that say a neighbour's data has arrived).

Each rank has one host thread that issues its kernels asynchronously, as a framework does: every
launch call costs it ``GpuConfig.kernel_launch_ns``, one after another in the order the launches
are made, and it never waits for the GPU.  A kernel starts at the later of its launch call's return
and its predecessor's end plus the GPU's completion-to-dispatch latency
(``GpuConfig.dependent_launch_ns``).  So a stream of short kernels is bound by the host (one kernel
per launch cost) and a stream of long kernels by the GPU (gaps of the dispatch latency): the host
runs ahead of the GPU.  A kernel ends ``GpuConfig.kernel_device_ns`` after its last workgroup (the
GPU's own per-kernel cost, which a profiler's kernel durations include).  Ops whose kernels were issued before the run (a command processor's
packets, :mod:`gpusim.sched.command_processor`) bypass the host: each kernel waits the launch
cost from its release (the dispatch latency for a kernel queued behind its op's previous one).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simpy.events import Event

from gpusim.engine.simulation import Simulation, Span
from gpusim.errors import OpError
from gpusim.hw.compute import WAITING_PREFIX, Kernel, KernelRun
from gpusim.hw.gpu import Buffer, Gpu
from gpusim.hw.system import Machine

if TYPE_CHECKING:
    from gpusim.ops import Op


@dataclass(frozen=True)
class Stream:
    """A queue of ops on each GPU.

    Attributes
    ----------
    name
        Stream name (ops naming the same stream run in order).
    cu_mask
        CUs its kernels may use (``None``: all) — CU masking / CU partitioning.
    """

    name: str = "compute"
    cu_mask: tuple[int, ...] | None = None


@dataclass
class OpRecord:
    """What happened to one op on one rank."""

    op: Op
    rank: int
    stream: str
    start_ns: float
    end_ns: float
    info: dict[str, Any] = field(default_factory=dict)
    released_ns: float | None = None
    """When the op let its stream move on before it ended (:meth:`OpContext.release_stream`), ns;
    ``None``: at its end."""


class OpContext:
    """What an op's executor sees while it runs on one rank.

    Attributes
    ----------
    executor, machine, sim
        The run's executor, simulated machine and simulation.
    op, rank, gpu, stream
        The op, the rank it runs on, that rank's (simulated) GPU and the stream.
    group
        The ranks the op spans.
    preissued
        The op's kernels were issued before the run: they bypass the rank's host thread.
    follows
        The next kernel follows GPU work that just ended (the op's dependencies, or its previous
        kernel), so the GPU's completion-to-dispatch latency applies to it.
    issue_ns
        When the host's launch call of the op's first kernel returned, measured (a replayed trace's
        ``issue_s``), ns; ``None``: the host thread's model.
    issued_ns
        When the op was issued at its measured ``issue_ns`` (set as it is), ns: the op's record starts
        there, not while it waited for its host, so a host-bound replay shows its GPU idle.
    released
        Fired when the op's stream may move on (:meth:`release_stream`, or the op's end); ``None``:
        the stream waits for the op's end whatever the op says.
    released_ns
        When :meth:`release_stream` let the stream move on, ns (``None`` until then).
    info
        Facts the executor adds to the op's record (implementation, FLOPs, bytes...).
    """

    def __init__(self, executor: Executor, op: Op, rank: int, stream: Stream, group: list[int],
                 preissued: bool = False, follows: bool = False, issue_ns: float | None = None,
                 released: Event | None = None):
        self.executor = executor
        self.released = released
        self.released_ns: float | None = None
        self.preissued = preissued
        self.follows = follows
        self.issue_ns = issue_ns
        self.issued_ns: float | None = None
        self.machine = executor.machine
        self.sim = executor.sim
        self.env = executor.sim.env
        self.op = op
        self.rank = rank
        self.gpu: Gpu = self.machine.gpu(rank)
        self.stream = stream
        self.group = group
        self.info: dict[str, Any] = {}

    @property
    def config(self):
        """The system's configuration."""
        return self.machine.config

    @property
    def cu_mask(self) -> tuple[int, ...] | None:
        """CUs this op's kernels may use."""
        return self.stream.cu_mask

    @property
    def cus(self) -> int:
        """How many CUs this op's kernels may use (the mask's, or the GPU's)."""
        return len(self.cu_mask) if self.cu_mask is not None else self.gpu.config.num_cus

    def tensor(self, name: str | None, nbytes: int, cached: bool = True) -> Buffer:
        """The buffer of tensor ``name`` on this rank's GPU (allocated at first use, ``nbytes`` long).

        An unnamed tensor is private to this op.  A named tensor that exists but is smaller than
        ``nbytes`` (e.g. a consumer that pads its tiles more) is moved to a new, larger buffer.
        """
        return self.executor.tensor(self.rank, name, nbytes, cached, self.op)

    def shared(self) -> dict[str, Any]:
        """State shared by all ranks taking part in this op (e.g. arrival flags)."""
        return self.executor.shared.setdefault(self.op.uid, {})

    def release_stream(self) -> None:
        """Let the op's stream move on now, before the op ends: its compute kernels are done and what
        remains (a collective's tail, driven by DMA engines or by kernels on another lane) needs no
        stream slot.  Only where the op was submitted with a ``released`` event (a trace row that says
        its collective finishes on its own); rows that need the op's result still wait for its end."""
        if self.released is not None and not self.released.triggered:
            self.released_ns = self.env.now
            self.released.succeed()

    def wait_for_issue(self) -> Generator[Event, Any, None]:
        """Wait until the host issued this op, where that was measured (``issue_ns``); an op that
        runs no kernel (a measured copy replayed as a delay) starts no earlier."""
        if self.issue_ns is not None and not self.preissued:
            at = self.executor.issue(self.rank, 0.0, self.issue_ns)
            self.issue_ns = None
            self.issued_ns = at
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)

    def launch(self, kernel: Kernel, host_ns: float | None = None,
               latency_ns: float = 0.0, queue: str | None = None) -> Generator[Event, Any, KernelRun]:
        """Launch ``kernel`` on this rank's GPU; return when it ends.

        The rank's host thread issues the launch after its earlier ones (a span on the rank's
        ``host`` lane, category ``call``, shows the call in the timeline), which costs it
        ``host_ns`` (default: the GPU's ``kernel_launch_ns``; 0 for a kernel the same library call
        queues behind the previous one, such as a split-K GEMM's reduction).  The kernel is ready
        at the later of that issue and now, plus the GPU's ``dependent_launch_ns`` where it
        follows GPU work (:attr:`follows`), then ``latency_ns`` more (device-side set-up such as a
        collective's), ns.  It then waits for its stream's hardware queue to finish the kernel
        before it (:mod:`gpusim.hw.queues`).  Once its last workgroup has ended, the kernel takes
        the GPU's ``kernel_device_ns`` more to complete (its queue's next kernel waits for that).
        The kernel's ``info`` gains the launching op's ``op_id`` (kept in ``Result.kernels``).
        ``queue`` names a second stream the op drives beside its own (a communication kernel that
        runs next to its compute kernels): the kernel waits for a hardware queue of that stream's
        own and shows on its lane.
        """
        if kernel.cu_mask is None and self.cu_mask is not None:
            kernel.cu_mask = self.cu_mask
        kernel.info.setdefault("op_id", self.op.uid)
        config = self.gpu.config
        if self.preissued:  # released by a command processor: the launch latency, or the dispatch gap
            ready = self.env.now + (config.kernel_launch_ns if host_ns is None else config.dependent_launch_ns)
        else:
            cost = config.kernel_launch_ns if host_ns is None else host_ns
            gap = config.dependent_launch_ns if self.follows else 0.0
            returned = self.executor.issue(self.rank, cost, self.issue_ns)
            if self.issue_ns is not None:
                self.issued_ns = returned
            if cost or self.issue_ns is not None:  # the host's call, on the rank's "host calls" track
                called = returned if self.issue_ns is not None else returned - cost
                self.sim.recorder.span(Span(f"launch {kernel.name}", "call", self.rank, "host", called, returned,
                                            {"op_id": self.op.uid}))
            ready = max(returned, self.env.now + gap)
            self.issue_ns = None
        ready += latency_ns
        if ready > self.env.now:
            yield self.env.timeout(ready - self.env.now)
        lane = self.stream.name if queue is None else queue
        hardware = self.gpu.queues.queue(lane, masked=self.stream.cu_mask is not None or queue is not None)
        with hardware.request() as turn:
            yield turn
            run = self.gpu.dispatcher.launch(kernel)
            yield run.done
            if config.kernel_device_ns:
                yield self.env.timeout(config.kernel_device_ns)
        self.follows = True
        args = dict(kernel.info)
        if kernel.math_units is not None and kernel.peak_flops_per_cu_cycle > 0:  # priced by gpusim.energy
            args.update(math_units=kernel.math_units,
                        math_cu_cycles=kernel.info.get("flops", 0.0) / kernel.peak_flops_per_cu_cycle)
        self.sim.recorder.span(Span(kernel.name, "kernel", self.rank, lane, run.start_ns,
                                    run.end_ns + config.kernel_device_ns, args))
        for start_ns, end_ns in kernel.stalls:  # inside the kernel's span: all its resident workgroups wait
            self.sim.recorder.span(Span(f"{WAITING_PREFIX}{kernel.name}", "kernel", self.rank, lane, start_ns, end_ns,
                                        {"op_id": kernel.info.get("op_id"), "waiting": True}))
        return run


class Executor:
    """Runs ops on the simulated machine.

    Parameters
    ----------
    sim
        The simulation.
    machine
        The simulated hardware.
    on_op_done
        Called after every (op, rank) finishes, e.g. to advance a progress bar.
    """

    def __init__(self, sim: Simulation, machine: Machine, on_op_done=None):
        self.sim = sim
        self.machine = machine
        self.records: list[OpRecord] = []
        self.shared: dict[int, dict[str, Any]] = {}
        self._tensors: dict[int, dict[str, Buffer]] = {}
        self._on_op_done = on_op_done
        self._host_ns: dict[int, float] = {}

    def issue(self, rank: int, cost_ns: float, at_ns: float | None = None) -> float:
        """Issue a launch call on ``rank``'s host thread, which it keeps busy for ``cost_ns``;
        return when the call returns, ns (the host never waits for the GPU).  ``at_ns``: the call
        returned then, measured (the host's later calls follow it)."""
        last = self._host_ns.get(rank, 0.0)
        returned = last + cost_ns if at_ns is None else at_ns
        self._host_ns[rank] = max(last, returned)
        return returned

    def tensor(self, rank: int, name: str | None, nbytes: int, cached: bool, op: Op) -> Buffer:
        """See :meth:`OpContext.tensor`."""
        gpu = self.machine.gpu(rank)
        key = gpu.index
        if name is None:
            return gpu.alloc(f"{op.label}#{op.uid}", nbytes, cached)
        table = self._tensors.setdefault(key, {})
        buffer = table.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = table[name] = gpu.alloc(name, nbytes, cached)
        return buffer

    def group_of(self, op: Op) -> list[int]:
        """Ranks ``op`` runs on (checked against the machine)."""
        ranks = list(range(self.machine.num_ranks)) if op.ranks is None else list(op.ranks)
        for rank in ranks:
            if rank >= self.machine.num_ranks:
                raise OpError(
                    f"{op.label}: rank {rank} does not exist; {self.machine.config.name} has "
                    f"ranks 0..{self.machine.num_ranks - 1}"
                )
        return ranks

    def submit(self, op: Op, rank: int, stream: Stream, after: list[Event] | None = None,
               preissued: bool = False, issue_ns: float | None = None, released: Event | None = None) -> Event:
        """Run ``op`` on ``rank`` once every event in ``after`` has fired; return its completion event.

        ``preissued``: the op's kernels were issued before the run (they bypass the host thread).
        ``issue_ns``: when the host's call that launched its first kernel returned, measured, ns.
        ``released``: an event to fire when the op lets its stream move on (:meth:`OpContext.release_stream`,
        or its end); the caller makes the stream's next op wait for it instead of the completion.
        """
        done = self.sim.event()
        self.sim.process(self._execute(op, rank, stream, after or [], done, preissued, issue_ns, released))
        return done

    def _execute(self, op: Op, rank: int, stream: Stream, after: list[Event], done: Event, preissued: bool,
                 issue_ns: float | None, released: Event | None):
        for event in after:
            if not event.processed:
                yield event
        ctx = OpContext(self, op, rank, stream, self.group_of(op), preissued, follows=bool(after), issue_ns=issue_ns,
                        released=released)
        start = self.sim.now
        yield from op.run_on(ctx)
        end = self.sim.now
        if ctx.issued_ns is not None:  # it waited for its measured host call, not for the GPU
            start = min(max(start, ctx.issued_ns), end)
        if released is not None and not released.triggered:
            released.succeed()
        self.records.append(OpRecord(op, rank, stream.name, start, end, ctx.info, ctx.released_ns))
        args = {"category": op.category, "op_id": op.uid, **ctx.info}
        self.sim.recorder.span(Span(op.label, "op", rank, stream.name, start, end, args))
        if self._on_op_done is not None:
            self._on_op_done()
        done.succeed()
