"""vidur's NCCL all-reduce on H100 DGX nodes against the hgx-h100 preset.

2, 4 and 8 GPUs in one node, 40 sizes each between 1 and 64 MiB (a subset of vidur's profile).
Writes a CSV (measured, simulated, error) and a plot into --out (default out/validate); exits 1
when an error leaves its tolerance.  Options as ``gpusim validate``.
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    sys.exit(main(["validate", "--dataset", "allreduce-hgx-h100", *sys.argv[1:]]))
