"""HBM: the address mapping and the timing of one channel's banks, row buffers and data bus.

Granularity (DESIGN.md section 2): a request is a contiguous range of one channel.  It is split
into *row segments* (the part of the request that falls into one row of one bank).  A segment
costs a row activation when its row is not open (precharge + activate, overlapped with other
banks' transfers) and then ``n`` bursts.  Bursts to one bank group are spaced ``t_ccd_l`` apart
(``t_ccd_wl`` for near-bank op-and-store); the shared data bus moves one burst every ``t_ccd_s``.
Segments to different bank groups therefore overlap and together reach the bus peak, while a
stream confined to one bank group gets ``t_ccd_s / t_ccd_l`` of it.  The schedule is computed
arithmetically: a channel costs no simulation events of its own.

Address mapping (low to high bits): ``interleave_bytes`` of contiguous addresses on one channel,
then the channel, then the next unit of the same channel.  Inside a channel, row-sized pieces
rotate over bank groups first, then over the banks of a group, then rows; with ``bank_xor`` the
bank slot is XORed with the folded bits of the row (:func:`bank_of`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpusim.config.gpu import HbmConfig
from gpusim.units import cycles_to_ns

READ = "read"
WRITE = "write"
UPDATE = "update"
"""Near-bank op-and-store: the bank reads, combines and writes back the incoming data."""

KINDS = (READ, WRITE, UPDATE)


def row_fold(row: int, banks: int) -> int:
    """XOR of the bank-index-wide groups of ``row``'s bits (its base-``banks`` digits): what
    :func:`bank_of` XORs into the bank slot of every piece of ``row``."""
    fold = 0
    while row:
        fold ^= row % banks
        row //= banks
    return fold


def bank_of(piece: int, groups: int, per_group: int, xor: bool) -> tuple[int, int, int]:
    """``(bank, bank_group, row)`` of the ``piece``-th row-sized piece of a channel: pieces rotate
    over bank groups, then the banks of a group, then rows; with ``xor`` the rotation's slot is
    XORed with every bank-index-wide group of the row's bits (permutation-based interleaving with
    the row folded, so that rows a multiple of the bank count apart still land in different banks)."""
    banks = groups * per_group
    row = piece // banks
    slot = piece % banks
    if xor:
        slot ^= row_fold(row, banks)
    group = slot % groups
    return group * per_group + slot // groups, group, row


class AddressMap:
    """Maps GPU physical addresses to channels and, inside a channel, to banks and rows.

    Parameters
    ----------
    hbm
        The memory's description.
    max_request_bytes
        Longest contiguous piece of one physical channel that becomes a single request.

    Channels, interleave units and rows are those of the simulated (lockstep) channels.
    """

    def __init__(self, hbm: HbmConfig, max_request_bytes: float):
        self.channels = hbm.sim_channels
        self.interleave = hbm.sim_interleave_bytes
        self.row_bytes = hbm.sim_row_bytes
        self.bank_groups = hbm.bank_groups
        self.banks_per_group = hbm.banks_per_group
        self.bank_xor = hbm.bank_xor
        self.max_request = max(int(max_request_bytes) * hbm.lockstep_channels, self.interleave)
        self.banks = self.bank_groups * self.banks_per_group
        # bank and bank group of each (hashed) slot, and the fold of each row met so far (bank_of
        # as lookups: it runs for every request and every row segment)
        self.slot_bank = [bank_of(slot, self.bank_groups, self.banks_per_group, False)[0] for slot in range(self.banks)]
        self.slot_bank_group = [(bank, slot % self.bank_groups) for slot, bank in enumerate(self.slot_bank)]
        self.folds: dict[int, int] = {}

    def split(self, addr: int, nbytes: int) -> list[tuple[int, int, int]]:
        """Cut ``[addr, addr + nbytes)`` into per-channel requests.

        Returns
        -------
        list of (channel, channel_address, nbytes)
            Contiguous pieces of single channels, each at most ``max_request_bytes`` long, in the
            order their first bytes appear in the range.
        """
        interleave, channels, longest = self.interleave, self.channels, self.max_request
        end = addr + nbytes
        first_unit = addr // interleave
        last_unit = (end - 1) // interleave
        if first_unit == last_unit:
            return [(first_unit % channels, (first_unit // channels) * interleave + addr - first_unit * interleave,
                     nbytes)]
        if last_unit - first_unit < channels:
            # The first unit from addr, the units between whole, the last one up to the end (a
            # link packet's write: two units, no whole one).
            pieces = [(first_unit % channels, (first_unit // channels) * interleave + addr - first_unit * interleave,
                       (first_unit + 1) * interleave - addr)]
            for unit in range(first_unit + 1, last_unit):
                pieces.append((unit % channels, (unit // channels) * interleave, interleave))
            pieces.append((last_unit % channels, (last_unit // channels) * interleave, end - last_unit * interleave))
            return pieces
        # Each channel receives one contiguous run of its own address space.
        pieces = []
        for step in range(channels):
            unit = first_unit + step
            channel = unit % channels
            head = addr - unit * interleave if step == 0 else 0
            start = (unit // channels) * interleave + head
            units_on_channel = (last_unit - unit) // channels + 1
            last_of_channel = unit + (units_on_channel - 1) * channels
            tail = min(end, (last_of_channel + 1) * interleave) - last_of_channel * interleave
            length = (units_on_channel - 1) * interleave + tail - head
            while length > 0:
                size = min(longest, length)
                pieces.append((channel, start, size))
                start += size
                length -= size
        return pieces

    def bank_row(self, ch_addr: int) -> tuple[int, int]:
        """Bank index and row of the byte at channel address ``ch_addr``."""
        piece = ch_addr // self.row_bytes
        banks = self.banks
        row = piece // banks
        slot = piece % banks
        if self.bank_xor:
            slot ^= self.fold(row)
        return self.slot_bank[slot], row

    def fold(self, row: int) -> int:
        """:func:`row_fold` of ``row``, remembered."""
        fold = self.folds.get(row)
        if fold is None:
            fold = self.folds[row] = row_fold(row, self.banks)
        return fold


@dataclass
class ChannelStats:
    """What one channel did.

    Attributes
    ----------
    bytes_read, bytes_written, bytes_updated
        Data moved by kind of request.
    activations
        Row activations: of simulated rows (``lockstep_channels`` physical rows each), of the
        physical rows of strided runs (``run_activations``) and of the near-bank ALUs' commands.
    run_activations
        The physical row activations of requests for strided data in runs shorter than a row.
    row_hits
        Segments that found their row open.
    busy_ns
        Time the data bus was occupied.
    """

    bytes_read: float = 0.0
    bytes_written: float = 0.0
    bytes_updated: float = 0.0
    activations: int = 0
    run_activations: int = 0
    row_hits: int = 0
    busy_ns: float = 0.0


class HbmChannel:
    """Timing state of one channel: open rows, bank and bank-group availability, the data bus.

    Parameters
    ----------
    hbm
        The memory's description.
    address_map
        The mapping shared by all channels of the GPU.
    """

    def __init__(self, hbm: HbmConfig, address_map: AddressMap):
        clock = hbm.clock_hz
        derate = 1.0 / ((1.0 - hbm.refresh_overhead) * hbm.sustained_efficiency)
        self.map = address_map
        self.bank_xor = address_map.bank_xor
        self.burst_bytes = hbm.sim_burst_bytes
        self.t_rp = cycles_to_ns(hbm.t_rp_cycles, clock)
        self.t_rcd = cycles_to_ns(hbm.t_rcd_cycles, clock)
        self.t_ras = cycles_to_ns(hbm.t_ras_cycles, clock)
        self.t_cl = cycles_to_ns(hbm.t_cl_cycles, clock)
        self.t_ccd_s = cycles_to_ns(hbm.t_ccd_s_cycles, clock) * derate
        self.t_ccd_l = cycles_to_ns(hbm.t_ccd_l_cycles, clock) * derate
        self.t_ccd_wl = cycles_to_ns(hbm.t_ccd_wl_cycles, clock) * derate
        self.t_wtr = cycles_to_ns(hbm.t_wtr_cycles, clock)
        self.t_rtw = cycles_to_ns(hbm.t_rtw_cycles, clock)
        self.activate_interval = cycles_to_ns(max(hbm.t_rrd_cycles, hbm.t_faw_cycles / 4), clock) / hbm.pseudo_channels
        self.physical_row_bytes = int(hbm.row_bytes)
        self.lockstep = hbm.lockstep_channels
        self.activations_free = 0.0
        banks = hbm.banks_per_channel
        self.open_row = [-1] * banks
        self.bank_free = [0.0] * banks
        self.activated_at = [-math.inf] * banks
        self.group_free = [0.0] * hbm.bank_groups
        self.bus_free = 0.0
        self.last_write = False
        self.stats = ChannelStats()
        # What access() reads for every request, in one tuple (fewer attribute lookups).
        self._constants = (address_map, address_map.folds, address_map.row_bytes, address_map.banks,
                           address_map.slot_bank_group, self.bank_xor, self.burst_bytes,
                           -(-address_map.row_bytes // self.burst_bytes), self.t_ccd_s, self.t_ras, self.t_rp, self.t_rcd)

    @property
    def activation_ns(self) -> float:
        """Precharge plus activate: the cost of opening a new row, ns."""
        return self.t_rp + self.t_rcd

    def row_is_open(self, ch_addr: int) -> bool:
        """Whether the first row segment of ``ch_addr`` would hit an open row."""
        bank, row = self.map.bank_row(ch_addr)
        return self.open_row[bank] == row

    def access(self, ch_addr: int, nbytes: int, kind: str, now: float, run_bytes: int | None = None) -> float:
        """Schedule a request issued at ``now``; return when its last data beat is done, ns.

        For reads the column latency ``t_cl`` is included; writes and updates are done when their
        data has been written into the banks.  A request standing for strided data in runs of
        ``run_bytes`` shorter than a row opens one row per run; the channel's activation rate
        (``t_rrd``, ``t_faw``) then bounds it, whatever its bursts would allow.
        """
        is_write = kind != READ
        spacing = self.t_ccd_wl if kind == UPDATE else self.t_ccd_l
        bus_free = self.bus_free
        if is_write != self.last_write:
            bus_free = (bus_free if bus_free > now else now) + (self.t_rtw if is_write else self.t_wtr)
            self.last_write = is_write
        end = now
        (address_map, folds, row_bytes, banks, slot_bank_group, xor, burst, row_bursts, t_ccd_s, t_ras, t_rp,
         t_rcd) = self._constants
        open_row, bank_free, group_free, activated_at = self.open_row, self.bank_free, self.group_free, self.activated_at
        stats = self.stats
        row_hits = activations = 0
        busy = stats.busy_ns
        row_group_occupancy, row_bus_occupancy = row_bursts * spacing, row_bursts * t_ccd_s  # a whole row's
        # AddressMap.bank_row, inlined and stepped: consecutive row-sized pieces take consecutive
        # slots of a row, then the next row (this loop runs for every row segment; AddressMap.fold
        # is called only for a row whose fold is not known yet).
        piece = ch_addr // row_bytes
        row = piece // banks
        unhashed = piece % banks
        fold = folds.get(row) if xor else 0
        if fold is None:
            fold = address_map.fold(row)
        size = row_bytes - ch_addr % row_bytes  # the first segment's, unless the request ends before its row
        remaining = nbytes
        while remaining > 0:
            if size > remaining:
                size = remaining
            remaining -= size
            bank, group = slot_bank_group[unhashed ^ fold]
            bank_ready = bank_free[bank]
            current = open_row[bank]
            if current == row:
                ready = bank_ready if bank_ready > now else now
                row_hits += 1
            else:
                act = bank_ready if bank_ready > now else now
                if current >= 0:
                    earliest = activated_at[bank] + t_ras
                    act = (act if act > earliest else earliest) + t_rp
                activated_at[bank] = act
                open_row[bank] = row
                ready = act + t_rcd  # not before now, as act is not
                activations += 1
            if size == row_bytes:
                group_occupancy, bus_occupancy = row_group_occupancy, row_bus_occupancy
            else:
                bursts = -(-size // burst)
                group_occupancy, bus_occupancy = bursts * spacing, bursts * t_ccd_s
            group_ready = group_free[group]
            start = ready if ready > group_ready else group_ready
            group_end = start + group_occupancy
            bus_free = (bus_free if bus_free > start else start) + bus_occupancy
            busy += bus_occupancy
            segment_end = group_end if group_end > bus_free else bus_free
            group_free[group] = group_end
            bank_free[bank] = segment_end
            if segment_end > end:
                end = segment_end
            size = row_bytes  # the later segments start at the start of a row
            unhashed += 1
            if unhashed == banks:
                unhashed = 0
                row += 1
                fold = folds.get(row) if xor else 0
                if fold is None:
                    fold = address_map.fold(row)
        self.bus_free = bus_free
        stats.row_hits += row_hits
        stats.activations += activations
        stats.busy_ns = busy
        if run_bytes is not None and run_bytes < self.physical_row_bytes and self.activate_interval > 0:
            runs = -(-nbytes // run_bytes)
            start = self.activations_free if self.activations_free > now else now
            self.activations_free = start + runs / self.lockstep * self.activate_interval
            stats.activations += runs
            stats.run_activations += runs
            opened = self.activations_free + self.t_rcd
            if opened > end:
                end = opened
            if self.activations_free > self.bus_free:
                self.bus_free = self.activations_free
        if kind == READ:
            stats.bytes_read += nbytes
            return end + self.t_cl
        if kind == WRITE:
            stats.bytes_written += nbytes
        else:
            stats.bytes_updated += nbytes
        return end

    @property
    def free_at(self) -> float:
        """When every bank and the data bus have finished the work scheduled so far, ns."""
        return max(self.bus_free, max(self.bank_free), max(self.group_free))

    def occupy_all_banks(self, start: float, end: float, activations: int) -> None:
        """Give the whole channel to near-memory commands from ``start`` to ``end`` (ns).

        All banks run the commands in lockstep (all-bank mode, :mod:`gpusim.hw.nmc` computes
        their timing): ordinary requests cannot use the channel meanwhile, and every row is closed
        afterwards.  ``activations`` counts the row activations of all banks together.
        """
        for bank in range(len(self.bank_free)):
            self.bank_free[bank] = max(self.bank_free[bank], end)
            self.open_row[bank] = -1
        for group in range(len(self.group_free)):
            self.group_free[group] = max(self.group_free[group], end)
        self.bus_free = max(self.bus_free, end)
        self.stats.activations += activations
        self.stats.busy_ns += end - start
