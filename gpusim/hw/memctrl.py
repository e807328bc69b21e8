"""Memory controllers: one per HBM channel, a finite queue, admission and arbitration policies.

Arbitration policies are pure functions ``pick(queue, now, view) -> index`` of the request to
serve next (Ciw style, testable without a simulation).  ``view`` answers questions about the
channel (is a request's row open? which stream was served last?).  Admission rules decide whether
a waiting request may enter the queue; T3-MCA uses one to keep communication from filling it.

The controller serves its queue as a simpy process that wakes once per request (or once per group
of requests that it can schedule at once): it picks a request, computes its timing on the
channel, tells the requester when it will be done, and sleeps until the data bus is close to free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpusim.config.gpu import McaConfig, MemCtrlConfig
from gpusim.engine.component import Component
from gpusim.engine.simulation import Simulation
from gpusim.errors import ConfigError
from gpusim.hw.hbm import READ, HbmChannel
from gpusim.hw.request import COMM, COMPUTE, NMC, MemRequest


class ChannelView(Protocol):
    """What a policy may ask about the channel it arbitrates.

    Attributes
    ----------
    open_row
        Open row of each bank (-1 when closed); a request hits when
        ``open_row[request.bank] == request.row``.
    last_stream
        Stream of the request served last.
    last_group
        Bank group of the request served last (-1: none known).
    banks_per_group
        Banks in a bank group (a request's group is ``request.bank // banks_per_group``).
    """

    open_row: list[int]
    last_stream: str | None
    last_group: int
    banks_per_group: int


def fcfs(queue: Sequence[MemRequest], now: float, view: ChannelView) -> int:
    """First come, first served."""
    return 0


def _first_ready(queue: Sequence[MemRequest], view: ChannelView, streams: tuple[str, ...] | None = None) -> int | None:
    """First-ready FCFS over bank groups among the requests of ``streams`` (``None``: all): the oldest
    request that hits an open row in another bank group than the last request's; else the oldest
    request in another bank group; else the oldest row hit; else the oldest (``None``: no request
    of ``streams``).  A bank group takes a burst every ``t_ccd_l`` and the bus one every
    ``t_ccd_s``, so a controller that alternates bank groups keeps its bus busy where serving one
    group's row hits would leave it half idle."""
    open_row = view.open_row
    last, per_group = view.last_group, view.banks_per_group
    hit = other = first = None
    for index, request in enumerate(queue):
        if streams is not None and request.stream not in streams:
            continue
        if first is None:
            first = index
        elsewhere = request.bank // per_group != last
        if open_row[request.bank] == request.row:
            if elsewhere:
                return index
            if hit is None:
                hit = index
        elif elsewhere and other is None:
            other = index
    if other is not None:
        return other
    return hit if hit is not None else first


def fr_fcfs(queue: Sequence[MemRequest], now: float, view: ChannelView) -> int:
    """First-ready FCFS over bank groups (:func:`_first_ready`)."""
    index = _first_ready(queue, view)
    return 0 if index is None else index


def round_robin_streams(queue: Sequence[MemRequest], now: float, view: ChannelView) -> int:
    """Alternate between the compute stream and the others; fall back when one is empty.

    Within a stream, first-ready FCFS.  This is the naive policy the dissertation shows is not
    enough to protect a GEMM from bursty communication (section 8.3.5).
    """
    prefer_compute = view.last_stream != COMPUTE
    order = ((COMPUTE,), (COMM, NMC)) if prefer_compute else ((COMM, NMC), (COMPUTE,))
    for streams in order:
        index = _first_ready(queue, view, streams)
        if index is not None:
            return index
    return 0


def compute_first(queue: Sequence[MemRequest], now: float, view: ChannelView) -> int:
    """T3-MCA's pick: compute-stream requests first (first-ready FCFS), then the rest."""
    index = _first_ready(queue, view, (COMPUTE,))
    if index is not None:
        return index
    return fr_fcfs(queue, now, view)


PickFn = Callable[[Sequence[MemRequest], float, ChannelView], int]

PICK_POLICIES: dict[str, PickFn] = {
    "fcfs": fcfs,
    "fr-fcfs": fr_fcfs,
    "round-robin": round_robin_streams,
    "t3-mca": compute_first,
}
"""Arbitration policies by name."""


@dataclass
class McaState:
    """T3-MCA's GPU-wide state: the communication threshold and the intensity it was chosen from.

    The threshold is a fraction of the queue capacity; ``None`` means no limit.  While
    ``observing``, controllers add queue-occupancy samples that :meth:`choose` turns into the
    kernel's memory intensity.
    """

    config: McaConfig
    threshold: float | None = None
    observing: bool = False
    samples: float = 0.0
    occupancy_sum: float = 0.0
    chosen: list[tuple[float, float | None]] = field(default_factory=list)

    def observe(self) -> None:
        """Start measuring the memory intensity of the running (isolated) kernel stage."""
        self.observing = True
        self.samples = 0.0
        self.occupancy_sum = 0.0

    def sample(self, occupancy_fraction: float) -> None:
        """Add one queue-occupancy sample (fraction of capacity)."""
        if self.observing:
            self.samples += 1
            self.occupancy_sum += occupancy_fraction

    def choose(self) -> float | None:
        """Stop observing; pick the threshold for the measured intensity and return it."""
        self.observing = False
        intensity = self.occupancy_sum / self.samples if self.samples else 0.0
        self.threshold = None
        for threshold, cutoff in zip(self.config.thresholds, self.config.intensity_cutoffs):
            if intensity >= cutoff:
                self.threshold = None if threshold >= 1.0 else threshold
                break
        self.chosen.append((intensity, self.threshold))
        return self.threshold

    def release(self) -> None:
        """Kernel boundary: drain communication without a limit."""
        self.threshold = None
        self.observing = False


class Arbiter:
    """A GPU's memory-controller policy: a pick function plus admission rules.

    Parameters
    ----------
    name
        One of :data:`PICK_POLICIES`.
    mca
        MCA parameters (used by ``"t3-mca"``).
    """

    def __init__(self, name: str, mca: McaConfig):
        if name not in PICK_POLICIES:
            raise ConfigError(f"memory_policy: unknown memory-controller policy {name!r}; known: {', '.join(PICK_POLICIES)}")
        self.name = name
        self.pick: PickFn = PICK_POLICIES[name]
        self.mca = McaState(mca) if name == "t3-mca" else None

    def may_admit(self, stream: str, occupancy: int, capacity: int, waited_ns: float) -> bool:
        """Whether a request of ``stream`` that has waited ``waited_ns`` may enter a queue holding ``occupancy``."""
        if occupancy >= capacity:
            return False
        mca = self.mca
        if mca is None or stream == COMPUTE or mca.threshold is None:
            return True
        return occupancy < mca.threshold * capacity or waited_ns >= mca.config.starvation_limit_ns


ADMISSION_ORDER = (COMPUTE, NMC, COMM)


class MemoryController(Component):
    """The controller of one HBM channel.

    It has no process of its own: a request that finds the channel idle is scheduled at once; a
    request that finds it busy waits in the queue, and the controller wakes (one event) when the
    data bus is about to run dry, schedules as many queued requests as fit in its window, and
    sleeps again.

    Parameters
    ----------
    sim
        The simulation.
    name, parent
        Position in the component hierarchy.
    gpu
        Index of the GPU it belongs to (for recording).
    index
        Channel index within the GPU.
    channel
        The channel's timing model.
    config
        Queue size, latency, scheduling window.
    arbiter
        The GPU's policy (shared by its channels).
    """

    def __init__(
        self,
        sim: Simulation,
        name: str,
        parent: Component,
        gpu: int,
        index: int,
        channel: HbmChannel,
        config: MemCtrlConfig,
        arbiter: Arbiter,
    ):
        super().__init__(sim, name, parent)
        self.gpu = gpu
        self.index = index
        self.channel = channel
        self.capacity = config.queue_entries
        self.latency = config.latency_ns
        self.low_water = channel.activation_ns
        self.high_water = channel.activation_ns + config.schedule_window_ns
        self.arbiter = arbiter
        self._admits_while_room = arbiter.mca is None
        self.queue: list[MemRequest] = []
        self.waiting: dict[str, deque[MemRequest]] = {stream: deque() for stream in ADMISSION_ORDER}
        self.waiting_count = 0
        self.last_stream: str | None = None
        self.last_group = -1
        self.banks_per_group = channel.map.banks_per_group
        self.max_occupancy = 0
        self.served = 0
        self.enqueue_observers: list[Callable[[MemRequest, float], None]] = []
        self._wakeup_pending = False
        self._pumping = False
        self._bin_ns = sim.recorder.bin_ns
        self._bank_row = channel.map.bank_row
        # What _pump reads at every wake-up or submitted request, in one tuple (fewer attribute lookups).
        self._service = (arbiter.pick, arbiter.mca, channel.access, sim.recorder.dram, gpu, index, self.latency,
                         self.banks_per_group)
        self.open_row: list[int] = channel.open_row
        """Open row of each bank of the channel (-1: closed): the channel's own list."""

    # -- requests in ------------------------------------------------------------------------
    def submit(self, request: MemRequest) -> None:
        """Offer a request; it enters the queue now or waits (in arrival order) until admitted."""
        stream = request.stream
        queue = self.queue
        if (
            (not self.waiting_count or not self.waiting[stream])
            and len(queue) < self.capacity
            and (self._admits_while_room or self.arbiter.may_admit(stream, len(queue), self.capacity, 0.0))
        ):
            self._enqueue(request)
            self._pump()
        else:
            self.waiting[stream].append(request)
            self.waiting_count += 1

    def _enqueue(self, request: MemRequest) -> None:
        queue = self.queue
        queue.append(request)
        occupancy = len(queue)
        if occupancy > 1:
            # Only a pick between several requests compares rows: requests get their bank and row
            # when they queue behind another, or when another queues behind them.
            bank_row = self._bank_row
            if occupancy == 2 and queue[0].bank < 0:
                first = queue[0]
                first.bank, first.row = bank_row(first.ch_addr)
            request.bank, request.row = bank_row(request.ch_addr)
        if occupancy > self.max_occupancy:
            self.max_occupancy = occupancy
        if request.admission:
            now = self.env.now
            for join in request.admission:
                join.done_at(now)
        if self.enqueue_observers:
            now = self.env.now
            for observer in self.enqueue_observers:
                observer(request, now)

    def _admit_waiting(self) -> None:
        now = self.env.now
        queue, capacity = self.queue, self.capacity
        # Without admission rules, room in the queue is enough (Arbiter.may_admit).
        may_admit = None if self._admits_while_room else self.arbiter.may_admit
        admitted = True
        while admitted and len(queue) < capacity:
            admitted = False
            for stream in ADMISSION_ORDER:
                waiting = self.waiting[stream]
                if waiting and (
                    may_admit is None or may_admit(stream, len(queue), capacity, now - waiting[0].arrival_ns)
                ):
                    self._enqueue(waiting.popleft())
                    self.waiting_count -= 1
                    admitted = True
                    break

    # -- service ----------------------------------------------------------------------------
    def _pump(self) -> None:
        """Schedule queued requests while the bus has room in the window; then arrange a wake-up."""
        if self._pumping:
            return
        queue = self.queue
        channel = self.channel
        now = self.env.now
        limit = now + self.high_water
        if queue and channel.bus_free <= limit:
            self._pumping = True
            pick, mca, access, traffic, gpu, index, latency, banks_per_group = self._service
            time_bin = int(now // self._bin_ns)
            served = 0
            while queue and channel.bus_free <= limit:
                if mca is not None:
                    mca.sample(len(queue) / self.capacity)
                request = queue.pop(pick(queue, now, self) if len(queue) > 1 else 0)
                kind = request.kind
                stream = request.stream
                end = access(request.ch_addr, request.nbytes, kind, now, request.run_bytes)
                done = end + latency if kind == READ else end
                request.done_ns = done
                served += 1
                self.last_stream = stream
                bank = request.bank
                self.last_group = bank // banks_per_group if bank >= 0 else -1
                traffic[(gpu, index, stream, kind, time_bin)] += request.nbytes
                if request.completion:
                    for join in request.completion:
                        join.done_at(done)
                if request.on_done is not None:
                    request.on_done(request, done)
                if self.waiting_count:
                    self._admit_waiting()
            self.served += served
            self._pumping = False
        if queue and not self._wakeup_pending:
            self._wakeup_pending = True
            wake = self.env.timeout(max(0.0, channel.bus_free - self.low_water - now))
            wake.callbacks.append(self._wake)

    def _wake(self, _event) -> None:
        self._wakeup_pending = False
        self._pump()
