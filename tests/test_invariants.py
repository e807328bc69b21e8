"""System-level invariants: bytes conserved over links, no deadlock, determinism."""

from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.engine import Countdown, Simulation
from gpusim.hw.system import Machine

RING4 = gpusim.load_system("t3-ring8", {"num_gpus": 4})

FP16_BYTES = st.integers(1, 2**21).map(lambda elements: 2 * elements)
op_strategy = st.one_of(
    st.builds(ops.Gemm, st.integers(16, 768), st.integers(16, 768), st.integers(16, 768)),
    st.builds(ops.AllReduce, FP16_BYTES),
    st.builds(ops.ReduceScatter, FP16_BYTES),
    st.builds(ops.AllGather, FP16_BYTES),
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


DETERMINISM_PROGRAM = """
import sys
import gpusim
from gpusim import ops
system = gpusim.load_system("t3-ring8", {"num_gpus": 4})
program = [ops.Gemm(1024, 768, 512, out="x"), ops.Elementwise("gelu", 2**18), ops.AllReduce(1024 * 768 * 2, input="x")]
result = gpusim.run(system, program, streams=["a", "b", "a"], mode="full")
result.ops[["op_id", "gpu", "name", "start_s", "end_s"]].to_csv(sys.stdout, index=False, float_format="%.17g")
result.dram.to_csv(sys.stdout, index=False, float_format="%.17g")
"""


def test_the_same_inputs_give_identical_results_whatever_the_hash_seed():
    """Nothing in the simulation is random, and nothing may depend on the order of a set or of
    hashing: two processes with different hash seeds give the same ops and traffic to the bit."""
    import os
    import subprocess
    import sys

    outputs = []
    for hash_seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", DETERMINISM_PROGRAM], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed})
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") > 10


WHAT_IF = st.fixed_dictionaries({}, optional={
    "gpu.num_cus": st.integers(1, 512),
    "gpu.clock": st.sampled_from(["0.5 GHz", "2.5 GHz"]),
    "gpu.l2.capacity": st.sampled_from(["1 MiB", "256 MiB"]),
    "gpu.hbm.clock": st.sampled_from(["0.5 GHz", "4 GHz"]),
    "links.bandwidth": st.sampled_from(["1 GB/s", "900 GB/s"]),
    "links.latency": st.sampled_from(["0 ns", "10 us"]),
    "num_gpus": st.sampled_from([2, 3, 4]),
    "collectives.cus": st.integers(1, 128),
    "gpu.cu.max_inflight_bytes": st.sampled_from(["1 KiB", "1 MiB"]),
    "gpu.memctrl.policy": st.sampled_from(["fcfs", "round-robin", "t3-mca"]),
    "gpu.tracker.sets": st.sampled_from([1, 256]),
})


@settings(max_examples=8, deadline=None)
@given(WHAT_IF, st.sampled_from(["full", "symmetric"]))
def test_what_if_hardware_finishes_every_op(overrides, mode):
    """Whatever valid values a what-if gives the hardware, plain, fused and tracked ops all finish."""
    system = gpusim.load_system("t3-ring8", overrides)
    program = [ops.Gemm(512, 256, 384, out="y"), ops.AllReduce(512 * 256 * 2, input="y"),
               ops.Elementwise("gelu", 2**16), ops.GemmReduceScatter(768, 256, 384), ops.AllGatherGemm(768, 128, 256)]
    result = gpusim.run(system, program, mode=mode)
    assert len(result.ops) == (system.num_gpus if mode == "full" else 1) * len(program)
    assert (result.ops["end_s"] > result.ops["start_s"]).all()
