"""The H100 measurements (validation/measured/h100) as a held-out check: nothing in the h100-sxm5
preset was fitted on them (its L2's shared fraction was read off the working-set sweep of both
Hopper GPUs, test_calibration_l2.py)."""

import pytest

from gpusim import validation


def compare_sample(name: str, points: int):
    dataset = validation.get(name)
    frame = validation.compare(dataset, validation.sample(dataset.load(), points, seed=2), workers=1, progress=False)
    return dataset, frame


@pytest.mark.parametrize(("name", "points"), [("gemm-h100", 30), ("gemm-h100-unaligned", 10),
                                              ("elementwise-h100", 30), ("rowreduce-h100", 16)])
def test_h100_kernels_within_tolerance(name, points):
    dataset, frame = compare_sample(name, points)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


def test_h100_data_sets_are_the_h200_ones_on_the_h100_preset():
    for kind in ("gemm", "gemm-{}-unaligned", "concurrency", "elementwise", "rowreduce", "l2", "l2-rowsum"):
        h100 = validation.get(kind.format("h100") if "{}" in kind else f"{kind}-h100")
        h200 = validation.get(kind.format("h200") if "{}" in kind else f"{kind}-h200")
        assert (h100.system, h200.system) == ("h100-sxm5", "h200-sxm")
        assert len(h100.load()) == len(h200.load())


@pytest.mark.xfail(strict=True, reason="known gap (docs/validation.md, the H100 section): the H100 machine's host is "
                   "slower, and eight calls on eight streams outlast the L2 flush they queue behind (1024^3 x 8: "
                   "174 us against 84 us on the H200's machine); the model charges no host time in this data set")
def test_h100_concurrency_data_set_within_tolerance():
    dataset = validation.get("concurrency-h100")
    rows = dataset.load().query("count == 8 and m * n * k <= 4096 * 4096 * 512")
    frame = validation.compare(dataset, rows, workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)
