"""T3 in the generation phase of inference (dissertation section 8.6.3), by replay.

Usage::

    python validation/t3/generation.py --out out/t3-generation [--models Mega-GPT-2 T-NLG]

The dissertation evaluates T3 on training and the prompt phase and argues (section 8.6.3) that the
all-reduces of token generation, small and latency-bound, can still be hidden behind their GEMMs.
This script generates two layers of each model decoding one token for each of 1, 8 and 64 sequences
(a cache of the Table 8.2 sequence length, no embedding or output layer) at TP 8 and 16, rewrites
them with :func:`gpusim.trace.overlap_gemm_collectives` (T3, T3-MCA, or the decomposition on the DMA
engines, which needs the rows to split over the ranks) and replays them on the T3 ring nodes
(:func:`gpusim.studies.t3.simulate_generation`).  It writes ``generation.csv``: every step's time,
how many GEMM/all-reduce pairs the rewrite overlapped and its speedup over the sequential step.
About a minute on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpusim.arguments import model_sweep_main, run_script
from gpusim.studies import t3


def main(argv: list[str] | None = None) -> int:
    """Run every point; write and print the table."""
    return model_sweep_main(argv, __doc__, t3.simulate_generation, t3.generation_points, t3.generation,
                            "generation.csv", t3.MODELS, t3.MAIN_MODELS)


if __name__ == "__main__":
    sys.exit(run_script(main, Path(__file__).parent.name + "/generation.py"))
