"""LLMCompass's A100 GEMM, softmax, layernorm, GeLU and GPT-3 layer measurements against the a100-sxm4 preset.

Writes gemm-a100.csv, softmax-a100.csv, layernorm-a100.csv, gelu-a100.csv,
transformer-layer-a100.csv and transformer-layer-decode-a100.csv (measured, simulated, error) and a plot of each into --out (default
out/validate); exits 1 when an error leaves its tolerance. Options as ``gpusim validate``.
"""

import sys

from gpusim.cli import main

if __name__ == "__main__":
    datasets = ["--dataset", "gemm-a100", "--dataset", "softmax-a100", "--dataset", "layernorm-a100",
                "--dataset", "gelu-a100", "--dataset", "transformer-layer-a100",
                "--dataset", "transformer-layer-decode-a100"]
    sys.exit(main(["validate", *datasets, *sys.argv[1:]]))
