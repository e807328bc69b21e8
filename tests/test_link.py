"""Packets, link schedules and end-to-end flow control on the links between GPUs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.engine import Countdown, Simulation
from gpusim.engine.primitives import CalendarPipe
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

    def logging_accept(addr, nbytes, kind, admission, cached=True):
        arrived.append((addr, nbytes))
        accept(addr, nbytes, kind, admission, cached)

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
    # each packet waits for the previous one's credit, which comes back over the link (about
    # 40.9 us per packet, the last one's credit not waited for); with room for all of them the link
    # streams (16 x 0.87 us + 20 us).
    one = _delivery_time_ns("64 KiB", "20 us")
    wide = _delivery_time_ns("4 MiB", "20 us")
    assert wide == pytest.approx(16 * 65536 / 75 + 20_000, rel=0.05)
    assert one == pytest.approx(16 * (65536 / 75 + 2 * 20_000) - 20_000, rel=0.02)


def test_a_link_serves_a_packet_that_arrives_first_even_if_it_was_booked_last():
    # A packet booked for the second hop of its route at t = 10 must not hold up one that reaches
    # the link at t = 1 and fits in the idle time before it.
    link = CalendarPipe(1.0)  # 1 ns per byte
    assert link.reserve(10.0, 5, horizon=0.0) == 10.0
    assert link.reserve(1.0, 4, horizon=0.0) == 1.0  # fits in [1, 5)
    assert link.reserve(2.0, 8, horizon=0.0) == 15.0  # does not fit before 10: after the busy stretch
    assert link.reserve(5.0, 5, horizon=0.0) == 5.0  # exactly fills [5, 10)
    assert (link.starts, link.ends) == ([1.0], [23.0])  # one busy stretch, merged
    assert link.reserve(30.0, 1, horizon=25.0) == 30.0 and link.starts == [30.0]  # the past is forgotten


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(1, 50)), min_size=1, max_size=60))
def test_bookings_never_overlap_and_never_start_before_they_arrive(bookings):
    link = CalendarPipe(0.5)
    served = []
    for arrival, units in bookings:
        start = link.reserve(arrival, units, horizon=0.0)
        assert start >= arrival
        served.append((start, start + units * 0.5))
    served.sort()
    assert all(end <= next_start + 1e-9 for (_, end), (next_start, _) in zip(served, served[1:]))
    # with nothing forgotten (horizon 0), the busy intervals add up to every booking's work
    assert sum(e - s for s, e in zip(link.starts, link.ends)) == pytest.approx(sum(units for _, units in bookings) * 0.5)


def test_multi_hop_routes_keep_the_links_busy():
    # An all-to-all over a ring of 8 routes most chunks over several links: 4 MiB load every link
    # direction with 4 MiB / 8 x 8 = 4 MiB, 56 us at 75 GB/s.  Links that started a packet only after
    # the last one booked (even one booked for later) idled between them: 185 us, and symmetric mode,
    # whose bookings come in another order, 132 us.
    system = gpusim.load_system("t3-ring8")
    bound = 4 * 2**20 / system.config.links.bandwidth_bytes_per_s
    full = gpusim.run(system, ops.AllToAll(4 * 2**20), mode="full").time_s
    with pytest.warns(gpusim.SymmetricModeWarning):  # close here, but only approximate in general
        symmetric = gpusim.run(system, ops.AllToAll(4 * 2**20), mode="symmetric").time_s
    assert bound < full < 2 * bound
    assert symmetric == pytest.approx(full, rel=0.03)
