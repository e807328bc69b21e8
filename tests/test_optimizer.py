"""Optimizer steps as GPU kernels: multi_tensor_apply grouping, kernel counts, implementations, bad input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.kernels.optimizer import (
    ALGORITHMS,
    CHUNK_ELEMENTS,
    MAX_BLOCKS,
    MAX_TENSORS,
    count_kernels,
    multi_tensor_launches,
)
from gpusim.studies.nmc_optimizer import model_parameter_sizes

T3 = gpusim.load_system("t3-table8.1")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5 * CHUNK_ELEMENTS), min_size=1, max_size=300), st.integers(1, 6))
def test_launches_cover_every_chunk_once_within_the_launch_limits(sizes, depth):
    launches = multi_tensor_launches(sizes, depth)
    blocks = [block for launch in launches for block in launch]
    expected = [(t, c) for t, size in enumerate(sizes) for c in range(-(-size // CHUNK_ELEMENTS))]
    assert blocks == expected
    for launch in launches:
        assert 0 < len(launch) <= MAX_BLOCKS
        assert len({t for t, _ in launch}) <= MAX_TENSORS[depth - 1]


def test_kernel_counts_of_adan_on_bert_base_match_seed_table_4_4():
    """Seed 000, Table 4.4: computation kernels of one Adan step on BERT-base fine-tuning (201 tensors)."""
    sizes = model_parameter_sizes("bert-base-classifier")
    assert (len(sizes), sum(sizes)) == (201, 109_483_778)
    counts = {impl: count_kernels("adan", sizes, impl) for impl in ("unfused", "fused", "multi_unfused", "multi_fused")}
    assert counts == {"unfused": 3618, "fused": 603, "multi_unfused": 108, "multi_fused": 22}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("impl", ops.OPTIMIZER_IMPLS)
def test_every_implementation_runs_and_launches_the_counted_kernels(algorithm, impl):
    sizes = [140_000, 1000, 70_000, 5]
    result = gpusim.run(T3, ops.Optimizer(algorithm, sizes, impl=impl))
    row = result.ops.iloc[0]
    assert row["kernels"] == count_kernels(algorithm, sizes, impl)
    assert len(result.kernels) == row["kernels"]
    assert row["duration_s"] > 0


def test_fused_traffic_is_the_minimum_and_unfused_moves_more():
    system = T3.with_overrides({"gpu.l2.capacity_bytes": 2**20})
    sizes = [512 * 1024] * 2  # 4 MiB per array: far larger than this L2
    traffic = {}
    for impl in ("multi_fused", "multi_unfused"):
        result = gpusim.run(system, ops.Optimizer("adamw", sizes, impl=impl))
        traffic[impl] = result.dram.bytes.sum()
    minimum = ALGORITHMS["adamw"].min_bytes_per_element(4) * sum(sizes)
    assert traffic["multi_fused"] == pytest.approx(minimum, rel=0.05)
    assert traffic["multi_unfused"] > 2 * minimum


def test_launch_overhead_and_small_kernels_make_per_tensor_steps_slow():
    sizes = [768] * 60 + [256 * 256] * 6  # many biases, some matrices
    times = {impl: gpusim.run(T3, ops.Optimizer("adam", sizes, impl=impl)).time_s for impl in ops.OPTIMIZER_IMPLS}
    assert times["multi_fused"] < times["multi_unfused"] < times["unfused"]
    assert times["multi_fused"] < times["fused"] < times["unfused"]
    launch = T3.gpu.kernel_launch_ns * 1e-9
    assert times["unfused"] > count_kernels("adam", sizes, "unfused") * launch


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"algorithm": "adagrad", "sizes": [4]}, "'algorithm' must be one of"),
        ({"algorithm": "adam", "sizes": []}, "'sizes' must be a non-empty list"),
        ({"algorithm": "adam", "sizes": [4, 0]}, "'sizes' must be a positive integer"),
        ({"algorithm": "adam", "sizes": [4], "impl": "triton"}, "'impl' must be one of"),
        ({"algorithm": "lamb", "sizes": [4], "grad_norm": "cpu"}, "'grad_norm' must be 'banks' or 'gpu'"),
        ({"algorithm": "adam", "sizes": [4], "dtype": "fp12"}, "'dtype' must be one of"),
    ],
)
def test_bad_optimizer_fields_are_rejected(fields, message):
    with pytest.raises(gpusim.OpError, match=message):
        ops.Optimizer(**fields)


def test_nmc_needs_near_memory_hardware():
    system = T3.with_overrides({"gpu.nmc.enabled": False})
    with pytest.raises(gpusim.OpError, match="adam.*impl='nmc' cannot run on .*nmc.enabled"):
        gpusim.run(system, ops.Optimizer("adam", [1024], impl="nmc"))
    with pytest.raises(gpusim.OpError, match="impl='nmc' cannot run on h100-sxm5: .*temp_storage_bytes must be at least"):
        gpusim.run("h100-sxm5", ops.Optimizer("lamb", [4096], impl="nmc"))  # 64-byte columns: 256 B hold too few


def test_parameter_lists_match_published_counts():
    sizes = {name: model_parameter_sizes(name) for name in ("bert-large", "llama2-7b", "gpt3")}
    assert sum(sizes["llama2-7b"]) == 6_738_415_616  # Hugging Face LlamaForCausalLM, Llama-2-7b
    assert sum(sizes["bert-large"]) == pytest.approx(336e6, rel=0.01)  # BertForPreTraining, ~340M
    assert sum(sizes["gpt3"]) == pytest.approx(175e9, rel=0.01)
    assert len(sizes["bert-large"]) == 5 + 24 * 16 + 2 + 7


@pytest.mark.parametrize("impl", ["multi_fused", "unfused", "nmc"])
def test_a_tensor_larger_than_memory_fails_at_once_naming_it(impl):
    """A tensor list's launches were planned over every 64 Ki-element chunk first: 2**34 of them for
    2**50 values (a list that would not fit in memory) before the buffer's allocation could refuse it."""
    too_large = ops.Optimizer("adam", (1000, 2**50), impl=impl)
    with pytest.raises(gpusim.OpError, match=r"^buffer 'optimizer\.p1': 4,503,599,627,370,496 bytes do not fit in "
                                             r"t3-table8\.1's 32 GiB of memory \(gpu\.hbm\.capacity_bytes\)$"):
        gpusim.run("t3-table8.1", too_large)
