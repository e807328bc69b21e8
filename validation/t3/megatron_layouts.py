"""T3 and its DMA-driven decomposition in the communication layouts Megatron-LM runs, by replay.

Usage::

    python validation/t3/megatron_layouts.py --out out/t3-layouts [--models Mega-GPT-2 T-NLG]

The dissertation's baseline runs every tensor-parallel all-reduce after its GEMM.  Megatron-LM also
runs sequence parallelism (reduce-scatters and all-gathers) and, by default, overlaps the backward
all-reduces with the weight gradients (``--async-tensor-model-parallel-allreduce``).  This script
generates two layers of each model (Table 8.2 batch and sequence length, TP 8, no embedding or output
layer, training with its Adam step) in each layout, rewrites them with
:func:`gpusim.trace.overlap_gemm_collectives` (T3-MCA, or the decomposition on the DMA engines) and
replays them on ``t3-ring8`` (:func:`gpusim.studies.t3.simulate_megatron_layout`).  It writes
``megatron_layouts.csv``: every iteration's time, its speedup over the serialized (``tp``) layout's
sequential iteration and over its own layout's.  About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from gpusim.arguments import output_folder_or_exit, positive_int, run_script
from gpusim.studies import t3
from gpusim.sweep import sweep


def main(argv: list[str] | None = None) -> int:
    """Run every model, phase, layout and configuration; write and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (megatron_layouts.csv, sweep cache)")
    parser.add_argument("--models", nargs="+", default=list(t3.MAIN_MODELS), choices=list(t3.MODELS),
                        help=f"models to run (default: {' '.join(t3.MAIN_MODELS)})")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes (default: the CPUs available)")
    args = parser.parse_args(argv)
    out = output_folder_or_exit(parser, args.out, "--out")
    raw = sweep(t3.simulate_megatron_layout, t3.megatron_layout_points(args.models), workers=args.workers,
                cache=out / "cache", description="Megatron-LM layouts")
    table = t3.megatron_layouts(raw)
    table.to_csv(out / "megatron_layouts.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(table.to_string(index=False, float_format="{:.4g}".format))
    print(f"wrote {out}/megatron_layouts.csv")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, Path(__file__).parent.name + "/megatron_layouts.py"))
