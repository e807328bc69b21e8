"""LLMCompass's MI210 softmax, layernorm and GeLU measurements against the mi210 preset.

Writes softmax-mi210.csv, layernorm-mi210.csv, gelu-mi210.csv (measured, simulated, error) and a
plot of each into --out (default out/validate); exits 1 when an error leaves its tolerance.
Options as ``gpusim validate``.
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    datasets = ["--dataset", "softmax-mi210", "--dataset", "layernorm-mi210", "--dataset", "gelu-mi210"]
    sys.exit(main(["validate", *datasets, *sys.argv[1:]]))
