"""Base class of simulated hardware: components form a hierarchy with dotted names."""

from __future__ import annotations

from gpusim.engine.simulation import Simulation


class Component:
    """A named part of the simulated machine (``node.gpu3.hbm.ch5``).

    Parameters
    ----------
    sim
        The simulation it lives in.
    name
        Its own name, unique among its siblings.
    parent
        The enclosing component, or ``None`` for the root.
    """

    def __init__(self, sim: Simulation, name: str, parent: Component | None = None):
        self.sim = sim
        self.env = sim.env
        self.name = name
        self.parent = parent

    @property
    def path(self) -> str:
        """Dotted name from the root, e.g. ``node.gpu3.hbm.ch5``."""
        return self.name if self.parent is None else f"{self.parent.path}.{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"
