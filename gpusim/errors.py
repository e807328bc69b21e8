"""Exceptions that gpusim raises for bad input.

Every error names where the bad value came from (a file, an override, a trace row), the field, and
what was expected, so that a user can fix it without reading gpusim's source.
"""

from __future__ import annotations


class GpusimError(Exception):
    """Base class of gpusim's own errors."""


class ConfigError(GpusimError, ValueError):
    """A hardware configuration (file or override) is invalid."""


class UnknownPresetError(ConfigError, KeyError):
    """A preset name that is not among the known hwconfigs.

    Parameters
    ----------
    name
        The name asked for.
    known
        The preset names that exist.
    """

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown hardware preset {name!r}; known presets: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class OpError(GpusimError, ValueError):
    """An operator with invalid parameters (e.g. a GEMM with a zero dimension)."""


class TraceError(GpusimError, ValueError):
    """A malformed operator trace."""


class SimulationError(GpusimError, RuntimeError):
    """The simulation reached an inconsistent state (e.g. a deadlock)."""


class SweepError(GpusimError, RuntimeError):
    """A point of a sweep failed; the message names the point, and the point's error is the cause."""
