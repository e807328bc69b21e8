"""Packets and end-to-end flow control on the links between GPUs."""

import pytest

import gpusim
from gpusim.engine import Countdown, Simulation
from gpusim.hw.system import Machine


def _machine(overrides=None):
    system = gpusim.load_system("t3-ring8", {"num_gpus": 4, **(overrides or {})})
    sim = Simulation()
    return sim, Machine(sim, system.config, mode="full")


def test_packets_are_cut_at_multiples_of_the_packet_size():
    # A packet that straddled a packet boundary would straddle one more memory channel stripe
    # than it needs to, and cost the destination an extra DRAM request.
    sim, machine = _machine()
    packet = machine.interconnect.packet_bytes
    arrived = []
    memory = machine.gpus[1].memory
    accept = memory.accept_remote

    def logging_accept(addr, nbytes, kind, admission):
        arrived.append((addr, nbytes))
        accept(addr, nbytes, kind, admission)

    memory.accept_remote = logging_accept
    start, nbytes = packet // 3, 5 * packet
    sim.process(machine.interconnect.transfer(0, 1, start, nbytes, "write"))
    sim.run()
    assert arrived[0] == (start, packet - start)
    assert all(addr % packet == 0 and size == packet for addr, size in arrived[1:-1])
    assert sum(size for _, size in arrived) == nbytes
    assert len(arrived) == 6


def _delivery_time_ns(credit_bytes: str, latency: str) -> float:
    sim, machine = _machine({"links.packet_bytes": "64 KiB", "links.credit_bytes": credit_bytes, "links.latency_ns": latency})
    finished = []
    done = Countdown(finished.append)

    def sender():
        yield from machine.interconnect.transfer(0, 1, 0, 16 * machine.interconnect.packet_bytes, "write", done)
        done.close(sim.now)

    sim.process(sender())
    sim.run()
    return finished[0]


def test_a_window_of_one_packet_pays_the_round_trip_per_packet():
    # 16 packets of 64 KiB over a 75 GB/s link with 20 us of flight: with a window of one packet
    # each packet waits for the previous one's credit (about 20.9 us per packet); with room for
    # all of them the link streams (16 x 0.87 us + 20 us).
    one = _delivery_time_ns("64 KiB", "20 us")
    wide = _delivery_time_ns("4 MiB", "20 us")
    assert wide == pytest.approx(16 * 65536 / 75 + 20_000, rel=0.05)
    assert one == pytest.approx(16 * (65536 / 75 + 20_000), rel=0.05)
