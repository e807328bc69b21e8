"""The L2's capacity for a working set every SM touches, against the sweep of
validation/measured/h{1,2}00/l2.csv (an fp32 buffer scaled in place, call after call), and what the
cold method's L2 flush leaves in it for the call after."""

import pytest

import gpusim
from gpusim import validation

MIB = 2**20


def compare_rows(name: str, query: str | None = None, **names: int):
    """The data set ``name`` and its comparison with the model, on the rows ``query`` selects (all by
    default; ``@MIB`` and ``names`` may appear in it)."""
    dataset = validation.get(name)
    rows = dataset.load().query(query, local_dict={"MIB": MIB, **names}) if query else None
    return dataset, validation.compare(dataset, rows, workers=1, progress=False)


def per_call_s(system: str, nbytes: int, **overrides) -> float:
    hardware = gpusim.load_system(system, {"gpu.kernel_launch_ns": 0.0, **overrides})
    return validation.simulate_reuse(hardware, "read_write_inplace", nbytes)["simulated_s"]


def test_a_buffer_that_fits_the_shared_fraction_is_served_by_the_l2():
    """40 MiB fits 0.7 of the H200's 60 MiB and is read and written at the L2's rate; the whole
    60 MiB holds 48 MiB, 0.7 of it does not (the HBM's rate)."""
    fits = 2 * 40 * MIB / per_call_s("h200-sxm", 40 * MIB)
    spills = 2 * 48 * MIB / per_call_s("h200-sxm", 48 * MIB)
    whole = 2 * 48 * MIB / per_call_s("h200-sxm", 48 * MIB, **{"gpu.l2.shared_fraction": 1.0})
    assert fits > 1.2 * spills
    assert whole > 1.2 * spills


@pytest.mark.parametrize(("gpu", "inside", "outside"), [("h200", 36, 48), ("h100", 28, 40)])
def test_the_l2_stops_holding_the_buffer_where_the_gpu_does(gpu, inside, outside):
    """Measured and simulated alike, the time per byte grows by more than 1.2x from a buffer inside
    the shared capacity to one outside it (HBM bound): H200 36 / 48 MiB, H100 28 / 40 (measured
    1.31x and 1.56x). With the whole capacity the model held 48 MiB and 40 MiB in the L2."""
    _, frame = compare_rows(f"l2-{gpu}", "bytes in [@inside * @MIB, @outside * @MIB]", inside=inside, outside=outside)
    per_byte = frame["measured_s"] / frame["bytes"], frame["simulated_s"] / frame["bytes"]
    measured, simulated = (float(series.iloc[1] / series.iloc[0]) for series in per_byte)
    assert measured > 1.2 and simulated > 1.2


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_working_set_sweep_within_tolerance(gpu):
    # the H100 met it in stop 23, with the write-through L2 and the controllers alternating bank groups, and meets it
    # with stop 33's write-back L2; the H200 met it in stop 24, once the gap between back-to-back kernels was read off
    # the model's span of a warm tiny kernel, until stop 33 (its in-place scales of L2-resident buffers 24-29% fast),
    # and again since stop 34, whose L2 serves a written byte at 1 / 1.46 of a read's rate (l2.write_cost)
    # sizes inside the shared capacity, around it and above it (the whole sweep: gpusim validate --dataset l2-h200)
    dataset, frame = compare_rows(f"l2-{gpu}", "bytes in [16 * @MIB, 24 * @MIB, 32 * @MIB, 48 * @MIB, 64 * @MIB, 96 * @MIB]")
    assert len(frame) == 6
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


@pytest.mark.xfail(strict=True, reason="known gap (docs/validation-log.md, stop 21): PyTorch's row sums of 2048 fp32 "
                   "values over 4-16 MiB take 5.0-5.2 us from a CUDA graph, the model 3.7-4.0 us; its 16 dependent L2 hits "
                   "cost what the H200 shows, but a reduce_kernel costs the H200 1-1.5 us more than the model's tiny kernel")
def test_row_sums_of_an_l2_resident_buffer_within_tolerance():
    dataset, frame = compare_rows("l2-rowsum-h200", "bytes <= 16 * @MIB")
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_row_sum_sweep_within_tolerance(gpu):
    # 512 to 32768 rows of 2048 fp32 values replayed from a CUDA graph: 16 dependent loads per lane; the H100 met
    # it once grids that overflow their slots paid only for their tail (stop 23: 22% / 42% -> 14% / 30%), though
    # its row sums of 37-42 MiB still go to the HBM early (+42..+76%: the model's LRU holds 0.7 of the L2, the
    # H100 about 0.8 for read-only sums)
    dataset, frame = compare_rows(f"l2-rowsum-{gpu}")
    assert len(frame) == 22
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


def _skinny_gemm_us(flush_bytes: int, overrides: dict) -> float:
    # a memory-bound GEMM (40 MB of weights, 16 tokens) timed as a lone cold call on the H200
    point = {"kind": "gemm", "m": 7680, "n": 16, "k": 2560, "trans_b": True, "dtype": "fp16"}
    return validation.simulate_point(system="h200-sxm", overrides={**validation.HOPPER_COLD_OVERRIDES, **overrides},
                                     flush_bytes=flush_bytes, **point)["simulated_s"] * 1e6


def test_a_read_only_call_after_the_l2_flush_writes_back_what_the_flush_left_dirty():
    # the preset's L2 keeps part of a long write dirty, so the GEMM's reads evict dirty lines after the flush;
    # a write-through L2 leaves nothing behind (the model before stop 33) and the flush costs nothing
    clean = _skinny_gemm_us(0, {})
    flushed = _skinny_gemm_us(validation.FLUSH_BYTES, {})
    assert flushed > clean + 3.0
    through = {"gpu.l2.write_through": True}
    assert _skinny_gemm_us(validation.FLUSH_BYTES, through) == pytest.approx(_skinny_gemm_us(0, through), abs=0.3)


def test_a_point_is_either_warm_or_after_a_flush():
    with pytest.raises(ValueError, match="exclude each other"):
        validation.simulate_point(kind="elementwise", system="h200-sxm", op="copy", elements=1024, warm=True,
                                  flush_bytes=2**20)
