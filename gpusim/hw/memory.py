"""A GPU's memory path: CU requests through the L2 to the memory controllers of the HBM channels."""

from __future__ import annotations

from gpusim.engine.primitives import Join
from gpusim.hw.cache import FETCH_BYTES, Fill, L2Cache
from gpusim.hw.hbm import READ, UPDATE, WRITE, AddressMap
from gpusim.hw.memctrl import MemoryController
from gpusim.hw.request import COMM, COMPUTE, MemRequest


class MemorySystem:
    """Routes reads, writes and near-memory updates of one GPU to its L2 and DRAM.

    Parameters
    ----------
    env
        The simpy environment.
    l2
        The GPU's L2.
    address_map
        Address-to-channel mapping.
    controllers
        One memory controller per channel.
    """

    def __init__(self, env, l2: L2Cache, address_map: AddressMap, controllers: list[MemoryController]):
        self.env = env
        self.l2 = l2
        self.map = address_map
        self.controllers = controllers

    # -- DRAM -------------------------------------------------------------------------------
    def dram(
        self,
        addr: int,
        nbytes: int,
        kind: str,
        stream: str,
        completion: Join | Fill | None = None,
        admission: Join | None = None,
        tag: object = None,
        run_bytes: int | None = None,
    ) -> int:
        """Send ``[addr, addr + nbytes)`` straight to the memory controllers.

        Parameters
        ----------
        completion
            Waits until the data of every request is done (read data back, or written).
        admission
            Waits until every request has entered its controller's queue (posted writes).
        tag
            Attached to each request (seen by enqueue observers such as the T3 tracker).
        run_bytes
            Contiguous run length of the real (strided) data the range stands for, see
            :class:`MemRequest`; ``None``: contiguous.

        Returns
        -------
        int
            Number of requests sent.
        """
        now = self.env.now
        pieces = self.map.split(addr, nbytes)
        if completion is not None:
            completion.pending += len(pieces)
        if admission is not None:
            admission.pending += len(pieces)
        controllers = self.controllers
        # The pieces share their (never modified) lists of joins.
        completions = None if completion is None else [completion]
        admissions = None if admission is None else [admission]
        for channel, ch_addr, size in pieces:
            controllers[channel].submit(
                MemRequest(channel, ch_addr, size, kind, stream, now, completions, admissions, None, tag, run_bytes)
            )
        return len(pieces)

    # -- through the L2 ---------------------------------------------------------------------
    def read(self, addr: int, nbytes: int, join: Join, stream: str = COMPUTE, cached: bool = True,
             run_bytes: int | None = None, l2_bytes: float | None = None) -> int:
        """Read ``nbytes`` at ``addr``; ``join`` completes when the data has arrived at the CU.

        ``run_bytes`` says that the range stands for strided data in runs of that length (see
        :class:`MemRequest`); DRAM fills then pay a row activation per run.  ``l2_bytes``: the
        bytes of L2 bandwidth the read costs this requester, where it is one of several that
        receive the same data from one L2 read (a multicast: each pays its share); default
        ``nbytes``.

        Returns
        -------
        int
            Bytes that come from DRAM (L2 misses, including those merged with a fill in flight);
            the rest hit in the L2.
        """
        if not cached:
            self.dram(addr, nbytes, READ, stream, completion=join, run_bytes=run_bytes)
            return nbytes
        l2 = self.l2
        now = self.env.now
        served = nbytes if l2_bytes is None else l2_bytes
        join.extend_to(l2.bandwidth_done(now, served))
        l2.stats.bytes_read += served
        l2.traffic[int(now // l2.bin_ns)] += served
        size = l2.block_bytes
        end = addr + nbytes
        block = addr // size
        last = (end - 1) // size
        missed = 0
        lookup, missing, present = l2.lookup, l2.missing, l2.present
        run_start = run_stop = -1  # the absent bytes to fetch in one DRAM read, not yet issued
        waited = None  # the fill the previous block waited for, unless a fill was issued since
        while block <= last:
            base = block * size
            start = addr - base if addr > base else 0
            stop = end - base if end < base + size else size
            state = lookup(block, now, start, stop)
            if state is False:  # fetch the absent bytes; the present ones may still be in flight
                if block in present:  # part of it is cached or on its way: fetch around that
                    ranges = missing(block, start, stop)
                    absent = sum(max(0, min(high, stop) - max(low, start)) for low, high in ranges)
                else:  # nothing of it: the read's granules, as missing() gives them
                    high = stop if stop == size else min(size, -(-stop // FETCH_BYTES) * FETCH_BYTES)
                    ranges = ((start - start % FETCH_BYTES, high),)
                    absent = stop - start  # of the read's own bytes
                for low, high in ranges:
                    if base + low != run_stop:
                        if run_start >= 0:
                            self._fill(run_start, run_stop, join, stream, run_bytes)
                            waited = None
                        run_start = base + low
                    run_stop = base + high
                state = l2.in_flight(block, now) if absent < stop - start else None
                missed += absent if state is None else stop - start
            elif state is not True:
                missed += stop - start
            if state is not True and state is not None:
                if state is not waited:  # waiting again for the same fill changes nothing
                    state.wait(join, now)
                    waited = state
            block += 1
        if run_start >= 0:
            self._fill(run_start, run_stop, join, stream, run_bytes)
        return missed

    def _fill(self, start: int, stop: int, join: Join, stream: str, run_bytes: int | None = None) -> None:
        """Read bytes ``[start, stop)`` from DRAM into the L2; ``join`` waits for them."""
        l2 = self.l2
        size = l2.block_bytes
        fill = Fill()
        self.dram(start, stop - start, READ, stream, completion=fill, run_bytes=run_bytes)
        fill.wait(join, self.env.now)
        # Blocks in address order: a partly covered first block, whole blocks, a partly covered last one.
        first, last = start // size, (stop - 1) // size
        if first == last:
            evicted = l2.insert(first, 0, fill, start - first * size, stop - first * size)
        else:
            head_partial = start != first * size
            tail_partial = stop != (last + 1) * size
            evicted = l2.insert(first, 0, fill, start - first * size) if head_partial else []
            whole = range(first + head_partial, last + 1 - tail_partial)
            if whole:
                evicted += l2.insert_whole(whole, fill)
            if tail_partial:
                evicted += l2.insert(last, 0, fill, 0, stop - last * size)
        if evicted:
            self._writeback(evicted, join)

    def write(
        self,
        addr: int,
        nbytes: int,
        join: Join,
        stream: str = COMPUTE,
        cached: bool = True,
        kind: str = WRITE,
        tag: object = None,
        through: bool | None = None,
    ) -> None:
        """Write (or, with ``kind="update"``, op-and-store) ``nbytes`` at ``addr``.

        Writes are posted: ``join`` completes when the data is in the L2 (and any write-backs it
        caused are queued), or, uncached, when the requests are in the controllers' queues.
        Updates always bypass the L2, since the bank's ALU combines them with DRAM contents.
        ``through`` (default: the L2's ``write_through``) sends a write that allocates on to DRAM too,
        leaving the block clean.
        """
        if kind == UPDATE or not cached:
            self._invalidate(addr, nbytes)
            self.dram(addr, nbytes, kind, stream, admission=join, tag=tag)
            return
        l2 = self.l2
        if through is None:
            through = l2.write_through
        join.extend_to(l2.bandwidth_done(self.env.now, nbytes * l2.write_cost))
        l2.stats.bytes_written += nbytes
        l2.traffic[int(self.env.now // l2.bin_ns)] += nbytes
        size = l2.block_bytes
        end = addr + nbytes
        block = addr // size
        insert = l2.insert
        while block * size < end:
            base = block * size
            lo = addr - base if addr > base else 0
            hi = end - base if end < base + size else size
            evicted = insert(block, 0 if through else hi - lo, None, lo, hi)
            if evicted:
                self._writeback(evicted, join)
            block += 1
        if through:
            self.dram(addr, nbytes, WRITE, stream, admission=join)

    def accept_remote(self, addr: int, nbytes: int, kind: str, admission: Join, cached: bool = True) -> None:
        """Take a write or update that arrived over a link; ``admission`` completes when it is queued.
        A write to a ``cached`` buffer allocates in the L2 where the L2 takes remote writes."""
        if kind == WRITE and cached and self.l2.remote_writes_allocate:
            self.write(addr, nbytes, admission, stream=COMM, through=self.l2.remote_writes_through)
        else:  # what write() does with an uncached write or an update, without its keyword arguments
            self._invalidate(addr, nbytes)
            self.dram(addr, nbytes, kind, COMM, None, admission)

    def flush(self, join: Join) -> None:
        """Write back every dirty L2 block (e.g. at the end of a kernel that must be visible in DRAM)."""
        self._writeback(self.l2.flush(), join)

    def _writeback(self, evicted: list[tuple[int, int]], join: Join | None) -> None:
        size = self.l2.block_bytes
        for block, dirty in evicted:
            self.dram(block * size, dirty, WRITE, COMPUTE, admission=join)

    def _invalidate(self, addr: int, nbytes: int) -> None:
        size = self.l2.block_bytes
        blocks = self.l2.blocks
        if not blocks:
            return
        for block in range(addr // size, (addr + nbytes - 1) // size + 1):
            if block in blocks:
                self.l2.invalidate(block)
