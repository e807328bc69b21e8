"""A loaded hardware system: the validated description that ``gpusim.run`` simulates."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import yaml

from gpusim.config.loader import load_system_config, overridden_field
from gpusim.config.node import SystemConfig
from gpusim.errors import ConfigError
from gpusim.hw.topology import Topology


class System:
    """A node (or several) of GPUs, as described by a preset plus overrides.

    Use :func:`load_system` to make one.  A System is immutable; :meth:`with_overrides` returns a
    changed copy.

    Parameters
    ----------
    config
        The validated description.
    source
        The preset name or file it came from.
    overrides
        The overrides applied to it.
    """

    def __init__(self, config: SystemConfig, source: str, overrides: dict[str, Any] | None = None):
        self.config = config
        self.source = source
        self.overrides = dict(overrides or {})

    @property
    def name(self) -> str:
        """The system's name."""
        return self.config.name

    @property
    def num_gpus(self) -> int:
        """GPUs in the whole system."""
        return self.config.total_gpus

    @property
    def gpu(self):
        """The GPU description (:class:`gpusim.config.GpuConfig`)."""
        return self.config.gpu

    @cached_property
    def topology(self) -> Topology:
        """The interconnect graph and routes."""
        return Topology(self.config)

    def with_overrides(self, overrides: dict[str, Any]) -> System:
        """A copy with more overrides applied (e.g. ``{"gpu.num_cus": 160}``); each replaces an earlier
        override of its field, however that one spelled it (``links.bandwidth_bytes_per_s`` for
        ``links.bandwidth``).  The copy reloads ``source`` with the overrides, so a System made
        directly from a description must carry the overrides that made it (a sweep's points do not:
        :mod:`gpusim.power_limit` changes their clocks in the description instead)."""
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{self.name}: overrides must be a mapping of dotted fields to values, got {overrides!r}")
        replaced = {overridden_field(path, value) for path, value in overrides.items()}
        kept = {path: value for path, value in self.overrides.items() if overridden_field(path, value) not in replaced}
        return load_system(self.source, {**kept, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """The resolved description as plain data (units in field names)."""
        return self.config.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The resolved description as YAML."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def __repr__(self) -> str:
        gpu = self.config.gpu
        return f"<System {self.name}: {self.num_gpus} x {gpu.name} ({self.config.topology.kind})>"


def load_system(name_or_path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> System:
    """Load a hardware preset or YAML file, with optional dotted-path overrides.

    Parameters
    ----------
    name_or_path
        A preset name (see ``gpusim list``), e.g. ``"t3-ring8"`` or ``"mi210"``, or a YAML path.
    overrides
        e.g. ``{"gpu.num_cus": 160, "links.bandwidth": "300 GB/s"}``.

    Returns
    -------
    System

    Raises
    ------
    gpusim.errors.UnknownPresetError
        Unknown name (the message lists the known presets).
    gpusim.errors.ConfigError
        Invalid contents (the message names file or override, field and expectation).
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"load_system takes a preset name or a YAML path, got {name_or_path!r}")
    config = load_system_config(name_or_path, overrides)
    return System(config, os.fspath(name_or_path), overrides)
