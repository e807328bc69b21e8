"""GEMM calibration: the presets against measured GEMMs (representative subsets; the full sets run
in ``gpusim validate`` and validation/calibration/), and the mechanisms the calibration rests on."""

from __future__ import annotations

import pandas as pd
import pytest

import gpusim
from gpusim import ops, validation


def compare_subset(name: str, query: str, extra: int = 0, extra_query: str | None = None):
    dataset = validation.get(name)
    rows = dataset.load()
    chosen = rows.query(query)
    if extra:
        chosen = pd.concat([chosen, validation.sample(rows.query(extra_query), extra, seed=1)])
    return dataset, validation.compare(dataset, chosen, workers=1, progress=False)


def test_v100_deepbench_gemms_within_tolerance():
    # every DeepBench GEMM up to 10 GFLOP (84 of 160) and six larger ones drawn at random; the
    # p90 passes narrowly (34.8% on the 84 against 35%) since split-K reductions wait the V100's
    # 0.8 us dependent-kernel gap rather than its 6 us per-call launch (docs/validation.md)
    dataset, frame = compare_subset("gemm-v100-deepbench", "2*m*n*k <= 1e10", 6, "1e10 < 2*m*n*k <= 4e11")
    stats = validation.error_stats(frame)
    assert not validation.violations(frame, dataset), stats


def test_mi210_gemms_within_tolerance():
    # the 17 LLMCompass GEMMs up to 2 TFLOP (the five largest are compute-bound like 8192^3)
    dataset, frame = compare_subset("gemm-mi210", "2*m*n*k <= 2e12")
    stats = validation.error_stats(frame)
    assert not validation.violations(frame, dataset), stats


def test_large_v100_gemm_sustains_the_calibrated_fraction_of_peak():
    system = gpusim.load_system("v100-sxm2")
    row = gpusim.run(system, ops.Gemm(8192, 8192, 4096)).ops.iloc[0]
    achieved = row.flops / row.duration_s
    peak = system.gpu.matrix_flops_per_s("fp16")
    assert 0.8 * system.gpu.gemm_efficiency["fp16"] * peak < achieved <= system.gpu.gemm_efficiency["fp16"] * peak


@pytest.mark.parametrize("n", [16, 128])
def test_strided_panels_pay_row_activations(n):
    """A row-major A ([m, k], K contiguous) is loaded in 64-byte runs that each open a DRAM row;
    transposed (M contiguous) it streams.  DeepBench measures the cuBLAS twins 1.5-2x apart (1.76x at
    n = 128); the model gives 1.27x there, since its streaming twin is bound by the L2's sustained
    bandwidth (within 1% of its measured time) while the strided one stays 28% too fast."""
    system = gpusim.load_system("v100-sxm2")
    short_runs = gpusim.run(system, ops.Gemm(7680, n, 2560, trans_a=False)).time_s
    long_runs = gpusim.run(system, ops.Gemm(7680, n, 2560, trans_a=True)).time_s
    assert 1.2 < short_runs / long_runs < 2.5
    unlimited = system.with_overrides({"gpu.hbm.t_faw_cycles": 0, "gpu.hbm.t_rrd_cycles": 0})
    assert gpusim.run(unlimited, ops.Gemm(7680, n, 2560, trans_a=False)).time_s == pytest.approx(long_runs, rel=0.1)


def test_grouped_rasterization_keeps_shared_panels_in_the_l2():
    """512 x 24000: four M-tiles share each B panel; dispatched together they read B once."""
    system = gpusim.load_system("v100-sxm2")
    result = gpusim.run(system, ops.Gemm(512, 24000, 2048, trans_a=True, trans_b=True))
    read = result.dram_totals().query("direction == 'read'")["bytes"].sum()
    b_bytes = 24000 * 2048 * 2
    assert read < 1.5 * b_bytes
