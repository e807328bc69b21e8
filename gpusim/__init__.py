"""gpusim: a cycle-approximate, discrete-event simulator of multi-GPU nodes.

Quick use::

    import gpusim
    system = gpusim.load_system("t3-ring8")
    result = gpusim.run(system, [gpusim.ops.Gemm(8192, 4256, 2128), gpusim.ops.ReduceScatter(8192 * 4256 * 2)])
    print(result.summary())
    result.to_perfetto("timeline.json")
"""

from gpusim import ops, trace
from gpusim.config.loader import list_presets
from gpusim.errors import (
    ConfigError,
    GpusimError,
    NoEffectWarning,
    OpError,
    SimulationError,
    SymmetricModeWarning,
    TraceError,
    UnknownPresetError,
)
from gpusim.parameter_sweep import sweep_parameters
from gpusim.results import Result
from gpusim.sched.executor import Stream
from gpusim.simulate import run
from gpusim.system import System, load_system

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "GpusimError",
    "NoEffectWarning",
    "OpError",
    "Result",
    "SimulationError",
    "Stream",
    "SymmetricModeWarning",
    "System",
    "TraceError",
    "UnknownPresetError",
    "__version__",
    "list_presets",
    "load_system",
    "ops",
    "run",
    "sweep_parameters",
    "trace",
]
