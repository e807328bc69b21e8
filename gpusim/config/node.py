"""Hardware description of a node (GPUs and the links between them) and of a multi-node system."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpusim.config.gpu import GpuConfig
from gpusim.config.quantities import Bandwidth, Bytes, Fraction, Int, Model, Name, Nanoseconds, PositiveInt

TopologyKind = Literal["ring", "fully_connected", "switch", "hybrid_cube_mesh", "custom"]
MAX_GPUS_PER_NODE = 1024
"""Most GPUs a node description may have (a fully connected node of n GPUs has n(n-1)/2 links: 1024
GPUs take about a gigabyte to build, a few thousand more than a machine's memory)."""
MAX_GPUS = 4096
"""Most GPUs a system may have over all its nodes (each is simulated: 4096 take about a gigabyte and a
half to simulate a kernel on, and many more would exhaust the simulator's memory)."""


class LinkConfig(Model):
    """A point-to-point GPU link (one direction of it is simulated as a server).

    Attributes
    ----------
    bandwidth_bytes_per_s
        Bandwidth of one direction of one link.  A "150 GB/s bidirectional" link is 75 GB/s here.
    latency_ns
        Time of flight of a packet (after its last byte left the sender).  Default 500 ns, one
        NVLink hop as the NVLink presets give it.
    packet_bytes
        Messages are cut into packets at destination addresses that are multiples of this size
        (a simulation granularity, not the link's real packet); one simulation event per packet.
        Default 64 KiB, every node's but the T3 rings' (docs/model.md).
    credit_bytes
        End-to-end flow control: bytes a sender may have in flight towards one destination before
        their credits are back: the destination's memory controllers accept the bytes and the
        credits travel the route back, so a route of latency L carries at most credit_bytes / 2L
        (768 KiB by default: fitted on the DGX A100's all-reduces).  Collectives whose rings share
        one neighbour can be bound by it.
    """

    bandwidth_bytes_per_s: Bandwidth
    latency_ns: Nanoseconds = 500.0
    packet_bytes: Bytes = 65536
    credit_bytes: Bytes = 786432


class TopologyConfig(Model):
    """How the GPUs of a node are connected.

    Attributes
    ----------
    kind
        ``ring`` (GPU i to i+1 and i-1), ``fully_connected`` (every pair), ``switch`` (every GPU to
        one non-blocking switch), ``hybrid_cube_mesh`` (DGX-1), or ``custom`` (``edges``).
    links_per_pair
        Parallel links between two connected GPUs (their bandwidths add).
    edges
        For ``custom``: pairs ``[a, b]`` or triples ``[a, b, links]`` of connected GPUs.
    """

    kind: TopologyKind
    links_per_pair: PositiveInt = 1
    edges: list[list[Int]] = []

    @model_validator(mode="after")
    def _check_edges(self) -> TopologyConfig:
        if self.kind == "custom" and not self.edges:
            raise ValueError("a custom topology needs 'edges'")
        if self.kind != "custom" and self.edges:
            raise ValueError(f"'edges' describe a custom topology; a {self.kind} topology makes its own links "
                             f"(give kind: custom, or leave 'edges' out)")
        pairs: dict[frozenset[int], list[int]] = {}
        for edge in self.edges:
            if len(edge) not in (2, 3):
                raise ValueError(f"edge {edge} must be [a, b] or [a, b, links]")
            if edge[0] == edge[1]:
                raise ValueError(f"edge {edge} links GPU {edge[0]} to itself; an edge links two GPUs")
            if len(edge) == 3 and edge[2] < 1:
                raise ValueError(f"edge {edge}: its number of links must be at least 1, got {edge[2]}")
            first = pairs.setdefault(frozenset(edge[:2]), edge)
            if first is not edge:
                raise ValueError(f"edges {first} and {edge} link the same GPUs; give each pair once "
                                 f"(with its number of links as a third value)")
        return self


class SwitchConfig(Model):
    """A non-blocking switch inside a node (NVSwitch): each GPU has one port to it.

    Attributes
    ----------
    port_bandwidth_bytes_per_s
        Bandwidth of one GPU's port, per direction.
    latency_ns
        Latency through the switch.
    """

    port_bandwidth_bytes_per_s: Bandwidth
    latency_ns: Nanoseconds = 700.0


class NetworkConfig(Model):
    """The network that joins several identical nodes (one NIC per GPU by default).

    Attributes
    ----------
    nic_bandwidth_bytes_per_s
        Bandwidth of one NIC per direction.
    nics_per_gpu
        NICs attached to each GPU; their bandwidths add.
    node_bandwidth_bytes_per_s
        Bandwidth per direction of a node's connection to the fabric, shared by all its GPUs' NICs
        (an oversubscribed leaf switch, fewer NICs than GPUs, or a host path that all traffic
        crosses); ``None``: the NICs reach the fabric unshared (a non-blocking, rail-optimised
        fabric).
    latency_ns
        End-to-end latency between NICs through the fabric.
    packet_bytes
        Largest packet (one simulation event each) on routes that cross the fabric.
    credit_bytes
        Bytes in flight from a sender to one destination on routes that cross the fabric (see
        :class:`LinkConfig`).  Default 768 KiB, the links' window fitted on the DGX A100 (not
        fitted on a network).
    """

    nic_bandwidth_bytes_per_s: Bandwidth
    nics_per_gpu: PositiveInt = 1
    node_bandwidth_bytes_per_s: Bandwidth | None = None
    latency_ns: Nanoseconds = 3000.0
    packet_bytes: Bytes = 65536
    credit_bytes: Bytes = 786432


class ProtocolConfig(Model):
    """A collective-library protocol (NCCL's LL, LL128, Simple): latency traded for bandwidth.

    Attributes
    ----------
    name
        Shown in results (``impl``).
    step_latency_ns
        Cost of one ring step's handshake between neighbouring GPUs (flag write and poll).
    base_latency_ns
        Fixed cost of a collective with this protocol, on top of the kernel launch.
    wire_efficiency
        Payload fraction of the bytes moved: LL sends an 8-byte flag with every 8 bytes of data
        (0.5), LL128 one 8-byte flag per 128-byte line (120/128), Simple none (1).
    channel_bytes
        Message bytes per channel below which the library uses fewer channels (NCCL: threads
        per channel x the protocol's per-thread threshold); ``None``: a channel per 64 KiB of a
        rank's chunk.
    """

    name: Name
    step_latency_ns: Nanoseconds
    base_latency_ns: Nanoseconds = 0.0
    wire_efficiency: Fraction = 1.0
    channel_bytes: Bytes | None = None


class CollectiveConfig(Model):
    """How the collective library on this node runs (NCCL/RCCL-like defaults).

    Attributes
    ----------
    cus
        CUs a CU-driven collective kernel occupies (NCCL "channels").
    slice_bytes
        Pipelining granularity of a CU-driven collective: bytes one CU moves per step.
    sync_ns
        Cost of one flag handshake between neighbouring GPUs (a small remote write + poll), when
        no ``protocols`` are given (and T3's arming flag).  The default, 1 us, is an estimate with
        no recorded source.
    launch_ns
        Extra set-up time of a collective kernel beyond a normal kernel launch.
    protocols
        Protocols a ring collective may use; the library picks, per call, the one its cost model
        (latency per step and per call, bandwidth times wire efficiency) predicts fastest, as
        NCCL's tuner does.  Empty: one protocol with ``sync_ns`` per step and no overhead.
    channel_inflight_bytes
        Bytes one channel's workgroup of a CU-driven collective keeps in flight (its threads' loads
        and stores, bytes): with the unloaded memory latency it bounds the channel's memory traffic
        (Little's law), below its CU's ``cu.max_inflight_bytes``.  ``None``: only the CU's bound.
    """

    cus: PositiveInt = 16
    slice_bytes: Bytes = 524288
    sync_ns: Nanoseconds = 1000.0
    launch_ns: Nanoseconds = 5000.0
    protocols: list[ProtocolConfig] = []
    channel_inflight_bytes: Bytes | None = None

    def protocol_list(self) -> list[ProtocolConfig]:
        """The protocols to choose from (the one made of ``sync_ns`` when none are configured)."""
        return self.protocols or [ProtocolConfig(name="simple", step_latency_ns=self.sync_ns)]


class SystemConfig(Model):
    """A complete system: ``nodes`` identical nodes of ``num_gpus`` GPUs each.

    Attributes
    ----------
    name, description, sources
        Identification and provenance.
    gpu
        The GPU of every node.
    num_gpus
        GPUs per node, at most :data:`MAX_GPUS_PER_NODE`.
    topology, links, switch
        The intra-node interconnect; ``switch`` is required for a switch topology.
    nodes
        Number of nodes; more than one needs ``network``, and all of them together have at most
        :data:`MAX_GPUS` GPUs.
    network
        The inter-node network.
    collectives
        Collective-library behaviour.
    """

    name: Name
    description: str = ""
    sources: list[str] = []
    gpu: GpuConfig
    num_gpus: Annotated[PositiveInt, Field(le=MAX_GPUS_PER_NODE)] = 1
    topology: TopologyConfig = TopologyConfig(kind="fully_connected")
    links: LinkConfig | None = None
    switch: SwitchConfig | None = None
    nodes: PositiveInt = 1
    network: NetworkConfig | None = None
    collectives: CollectiveConfig = CollectiveConfig()

    @model_validator(mode="after")
    def _check_interconnect(self) -> SystemConfig:
        if self.num_gpus > 1:
            if self.topology.kind == "switch":
                if self.switch is None:
                    raise ValueError("a switch topology needs 'switch' (port bandwidth, latency)")
            elif self.links is None:
                raise ValueError(f"a {self.topology.kind} topology of {self.num_gpus} GPUs needs 'links'")
        if self.topology.kind == "hybrid_cube_mesh" and self.num_gpus != 8:
            raise ValueError("hybrid_cube_mesh is defined for 8 GPUs")
        for edge in self.topology.edges:
            for gpu in edge[:2]:
                if not 0 <= gpu < self.num_gpus:
                    raise ValueError(f"topology edge {edge} names GPU {gpu}; GPUs are 0..{self.num_gpus - 1}")
        if self.nodes > 1 and self.network is None:
            raise ValueError(f"{self.nodes} nodes need 'network' (NIC bandwidth, latency)")
        if self.total_gpus > MAX_GPUS:
            raise ValueError(f"{self.nodes} nodes of {self.num_gpus} GPUs are {self.total_gpus} GPUs; at most "
                             f"{MAX_GPUS} are simulated (fields 'nodes' and 'num_gpus')")
        return self

    @property
    def total_gpus(self) -> int:
        """GPUs in the whole system."""
        return self.num_gpus * self.nodes

