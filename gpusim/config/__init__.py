"""Hardware descriptions (pydantic models) and the loading of ``hwconfigs/`` presets."""

from gpusim.config.gpu import (
    DTYPE_BYTES,
    DTYPES,
    CuConfig,
    DmaConfig,
    GemmFallbackConfig,
    GpuConfig,
    HbmConfig,
    L2Config,
    McaConfig,
    MemCtrlConfig,
    NmcConfig,
    TrackerConfig,
)
from gpusim.config.loader import list_presets, load_gpu_config, load_system_config
from gpusim.config.node import (
    CollectiveConfig,
    LinkConfig,
    NetworkConfig,
    ProtocolConfig,
    SwitchConfig,
    SystemConfig,
    TopologyConfig,
)

__all__ = [
    "DTYPES",
    "DTYPE_BYTES",
    "CollectiveConfig",
    "CuConfig",
    "DmaConfig",
    "GemmFallbackConfig",
    "GpuConfig",
    "HbmConfig",
    "L2Config",
    "LinkConfig",
    "McaConfig",
    "MemCtrlConfig",
    "NetworkConfig",
    "NmcConfig",
    "ProtocolConfig",
    "SwitchConfig",
    "SystemConfig",
    "TopologyConfig",
    "TrackerConfig",
    "list_presets",
    "load_gpu_config",
    "load_system_config",
]
