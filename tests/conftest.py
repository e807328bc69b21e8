"""Shared fixtures: a simulation, small hardware, and the path of the shared measured data."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusim.config import load_system_config
from gpusim.engine import Simulation

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture
def sim() -> Simulation:
    """A fresh simulation."""
    return Simulation()


@pytest.fixture
def env(sim):
    """The simpy environment of a fresh simulation (simpy-style micro-scenarios)."""
    return sim.env


@pytest.fixture(scope="session")
def t3_config():
    """The dissertation's Table 8.1 ring of 8 GPUs."""
    return load_system_config("t3-ring8")


def shared_data(relative: str) -> Path:
    """A file under ../shared/data; skips the test when the shared folder is absent."""
    path = SHARED / "data" / relative
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path
