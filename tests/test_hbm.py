"""HBM timing: address mapping, row buffers, bank groups, op-and-store."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.config import load_gpu_config
from gpusim.hw.hbm import AddressMap, HbmChannel, bank_of

GPU = load_gpu_config("t3-table8.1")
LINEAR = GPU.hbm.model_copy(update={"bank_xor": False})
"""The preset's HBM without bank hashing: strides of whole rows name the banks directly."""


def fresh(hbm=GPU.hbm):
    address_map = AddressMap(hbm, GPU.memctrl.max_request_bytes)
    return address_map, HbmChannel(hbm, address_map)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**26), st.integers(1, 2**21))
def test_split_conserves_bytes_and_respects_request_limit(addr, nbytes):
    address_map, _ = fresh()
    pieces = address_map.split(addr, nbytes)
    assert sum(size for _, _, size in pieces) == nbytes
    assert all(0 < size <= address_map.max_request for _, _, size in pieces)
    assert all(0 <= channel < address_map.channels for channel, _, _ in pieces)


def test_split_maps_every_byte_where_the_interleave_says():
    address_map, _ = fresh()
    unit, channels = address_map.interleave, address_map.channels
    addr, nbytes = 3 * unit + 256, 5 * channels * unit + 768
    covered = set()
    for channel, ch_addr, size in address_map.split(addr, nbytes):
        for offset in range(0, size, 256):
            covered.add((channel, ch_addr + offset))
    for byte in range(addr, addr + nbytes, 256):
        u = byte // unit
        assert (u % channels, (u // channels) * unit + byte % unit) in covered


def test_streaming_reads_reach_peak_bandwidth_minus_refresh():
    address_map, channel = fresh()
    size = address_map.interleave
    end = 0.0
    for i in range(256):
        end = channel.access(i * size, size, "read", 0.0)
    bandwidth = 256 * size / end * 1e9
    peak = GPU.hbm.channel_bandwidth_bytes_per_s * GPU.hbm.lockstep_channels
    assert bandwidth == pytest.approx(peak * (1 - GPU.hbm.refresh_overhead), rel=0.03)


def test_row_hit_is_faster_than_row_miss():
    address_map, channel = fresh(LINEAR)
    channel.access(0, 64, "read", 0.0)
    hit = channel.access(64, 64, "read", 1000.0) - 1000.0
    _, channel = fresh(LINEAR)
    channel.access(0, 64, "read", 0.0)
    rows_apart = address_map.row_bytes * address_map.bank_groups * address_map.banks_per_group
    miss = channel.access(rows_apart, 64, "read", 1000.0) - 1000.0
    assert miss - hit == pytest.approx(channel.t_rp + channel.t_rcd, rel=0.01)


def test_one_bank_group_gets_ccd_s_over_ccd_l_of_the_bus():
    """Whole rows from banks of one group come t_ccd_l apart; from banks of alternating groups,
    t_ccd_s apart (the bus's rate): one group gets t_ccd_s / t_ccd_l of the bus."""
    ends = {}
    for name, groups_apart in (("one group", True), ("every group", False)):
        address_map, channel = fresh(LINEAR)
        stride = address_map.row_bytes * (address_map.bank_groups if groups_apart else 1)
        bursts = 0
        for i in range(64):
            ends[name] = channel.access(i * stride, address_map.row_bytes, "read", 0.0)
            bursts += address_map.row_bytes // channel.burst_bytes
    first_row = channel.t_rcd + channel.t_rp
    assert ends["one group"] == pytest.approx(bursts * channel.t_ccd_l, abs=first_row)
    assert ends["every group"] == pytest.approx(bursts * channel.t_ccd_s, abs=first_row)
    assert ends["every group"] / ends["one group"] == pytest.approx(channel.t_ccd_s / channel.t_ccd_l, rel=0.02)


def test_updates_to_one_group_are_slower_than_writes():
    address_map, channel = fresh(LINEAR)
    stride = address_map.row_bytes * address_map.bank_groups
    write_end = max(channel.access(i * stride, address_map.row_bytes, "write", 0.0) for i in range(16))
    _, channel = fresh(LINEAR)
    update_end = max(channel.access(i * stride, address_map.row_bytes, "update", 0.0) for i in range(16))
    assert update_end / write_end == pytest.approx(GPU.hbm.t_ccd_wl_cycles / GPU.hbm.t_ccd_l_cycles, rel=0.1)


def test_bank_xor_spreads_rows_a_bank_span_apart_over_banks():
    """Without hashing, pieces a multiple of the bank count apart share a bank; with the row bits
    folded into the bank index they do not, and every bank still holds one piece of each span."""
    groups, per_group = GPU.hbm.bank_groups, GPU.hbm.banks_per_group
    banks = groups * per_group
    pieces = [row * banks for row in (0, banks, 2 * banks, 3 * banks)]  # rows 0, 16, 32, 48 of 16 banks
    plain = {bank_of(piece, groups, per_group, False)[0] for piece in pieces}
    hashed = {bank_of(piece, groups, per_group, True)[0] for piece in pieces}
    assert len(plain) == 1 and len(hashed) == len(pieces)
    for row in range(40):
        slots = {bank_of(row * banks + i, groups, per_group, True)[0] for i in range(banks)}
        assert slots == set(range(banks))


def test_channel_timing_uses_the_hashed_bank():
    hashed = GPU.hbm.model_copy(update={"bank_xor": True})
    address_map = AddressMap(hashed, GPU.memctrl.max_request_bytes)
    channel = HbmChannel(hashed, address_map)
    span = address_map.row_bytes * GPU.hbm.banks_per_channel
    channel.access(0, 64, "read", 0.0)
    assert channel.row_is_open(0)
    assert address_map.bank_row(span)[0] != address_map.bank_row(0)[0]
    assert not channel.row_is_open(span)  # another bank, no row open there yet


def test_bank_xor_needs_a_power_of_two_bank_count():
    with pytest.raises(ValueError, match="bank_xor needs a power-of-two number of banks"):
        type(GPU.hbm)(**{**GPU.hbm.model_dump(), "bank_groups": 3, "bank_xor": True})


def test_pseudo_channels_open_rows_in_their_own_activate_windows():
    """A GEMM that reads its transposed weights in 64-byte runs opens a row for nearly every run: the
    activate windows bound it.  Two pseudo-channels per channel open rows twice as often, so the
    same activations take about half the time; a GEMM reading long runs does not notice."""
    import gpusim
    from gpusim import ops

    def run(pseudo_channels: int, trans_b: bool):
        system = gpusim.load_system("a100-sxm4", {"gpu.hbm.pseudo_channels": pseudo_channels,
                                                  "gpu.kernel_launch_ns": 0})
        result = gpusim.run(system, ops.Gemm(2, 10240, 2560, trans_b=trans_b))
        return result.time_s, result.counters["gpu0.dram_activations"]

    one, opened_one = run(1, True)
    two, opened_two = run(2, True)
    # the same rows, but for a few of A's 10 KiB, which stay open or not as the timing falls (4 of 825,777)
    assert opened_one == pytest.approx(opened_two, rel=1e-4)
    assert opened_two > 10 * 2560 * 10240 * 2 / 2048  # far more rows than 2 KiB rows of data
    assert two < 0.75 * one
    long_one, _ = run(1, False)
    long_two, _ = run(2, False)
    assert long_two == pytest.approx(long_one, rel=0.05)
