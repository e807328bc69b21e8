"""How much a GEMM slows down beside a memory stream that holds a few SMs or a copy engine (this
project; runs on the GPU machine, imports nothing from gpusim).

T3 (dissertation chapter 8) overlaps a GEMM with the collective that follows it; the collective's
memory traffic competes with the GEMM's reads at the memory controllers, and where the collective
runs on CUs (Fig. 8.4) it also takes CUs away.  An H200 cannot mask CUs, but a Triton kernel of
``programs`` persistent programs holds that many SMs for as long as it runs.  For three GEMM shapes
(a square and T-NLG's FC-2 and OP sub-layers at TP = 8, fp16, ``torch.matmul``) this script times the
GEMM, between CUDA events on its own stream:

- ``alone``: nothing else runs;
- ``spin``: ``programs`` programs of arithmetic with no memory traffic run beside it (the SMs lost);
- ``copy``: ``programs`` programs copy a 1 GiB fp16 buffer (2 GiB moved per pass) beside it (the SMs
  lost and the HBM shared);
- ``dma``: a CUDA graph of 1 GiB device-to-device ``copy_`` calls runs beside it (``programs`` 0):
  inside a graph such copies go to the copy engines (README.md), so no SM is lost, only the HBM;
- ``dma_chunks``: the same in 64 MiB copies.

The background is launched first and lasts about three times the GEMM (its passes are chosen from
its time alone); the GEMM's stream first sleeps about 50 us, so that the background is resident and
the host has queued the GEMM before its start event.  Writes ``interference.csv``: m, n, k, mode,
programs, gemm_ms (median of 5), background_ms (the background's own span in the same runs, median),
background_alone_ms, background_gb_per_s_alone (bytes moved per second alone), gemm_grid (the
GEMM kernel's grid, from the profiler) and kernels (the GEMM's kernel count).

Usage: ``python3 interference.py --out DIR``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

GEMMS = ((8192, 8192, 8192), (8192, 4256, 2128), (8192, 4256, 532))
"""(m, n, k): a square, T-NLG FC-2 and OP at TP = 8 (SL 1K x B 8 tokens, H = 4256), fp16."""
PROGRAMS = (8, 16, 33, 66)
"""Background programs: about 6%, 12%, 25% and 50% of the H200's 132 SMs."""
COPY_ELEMENTS = 2**29
"""fp16 values of the copy's source and destination (1 GiB each: far beyond the 60 MiB L2)."""
BLOCK = 8192
"""Values a program moves per step (16 KiB of fp16, 64 bytes per thread of 8 warps)."""
DMA_CHUNK_ELEMENTS = 2**25
"""fp16 values per copy of the ``dma_chunks`` mode (64 MiB: the GEMM's kernels can slip in between)."""
PROFILED_CHUNKS: set[int] = set()
REPEATS = 5
SLEEP_CYCLES = 100_000
"""``torch.cuda._sleep`` before the GEMM's start event (about 50 us at 1.98 GHz)."""


@triton.jit
def copy_passes(src_ptr, dst_ptr, n, passes, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = tl.cdiv(n, BLOCK)
    for _ in range(passes):
        for block in range(pid, blocks, programs):
            offsets = block * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def spin(out_ptr, iterations, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = tl.arange(0, BLOCK).to(tl.float32)
    for _ in range(iterations):
        x = x * 0.9999 + 0.0001
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), x)


def events_ms(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    end.synchronize()
    return start.elapsed_time(end)


def alone_ms(work: Callable[[], None], repeats: int = REPEATS) -> float:
    """Median time of ``work`` on the current stream, after one warm-up call, ms."""
    work()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        samples.append(events_ms(start, end))
    return statistics.median(samples)


def side_by_side_ms(gemm: Callable[[], None], background: Callable[[], None], streams) -> tuple[float, float]:
    """Median GEMM time and background span with the background launched first on its own stream."""
    back_stream, gemm_stream = streams
    gemm_samples, back_samples = [], []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        with torch.cuda.stream(back_stream):
            events[0].record()
            background()
            events[1].record()
        with torch.cuda.stream(gemm_stream):
            torch.cuda._sleep(SLEEP_CYCLES)
            events[2].record()
            gemm()
            events[3].record()
        gemm_samples.append(events_ms(events[2], events[3]))
        back_samples.append(events_ms(events[0], events[1]))
    return statistics.median(gemm_samples), statistics.median(back_samples)


def device_events(work: Callable[[], None], categories: tuple[str, ...] = ("kernel", "gpu_memcpy")) -> list[dict]:
    """The device events (kernels with their grids, copies) of one call of ``work``, from the PyTorch
    profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in categories]


def copy_graph(src: torch.Tensor, dst: torch.Tensor, chunk: int, copies: int, stream) -> tuple:
    """A CUDA graph of ``copies`` whole copies of ``src`` into ``dst``, each made of ``chunk``-value
    ``copy_`` calls, captured on ``stream``; and the bytes it moves (read + write).  The first time a
    chunk size is seen, the profiler's device events of one replay are printed (kernel or memcpy)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(copies):
            for start in range(0, src.numel(), chunk):
                dst[start : start + chunk].copy_(src[start : start + chunk])
    if chunk not in PROFILED_CHUNKS:
        PROFILED_CHUNKS.add(chunk)
        names = sorted({(event["name"][:60], event.get("cat")) for event in device_events(graph.replay)})
        print(f"copy graph, chunks of {chunk} values: device events {names[:8]}", flush=True)
    return graph, 2 * src.numel() * src.element_size() * copies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    src = torch.randn(COPY_ELEMENTS, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    spun = torch.empty(max(PROGRAMS) * 1024, device="cuda", dtype=torch.float32)
    moved_per_pass = 2 * src.numel() * src.element_size()

    def copy(programs: int, passes: int) -> Callable[[], None]:
        return lambda: copy_passes[(programs,)](src, dst, src.numel(), passes, BLOCK=BLOCK, num_warps=8)

    def spinning(programs: int, iterations: int) -> Callable[[], None]:
        return lambda: spin[(programs,)](spun, iterations, BLOCK=1024, num_warps=8)

    copy_pass_ms = {programs: alone_ms(copy(programs, 1)) for programs in PROGRAMS}
    spin_probe = 200_000
    spin_probe_ms = alone_ms(spinning(max(PROGRAMS), spin_probe), repeats=3)
    dma_ms = alone_ms(lambda: dst.copy_(src))  # eager: for the log only
    print(f"copy pass alone: {copy_pass_ms}; spin {spin_probe} iterations: {spin_probe_ms:.3f} ms; "
          f"eager copy_: {dma_ms:.3f} ms", flush=True)

    fields = ["m", "n", "k", "mode", "programs", "gemm_ms", "background_ms", "background_alone_ms",
              "background_gb_per_s_alone", "gemm_grid", "kernels"]
    with open(args.out / "interference.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for m, n, k in GEMMS:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            c = torch.empty(m, n, device="cuda", dtype=torch.float16)

            def gemm(a=a, b=b, c=c) -> None:
                torch.matmul(a, b, out=c)

            kernels = device_events(gemm, ("kernel",))
            grid = "x".join(map(str, kernels[-1].get("args", {}).get("grid", []))) if kernels else ""
            count = len(kernels)

            def add(mode: str, programs: int, gemm_ms: float, back_ms: float, back_alone: float, moved: float,
                    m=m, n=n, k=k, grid=grid, count=count) -> None:
                rate = moved / (back_alone * 1e-3) / 1e9 if back_alone > 0 else math.nan
                writer.writerow({"m": m, "n": n, "k": k, "mode": mode, "programs": programs,
                                 "gemm_ms": f"{gemm_ms:.6g}", "background_ms": f"{back_ms:.6g}",
                                 "background_alone_ms": f"{back_alone:.6g}",
                                 "background_gb_per_s_alone": f"{rate:.6g}", "gemm_grid": grid, "kernels": count})
                handle.flush()
                print(m, n, k, mode, programs, f"gemm {gemm_ms:.3f} ms", f"background {back_ms:.3f} ms", flush=True)

            gemm_alone, _ = side_by_side_ms(gemm, lambda: None, streams)
            add("alone", 0, gemm_alone, 0.0, 0.0, 0.0)
            target_ms = 3 * gemm_alone + 0.2
            for programs in PROGRAMS:
                passes = max(1, math.ceil(target_ms / copy_pass_ms[programs]))
                background = copy(programs, passes)
                back_alone = alone_ms(background, repeats=3)
                gemm_ms, back_ms = side_by_side_ms(gemm, background, streams)
                add("copy", programs, gemm_ms, back_ms, back_alone, moved_per_pass * passes)
                iterations = max(1, math.ceil(spin_probe * target_ms / spin_probe_ms))
                background = spinning(programs, iterations)
                back_alone = alone_ms(background, repeats=3)
                gemm_ms, back_ms = side_by_side_ms(gemm, background, streams)
                add("spin", programs, gemm_ms, back_ms, back_alone, 0.0)
            for mode, chunk in (("dma", src.numel()), ("dma_chunks", DMA_CHUNK_ELEMENTS)):
                graph, moved = copy_graph(src, dst, chunk, math.ceil(target_ms / dma_ms), streams[0])
                back_alone = alone_ms(graph.replay, repeats=3)
                gemm_ms, back_ms = side_by_side_ms(gemm, graph.replay, streams)
                add(mode, 0, gemm_ms, back_ms, back_alone, moved)
            del a, b, c, graph
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
