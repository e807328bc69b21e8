"""HBM timing: address mapping, row buffers, bank groups, op-and-store."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.config import load_gpu_config
from gpusim.hw.hbm import AddressMap, HbmChannel

GPU = load_gpu_config("t3-table8.1")


def fresh():
    address_map = AddressMap(GPU.hbm, GPU.memctrl.max_request_bytes)
    return address_map, HbmChannel(GPU.hbm, address_map)


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
    address_map, channel = fresh()
    channel.access(0, 64, "read", 0.0)
    hit = channel.access(64, 64, "read", 1000.0) - 1000.0
    _, channel = fresh()
    channel.access(0, 64, "read", 0.0)
    rows_apart = address_map.row_bytes * address_map.bank_groups * address_map.banks_per_group
    miss = channel.access(rows_apart, 64, "read", 1000.0) - 1000.0
    assert miss - hit == pytest.approx(channel.t_rp + channel.t_rcd, rel=0.01)


def test_one_bank_group_gets_ccd_s_over_ccd_l_of_the_bus():
    address_map, channel = fresh()
    stride = address_map.row_bytes * address_map.bank_groups  # same group, next bank
    bursts = 0
    end = 0.0
    for i in range(64):
        end = channel.access(i * stride, address_map.row_bytes, "read", 0.0)
        bursts += address_map.row_bytes // channel.burst_bytes
    assert end >= bursts * channel.t_ccd_l


def test_updates_to_one_group_are_slower_than_writes():
    address_map, channel = fresh()
    stride = address_map.row_bytes * address_map.bank_groups
    write_end = max(channel.access(i * stride, address_map.row_bytes, "write", 0.0) for i in range(16))
    _, channel = fresh()
    update_end = max(channel.access(i * stride, address_map.row_bytes, "update", 0.0) for i in range(16))
    assert update_end / write_end == pytest.approx(GPU.hbm.t_ccd_wl_cycles / GPU.hbm.t_ccd_l_cycles, rel=0.1)
