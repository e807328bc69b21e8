"""The simulation: a simpy environment (time in ns) and a recorder."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import BoundClass, EventPriority, StopSimulation
from simpy.events import NORMAL, Event

PROGRESS_EVENTS = 8192
"""Events between two calls of an environment's progress hook (:attr:`CountingEnvironment.on_progress`)."""


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it schedules (for event budgets).

    ``schedule`` repeats simpy's own one-line body instead of calling it: every event passes
    through here, and the extra call cost about 3% of a memory-bound run.  The event factories
    (``timeout``, ``event``, ``process``...) are bound to the instance once, as simpy does for
    its own class (``BoundClass.bind_early`` sees only the subclass's attributes), instead of at
    every use.  ``now`` is a plain attribute that :meth:`step` and :meth:`run` set together with
    simpy's ``_now``: simpy's ``now`` is a property, a function call per read, and a memory-bound run
    reads the time over a million times.  ``on_progress``, when set, is called with the simulated
    time (ns) every :data:`PROGRESS_EVENTS` events that :meth:`run` processes, so that a long run
    can show that it is moving.
    """

    now: float = 0.0
    """The current simulation time, ns (shadows simpy's property)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self._now
        self.events_scheduled = 0
        self.on_progress: Callable[[float], None] | None = None
        for name, attribute in simpy.Environment.__dict__.items():
            if type(attribute) is BoundClass:
                setattr(self, name, getattr(self, name))

    def schedule(self, event, priority=NORMAL, delay=0):
        self.events_scheduled += 1
        heappush(self._queue, (self._now + delay, priority, next(self._eid), event))

    def step(self) -> None:
        """simpy's ``step``, with :attr:`now` set first to the time of the event it processes (the
        earliest in the queue), as simpy sets ``_now``."""
        if self._queue:
            self.now = self._queue[0][0]
        super().step()

    def run(self, until: float | Event | None = None) -> Any:
        """simpy's ``run``; without ``until`` (run until no event is left, as every simulation
        does) the body of simpy's ``step`` is repeated here instead of called for every event."""
        if until is not None:
            return super().run(until)
        queue = self._queue
        beat = self.on_progress
        countdown = PROGRESS_EVENTS
        while queue:
            now, _, _, event = heappop(queue)
            self.now = self._now = now
            if beat is not None:
                countdown -= 1
                if not countdown:
                    countdown = PROGRESS_EVENTS
                    beat(self._now)
            callbacks, event.callbacks = event.callbacks, None
            try:
                for callback in callbacks:
                    callback(event)
            except StopSimulation as stop:
                event.callbacks = callbacks[callbacks.index(callback) + 1:]
                self.schedule(event, EventPriority(-1))
                return stop.args[0]
            if not event._ok and not hasattr(event, "_defused"):
                error = type(event._value)(*event._value.args)
                error.__cause__ = event._value
                raise error
        return None


@dataclass
class Span:
    """One interval on a timeline: a kernel, an op or a phase.

    Attributes
    ----------
    name, category
        What ran; category is e.g. ``"kernel"``, ``"op"``, ``"dma"``, ``"sync"``.
    gpu, lane
        Where: a GPU index and a lane (stream name, ``dma0``...).
    start_ns, end_ns
        When.
    args
        Extra fields shown in the timeline and kept in results.
    """

    name: str
    category: str
    gpu: int
    lane: str
    start_ns: float
    end_ns: float
    args: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Collects what happened: spans, DRAM and link traffic binned in time, and counters.

    The memory controllers and the links add their bytes to :attr:`dram` and :attr:`links`
    themselves, on their hot paths: ``dram[(gpu, channel, stream, direction, time_ns // bin_ns)]``
    and ``links[(link, src, dst, time_ns // bin_ns)]``, bin indices as ints.

    Parameters
    ----------
    bin_ns
        Width of the time bins for traffic, ns.
    """

    def __init__(self, bin_ns: float = 5000.0):
        self.bin_ns = bin_ns
        self.spans: list[Span] = []
        self.dram: defaultdict[tuple[int, int, str, str, int], float] = defaultdict(float)
        self.links: defaultdict[tuple[str, int, int, int], float] = defaultdict(float)
        self.l2: defaultdict[tuple[int, int], float] = defaultdict(float)
        self.counters: defaultdict[str, float] = defaultdict(float)

    def span(self, span: Span) -> None:
        """Record a finished interval."""
        self.spans.append(span)

    def count(self, name: str, amount: float = 1.0) -> None:
        """Add to a named counter."""
        self.counters[name] += amount


class Simulation:
    """A simpy environment plus the state every component shares.

    Nothing in it is random: the same inputs give identical results.

    Parameters
    ----------
    bin_ns
        Width of the time bins in which DRAM and link traffic is recorded, ns.
    """

    def __init__(self, bin_ns: float = 5000.0):
        self.env = CountingEnvironment()
        self.recorder = Recorder(bin_ns)

    @property
    def now(self) -> float:
        """Current simulated time, ns."""
        return self.env.now

    def process(self, generator) -> simpy.Process:
        """Start a simpy process."""
        return self.env.process(generator)

    def timeout(self, delay_ns: float) -> simpy.Timeout:
        """An event ``delay_ns`` from now."""
        return self.env.timeout(delay_ns)

    def event(self) -> simpy.Event:
        """A fresh untriggered event."""
        return self.env.event()

    def run(self, until: float | simpy.Event | None = None) -> None:
        """Advance the simulation (to ``until``, or until nothing is left to do)."""
        self.env.run(until=until)

    @property
    def events_scheduled(self) -> int:
        """Events scheduled so far."""
        return self.env.events_scheduled
