"""vidur's NCCL all-reduce on DGX A100 nodes against the dgx-a100 preset.

Two data sets: 2, 4, 8 GPUs in one node and 16 GPUs over two nodes (the validation target), and
two nodes of 1, 2, 4 GPUs (the data the network is fitted to).  Writes one CSV (measured,
simulated, error) and plot per data set into --out (default out/validate); exits 1 when an error
leaves its tolerance.  The full data sets hold 3460 and 2595 sizes between 1 and 64 MiB; use
--points N for a random subset (drawn evenly over GPU counts).  Options as ``gpusim validate``.
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    datasets = ["--dataset", "allreduce-dgx-a100", "--dataset", "allreduce-dgx-a100-2nodes"]
    sys.exit(main(["validate", *datasets, *sys.argv[1:]]))
