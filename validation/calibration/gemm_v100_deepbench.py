"""DeepBench's 160 FP16 GEMMs on a V100 SXM2 against the v100-sxm2 preset.

Writes gemm-v100-deepbench.csv (measured, simulated, error per GEMM) and gemm-v100-deepbench.png into --out (default
out/validate) and exits 1 when the error leaves its tolerance.  Options as ``gpusim validate``
(--points N for a random subset, --workers N).
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    sys.exit(main(["validate", "--dataset", "gemm-v100-deepbench", *sys.argv[1:]]))
