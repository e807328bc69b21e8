"""Fit the Hopper presets' idle power, on-chip data-movement energy and matrix-unit energy to the
nvidia-smi samples of this project's H200 and H100 runs.

The measurement runs of ``validation/measured/h200`` and ``validation/measured/h100`` sampled
``power.draw`` and the SM clock every 250 ms (``clocks.csv``; ``log.txt`` times each section).
Three facts come out of them:

* ``idle_watts``: the median power of the samples with the SM clock at its maximum (1980 MHz)
  and no kernel running (utilisation 0%), over every run of both GPUs.
* ``l2_pj_per_byte`` (the energy of a byte moved between the SMs and the L2, with the SMs' load
  and store path and the on-chip network): the H200's median power while its ``streaming``
  section ran (element-wise kernels up to 2^30 values, most of the time in the large ones)
  equals the model's power for a copy of 2^28 fp16 values, given the presets' DRAM prices.
  The samples start 1 s after the section (``power.draw`` averages over about a second).
* ``matrix_pj_per_cu_cycle``: in the GEMM section the GPU reached its 700 W limit and lowered the
  SM clock to a median ``f`` over the samples within 3% of it.  An 8192^3 fp16 GEMM simulated
  with the SM and L2 clocks at ``f`` draws the limit with this price.  This assumes that the
  energy per FLOP and per byte does not change with the clock (the voltage held; lower voltages
  at lower clocks would make the price larger).

The H100's streaming section is held out: the script prints the model's power for it.  The
vector units' power, the DRAM's and the links' prices are not fitted (hwconfigs/gpus/h100-sxm5.yaml).

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


def dynamic_watts(system: str, op: str, prices: dict[str, float], clock_mhz: float = MAX_CLOCK_MHZ,
                  ) -> tuple[float, dict[str, float]]:
    """Power above idle of ``op`` on ``system`` with its SM and L2 clocks at ``clock_mhz``, priced at
    ``prices`` (J per unit, by component; the preset's own price for the rest), and the op's
    activity per second by component."""
    overrides = {"gpu.clock_hz": clock_mhz * 1e6, "gpu.l2.clock_hz": clock_mhz * 1e6}
    result = gpusim.run(gpusim.load_system(system, overrides), [parse_op(op)])
    table = result.energy().set_index("component")
    rates = (table["amount"] / result.time_s).to_dict()
    priced = {name: table.at[name, "energy_j"] / result.time_s for name in table.index if name != "idle"}
    for name, price in prices.items():
        priced[name] = rates[name] * price
    return sum(priced.values()), rates


def main() -> None:
    """Print the measurements, the fitted values and the held-out check."""
    rows = [row for gpu in ("h200", "h100") for path in sorted((MEASURED / gpu).glob("clocks*.csv"))
            for row in samples(path)]
    idle = statistics.median(watts for _, sm, watts, util in rows if sm == MAX_CLOCK_MHZ and util == 0)
    capped = statistics.median(sm for _, sm, watts, _ in samples(MEASURED / "h200" / "clocks.csv")
                               if watts >= 0.97 * LIMIT_W)
    streaming = section_power("h200", "streaming")
    print(f"idle at {MAX_CLOCK_MHZ} MHz: {idle:.1f} W ({len(rows)} samples); H200 streaming section: {streaming:.0f} W; "
          f"H200 samples within 3% of {LIMIT_W:.0f} W: median SM clock {capped:.0f} MHz")

    rest, rates = dynamic_watts("h200-sxm", COPY, {"l2": 0.0})
    l2_price = (streaming - idle - rest) / rates["l2"]
    print(f"copy on h200-sxm: {rates['l2'] / 1e12:.2f} TB/s through the L2, {rest:.0f} W in the DRAM: "
          f"l2_pj_per_byte = {l2_price * 1e12:.1f}")

    rest, rates = dynamic_watts("h200-sxm", GEMM, {"l2": l2_price, "matrix": 0.0}, capped)
    matrix = (LIMIT_W - idle - rest) / rates["matrix"]
    print(f"8192^3 GEMM on h200-sxm at {capped:.0f} MHz: {rates['matrix'] / 1e12:.3f} T CU-cycles/s at the tensor "
          f"cores' peak, {rest:.0f} W in memory: matrix_pj_per_cu_cycle = {matrix * 1e12:.0f} "
          f"({matrix * 1e12 / 4096:.2f} pJ per fp16 FLOP)")

    held_out = section_power("h100", "streaming")
    model, _ = dynamic_watts("h100-sxm5", COPY, {"l2": l2_price})
    print(f"held out, H100 streaming section: measured {held_out:.0f} W, model {idle + model:.0f} W "
          f"({(idle + model) / held_out - 1:+.1%})")


if __name__ == "__main__":
    main()
