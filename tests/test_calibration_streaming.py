"""Element-wise and row-reduction kernels on the mi210 preset against LLMCompass's measurements."""

from __future__ import annotations

import pytest

import gpusim
from gpusim import ops, validation

LAYERNORM_GAP = pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/validation.md): PyTorch 2.0's Inductor kernels (three walks, two sums), which fit "
    "LLMCompass's A100 layernorm (6.2%), leave the MI210's too fast: the persistent shapes (4096 x 32-1024) by "
    "32-52%, m x 4096 by 13-43%; the median (27.0%) misses 20%",
)


@pytest.mark.parametrize("name", ["gelu-mi210", "softmax-mi210", pytest.param("layernorm-mi210", marks=LAYERNORM_GAP)])
def test_mi210_streaming_kernels_within_tolerance(name):
    dataset = validation.get(name)
    frame = validation.compare(dataset, workers=1, progress=False)
    stats = validation.error_stats(frame)
    assert not validation.violations(frame, dataset), stats


def test_long_rows_reread_from_dram_short_rows_from_the_l2():
    """PyTorch 2.0's softmax re-reads every row in each of its three passes: 2048-element rows
    from the L2, where they still are; the 32768-element rows of the resident workgroups (13 MiB)
    no longer fit in the 8 MiB L2 and the re-reads go to DRAM."""
    system = gpusim.load_system("mi210")
    short = gpusim.run(system, ops.RowReduce("softmax", 1024, 2048, library="pytorch-2.0"))
    long = gpusim.run(system, ops.RowReduce("softmax", 1024, 32768, library="pytorch-2.0"))
    short_reads = short.dram_totals().query("direction == 'read'")["bytes"].sum()
    long_reads = long.dram_totals().query("direction == 'read'")["bytes"].sum()
    assert short_reads <= 1.1 * 1024 * 2048 * 2
    assert long_reads >= 2.9 * 1024 * 32768 * 2


@pytest.mark.xfail(strict=True, reason=(
    "known gap (docs/validation-log.md, stop 28): with the L2's shared fraction of 0.7 (fitted on this softmax) "
    "both shapes re-read their rows from the HBM and take 1.56 ms; the long rows' extra cost grows with the "
    "row (4096 x 8192 -14%, x 16384 -22%, x 32768 -28%) and is not in the model (1.15x before stop 28)"))
def test_long_row_softmax_is_slower_than_short_row_softmax_of_the_same_size():
    """LLMCompass's MI210: 1.52 ms for 32768 rows of 4096 against 2.18 ms for 4096 rows of 32768
    (1.43x). PyTorch 2.0's kernel reads a row three times, from the L2 or the HBM."""
    system = gpusim.load_system("mi210")
    short = gpusim.run(system, ops.RowReduce("softmax", 32768, 4096, library="pytorch-2.0"))
    long = gpusim.run(system, ops.RowReduce("softmax", 4096, 32768, library="pytorch-2.0"))
    assert long.time_s > 1.15 * short.time_s


def test_streaming_bandwidth_follows_memory_level_parallelism():
    """A 2 MiB GeLU is latency-bound: more bytes in flight per thread make it faster (without the
    per-call floor); a 32 MiB GeLU is bound by sustained HBM bandwidth whatever the parallelism."""
    system = gpusim.load_system("mi210").with_overrides({"gpu.kernel_launch_ns": 0})
    narrow_system = system.with_overrides({"gpu.streaming_inflight_bytes_per_thread": 1})
    wide_system = system.with_overrides({"gpu.streaming_inflight_bytes_per_thread": 16})
    small = ops.Elementwise("gelu", 2**20, "fp16")
    assert gpusim.run(wide_system, small).time_s < 0.5 * gpusim.run(narrow_system, small).time_s
    large = ops.Elementwise("gelu", 2**24, "fp16")
    narrow, wide = gpusim.run(narrow_system, large).time_s, gpusim.run(wide_system, large).time_s
    assert wide > 0.6 * narrow


def test_h200_elementwise_kernels_within_tolerance():
    # 40 of the 161 element-wise rows drawn at random (the whole set: gpusim validate)
    dataset = validation.get("elementwise-h200")
    frame = validation.compare(dataset, validation.sample(dataset.load(), 40, seed=1), workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


def test_h200_row_reductions_within_tolerance():
    dataset = validation.get("rowreduce-h200")
    frame = validation.compare(dataset, validation.sample(dataset.load(), 16, seed=1), workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_hopper_row_reduction_kernels_within_tolerance(gpu):
    # 24 of the grid's 118 kernel durations drawn at random (the whole set: gpusim validate)
    dataset = validation.get(f"rowreduce-grid-{gpu}")
    frame = validation.compare(dataset, validation.sample(dataset.load(), 24, seed=1), workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)
