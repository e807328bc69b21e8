"""Fit the Hopper presets' idle power, on-chip data-movement energy and matrix- and vector-unit
energy to the nvidia-smi samples of this project's H200 and H100 runs.

The measurement runs of ``validation/measured/h200`` and ``validation/measured/h100`` sampled
``power.draw`` and the SM clock every 250 ms (``clocks.csv``; ``log.txt`` times each section).
Four facts come out of them:

* ``idle_watts``: the median power of the samples with the SM clock at its maximum (1980 MHz)
  and no kernel running (utilisation 0%), over every run of both GPUs.
* ``l2_pj_per_byte`` (the energy of a byte moved between the SMs and the L2, with the SMs' load
  and store path and the on-chip network): the H200's median power while its ``streaming``
  section ran (element-wise kernels up to 2^30 values, most of the time in the large ones)
  equals the model's power for a copy of 2^28 fp16 values, given the presets' DRAM prices.
  The samples start 1 s after the section (``power.draw`` averages over about a second).
* ``vector_pj_per_cu_cycle``: the GEMM section ends with FP32 squares (no tensor cores; 16384^3
  runs 2.5 s), which held the board at its 700 W limit with the SM clock at 1950-1965 MHz: the
  only samples at the limit above ``SIMT_MIN_CLOCK_MHZ``.  A 16384^3 fp32 GEMM simulated on
  ``h200-sxm`` draws their median power with this price.
* ``matrix_pj_per_cu_cycle``: the section's large tensor-core GEMMs also held the board at the
  limit, but with the SM clock lowered to 1230-1500 MHz.  The preset's ``gemm_efficiency`` was
  fitted to the times they took at those clocks, so the model runs them as fast at its nominal
  1.98 GHz: an 8192^3 fp16 GEMM simulated on ``h200-sxm`` draws the limit with this price.  The
  energy of such a GEMM (power x time) is then the measured one; the split between a lower
  clock and more work per cycle is not.

Held out (printed): the H100's streaming section and its FP32 squares at the limit, and how far a
tf32 GEMM (the tf32 squares also ran at the limit, at 1515-1680 MHz) lands from the limit.  The
DRAM's, the near-bank ALUs' and the links' prices are not fitted (hwconfigs/gpus/h100-sxm5.yaml).

Run from the repository root: ``python validation/calibration/power_hopper.py``.
"""

from __future__ import annotations

import csv
import re
import statistics
from datetime import datetime, timedelta
from pathlib import Path

import gpusim
from gpusim.cli import parse_op

MEASURED = Path(__file__).resolve().parents[1] / "measured"
LIMIT_W = 700.0
"""The boards' power limit (nvidia-smi, both GPUs)."""
MAX_CLOCK_MHZ = 1980
LAG_S = 1.0
"""How long after a section starts its samples are taken to show it."""
COPY = "elementwise kind=copy elements=268435456 dtype=fp16"
GEMM = "gemm m=8192 n=8192 k=8192 dtype=fp16"
FP32_GEMM = "gemm m=16384 n=16384 k=16384 dtype=fp32"
TF32_GEMM = "gemm m=8192 n=8192 k=8192 dtype=tf32"
SIMT_MIN_CLOCK_MHZ = 1800
"""Samples at the limit with the SM clock at or above this are the FP32 GEMMs' (no tensor cores): the
tensor-core GEMMs held the limit at 1230-1500 MHz on both GPUs."""


def samples(path: Path) -> list[tuple[datetime, int, float, int]]:
    """(time, SM clock in MHz, power in W, utilisation in %) of every sample in ``path``."""
    with path.open() as handle:
        reader = csv.reader(handle, skipinitialspace=True)
        next(reader)
        return [(datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f"), int(sm.split()[0]), float(watts.split()[0]),
                 int(util.split()[0])) for stamp, sm, _, watts, _, util in reader]


def section_power(gpu: str, section: str) -> float:
    """Median power of ``gpu``'s first run while ``section`` ran (``log.txt``), W."""
    rows = samples(MEASURED / gpu / "clocks.csv")
    times = [(datetime.strptime(m.group(1), "%H:%M:%S").time(), m.group(2))
             for m in re.finditer(r"\[(\d\d:\d\d:\d\d)\] (\w+):", (MEASURED / gpu / "log.txt").read_text())]
    day = rows[0][0].date()
    starts = [(datetime.combine(day, t), name) for t, name in times]
    begin = next(i for i, (_, name) in enumerate(starts) if name == section)
    start, end = starts[begin][0] + timedelta(seconds=LAG_S), starts[begin + 1][0]
    return statistics.median(watts for stamp, _, watts, _ in rows if start <= stamp <= end)


def dynamic_watts(system: str, op: str, prices: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Power above idle of ``op`` on ``system`` (at the preset's clocks), priced at
    ``prices`` (J per unit, by component; the preset's own price for the rest), and the op's
    activity per second by component."""
    result = gpusim.run(gpusim.load_system(system), [parse_op(op)])
    table = result.energy().set_index("component")
    rates = (table["amount"] / result.time_s).to_dict()
    priced = {name: table.at[name, "energy_j"] / result.time_s for name in table.index if name != "idle"}
    for name, price in prices.items():
        priced[name] = rates[name] * price
    return sum(priced.values()), rates


def at_limit(gpu: str, simt: bool) -> list[tuple[int, float]]:
    """(SM clock in MHz, power in W) of the samples of ``gpu``'s first run within 3% of the limit:
    those whose clock stayed at ``SIMT_MIN_CLOCK_MHZ`` or above (``simt``: the FP32 GEMMs without
    tensor cores) or those below it (the tensor-core GEMMs, whose clock the limit lowered)."""
    return [(sm, watts) for _, sm, watts, _ in samples(MEASURED / gpu / "clocks.csv")
            if watts >= 0.97 * LIMIT_W and (sm >= SIMT_MIN_CLOCK_MHZ) == simt]


def main() -> None:
    """Print the measurements, the fitted values and the held-out checks."""
    rows = [row for gpu in ("h200", "h100") for path in sorted((MEASURED / gpu).glob("clocks*.csv"))
            for row in samples(path)]
    idle = statistics.median(watts for _, sm, watts, util in rows if sm == MAX_CLOCK_MHZ and util == 0)
    streaming = section_power("h200", "streaming")
    tensor = at_limit("h200", simt=False)
    simt = at_limit("h200", simt=True)
    print(f"idle at {MAX_CLOCK_MHZ} MHz: {idle:.1f} W ({len(rows)} samples); H200 streaming section: {streaming:.0f} W; "
          f"H200 samples within 3% of {LIMIT_W:.0f} W: {len(tensor)} of the tensor-core GEMMs at a median "
          f"{statistics.median(sm for sm, _ in tensor):.0f} MHz, {len(simt)} of the FP32 GEMMs at "
          f"{statistics.median(sm for sm, _ in simt):.0f} MHz and {statistics.median(w for _, w in simt):.1f} W")

    rest, rates = dynamic_watts("h200-sxm", COPY, {"l2": 0.0})
    l2_price = (streaming - idle - rest) / rates["l2"]
    print(f"copy on h200-sxm: {rates['l2'] / 1e12:.2f} TB/s through the L2, {rest:.0f} W in the DRAM: "
          f"l2_pj_per_byte = {l2_price * 1e12:.1f}")

    rest, rates = dynamic_watts("h200-sxm", FP32_GEMM, {"l2": l2_price, "vector": 0.0})
    vector = (statistics.median(w for _, w in simt) - idle - rest) / rates["vector"]
    print(f"{FP32_GEMM} on h200-sxm: {rates['vector'] / 1e12:.3f} T SM-cycles/s at the FP32 lanes' peak, "
          f"{rest:.0f} W in memory: vector_pj_per_cu_cycle = {vector * 1e12:.0f} "
          f"({vector * 1e12 / 256:.1f} pJ per fp32 FLOP)")

    rest, rates = dynamic_watts("h200-sxm", GEMM, {"l2": l2_price, "vector": vector, "matrix": 0.0})
    matrix = (LIMIT_W - idle - rest) / rates["matrix"]
    print(f"{GEMM} on h200-sxm: {rates['matrix'] / 1e12:.3f} T SM-cycles/s at the tensor cores' peak, "
          f"{rest:.0f} W in memory: matrix_pj_per_cu_cycle = {matrix * 1e12:.0f} "
          f"({matrix * 1e12 / 4096:.2f} pJ per fp16 FLOP)")

    prices = {"l2": l2_price, "vector": vector, "matrix": matrix}
    held_out = section_power("h100", "streaming")
    model, _ = dynamic_watts("h100-sxm5", COPY, prices)
    print(f"held out, H100 streaming section: measured {held_out:.0f} W, model {idle + model:.0f} W "
          f"({(idle + model) / held_out - 1:+.1%})")
    measured = statistics.median(w for _, w in at_limit("h100", simt=True))
    model, _ = dynamic_watts("h100-sxm5", FP32_GEMM, prices)
    print(f"held out, the H100's FP32 GEMMs at the limit: measured {measured:.0f} W, model {idle + model:.0f} W "
          f"({(idle + model) / measured - 1:+.1%})")
    model, _ = dynamic_watts("h200-sxm", TF32_GEMM, prices)
    print(f"held out, {TF32_GEMM} on h200-sxm (the tf32 squares ran at the limit, at 1515-1680 MHz): "
          f"model {idle + model:.0f} W ({(idle + model) / LIMIT_W - 1:+.1%} of the limit)")


if __name__ == "__main__":
    main()
