"""Nsight Compute counters of the fp16 GEMMs of T3's sliced sub-layers (Mega-GPT-2 and T-NLG at TP 8
and 16, dissertation chapter 8) and an 8192^3 GEMM on the H200: how many bytes each kernel reads from
and writes to the HBM, against its operands' and output's sizes (this project; runs on the GPU
machine, imports nothing from gpusim).

Each case runs once untimed, then once inside ``torch.cuda.profiler`` start/stop, so that
``ncu --profile-from-start off`` profiles only that call.

Usage: ``ncu --profile-from-start off --metrics ... python3 gemm_counters.py`` (see the README beside
this file).
"""

from __future__ import annotations

import torch
from reduction_counters import profile_once

SHAPES = (
    (16384, 3072, 384, True), (16384, 3072, 1536, True), (16384, 3072, 1536, False), (16384, 3072, 1152, False),
    (16384, 3072, 192, True), (16384, 3072, 768, True), (16384, 3072, 768, False), (16384, 3072, 576, False),
    (8192, 4256, 532, True), (8192, 4256, 2128, True), (8192, 4256, 2128, False), (8192, 4256, 1596, False),
    (8192, 4256, 266, True), (8192, 4256, 1064, True), (8192, 4256, 1064, False), (8192, 4256, 798, False),
    (8192, 8192, 8192, False),
)
"""(m, n, k, trans_b), fp16, row-major: T3's OP, FC-2, FC-1 and IP GEMMs of Mega-GPT-2 and T-NLG at
TP 8 and 16 (``gpusim.studies.t3.sublayer_gemm``; ``trans_b``: B stored ``[n, k]``, as
``torch.nn.Linear`` stores its weight), and 8192^3."""


def main() -> int:
    for m, n, k, trans_b in SHAPES:
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        b = torch.randn(n, k, dtype=torch.float16, device="cuda") if trans_b else \
            torch.randn(k, n, dtype=torch.float16, device="cuda")
        c = torch.empty(m, n, dtype=torch.float16, device="cuda")
        operand = b.t() if trans_b else b
        profile_once(lambda a=a, operand=operand, c=c: torch.matmul(a, operand, out=c), f"gemm {m} {n} {k} trans_b={trans_b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
