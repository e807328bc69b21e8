"""Element-wise and row-reduction kernels on the mi210 preset against LLMCompass's measurements."""

from __future__ import annotations

import pytest

import gpusim
from gpusim import ops, validation

LAYERNORM_GAP = pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/validation.md): the measured torch.compile layernorm costs 34-55 us even on "
    "256 KiB inputs, 13-34 us more than GeLU and softmax calls of the same size; no hardware mechanism "
    "explains it, so the eleven smallest shapes stay 16-56% too fast and the median misses 20%",
)


@pytest.mark.parametrize("name", ["gelu-mi210", "softmax-mi210", pytest.param("layernorm-mi210", marks=LAYERNORM_GAP)])
def test_mi210_streaming_kernels_within_tolerance(name):
    dataset = validation.get(name)
    frame = validation.compare(dataset, workers=1, progress=False)
    stats = validation.error_stats(frame)
    assert not validation.violations(frame, dataset), stats


def test_short_rows_stay_in_the_l2_between_passes():
    """Softmax over 4096-element rows re-reads them from the L2; over 32768-element rows the rows
    of the resident workgroups no longer fit and the re-reads go to DRAM (measured: 1.5 vs 2.2 ms)."""
    system = gpusim.load_system("mi210")
    short = gpusim.run(system, ops.RowReduce("softmax", 32768, 4096))
    long = gpusim.run(system, ops.RowReduce("softmax", 4096, 32768))
    short_reads = short.dram_totals().query("direction == 'read'")["bytes"].sum()
    long_reads = long.dram_totals().query("direction == 'read'")["bytes"].sum()
    assert long_reads > 1.5 * short_reads
    assert long.time_s > 1.15 * short.time_s


def test_streaming_bandwidth_follows_memory_level_parallelism():
    system = gpusim.load_system("mi210")
    op = ops.Elementwise("gelu", 2**22, "fp16")
    narrow = gpusim.run(system, op).time_s
    wide = gpusim.run(system.with_overrides({"gpu.streaming_inflight_bytes_per_thread": 16}), op).time_s
    assert wide < 0.8 * narrow
