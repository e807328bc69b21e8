"""The thin layer over simpy: the simulation, components, and event-frugal primitives."""

from gpusim.engine.component import Component
from gpusim.engine.primitives import Countdown, Credits, Join, Pipe, succeed_at
from gpusim.engine.simulation import CountingEnvironment, Recorder, Simulation, Span

__all__ = [
    "Component",
    "Countdown",
    "CountingEnvironment",
    "Credits",
    "Join",
    "Pipe",
    "Recorder",
    "Simulation",
    "Span",
    "succeed_at",
]
