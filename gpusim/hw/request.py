"""A DRAM request: a contiguous range of one channel, read, written or updated (op-and-store)."""

from __future__ import annotations

from collections.abc import Callable

from gpusim.engine.primitives import Join

COMPUTE = "compute"
COMM = "comm"
NMC = "nmc"
STREAMS = (COMPUTE, COMM, NMC)
"""Stream tags of memory traffic: kernels' own accesses, communication (collectives, DMA, remote
writes), and near-memory commands."""


class MemRequest:
    """One request to one channel's memory controller.

    Parameters
    ----------
    channel
        Channel index within the GPU.
    ch_addr
        Address within the channel's own address space.
    nbytes
        Length in bytes.
    kind
        ``"read"``, ``"write"`` or ``"update"`` (near-bank op-and-store).
    stream
        ``"compute"``, ``"comm"`` or ``"nmc"``.
    arrival_ns
        When the request was offered to the controller.
    completion
        Joins to tell when the request's data is done (reads: data back at the requester); the
        pieces of one range share the list, which is never modified.
    admission
        Joins to tell when the request entered the controller's queue (posted writes).
    on_done
        Called as ``on_done(request, done_ns)`` when the request is scheduled.
    tag
        Anything the requester wants to find again (e.g. a T3 tracker entry).
    run_bytes
        Length of the contiguous runs the range stands for when the data it represents is
        strided in the real layout (a transposed GEMM panel: one short run per row or column);
        ``None`` for truly contiguous data.  Each run then needs its own DRAM row activation.

    The memory controller fills in ``bank`` and ``row`` (of the first byte) when the request
    shares its queue with others, for the policies' row-hit checks, and ``done_ns`` when it
    schedules the request.
    """

    __slots__ = (
        "channel",
        "ch_addr",
        "nbytes",
        "kind",
        "stream",
        "arrival_ns",
        "completion",
        "admission",
        "on_done",
        "tag",
        "done_ns",
        "bank",
        "row",
        "run_bytes",
    )

    def __init__(
        self,
        channel: int,
        ch_addr: int,
        nbytes: int,
        kind: str,
        stream: str,
        arrival_ns: float,
        completion: list[Join] | None = None,
        admission: list[Join] | None = None,
        on_done: Callable[[MemRequest, float], None] | None = None,
        tag: object = None,
        run_bytes: int | None = None,
    ):
        self.channel = channel
        self.ch_addr = ch_addr
        self.nbytes = nbytes
        self.kind = kind
        self.stream = stream
        self.arrival_ns = arrival_ns
        self.completion = completion
        self.admission = admission
        self.on_done = on_done
        self.tag = tag
        self.done_ns: float | None = None
        self.bank = -1
        self.row = -1
        self.run_bytes = run_bytes

    def __repr__(self) -> str:
        return f"<MemRequest {self.kind} {self.stream} ch{self.channel}+{self.ch_addr:#x} {self.nbytes}B>"
