"""One simulated GPU: its hardware queues, CUs and dispatcher, L2, HBM channels and controllers, DMA engines, memory."""

from __future__ import annotations

from dataclasses import dataclass

from gpusim.config.gpu import GEMM_WIDENING, GpuConfig
from gpusim.engine.component import Component
from gpusim.engine.simulation import Simulation
from gpusim.errors import OpError
from gpusim.hw.cache import L2Cache
from gpusim.hw.compute import ComputeUnit, Dispatcher
from gpusim.hw.dma import DmaEngine
from gpusim.hw.hbm import AddressMap, HbmChannel
from gpusim.hw.link import Interconnect
from gpusim.hw.memctrl import Arbiter, MemoryController
from gpusim.hw.memory import MemorySystem
from gpusim.hw.queues import HardwareQueues
from gpusim.hw.tracker import Tracker


@dataclass(frozen=True)
class Buffer:
    """A region of one GPU's memory.

    Attributes
    ----------
    name
        For errors and timelines.
    addr
        Start address (aligned so that every buffer starts on channel 0).
    nbytes
        Size in bytes.
    cached
        Whether accesses go through the L2 (T3's reduction outputs are allocated uncached).
    """

    name: str
    addr: int
    nbytes: int
    cached: bool = True

    def at(self, offset: int) -> int:
        """Address of byte ``offset`` of the buffer."""
        return self.addr + offset


class Gpu(Component):
    """A GPU assembled from its description.

    Parameters
    ----------
    sim
        The simulation.
    parent
        The machine.
    index
        Global GPU index (rank).
    config
        The GPU's description.
    memory_policy
        Memory-controller arbitration policy name (default: the config's).
    dispatch_policy
        Workgroup dispatch policy between concurrent kernels (default: the config's).
    """

    def __init__(
        self,
        sim: Simulation,
        parent: Component | None,
        index: int,
        config: GpuConfig,
        memory_policy: str | None = None,
        dispatch_policy: str | None = None,
    ):
        super().__init__(sim, f"gpu{index}", parent)
        self.index = index
        self.config = config
        hbm = config.hbm
        self.address_map = AddressMap(hbm, config.memctrl.max_request_bytes)
        self.arbiter = Arbiter(memory_policy or config.memctrl.policy, config.memctrl.mca)
        self.channels = [HbmChannel(hbm, self.address_map) for _ in range(hbm.sim_channels)]
        self.controllers = [
            MemoryController(sim, f"mc{i}", self, index, i, channel, config.memctrl, self.arbiter)
            for i, channel in enumerate(self.channels)
        ]
        self.l2 = L2Cache(config.l2, sim.recorder.bin_ns)
        self.memory = MemorySystem(self.env, self.l2, self.address_map, self.controllers)
        miss_latency = self.unloaded_memory_latency_ns
        inflight_ns_per_byte = miss_latency / config.cu.max_inflight_bytes
        hit_ratio = min(1.0, config.l2.hit_latency_ns / miss_latency)
        self.cus = [ComputeUnit(i, config.cu, inflight_ns_per_byte, hit_ratio) for i in range(config.num_cus)]
        self.dispatcher = Dispatcher(self.env, self.cus, dispatch_policy or config.dispatch_policy)
        self.queues = HardwareQueues(self.env, config.hardware_queues)
        self.dma: list[DmaEngine] = []
        self.tracker = Tracker(self, config.tracker)
        self._next_addr = 0
        self._alignment = int(hbm.interleave_bytes) * hbm.channels

    @property
    def unloaded_memory_latency_ns(self) -> float:
        """Latency of an L2 miss on an idle memory: L2, network, activate, column, one burst train, ns."""
        return self.config.unloaded_miss_latency_ns

    def attach_dma(self, interconnect: Interconnect) -> None:
        """Create the DMA engines once the links exist."""
        self.dma = [
            DmaEngine(self.sim, f"dma{i}", self, self.index, self.config.dma, self.memory, interconnect)
            for i in range(self.config.dma.engines)
        ]

    def alloc(self, name: str, nbytes: int, cached: bool = True) -> Buffer:
        """Allocate ``nbytes``; every GPU that allocates the same sequence gets the same addresses.

        Raises
        ------
        OpError
            The buffer is larger than the GPU's memory (``hbm.capacity_bytes``).
        """
        if nbytes <= 0:
            raise ValueError(f"buffer {name!r}: size must be positive, got {nbytes}")
        self.check_fits(name, nbytes)
        addr = self._next_addr
        self._next_addr += -(-int(nbytes) // self._alignment) * self._alignment
        return Buffer(name, addr, int(nbytes), cached)

    def check_fits(self, name: str, nbytes: int) -> None:
        """Raise unless a buffer ``name`` of ``nbytes`` fits in the GPU's memory (before a kernel
        plans its work over a tensor it has not allocated yet).

        Raises
        ------
        OpError
            ``nbytes`` exceeds ``hbm.capacity_bytes``; the message names the buffer and the field.
        """
        if nbytes > self.config.hbm.capacity_bytes:
            raise OpError(f"buffer {name!r}: {nbytes:,} bytes do not fit in {self.config.name}'s "
                          f"{self.config.hbm.capacity_bytes / 2**30:g} GiB of memory (gpu.hbm.capacity_bytes)")

    def matrix_flops_per_ns(self, dtype: str) -> float:
        """Sustained GEMM FLOPs per ns of one CU for ``dtype``: matrix units if it has them for
        ``dtype`` (or a type it widens to), else vector units, times the calibrated GEMM efficiency
        of ``dtype``, else of the type whose units run it, else of the type it widens to, else the
        lowest."""
        config = self.config
        peak = config.cu.gemm_peak(dtype)
        fitted = [config.gemm_efficiency.get(d) for d in (dtype, config.cu.gemm_units(dtype),
                                                          *GEMM_WIDENING.get(dtype, ()))]
        efficiency = next((e for e in fitted if e), min(config.gemm_efficiency.values()))
        return peak * config.clock_hz * 1e-9 * efficiency

    def vector_flops_per_ns(self, dtype: str) -> float:
        """Sustained element-wise FLOPs per ns of one CU for ``dtype``, with the vector efficiency."""
        return self.config.cu.vector_peak(dtype) * self.config.clock_hz * 1e-9 * self.config.vector_efficiency
