"""Small synchronisation primitives on top of simpy, built to spend as few events as possible.

* :class:`Join` waits for many parts that each report *when* they complete, and costs one event.
* :class:`Credits` is a FIFO counting semaphore that costs an event only when someone must wait.
* :class:`Pipe` is a FIFO server whose occupancy is computed rather than simulated: reserving it
  returns the time the work finishes and costs no event at all.
"""

from __future__ import annotations

import bisect
from collections import deque

import simpy
from simpy.events import NORMAL, Event


def succeed_at(env: simpy.Environment, event: Event, delay: float, value: object = None) -> Event:
    """Trigger ``event`` successfully ``delay`` ns from now (like a timeout, but on an existing event)."""
    event._ok = True
    event._value = value
    env.schedule(event, NORMAL, max(0.0, delay))
    return event


class Join:
    """Completion of a group of parts whose finishing times become known one by one.

    Each part is announced with :meth:`add` and later reports its completion time with
    :meth:`done_at` (which may be in the future).  After :meth:`close` the join's ``event``
    fires at the latest reported time once every part has reported.

    Parameters
    ----------
    env
        The simpy environment.
    """

    __slots__ = ("env", "event", "pending", "latest", "closed")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.event: Event = Event(env)
        self.pending = 0
        self.latest = env.now
        self.closed = False

    def add(self, parts: int = 1) -> None:
        """Announce ``parts`` more parts."""
        self.pending += parts

    def done_at(self, time_ns: float) -> None:
        """One part completes at absolute time ``time_ns``."""
        if time_ns > self.latest:
            self.latest = time_ns
        self.pending -= 1
        if self.closed and self.pending == 0:
            succeed_at(self.env, self.event, self.latest - self.env.now)

    def extend_to(self, time_ns: float) -> None:
        """Make the join complete no earlier than ``time_ns`` (without adding a part)."""
        if time_ns > self.latest:
            self.latest = time_ns

    def close(self) -> Event:
        """No more parts will be added; return the event to wait on."""
        self.closed = True
        if self.pending == 0 and not self.event.triggered:
            succeed_at(self.env, self.event, self.latest - self.env.now)
        return self.event


class Credits:
    """A FIFO counting semaphore of ``capacity`` units.

    Parameters
    ----------
    env
        The simpy environment.
    capacity
        Units available when nobody holds any.
    """

    __slots__ = ("env", "capacity", "available", "_waiters")

    def __init__(self, env: simpy.Environment, capacity: float):
        self.env = env
        self.capacity = capacity
        self.available = capacity
        self._waiters: deque[tuple[float, Event]] = deque()

    def take(self, amount: float) -> Event | None:
        """Take ``amount`` units; return ``None`` if granted now, else an event that fires when granted."""
        if amount > self.capacity:
            amount = self.capacity
        if not self._waiters and self.available >= amount:
            self.available -= amount
            return None
        event = Event(self.env)
        self._waiters.append((amount, event))
        return event

    def give(self, amount: float) -> None:
        """Return ``amount`` units and wake waiters in FIFO order."""
        capacity = self.capacity
        available = self.available + (amount if amount <= capacity else capacity)
        self.available = available if available < capacity else capacity
        waiters = self._waiters
        while waiters and self.available >= waiters[0][0]:
            wanted, event = waiters.popleft()
            self.available -= wanted
            event.succeed()

    @property
    def in_use(self) -> float:
        """Units currently taken."""
        return self.capacity - self.available


class Pipe:
    """A first-come-first-served server of fixed rate whose schedule is computed, not simulated.

    Parameters
    ----------
    ns_per_unit
        Service time of one unit of work (a byte, a FLOP), in ns.
    """

    __slots__ = ("ns_per_unit", "free_at", "busy_ns")

    def __init__(self, ns_per_unit: float):
        self.ns_per_unit = ns_per_unit
        self.free_at = 0.0
        self.busy_ns = 0.0

    def reserve(self, now: float, units: float) -> float:
        """Queue ``units`` of work arriving at ``now``; return the time it finishes."""
        duration = units * self.ns_per_unit
        start = self.free_at if self.free_at > now else now
        self.free_at = start + duration
        self.busy_ns += duration
        return self.free_at


class CalendarPipe:
    """A server of fixed rate that serves work in the order it *arrives*, whatever the order in
    which it was booked; its schedule is computed, not simulated.

    Work is booked when it is known, which for the later hops of a route is before it gets there:
    a packet booked at the second link of its route for ``t + 5 us`` must not hold up a packet
    booked after it that reaches the link at ``t + 1 us``.  The calendar keeps the busy intervals
    and gives each booking the earliest idle gap at or after its arrival that is long enough (a
    plain :class:`Pipe` starts it after the last booking, leaving the link idle in between).

    Parameters
    ----------
    ns_per_unit
        Service time of one unit of work (a byte), in ns.
    """

    __slots__ = ("ns_per_unit", "starts", "ends")

    def __init__(self, ns_per_unit: float):
        self.ns_per_unit = ns_per_unit
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, now: float, units: float, horizon: float) -> float:
        """Book ``units`` of work arriving at ``now``; return the time it starts.

        ``horizon`` is the simulation's present: no booking arrives before it, so the intervals
        that ended by then are forgotten.
        """
        duration = units * self.ns_per_unit
        starts, ends = self.starts, self.ends
        if ends and ends[0] <= horizon:
            stale = bisect.bisect_right(ends, horizon)
            del starts[:stale], ends[:stale]
        if not ends or now >= ends[-1]:  # after every booking: the common case
            if ends and now == ends[-1]:
                ends[-1] = now + duration
            else:
                starts.append(now)
                ends.append(now + duration)
            return now
        index = bisect.bisect_right(ends, now)
        start = now
        while index < len(starts) and start + duration > starts[index]:
            start = max(start, ends[index])
            index += 1
        end = start + duration
        # merge with the neighbours it touches, so that a busy stretch stays one interval
        if index < len(starts) and end == starts[index]:
            starts[index] = start
            if index > 0 and ends[index - 1] == start:
                starts[index] = starts[index - 1]
                del starts[index - 1], ends[index - 1]
        elif index > 0 and ends[index - 1] == start:
            ends[index - 1] = end
        else:
            starts.insert(index, start)
            ends.insert(index, end)
        return start


class Countdown:
    """Like :class:`Join`, but calls a function instead of firing an event (no event at all).

    Parameters
    ----------
    on_zero
        Called as ``on_zero(latest_ns)`` once closed and every part has reported.
    """

    __slots__ = ("pending", "latest", "closed", "on_zero")

    def __init__(self, on_zero):
        self.pending = 0
        self.latest = 0.0
        self.closed = False
        self.on_zero = on_zero

    def add(self, parts: int = 1) -> None:
        """Announce ``parts`` more parts."""
        self.pending += parts

    def extend_to(self, time_ns: float) -> None:
        """Complete no earlier than ``time_ns``."""
        if time_ns > self.latest:
            self.latest = time_ns

    def done_at(self, time_ns: float) -> None:
        """One part completes at ``time_ns``."""
        if time_ns > self.latest:
            self.latest = time_ns
        self.pending -= 1
        if self.closed and self.pending == 0:
            self.on_zero(self.latest)

    def close(self, now: float) -> None:
        """No more parts; report now if nothing is pending."""
        self.closed = True
        if self.latest < now:
            self.latest = now
        if self.pending == 0:
            self.on_zero(self.latest)
