"""Probe what bounds per-thread loads from the L2 of an NVIDIA GPU, with a Triton kernel whose grid
and bytes in flight are chosen (this project; runs on the GPU machine, imports nothing from gpusim).

Each program of ``scale_passes`` walks an fp32 buffer in blocks of ``BLOCK`` values, loading and
storing each block in place, ``passes`` times over, each pass on other blocks than the last (so
that an SM does not find them in its L1); ``sum_passes`` loads only and writes one sum per program.  A buffer of 16 MiB stays in the L2, one of 1 GiB streams from the HBM.  Varying the
programs (8 to 1056, one to eight per SM on a 132-SM GPU) and ``BLOCK`` (512 to 8192 values per
128-thread program: 16 to 256 bytes per thread in flight) separates a bound per SM (bandwidth
grows with the programs) from one of the L2 as a whole (it stops growing), and shows Little's law
(bandwidth x latency = bytes in flight).

Writes ``l2_probe.csv``: kernel, buffer_bytes, programs, block_values, passes, ms (median of 5
launches timed by CUDA events), tb_per_s (bytes loaded + stored per second).

Usage: ``python3 l2_probe.py --out DIR``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def scale_passes(x_ptr, n, passes, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = tl.cdiv(n, BLOCK)
    for step in range(passes):
        for block in range(pid, blocks, programs):
            # each pass moves every program 1237 blocks on (a prime), so no SM finds its blocks in its L1
            offsets = ((block + step * 1237) % blocks) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            values = tl.load(x_ptr + offsets, mask=mask)
            tl.store(x_ptr + offsets, values * 1.0000001, mask=mask)


@triton.jit
def sum_passes(x_ptr, out_ptr, n, passes, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = tl.cdiv(n, BLOCK)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(passes):
        for block in range(pid, blocks, programs):
            offsets = ((block + step * 1237) % blocks) * BLOCK + tl.arange(0, BLOCK)
            total += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(total, axis=0))


def launch(kernel: str, x: torch.Tensor, out: torch.Tensor, programs: int, block_values: int, passes: int) -> None:
    if kernel == "scale":
        scale_passes[(programs,)](x, x.numel(), passes, BLOCK=block_values, num_warps=4)
    else:
        sum_passes[(programs,)](x, out, x.numel(), passes, BLOCK=block_values, num_warps=4)


def timed_ms(*args, repeats: int = 5) -> float:
    """Median time of one :func:`launch` of ``args``, after one to compile and warm up, ms."""
    launch(*args)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(*args)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fields = ["kernel", "buffer_bytes", "programs", "block_values", "passes", "ms", "tb_per_s"]
    with open(args.out / "l2_probe.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for buffer_bytes, target_bytes in ((16 * 2**20, 4 * 2**30), (2**30, 8 * 2**30)):
            n = buffer_bytes // 4
            x = torch.randn(n, device="cuda", dtype=torch.float32)
            out = torch.empty(8 * sms, device="cuda", dtype=torch.float32)
            passes = max(1, target_bytes // buffer_bytes)
            for block_values in (512, 2048, 8192):
                for per_sm in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8):
                    programs = max(1, round(sms * per_sm))
                    # fewer passes where few programs run, so each launch stays near a few ms
                    scaled = max(1, round(passes * min(1.0, per_sm)))
                    for kernel in ("scale", "sum"):
                        moved = (2 if kernel == "scale" else 1) * buffer_bytes * scaled
                        ms = timed_ms(kernel, x, out, programs, block_values, scaled)
                        writer.writerow({"kernel": kernel, "buffer_bytes": buffer_bytes, "programs": programs,
                                         "block_values": block_values, "passes": scaled, "ms": f"{ms:.6g}",
                                         "tb_per_s": f"{moved / (ms * 1e-3) / 1e12:.6g}"})
                        handle.flush()
                        print(kernel, buffer_bytes, programs, block_values, scaled, f"{ms:.3f} ms",
                              f"{moved / (ms * 1e-3) / 1e12:.2f} TB/s", flush=True)
            del x
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
