"""The resources (registers per thread, shared memory, grid, block) of the kernels cuBLAS runs for a
few GEMMs, and of ``interference.py``'s background kernels (rows ``copy`` and ``spin``, 8 programs), from
the PyTorch profiler's trace (this project; runs on the GPU machine, imports nothing
from gpusim).  Writes ``kernel_resources.csv``: m, n, k, name, registers_per_thread,
shared_memory_bytes, grid, block, duration_us.

Usage: ``python3 kernel_resources.py --out DIR``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

GEMMS = ((8192, 8192, 8192), (8192, 4256, 2128), (8192, 4256, 532), (8192, 4256, 536), (4096, 4096, 1530),
         (35, 8457, 2048), (2048, 7133, 2048), (5124, 9124, 2048), (1024, 700, 512))
"""(m, n, k), fp16, row-major: interference.py's three (OP's K of 532 is not a multiple of 8 values, so
cuBLAS runs a fallback kernel), an aligned neighbour of OP, and DeepBench's unaligned shapes."""


def write_kernels(writer: csv.DictWriter, shape: tuple, work) -> None:
    """Profile one call of ``work`` and write a row per kernel it ran."""
    from interference import device_events

    for event in device_events(work, ("kernel",)):
        info = event.get("args", {})
        row = {"m": shape[0], "n": shape[1], "k": shape[2], "name": event["name"][:160],
               "registers_per_thread": info.get("registers per thread"),
               "shared_memory_bytes": info.get("shared memory"), "grid": "x".join(map(str, info.get("grid", []))),
               "block": "x".join(map(str, info.get("block", []))), "duration_us": event.get("dur")}
        writer.writerow(row)
        print(row, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fields = ["m", "n", "k", "name", "registers_per_thread", "shared_memory_bytes", "grid", "block", "duration_us"]
    with open(args.out / "kernel_resources.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        from interference import BLOCK, copy_passes, spin  # the background kernels of interference.py

        src = torch.randn(2**24, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        spun = torch.empty(8 * 1024, device="cuda", dtype=torch.float32)
        backgrounds = {"copy": lambda: copy_passes[(8,)](src, dst, src.numel(), 1, BLOCK=BLOCK, num_warps=8),
                       "spin": lambda: spin[(8,)](spun, 1000, BLOCK=1024, num_warps=8)}
        for label, launch in backgrounds.items():
            launch()
            torch.cuda.synchronize()
            write_kernels(writer, (label, 0, 0), launch)
        for m, n, k in GEMMS:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            c = torch.empty(m, n, device="cuda", dtype=torch.float16)
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            write_kernels(writer, (m, n, k), lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
