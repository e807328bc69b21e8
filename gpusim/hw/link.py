"""Links between GPUs and the interconnect that moves packets over them.

Each direction of a link is a server of fixed bandwidth, serving packets in the order they reach it,
plus a time of flight.  A message is cut into packets; each packet books every link on its route in
turn (store and forward), each for when it will get there, and costs one simulation event: its
arrival, when its data is handed to the destination GPU's memory.
End-to-end flow control bounds the bytes a sender may have in flight towards one destination:
a packet's credits leave the destination when its memory controllers accept the packet's data,
so a congested memory back-pressures the senders, and reach the sender one time of flight of the
route later (the window covers a round trip: a route of latency L and window W carries at most
W / 2L).
"""

from __future__ import annotations

from collections.abc import Callable

from gpusim.config.node import LinkConfig
from gpusim.engine.primitives import CalendarPipe, Countdown, Credits
from gpusim.engine.simulation import Simulation
from gpusim.hw.memory import MemorySystem
from gpusim.hw.topology import Topology, gpu_index, gpu_node, is_gpu_node
from gpusim.units import NS_PER_S


class Link:
    """One direction of a physical link (or switch port, or NIC).

    Parameters
    ----------
    name
        ``"gpu0->gpu1"``.
    bandwidth_bytes_per_s
        Rate of this direction.
    latency_ns
        Time of flight.
    kind
        ``"link"``, ``"switch_port"`` or ``"nic"``.
    """

    __slots__ = ("name", "pipe", "latency", "kind", "bytes_sent")

    def __init__(self, name: str, bandwidth_bytes_per_s: float, latency_ns: float, kind: str):
        self.name = name
        self.pipe = CalendarPipe(NS_PER_S / bandwidth_bytes_per_s)
        self.latency = latency_ns
        self.kind = kind
        self.bytes_sent = 0.0


class Interconnect:
    """All links of a system, and packet transfers over them.

    Parameters
    ----------
    sim
        The simulation.
    topology
        Graph and routes.
    memory_of
        The memory system that receives data addressed to a rank.  In symmetric mode every rank
        maps to the one simulated GPU, which so receives its neighbours' (mirrored) traffic.
    mirrored
        Symmetric mode: the simulated GPU's traffic stands for every rank's, rotated.  A packet
        that crosses link ``a -> b`` on its way stands for the packets that the rank ``a`` places
        ahead of it sends over link ``0 -> b - a`` (its first hop) at the same moment, so every
        link of a route is reserved as its rotation that starts (or, for a switch's egress port,
        ends) at GPU 0.  Without this, multi-hop routes and switch egress ports would carry only
        the simulated GPU's own packets and be too fast.
    """

    def __init__(self, sim: Simulation, topology: Topology, memory_of: Callable[[int], MemorySystem],
                 mirrored: bool = False):
        self.sim = sim
        self.mirrored = mirrored
        self.env = sim.env
        self.topology = topology
        self.memory_of = memory_of
        config = topology.config
        defaults = LinkConfig.model_fields
        self.packet_bytes = int(config.links.packet_bytes if config.links else defaults["packet_bytes"].default)
        self.credit_bytes = float(config.links.credit_bytes if config.links else defaults["credit_bytes"].default)
        self.network_packet_bytes = int(config.network.packet_bytes) if config.network else self.packet_bytes
        self.network_credit_bytes = float(config.network.credit_bytes) if config.network else self.credit_bytes
        self.links: dict[tuple[str, str], Link] = {}
        for u, v, data in topology.graph.edges(data=True):
            self.links[(u, v)] = Link(f"{u}->{v}", data["bandwidth_bytes_per_s"], data["latency_ns"], data["kind"])
        self._routes: dict[tuple[int, int], tuple[list[Link], int]] = {}
        self._credits: dict[tuple[int, int], Credits] = {}

    def _route(self, src: int, dst: int) -> tuple[list[Link], int]:
        key = (src, dst)
        route = self._routes.get(key)
        if route is None:
            edges = self.topology.route(src, dst)
            links = [self.links[self._rotated_to_gpu0(edge) if self.mirrored else edge] for edge in edges]
            crosses_fabric = any(link.kind == "nic" for link in links)
            packet = self.network_packet_bytes if crosses_fabric else self.packet_bytes
            route = self._routes[key] = (links, packet)
            self._credits[key] = Credits(self.env, self.network_credit_bytes if crosses_fabric else self.credit_bytes)
        return route

    def _rotated_to_gpu0(self, edge: tuple[str, str]) -> tuple[str, str]:
        """The link that ``edge`` becomes when the GPUs are renumbered so that its GPU end
        (its source, or the destination of a switch's egress port) is GPU 0."""
        gpus = self.topology.num_gpus
        shift = gpu_index(edge[0]) if is_gpu_node(edge[0]) else gpu_index(edge[1])

        def rotate(node: str) -> str:
            return gpu_node((gpu_index(node) - shift) % gpus) if is_gpu_node(node) else node

        return rotate(edge[0]), rotate(edge[1])

    def transfer(self, src: int, dst: int, addr: int, nbytes: int, kind: str, done: Countdown | None = None,
                 cached: bool = True):
        """Send ``nbytes`` from GPU ``src`` to ``addr`` in GPU ``dst``'s memory (a simpy generator).

        The generator returns once the last packet has left ``src`` (it yields while waiting for
        flow-control credits).  ``done``, if given, gets one part per packet, completed when the
        destination's memory has accepted that packet's data.

        Parameters
        ----------
        kind
            ``"write"`` or ``"update"`` (near-memory op-and-store at the destination).
        cached
            Whether the destination buffer may be cached in the destination's L2 (an uncached
            buffer, such as a fused collective's output, takes writes straight to its DRAM).
        """
        if src == dst:
            raise ValueError(f"transfer from GPU {src} to itself")
        links, packet = self._route(src, dst)
        credits = self._credits[(src, dst)]
        return_ns = sum(link.latency for link in links)  # the credits' way back
        memory = self.memory_of(dst)
        traffic, bin_ns = self.sim.recorder.links, self.sim.recorder.bin_ns
        env = self.env
        offset = 0
        while offset < nbytes:
            size = packet - (addr + offset) % packet
            if size > nbytes - offset:
                size = nbytes - offset
            wait = credits.take(size)
            if wait is not None:
                yield wait
            now = t = env.now
            for link in links:
                pipe = link.pipe
                start = pipe.reserve(t, size, now)
                sent = start + size * pipe.ns_per_unit
                first = int(start // bin_ns)
                if sent > (first + 1) * bin_ns:  # a packet across a bin's end: each bin its share (rates <= the link's)
                    before = size * ((first + 1) * bin_ns - start) / (sent - start)
                    traffic[(link.name, src, dst, first)] += before
                    traffic[(link.name, src, dst, first + 1)] += size - before
                else:
                    traffic[(link.name, src, dst, first)] += size
                link.bytes_sent += size
                t = sent + link.latency
            if done is not None:
                done.pending += 1
            arrival = env.timeout(t - now)
            arrival.callbacks.append(self._arrival_callback(memory, addr + offset, size, kind, credits, return_ns,
                                                            done, cached))
            offset += size

    def _arrival_callback(self, memory: MemorySystem, addr: int, size: int, kind: str, credits: Credits,
                          return_ns: float, done: Countdown | None, cached: bool):
        env = self.env

        def arrive(_event) -> None:
            def accepted(time_ns: float) -> None:
                back = time_ns - env.now + return_ns
                if back > 0:
                    env.timeout(back).callbacks.append(lambda _returned: credits.give(size))
                else:
                    credits.give(size)
                if done is not None:
                    done.done_at(time_ns)

            admission = Countdown(accepted)
            memory.accept_remote(addr, size, kind, admission, cached)
            admission.close(self.env.now)

        return arrive
