"""The simulated machine of one run: its GPUs and the interconnect between them.

In *full* mode every GPU is simulated.  In *symmetric* mode (for topologies where every GPU sees
the same network, and work where every GPU does the same) only GPU 0 is simulated: data sent to
any other GPU is delivered, mirrored, to GPU 0, which thereby receives exactly the traffic its
neighbours would send it.
"""

from __future__ import annotations

from gpusim.config.node import SystemConfig
from gpusim.engine.component import Component
from gpusim.engine.simulation import Simulation
from gpusim.errors import ConfigError, OpError
from gpusim.hw.gpu import Gpu
from gpusim.hw.link import Interconnect
from gpusim.hw.memory import MemorySystem
from gpusim.hw.topology import Topology

MODES = ("full", "symmetric")


class Machine(Component):
    """All simulated hardware of one run.

    Parameters
    ----------
    sim
        The simulation.
    config
        The system's description.
    mode
        ``"full"`` or ``"symmetric"``.
    memory_policy
        Memory-controller arbitration policy for every GPU (default: each GPU's configured one).
    dispatch_policy
        Workgroup dispatch policy between concurrent kernels for every GPU (default: each GPU's
        configured one).
    topology
        A prebuilt topology of ``config`` (built if omitted).
    """

    def __init__(
        self,
        sim: Simulation,
        config: SystemConfig,
        mode: str = "full",
        memory_policy: str | None = None,
        dispatch_policy: str | None = None,
        topology: Topology | None = None,
    ):
        super().__init__(sim, "node")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.config = config
        self.mode = mode
        self.topology = topology or Topology(config)
        if mode == "symmetric" and not self.topology.symmetric:
            raise ConfigError(
                f"symmetric mode needs a topology in which all GPUs are alike (ring, fully connected, "
                f"switch); {config.name} is {config.topology.kind}; use mode='full'"
            )
        if mode == "symmetric" and config.nodes > 1:
            raise ConfigError(f"symmetric mode is limited to a single node; {config.name} has {config.nodes} nodes; "
                              "use mode='full'")
        self.num_ranks = config.total_gpus
        simulated = range(self.num_ranks) if mode == "full" else range(1)
        self.gpus = {
            rank: Gpu(sim, self, rank, config.gpu, memory_policy, dispatch_policy) for rank in simulated
        }
        self.interconnect = Interconnect(sim, self.topology, self.memory_of, mirrored=mode == "symmetric")
        for gpu in self.gpus.values():
            gpu.attach_dma(self.interconnect)

    @property
    def simulated_ranks(self) -> list[int]:
        """Ranks whose GPUs are simulated."""
        return list(self.gpus)

    def gpu(self, rank: int) -> Gpu:
        """The simulated GPU that stands for ``rank``."""
        if not 0 <= rank < self.num_ranks:
            raise OpError(f"rank {rank} does not exist; {self.config.name} has ranks 0..{self.num_ranks - 1}")
        return self.gpus[rank if self.mode == "full" else 0]

    def memory_of(self, rank: int) -> MemorySystem:
        """The memory that receives data addressed to ``rank``."""
        return self.gpu(rank).memory

    def is_simulated(self, rank: int) -> bool:
        """Whether ``rank``'s own work is simulated (in symmetric mode only rank 0's is)."""
        return rank in self.gpus
