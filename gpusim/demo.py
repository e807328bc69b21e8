"""The main demo: a tensor-parallel GEMM followed by a ring reduce-scatter on the 8-GPU ``t3-ring8``.

Prints a table, writes a plot and a Perfetto timeline.  Run it with ``make demo`` or
``gpusim demo --out out/demo``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpusim import ops
from gpusim.cli import write_outputs
from gpusim.simulate import run
from gpusim.system import load_system


def main(out: Path, quick: bool = False) -> int:
    """Simulate T-NLG's FC-2 GEMM (TP=8) and its reduce-scatter; write results into ``out``."""
    system = load_system("t3-ring8")
    tokens, hidden, tp = (2048 if quick else 8192), 4256, 8
    m, n, k = tokens, hidden, 4 * hidden // tp
    program = [
        ops.Gemm(m, n, k, dtype="fp16", out="fc2_out", name="FC-2 GEMM"),
        ops.ReduceScatter(m * n * 2, input="fc2_out", name="reduce-scatter"),
    ]
    print(f"T-NLG FC-2, TP={tp} on {system.name}: GEMM {m}x{n}x{k} fp16, then a ring reduce-scatter of its output")
    result = run(system, program, mode="full", progress=True)
    table = result.summary()[["name", "impl", "start_s", "duration_s", "tflop_per_s", "gb_per_s"]]
    with pd.option_context("display.width", 160, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    print(f"sub-layer time {result.time_s * 1e3:.3f} ms (simulated); simulator: {result.stats['events']} events, "
          f"{result.stats['wall_s']:.1f} s wall")
    write_outputs(result, out, f"{system.name}: T-NLG FC-2 GEMM then reduce-scatter")
    print(f"wrote {out}/timeline.png and {out}/timeline.perfetto.json (open it in https://ui.perfetto.dev)")
    return 0
