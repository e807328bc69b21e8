"""DMA (copy) engines: read local memory, send it over the links, write or update remote memory.

Each engine has a bounded command queue and works through it in order, reading ``block_bytes`` at
a time (communication stream) and overlapping the read of the next block with the sending of the
current one.  An engine moves at most ``bandwidth_bytes_per_s``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpusim.config.gpu import DmaConfig
from gpusim.engine.component import Component
from gpusim.engine.primitives import Countdown, Join, Pipe
from gpusim.engine.simulation import Simulation
from gpusim.hw.link import Interconnect
from gpusim.hw.memory import MemorySystem
from gpusim.hw.request import COMM
from gpusim.units import NS_PER_S


@dataclass
class DmaCommand:
    """Copy ``nbytes`` from local ``src_addr`` to ``dst_addr`` on GPU ``dst``.

    Attributes
    ----------
    kind
        ``"write"`` or ``"update"`` (op-and-store at the destination).
    src_cached
        Whether the source is read through the L2.
    on_done
        Called with the time the destination accepted the last byte.
    label
        Shown in the timeline.
    setup_ns
        Time from the command reaching the head of the queue to its first read; ``None`` for the
        engine's configured ``setup_ns``, 0 for commands programmed ahead of time whose readiness
        is signalled by hardware (T3's triggered DMAs).
    dst_cached
        Whether the destination buffer may be cached in the destination's L2.
    """

    src_addr: int
    nbytes: int
    dst: int
    dst_addr: int
    kind: str = "write"
    src_cached: bool = False
    on_done: Callable[[float], None] | None = None
    label: str = "dma"
    setup_ns: float | None = None
    dst_cached: bool = True


class DmaEngine(Component):
    """One DMA engine of a GPU.

    Parameters
    ----------
    sim, name, parent
        Simulation and place in the hierarchy.
    gpu
        Global index of the GPU it belongs to.
    config
        Engine parameters.
    memory
        The local memory it reads.
    interconnect
        The links it sends over.
    """

    def __init__(
        self,
        sim: Simulation,
        name: str,
        parent: Component,
        gpu: int,
        config: DmaConfig,
        memory: MemorySystem,
        interconnect: Interconnect,
    ):
        super().__init__(sim, name, parent)
        self.gpu = gpu
        self.config = config
        self.memory = memory
        self.interconnect = interconnect
        self.queue: deque[DmaCommand] = deque()
        self.pipe = Pipe(NS_PER_S / config.bandwidth_bytes_per_s)
        self.bytes_moved = 0.0
        self.max_queued = 0
        self._wake = None
        self.env.process(self._run())

    @property
    def backlog(self) -> int:
        """Commands waiting."""
        return len(self.queue)

    def submit(self, command: DmaCommand) -> None:
        """Queue a command; raises if the engine's queue is full."""
        if len(self.queue) >= self.config.queue_entries:
            raise OverflowError(f"{self.path}: command queue full ({self.config.queue_entries} entries)")
        self.queue.append(command)
        self.max_queued = max(self.max_queued, len(self.queue))
        if self._wake is not None:
            wake, self._wake = self._wake, None
            wake.succeed()

    def _read(self, addr: int, nbytes: int, cached: bool) -> Join:
        join = Join(self.env)
        self.memory.read(addr, nbytes, join, stream=COMM, cached=cached)
        join.extend_to(self.pipe.reserve(self.env.now, nbytes))
        join.close()
        return join

    def _run(self):
        env = self.env
        block = int(self.config.block_bytes)
        while True:
            if not self.queue:
                self._wake = env.event()
                yield self._wake
                continue
            command = self.queue.popleft()
            setup = self.config.setup_ns if command.setup_ns is None else command.setup_ns
            if setup > 0:
                yield env.timeout(setup)

            def finished(time_ns: float, command: DmaCommand = command) -> None:
                self.sim.recorder.count(f"gpu{self.gpu}.dma_bytes", command.nbytes)
                if command.on_done is not None:
                    command.on_done(time_ns)

            delivered = Countdown(finished)
            offsets = list(range(0, command.nbytes, block))
            pending = self._read(command.src_addr, min(block, command.nbytes), command.src_cached)
            for index, offset in enumerate(offsets):
                size = min(block, command.nbytes - offset)
                yield pending.event
                if index + 1 < len(offsets):
                    nxt = offsets[index + 1]
                    pending = self._read(
                        command.src_addr + nxt, min(block, command.nbytes - nxt), command.src_cached
                    )
                yield from self.interconnect.transfer(
                    self.gpu, command.dst, command.dst_addr + offset, size, command.kind, delivered,
                    command.dst_cached,
                )
                self.bytes_moved += size
            delivered.close(env.now)
