"""L2 counters of an out-of-place chain (measure.py's ``chain`` section) under Nsight Compute, to test
whether a consumer's reads of its producer's output cross the L2's two halves (this project; runs on
the GPU machine, imports nothing from gpusim).

Six ``torch.mul(x, 2.0, out=y)`` over fp16 tensors of ``--mib`` MiB, each reading its predecessor's
output; run under ``ncu --metrics ... python3 chain_counters.py`` (see the README beside this file).

Usage: ``python3 chain_counters.py [--mib 16]``.
"""

from __future__ import annotations

import argparse

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    elements = args.mib * 2**20 // 2
    tensors = [torch.randn(elements, dtype=torch.float16, device="cuda") for _ in range(7)]
    read_only = torch.randn(elements, dtype=torch.float16, device="cuda")
    torch.mul(read_only, 2.0, out=tensors[0])  # warm: the source, once, read only
    torch.mul(read_only, 2.0, out=tensors[0])  # read again: held for reading
    for source, target in zip(tensors, tensors[1:]):
        torch.mul(source, 2.0, out=target)  # each reads what the one before wrote
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
