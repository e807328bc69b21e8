"""Near-bank ALUs: instruction set, functional semantics of the optimizer programs, command timing,
tiling by temporary storage, and their place in a simulation."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.config import load_gpu_config
from gpusim.hw.nmc import AluSchedule, Instruction, NearMemoryUnits, NmcProgram, interpret
from gpusim.kernels.optimizer import ALGORITHMS, LAMB_GRAD_NORM, LAMB_STAGE1, LAMB_STAGE2

T3 = load_gpu_config("t3-table8.1")
HYPER = {
    "lr": 1e-3,
    "beta1": 0.9,
    "beta2": 0.999,
    "beta3": 0.99,
    "eps": 1e-6,
    "weight_decay": 0.01,
    "momentum": 0.9,
    "dampening": 0.1,
}


def gpu_with(**nmc):
    return T3.model_copy(update={"nmc": T3.nmc.model_copy(update=nmc)})


# -- instruction set -------------------------------------------------------------------------------
def test_instructions_classify_their_accesses():
    assert Instruction.parse("mul r0 g #clip").access == "read"
    assert Instruction.parse("mov m r1").access == "write"
    assert Instruction.parse("fma p p #decay r1").access == "update"
    assert Instruction.parse("fma a0 r1 r1 a0").access == "alu"
    assert Instruction.parse("fma a0 r1 r1 a0").per_tile
    assert not Instruction.parse("mov partials a0").per_tile


@pytest.mark.parametrize(
    "text, message",
    [
        ("frobnicate r0 r1", "unknown operation"),
        ("add r0 r1", "takes a destination and 2"),
        ("add r0 x y", "reads 2 tensors"),
        ("add y x r0", "may only write back the tensor it reads"),
        ("mov #one r0", "destination cannot be an immediate"),
        ("mul a0 r0 a0", "accumulator is only updated"),
        ("add r0 r1 3x", "bad operand"),
    ],
)
def test_bad_instructions_are_rejected_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        NmcProgram.from_text("bad", [text])


def test_program_resources():
    assert (LAMB_STAGE1.registers, LAMB_STAGE1.accumulators) == (3, ("a0", "a1"))
    assert LAMB_STAGE1.tensors_read == ("g", "m", "v", "p")
    assert LAMB_STAGE1.tensors_written == ("m", "v", "u")
    assert [str(i) for i in LAMB_STAGE1.epilogue] == ["mov partials a0", "mov partials a1"]


# -- functional semantics against independent numpy formulas ---------------------------------
def arrays(names, n=1000, seed=0):
    rng = np.random.default_rng(seed)
    data = {name: rng.standard_normal(n).astype(np.float32) for name in names}
    for name in ("v", "n"):
        if name in data:
            data[name] = np.abs(data[name])
    return data


def run_program(algorithm, program, data, step=3, scalars=None):
    values = ALGORITHMS[algorithm].immediates(HYPER, step, scalars or {})
    return interpret(program, data, values)


def test_sgd_program_matches_pytorch_sgd():
    data = arrays(["p", "g", "buf"])
    p, g, buf = (data[k].astype(np.float64) for k in ("p", "g", "buf"))
    buf = HYPER["momentum"] * buf + (1 - HYPER["dampening"]) * g
    p = p - HYPER["lr"] * buf
    run_program("sgd", ALGORITHMS["sgd"].nmc["banks"].programs[0], data)
    np.testing.assert_allclose(data["buf"], buf, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data["p"], p, rtol=1e-5, atol=1e-6)


def test_adamw_program_matches_pytorch_adamw():
    step = 5
    data = arrays(["p", "g", "m", "v"])
    p, g, m, v = (data[k].astype(np.float64) for k in ("p", "g", "m", "v"))
    b1, b2, lr, eps, wd = HYPER["beta1"], HYPER["beta2"], HYPER["lr"], HYPER["eps"], HYPER["weight_decay"]
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2**step) + eps
    p = p - lr / (1 - b1**step) * m / denom
    run_program("adamw", ALGORITHMS["adamw"].nmc["banks"].programs[0], data, step)
    for name, expected in (("m", m), ("v", v), ("p", p)):
        np.testing.assert_allclose(data[name], expected, rtol=2e-5, atol=1e-6)


def test_lamb_programs_with_gpu_reductions_match_lamb():
    step, max_norm = 4, 1.0
    data = arrays(["p", "g", "m", "v", "u"])
    p, g, m, v = (data[k].astype(np.float64) for k in ("p", "g", "m", "v"))
    b1, b2, lr, eps, wd = HYPER["beta1"], HYPER["beta2"], HYPER["lr"], HYPER["eps"], HYPER["weight_decay"]
    clip = 1 / max(1.0, np.linalg.norm(g) / max_norm)
    g = g * clip
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps) + wd * p
    ratio = np.linalg.norm(p) / np.linalg.norm(u)
    p_new = p - lr * ratio * u

    (g_squares,) = run_program("lamb", LAMB_GRAD_NORM, data, step).values()  # partial sums, reduced
    scalars = {"clip": 1 / max(1.0, math.sqrt(g_squares) / max_norm)}
    totals = run_program("lamb", LAMB_STAGE1, data, step, scalars)
    scalars["ratio"] = math.sqrt(totals["a1"]) / math.sqrt(totals["a0"])
    run_program("lamb", LAMB_STAGE2, data, step, scalars)
    assert scalars["ratio"] == pytest.approx(ratio, rel=1e-5)
    np.testing.assert_allclose(data["m"], m, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(data["p"], p_new, rtol=2e-5, atol=1e-6)


def test_adan_program_matches_the_adan_reference_implementation():
    step = 3
    data = arrays(["p", "g", "m", "n", "d", "neg"])
    p, g, m, n, d, neg = (data[k].astype(np.float64) for k in ("p", "g", "m", "n", "d", "neg"))
    b1, b2, b3, lr, eps, wd = (HYPER[k] for k in ("beta1", "beta2", "beta3", "lr", "eps", "weight_decay"))
    # sail-sg/Adan _single_tensor_adan, no_prox=False, clip 1
    neg = neg + g
    m = b1 * m + (1 - b1) * g
    d = b2 * d + (1 - b2) * neg
    neg = b2 * neg + g
    n = b3 * n + (1 - b3) * neg * neg
    denom = np.sqrt(n) / math.sqrt(1 - b3**step) + eps
    p = p - lr / (1 - b1**step) * m / denom - lr * b2 / (1 - b2**step) * d / denom
    p = p / (1 + lr * wd)
    run_program("adan", ALGORITHMS["adan"].nmc["banks"].programs[0], data, step)
    for name, expected in (("m", m), ("d", d), ("n", n), ("p", p), ("neg", -g)):
        np.testing.assert_allclose(data[name], expected, rtol=2e-5, atol=1e-6)


# -- timing ------------------------------------------------------------------------------------------
COPY = NmcProgram.from_text("copy", ["mov r0 x", "mov y r0"])


def test_copy_schedule_by_hand():
    """Two row visits per tile of 8 columns; t3-table8.1 at 1 GHz: tRP = tRCD = 12, tRAS = 28,
    tWR = 16, tWTR = 3, tCCD_L = 2 cycles."""
    units = NearMemoryUnits(gpu_with(temp_storage_bytes=256))
    timing = units.broadcast(COPY, 64 * 32 * units.banks)
    assert (timing.columns_per_bank, timing.tile_columns, timing.tiles) == (64, 8, 8)
    # tile 0: activate x at 0, read 12..28; precharge x at 28 (tRAS), activate y at 40, write 52..68
    # tile 1: precharge y at 68 + tWR = 84, activate x at 96, read 108..124; y: 124, 136, 148..164
    first, period = 68, 164 - 68
    assert timing.duration_ns == pytest.approx((first + 7 * period) / (1 - T3.hbm.refresh_overhead))
    assert timing.activations_per_bank == 16
    assert timing.column_commands["read"] == timing.column_commands["write"] == 64
    assert timing.column_ns == pytest.approx(128 * 2 / (1 - T3.hbm.refresh_overhead))  # the rest: row switches


def test_op_and_store_costs_ccd_wl_per_column():
    units = NearMemoryUnits(T3)
    scale = NmcProgram.from_text("scale", ["mul x x #c"])
    update = units.broadcast(scale, 64 * 32 * units.banks)
    assert update.tile_columns == 64  # no registers: a tile is a whole row
    derate = 1 / (1 - T3.hbm.refresh_overhead)
    assert update.duration_ns == pytest.approx((12 + 64 * 4) * derate)


def test_divide_issue_cycles_slow_a_register_instruction_unless_row_switches_hide_them():
    slow = NearMemoryUnits(gpu_with(temp_storage_bytes=4096)).broadcast(LAMB_STAGE1, 2**24)
    fast_cycles = {**T3.nmc.op_cycles, "div": 1.0, "sqrt": 1.0}
    fast = NearMemoryUnits(gpu_with(temp_storage_bytes=4096, op_cycles=fast_cycles)).broadcast(LAMB_STAGE1, 2**24)
    extra = 2 * (8 - 2) * slow.columns_per_bank / (1 - T3.hbm.refresh_overhead)  # div and sqrt: 8 instead of 2 ns
    assert slow.duration_ns - fast.duration_ns == pytest.approx(extra, rel=0.05)
    # with 2-column tiles the ALU waits for row switches anyway
    small = [NearMemoryUnits(gpu_with(op_cycles=c)).broadcast(LAMB_STAGE1, 2**24) for c in (T3.nmc.op_cycles, fast_cycles)]
    assert small[0].tile_columns == 2
    assert small[0].duration_ns == pytest.approx(small[1].duration_ns, rel=0.01)


def explicit_duration(units, program, columns):
    """Every tile scheduled one by one (no steady-state shortcut)."""
    tile = units.tile_columns(program)
    schedule = AluSchedule(units.timing, units.column_ns, units.banks_per_alu)
    schedule.run(program.prologue, tile, -1)
    tiles = math.ceil(columns / tile)
    for index in range(tiles):
        schedule.run(program.body, min(tile, columns - index * tile), index)
    schedule.run(program.epilogue, tile, tiles)
    return schedule.counts.end_ns * units.timing.refresh_derate, schedule.counts.activations


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 600),
    st.sampled_from([LAMB_STAGE1, LAMB_STAGE2, COPY, ALGORITHMS["adan"].nmc["banks"].programs[0]]),
    st.sampled_from([(1, 256), (1, 1024), (2, 1024), (4, 4096)]),
)
def test_steady_state_shortcut_equals_tile_by_tile_schedule(columns, program, hardware):
    banks_per_alu, storage = hardware
    units = NearMemoryUnits(gpu_with(banks_per_alu=banks_per_alu, temp_storage_bytes=storage))
    timing = units.broadcast(program, columns * 32 * units.banks)
    duration, activations = explicit_duration(units, program, columns)
    assert timing.duration_ns == pytest.approx(duration, rel=1e-9)
    assert timing.activations_per_bank == activations // banks_per_alu


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5000), st.sampled_from([LAMB_STAGE1, ALGORITHMS["adamw"].nmc["banks"].programs[0]]))
def test_more_temporary_storage_is_never_slower_and_needs_fewer_activations(columns, program):
    nbytes = columns * 32 * 512
    previous = None
    for storage in (256, 512, 1024, 2048, 4096, 8192):
        timing = NearMemoryUnits(gpu_with(temp_storage_bytes=storage)).broadcast(program, nbytes)
        if previous is not None:
            assert timing.duration_ns <= previous.duration_ns * (1 + 1e-9)
            assert timing.activations_per_bank <= previous.activations_per_bank
        previous = timing


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([1, 2, 4]))
def test_duration_is_bounded_by_column_commands_and_row_cycles(columns, banks_per_alu):
    units = NearMemoryUnits(gpu_with(banks_per_alu=banks_per_alu, temp_storage_bytes=1024 * banks_per_alu))
    timing = units.broadcast(LAMB_STAGE1, columns * 32 * units.banks)
    commands = sum(timing.column_commands.values()) * banks_per_alu
    t = units.timing
    assert timing.duration_ns >= commands * t.t_ccd_l * t.refresh_derate
    # a row cycle never exceeds: wait for tRAS or the last column (+ tWR), precharge, activate
    worst_row = t.t_ras + t.t_wr + t.t_rp + t.t_rcd
    slowest_column = max(t.t_ccd_wl, max(units.column_ns.values()))
    bound = (commands * slowest_column + timing.activations_per_bank * banks_per_alu * worst_row) * t.refresh_derate
    assert timing.duration_ns <= bound


def test_sharing_an_alu_between_banks_is_slower_but_hides_row_switches():
    per_bank = NearMemoryUnits(gpu_with(temp_storage_bytes=1024)).broadcast(LAMB_STAGE1, 2**26)
    shared = NearMemoryUnits(gpu_with(banks_per_alu=4, temp_storage_bytes=4096)).broadcast(LAMB_STAGE1, 2**26)
    assert 2 * per_bank.duration_ns < shared.duration_ns < 4 * per_bank.duration_ns


def test_too_little_storage_or_a_missing_operation_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="temp_storage_bytes must be at least 160 B"):
        NearMemoryUnits(gpu_with(temp_storage_bytes=128)).broadcast(LAMB_STAGE1, 2**20)
    with pytest.raises(ValueError, match="op_cycles .* does not list"):
        NearMemoryUnits(gpu_with(op_cycles={"mov": 1.0, "fma": 1.0})).broadcast(LAMB_STAGE1, 2**20)
    with pytest.raises(ValueError, match="banks_per_alu"):
        NearMemoryUnits(gpu_with(banks_per_alu=3))
    with pytest.raises(ValueError, match="nmc.enabled"):
        NearMemoryUnits(gpu_with(enabled=False))


def test_small_tensors_still_take_a_column_in_every_bank():
    units = NearMemoryUnits(T3)
    tiny, one_column = units.broadcast(LAMB_STAGE1, 4 * 768), units.broadcast(LAMB_STAGE1, 32 * units.banks)
    assert tiny.duration_ns == one_column.duration_ns


# -- in a simulation -------------------------------------------------------------------------
SYSTEM = gpusim.load_system("t3-table8.1")


def test_lamb_on_nmc_moves_only_partial_sums_and_shows_its_synchronizations():
    sizes = [1024 * 1024, 4096, 1024 * 1024]
    result = gpusim.run(SYSTEM, ops.Optimizer("lamb", sizes, impl="nmc"))
    spans = [span for span in result.spans if span.category in ("nmc", "sync")]
    names = [span.name for span in spans]
    assert names == [f"lamb_grad_norm[{i}]" for i in range(3)] + ["lamb_grad_norm sync"] + [
        f"lamb_stage1[{i}]" for i in range(3)
    ] + ["lamb_stage1 sync"] + [f"lamb_stage2[{i}]" for i in range(3)]
    assert all(a.end_ns <= b.start_ns + 1e-6 for a, b in zip(spans, spans[1:]))
    moved = result.dram.bytes.sum()
    units = NearMemoryUnits(SYSTEM.gpu)
    partials = 3 * units.alus * 32 * len(sizes)  # three norms, a column per ALU and tensor
    assert moved == pytest.approx(partials, rel=0.01)
    inside = result.counters
    assert inside["gpu0.nmc_bytes_read"] >= 6 * 4 * sum(sizes)  # g twice, m, v, p, u
    assert inside["gpu0.nmc_bytes_write"] >= 3 * 4 * sum(sizes)  # m, v, u
    assert inside["gpu0.nmc_bytes_update"] >= 4 * sum(sizes)  # p
    assert inside["gpu0.nmc_activations"] > 0


def test_ordinary_traffic_waits_while_the_banks_run_near_memory_commands():
    sizes = [8 * 1024 * 1024]
    result = gpusim.run(
        SYSTEM,
        [ops.Optimizer("sgd", sizes, impl="nmc"), ops.Elementwise("copy", 4 * 1024 * 1024, dtype="fp32")],
        streams=["opt", "other"],
    )
    nmc = [span for span in result.spans if span.category == "nmc"][0]
    dram = result.dram
    ordinary = dram[(dram.stream == "compute") & (dram.t_s * 1e9 > nmc.start_ns + 5000) & (dram.t_s * 1e9 + 5000 < nmc.end_ns)]
    assert nmc.end_ns - nmc.start_ns > 20000
    assert ordinary.bytes.sum() == 0
    copy = result.ops[result.ops.kind == "elementwise"].iloc[0]
    assert copy.end_s * 1e9 > nmc.end_ns  # the copy could not finish during the broadcast


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_host_supplies_every_immediate_of_every_program(name):
    algorithm = ALGORITHMS[name]
    values = algorithm.immediates(HYPER, 2, {"clip": 0.5, "ratio": 2.0})
    for plan in algorithm.nmc.values():
        for program in plan.programs:
            assert set(program.immediates) <= set(values), program.name
