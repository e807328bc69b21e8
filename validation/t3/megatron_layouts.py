"""T3 and its DMA-driven decomposition in the communication layouts Megatron-LM runs, by replay.

Usage::

    python validation/t3/megatron_layouts.py --out out/t3-layouts [--models Mega-GPT-2 T-NLG]

The dissertation's baseline runs every tensor-parallel all-reduce after its GEMM.  Megatron-LM also
runs sequence parallelism (reduce-scatters and all-gathers) and, by default, overlaps the backward
all-reduces with the weight gradients (``--async-tensor-model-parallel-allreduce``).  This script
generates two layers of each model (Table 8.2 batch and sequence length, TP 8, no embedding or output
layer, training with its Adam step) in each layout, rewrites them with
:func:`gpusim.trace.overlap_gemm_collectives` (T3-MCA, or the decomposition on the DMA engines), in the
sequence-parallel layout also with :func:`gpusim.trace.overlap_gather_gemms` (a GEMM kernel per gathered
chunk, or T3's tracker triggering one kernel's workgroups: :data:`gpusim.studies.t3.GATHER_CONFIGS`), and
replays them on ``t3-ring8`` (:func:`gpusim.studies.t3.simulate_megatron_layout`).  It writes
``megatron_layouts.csv``: every iteration's time, its speedup over the serialized (``tp``) layout's
sequential iteration and over its own layout's.  About 5 minutes on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpusim.arguments import model_sweep_main, run_script
from gpusim.studies import t3


def main(argv: list[str] | None = None) -> int:
    """Run every point; write and print the table."""
    return model_sweep_main(argv, __doc__, t3.simulate_megatron_layout, t3.megatron_layout_points, t3.megatron_layouts,
                            "megatron_layouts.csv", t3.MODELS, t3.MAIN_MODELS)


if __name__ == "__main__":
    sys.exit(run_script(main, Path(__file__).parent.name + "/megatron_layouts.py"))
