"""LLMCompass's 22 FP16 GEMMs on an MI210 against the mi210 preset.

Writes gemm-mi210.csv (measured, simulated, error per GEMM) and gemm-mi210.png into --out (default
out/validate) and exits 1 when the error leaves its tolerance.  Options as ``gpusim validate``
(--points N for a random subset, --workers N).
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    sys.exit(main(["validate", "--dataset", "gemm-mi210", *sys.argv[1:]]))
