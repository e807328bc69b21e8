"""Topologies as networkx graphs: GPUs, switches and the inter-node fabric, joined by directed links.

Nodes are named ``gpu{i}`` (global GPU index), ``node{k}.switch``, ``fabric`` and, when a node's
connection to the fabric is shared, ``node{k}.uplink``.  Every directed
edge carries ``bandwidth_bytes_per_s`` and ``latency_ns``.  Routes are shortest paths by
latency plus serialisation of a typical packet, so traffic stays on fast intra-node links and
leaves a node only through the NICs.
"""

from __future__ import annotations

import itertools
from functools import cached_property, lru_cache

import networkx as nx
import numpy as np

from gpusim.config.node import SystemConfig
from gpusim.errors import ConfigError

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


def is_gpu_node(node: str) -> bool:
    """Whether a graph node is a GPU (not a switch, uplink or the fabric)."""
    return node.startswith("gpu")


def gpu_index(node: str) -> int:
    """Global GPU index of a GPU's graph node (the inverse of :func:`gpu_node`)."""
    return int(node[3:])


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
        nic = {
            "bandwidth_bytes_per_s": net.nic_bandwidth_bytes_per_s * net.nics_per_gpu,
            "latency_ns": net.latency_ns / 2,
            "kind": "nic",
        }
        for node in range(config.nodes):
            entry = "fabric"
            if net.node_bandwidth_bytes_per_s is not None:
                entry = f"node{node}.uplink"
                graph.add_node(entry, kind="uplink", node=node)
                uplink = {"bandwidth_bytes_per_s": net.node_bandwidth_bytes_per_s, "latency_ns": 0.0, "kind": "uplink"}
                graph.add_edge(entry, "fabric", **uplink)
                graph.add_edge("fabric", entry, **uplink)
            for local in range(n):
                gpu = gpu_node(node * n + local)
                graph.add_edge(gpu, entry, **nic)
                graph.add_edge(entry, gpu, **nic)
    return graph


MAX_CYCLE_CANDIDATES = 50000
"""Directed Hamiltonian cycles enumerated when choosing rings (all of them up to 9 GPUs)."""


@lru_cache(maxsize=64)
def balanced_rings(gpus: tuple[int, ...], capacity: tuple[float, ...], count: int) -> tuple[tuple[int, ...], ...] | None:
    """``count`` directed Hamiltonian cycles of ``gpus`` that load every link in proportion to its bandwidth.

    Parameters
    ----------
    gpus
        The GPUs, the first one starting every cycle.
    capacity
        Bandwidth of the link from ``gpus[i]`` to ``gpus[j]`` at index ``i * len(gpus) + j`` (0: no link).
    count
        Rings wanted (repetitions allowed).

    Returns
    -------
    tuple of cycles, or None when no cycle uses direct links only.
    """
    n = len(gpus)
    bandwidth = np.asarray(capacity, dtype=float)
    cycles = []
    for rest in itertools.islice(itertools.permutations(range(1, n)), MAX_CYCLE_CANDIDATES):
        order = (0, *rest)
        edges = [order[i] * n + order[(i + 1) % n] for i in range(n)]
        if all(bandwidth[e] > 0 for e in edges):
            cycles.append((order, edges))
    if not cycles:
        return None
    edges = np.array([e for _, e in cycles])
    inverse = np.where(bandwidth > 0, 1.0 / np.where(bandwidth > 0, bandwidth, 1.0), 0.0) * bandwidth.max()
    load = np.zeros(n * n)
    picked = []
    for _ in range(count):
        ratios = (load[edges] + 1.0) * inverse[edges]
        worst = ratios.max(axis=1)
        best = np.lexsort((ratios.sum(axis=1), worst))[0]
        load[edges[best]] += 1.0
        picked.append(tuple(gpus[i] for i in cycles[best][0]))
    return tuple(picked)


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
                raise ConfigError(f"{self.config.name}: GPU {src} cannot reach GPU {dst} in its "
                                  f"{self.config.topology.kind} topology (field 'topology.edges')") from exc
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
            raise ConfigError(f"{self.config.name}: its {self.config.topology.kind} topology of {n} GPUs has no ring "
                              f"through direct links, which a ring collective needs (field 'topology.edges')")
        return cycle

    def link_capacity(self, src: int, dst: int) -> float:
        """Bandwidth of the direct link from GPU ``src`` to GPU ``dst`` (0 when not directly linked), bytes/s."""
        data = self.graph.get_edge_data(gpu_node(src), gpu_node(dst))
        return 0.0 if data is None or data["kind"] != "link" else float(data["bandwidth_bytes_per_s"])

    def rings(self, group: list[int], count: int) -> list[list[int]]:
        """``count`` rings (orders of ``group``, one node's GPUs) that spread over the direct links.

        On a fully connected or hybrid cube-mesh node a collective library builds several rings
        through different links, so that every link carries traffic (NCCL/RCCL channels).  Each
        ring here is a directed Hamiltonian cycle through direct links; channel after channel, the
        cycle is chosen whose most loaded link direction (load relative to bandwidth) would be least
        loaded, so that link loads stay proportional to link bandwidths.  On a ring or switch node,
        or when the GPUs have no cycle through direct links, every ring is the topology's ring order.
        """
        ordered = sorted(group, key=lambda gpu: self.ring_order.index(gpu % self.config.num_gpus))
        if len(group) <= 2 or self.config.topology.kind in ("ring", "switch"):
            return [list(ordered) for _ in range(count)]
        capacity = tuple(self.link_capacity(a, b) for a in ordered for b in ordered)
        chosen = balanced_rings(tuple(ordered), capacity, count)
        if chosen is None:
            return [list(ordered) for _ in range(count)]
        return [list(ring) for ring in chosen]

    @property
    def symmetric(self) -> bool:
        """Whether every GPU sees the same network (so one GPU can stand for all)."""
        return self.config.topology.kind in ("ring", "fully_connected", "switch")

    @property
    def mirrors_direct_traffic(self) -> bool:
        """Whether symmetric mode is exact (within 1.5%) for direct collectives and all-to-all.

        On a fully connected node or a switch every peer is one hop away.  On a ring they route
        over several hops, where one GPU's mirrored packets meet the other ranks' at other moments
        than the real ones do (docs/model.md: up to 4.4% slow at the presets' link latency, up to
        1.5x off it).
        """
        return self.config.topology.kind in ("fully_connected", "switch")
