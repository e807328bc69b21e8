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

The ``port`` sweep then asks whether one SM's path to the L2 has a bandwidth of its own.  The grid
sweep cannot tell: there the L2's total (8.5 TB/s on the H200) is just 132 times what two programs
on one SM reach (65 GB/s).  Half and all of the SMs each run one program of 4-32 warps with 128
bytes per thread in flight (16-128 KiB per SM), over the L2-resident buffer: if an SM's loads stop
growing with its bytes in flight while the L2 as a whole is far from busy, the SM's port is the
bound (a GEMM that leaves SMs idle then reads its panels more slowly than one that fills the GPU,
which is what cuBLAS's choice of grids suggests: docs/validation.md).  Writes ``l2_port.csv``:
kernel, buffer_bytes, programs, warps, block_values, inflight_kib_per_program, passes, ms, tb_per_s,
gb_per_s_per_program.

Usage: ``python3 l2_probe.py --out DIR [--sweeps grid,port]``.
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


def launch(kernel: str, x: torch.Tensor, out: torch.Tensor, programs: int, block_values: int, passes: int,
           warps: int = 4) -> None:
    if kernel == "scale":
        scale_passes[(programs,)](x, x.numel(), passes, BLOCK=block_values, num_warps=warps)
    else:
        sum_passes[(programs,)](x, out, x.numel(), passes, BLOCK=block_values, num_warps=warps)


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


def grid_sweep(out_dir: Path, sms: int) -> None:
    """Programs (1/16 to 8 per SM) x 16-256 bytes per thread in flight, for an L2-resident and an
    HBM-resident buffer: ``l2_probe.csv``."""
    fields = ["kernel", "buffer_bytes", "programs", "block_values", "passes", "ms", "tb_per_s"]
    with open(out_dir / "l2_probe.csv", "w", newline="") as handle:
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


PORT_BYTES_PER_THREAD = 128
"""Bytes each thread of the port sweep keeps in flight (32 fp32 values)."""


def port_sweep(out_dir: Path, sms: int, buffer_bytes: int = 16 * 2**20, target_bytes: int = 4 * 2**30) -> None:
    """One program on each of half or all of the SMs, 4-32 warps each with
    :data:`PORT_BYTES_PER_THREAD` in flight per thread, over an L2-resident buffer of about
    ``buffer_bytes`` (a whole number of blocks per program, so that every program moves the same
    bytes): ``l2_port.csv``."""
    fields = ["kernel", "buffer_bytes", "programs", "warps", "block_values", "inflight_kib_per_program", "passes",
              "ms", "tb_per_s", "gb_per_s_per_program"]
    out = torch.empty(sms, device="cuda", dtype=torch.float32)
    with open(out_dir / "l2_port.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for programs in (sms // 2, sms):
            for warps in (4, 8, 16, 32):
                block_values = warps * 32 * PORT_BYTES_PER_THREAD // 4
                blocks_each = max(1, buffer_bytes // (programs * block_values * 4))
                size = programs * blocks_each * block_values * 4
                x = torch.randn(size // 4, device="cuda", dtype=torch.float32)
                passes = max(1, round(target_bytes / size * programs / sms))
                for kernel in ("sum", "scale"):
                    moved = (2 if kernel == "scale" else 1) * size * passes
                    ms = timed_ms(kernel, x, out, programs, block_values, passes, warps)
                    rate = moved / (ms * 1e-3)
                    writer.writerow({"kernel": kernel, "buffer_bytes": size, "programs": programs,
                                     "warps": warps, "block_values": block_values,
                                     "inflight_kib_per_program": block_values * 4 // 1024, "passes": passes,
                                     "ms": f"{ms:.6g}", "tb_per_s": f"{rate / 1e12:.6g}",
                                     "gb_per_s_per_program": f"{rate / programs / 1e9:.6g}"})
                    handle.flush()
                    print(kernel, programs, warps, block_values, passes, f"{ms:.3f} ms",
                          f"{rate / programs / 1e9:.1f} GB/s per program", flush=True)
                del x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sweeps", default="grid,port", help="grid (l2_probe.csv), port (l2_port.csv)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sweeps = args.sweeps.split(",")
    if "grid" in sweeps:
        grid_sweep(args.out, sms)
    if "port" in sweeps:
        port_sweep(args.out, sms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
