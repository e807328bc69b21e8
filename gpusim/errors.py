"""Exceptions that gpusim raises for bad input, and the warnings it gives about approximate results.

Every error names where the bad value came from (a file, an override, a trace row), the field, and
what was expected, so that a user can fix it without reading gpusim's source.  Every error can be
pickled, so that one raised in a worker process (a sweep's point) reaches the caller as itself; a
class whose constructor takes other arguments than the message says how to rebuild it
(``__reduce__``).
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

    def __reduce__(self) -> tuple[type, tuple[str, list[str]], dict]:
        return type(self), (self.name, self.known), self.__dict__


class OpError(GpusimError, ValueError):
    """An operator with invalid parameters (e.g. a GEMM with a zero dimension)."""


class TraceError(GpusimError, ValueError):
    """A malformed operator trace."""


class UnsupportedTraceError(TraceError):
    """An imported kernel or node that gpusim cannot model; its reader can replay such rows as delays.

    Parameters
    ----------
    problem
        Where (file, event or node, field) and why it cannot be modelled.
    replayed
        What the delay option does with it (``"such kernels as delays of their measured duration"``).
    option
        How the caller spells that option: the readers' ``unsupported='delay'`` argument or a
        command's ``--unsupported delay``.
    """

    def __init__(self, problem: str, replayed: str, option: str):
        self.problem = problem
        self.replayed = replayed
        self.option = option
        super().__init__(f"{problem}; {option} replays {replayed}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str], dict]:
        return type(self), (self.problem, self.replayed, self.option), self.__dict__

    def naming(self, option: str) -> UnsupportedTraceError:
        """The same error with the option spelled ``option``."""
        return UnsupportedTraceError(self.problem, self.replayed, option)


class SimulationError(GpusimError, RuntimeError):
    """The simulation reached an inconsistent state (e.g. a deadlock)."""


class SweepError(GpusimError, RuntimeError):
    """A point of a sweep failed; the message names the point, and the point's error is the cause."""


class SymmetricModeWarning(UserWarning):
    """Symmetric mode only approximates some ops of a run; full mode simulates them exactly (docs/model.md)."""


class NoEffectWarning(UserWarning):
    """An override of a field the system does not use (such as ``links.bandwidth`` on a switch
    topology), or a what-if sweep's field that changed no point's simulated time."""
