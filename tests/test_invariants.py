"""System-level invariants: bytes conserved over links, no deadlock, determinism."""

from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.engine import Countdown, Simulation
from gpusim.hw.system import Machine

RING4 = gpusim.load_system("t3-ring8", {"num_gpus": 4})

op_strategy = st.one_of(
    st.builds(ops.Gemm, st.integers(16, 768), st.integers(16, 768), st.integers(16, 768)),
    st.builds(ops.AllReduce, st.integers(1, 2**22)),
    st.builds(ops.ReduceScatter, st.integers(1, 2**22)),
    st.builds(ops.AllGather, st.integers(1, 2**22)),
    st.builds(ops.Elementwise, st.sampled_from(["add", "gelu", "copy"]), st.integers(1, 2**20)),
)


@settings(max_examples=10, deadline=None)
@given(st.lists(op_strategy, min_size=1, max_size=4), st.lists(st.sampled_from(["a", "b"]), min_size=4, max_size=4))
def test_random_programs_finish_without_deadlock(program, streams):
    result = gpusim.run(RING4, program, streams=streams[: len(program)], mode="full")
    assert len(result.ops) == 4 * len(program)
    assert (result.ops["end_s"] >= result.ops["start_s"]).all()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(1, 300_000), st.integers(0, 100_000)),
                min_size=1, max_size=12))
def test_bytes_sent_over_links_arrive_in_memory(transfers):
    sim = Simulation()
    machine = Machine(sim, RING4.config, mode="full")
    delivered = []

    def sender(src, hop, nbytes, addr):
        dst = (src + hop) % 4
        done = Countdown(lambda t: None)
        yield from machine.interconnect.transfer(src, dst, addr, nbytes, "write", done)
        done.close(sim.now)
        delivered.append(nbytes)

    for src, hop, nbytes, addr in transfers:
        sim.process(sender(src, hop, nbytes, addr))
    sim.run()
    assert sum(delivered) == sum(n for _, _, n, _ in transfers)
    written = sum(ch.stats.bytes_written for gpu in machine.gpus.values() for ch in gpu.channels)
    assert written == sum(n for _, _, n, _ in transfers)


def test_same_inputs_and_seed_give_identical_results():
    program = [ops.Gemm(1024, 768, 512, out="x"), ops.AllReduce(1024 * 768 * 2, input="x")]
    first = gpusim.run(RING4, program, mode="full", seed=3)
    second = gpusim.run(RING4, program, mode="full", seed=3)
    assert first.ops[["start_s", "end_s"]].equals(second.ops[["start_s", "end_s"]])
    assert first.dram.equals(second.dram)
