"""Topologies as networkx graphs: GPUs, switches and the inter-node fabric, joined by directed links.

Nodes are named ``gpu{i}`` (global GPU index), ``node{k}.switch`` and ``fabric``.  Every directed
edge carries ``bandwidth_bytes_per_s`` and ``latency_ns``.  Routes are shortest paths by
latency plus serialisation of a typical packet, so traffic stays on fast intra-node links and
leaves a node only through the NICs.
"""

from __future__ import annotations

from functools import cached_property

import networkx as nx

from gpusim.config.node import SystemConfig

DGX1_HYBRID_CUBE_MESH = [
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
]  # fmt: skip
"""NVLink pairs (a, b, links) of a DGX-1 with V100 (``nvidia-smi topo -m``): six links per GPU."""


def gpu_node(index: int) -> str:
    """Graph node name of global GPU ``index``."""
    return f"gpu{index}"


def _intra_node_pairs(config: SystemConfig) -> list[tuple[int, int, int]]:
    n = config.num_gpus
    per_pair = config.topology.links_per_pair
    kind = config.topology.kind
    if kind == "ring":
        pairs = {tuple(sorted((i, (i + 1) % n))) for i in range(n)} if n > 1 else set()
        return [(a, b, per_pair) for a, b in sorted(pairs)]
    if kind == "fully_connected":
        return [(a, b, per_pair) for a in range(n) for b in range(a + 1, n)]
    if kind == "hybrid_cube_mesh":
        return list(DGX1_HYBRID_CUBE_MESH)
    if kind == "custom":
        return [(e[0], e[1], e[2] if len(e) == 3 else per_pair) for e in config.topology.edges]
    return []


def build_graph(config: SystemConfig) -> nx.DiGraph:
    """The directed graph of a system's GPUs, switches and links."""
    graph = nx.DiGraph()
    n = config.num_gpus
    for node in range(config.nodes):
        base = node * n
        for local in range(n):
            graph.add_node(gpu_node(base + local), kind="gpu", node=node)
        if config.topology.kind == "switch" and n > 1:
            switch = f"node{node}.switch"
            graph.add_node(switch, kind="switch", node=node)
            port = config.switch
            for local in range(n):
                gpu = gpu_node(base + local)
                attrs = {"bandwidth_bytes_per_s": port.port_bandwidth_bytes_per_s, "kind": "switch_port"}
                graph.add_edge(gpu, switch, latency_ns=port.latency_ns / 2, **attrs)
                graph.add_edge(switch, gpu, latency_ns=port.latency_ns / 2, **attrs)
        else:
            for a, b, links in _intra_node_pairs(config):
                attrs = {
                    "bandwidth_bytes_per_s": config.links.bandwidth_bytes_per_s * links,
                    "latency_ns": config.links.latency_ns,
                    "kind": "link",
                }
                graph.add_edge(gpu_node(base + a), gpu_node(base + b), **attrs)
                graph.add_edge(gpu_node(base + b), gpu_node(base + a), **attrs)
    if config.nodes > 1:
        net = config.network
        graph.add_node("fabric", kind="fabric", node=-1)
        for gpu in range(config.total_gpus):
            attrs = {
                "bandwidth_bytes_per_s": net.nic_bandwidth_bytes_per_s * net.nics_per_gpu,
                "latency_ns": net.latency_ns / 2,
                "kind": "nic",
            }
            graph.add_edge(gpu_node(gpu), "fabric", **attrs)
            graph.add_edge("fabric", gpu_node(gpu), **attrs)
    return graph


class Topology:
    """A system's graph with cached routes and ring orders.

    Parameters
    ----------
    config
        The system.
    """

    def __init__(self, config: SystemConfig):
        self.config = config
        self.graph = build_graph(config)
        self._routes: dict[tuple[int, int], list[tuple[str, str]]] = {}
        packet = config.links.packet_bytes if config.links else 65536.0
        for _, _, data in self.graph.edges(data=True):
            data["weight"] = data["latency_ns"] + packet * 1e9 / data["bandwidth_bytes_per_s"]

    @property
    def num_gpus(self) -> int:
        """GPUs in the system."""
        return self.config.total_gpus

    def node_of(self, gpu: int) -> int:
        """Node index of global GPU ``gpu``."""
        return gpu // self.config.num_gpus

    def route(self, src: int, dst: int) -> list[tuple[str, str]]:
        """Directed edges a message from GPU ``src`` to GPU ``dst`` traverses."""
        key = (src, dst)
        if key not in self._routes:
            try:
                path = nx.shortest_path(self.graph, gpu_node(src), gpu_node(dst), weight="weight")
            except nx.NetworkXNoPath as exc:
                raise ValueError(f"GPU {src} cannot reach GPU {dst} in topology {self.config.topology.kind}") from exc
            self._routes[key] = list(zip(path[:-1], path[1:]))
        return self._routes[key]

    def neighbours(self, gpu: int) -> list[int]:
        """GPUs directly linked to ``gpu`` (through a switch counts as direct)."""
        result = []
        for other in range(self.num_gpus):
            if other != gpu and len(self.route(gpu, other)) <= 2 and self.node_of(other) == self.node_of(gpu):
                result.append(other)
        return result

    @cached_property
    def ring_order(self) -> list[int]:
        """An order of a node's local GPUs in which consecutive GPUs are directly linked (a ring)."""
        n = self.config.num_gpus
        if n <= 2 or self.config.topology.kind in ("ring", "fully_connected", "switch"):
            return list(range(n))
        adjacent = {g: set(self.graph.successors(gpu_node(g))) for g in range(n)}

        def extend(path: list[int]) -> list[int] | None:
            if len(path) == n:
                return path if gpu_node(path[0]) in adjacent[path[-1]] else None
            for nxt in range(n):
                if nxt not in path and gpu_node(nxt) in adjacent[path[-1]]:
                    found = extend(path + [nxt])
                    if found:
                        return found
            return None

        cycle = extend([0])
        if cycle is None:
            raise ValueError(f"topology {self.config.topology.kind} of {n} GPUs has no ring through direct links")
        return cycle

    @property
    def symmetric(self) -> bool:
        """Whether every GPU sees the same network (so one GPU can stand for all)."""
        return self.config.topology.kind in ("ring", "fully_connected", "switch")
