"""Measure kernels on an NVIDIA H200 with PyTorch, for gpusim's ``h200-sxm`` preset.

Runs on the GPU machine (PyTorch, CUDA; Hugging Face ``transformers`` for the optimizer models and
the profiled training step) and imports nothing from gpusim.  Every section writes its CSV as soon
as it ends, and a section that fails is logged and skipped, so one failure loses only its own rows.

Sections and files (in ``--out``):

``env.json``
    Device, driver, library versions, the measured copy-bandwidth and matrix-rate ceilings, and
    the parameter tensor sizes of the optimizer models.
``launch.csv``
    The fixed cost of a kernel: host time per eager call back to back, device time per kernel in a
    CUDA graph, a single call's round trip, and the profiler's kernel durations and gaps.
``gemm.csv``
    ``torch.matmul`` over DeepBench's and LLMCompass's GEMM shapes (read from the sibling CSVs),
    a transformer grid and square shapes in several dtypes.
``streaming.csv``
    Element-wise kernels over 2^10 .. 2^30 elements and row reductions (softmax, layernorm,
    rmsnorm, sum) over the LLMCompass shapes.
``optimizer.csv``
    ``optimizer.step()`` of Adam, AdamW and SGD with momentum on BERT-base (classifier) and
    BERT-Large (pre-training) parameters, fp32, in the four implementations of seed 000 (one
    unfused kernel chain per tensor, one fused kernel per tensor, multi-tensor unfused, multi-tensor
    fused): median step time, kernels per step and the kernels' busy time.
``gpt2_train_step.json.gz``
    A Kineto trace (record_shapes) of one fp16 forward + backward step of GPT-2 small.
``memory.csv``, ``concurrency.csv``, ``gpt2_2layers_train_step.json.gz``
    Sections ``memory``, ``concurrency`` and ``small_trace`` (not run by default): bandwidth by
    kind of access, concurrent GEMMs on 1-8 streams, and a 2-layer GPT-2 training step.
``flush_residue.csv``
    Section ``flush_residue`` (not run by default; added in stop 33, not yet run): a sum, a skinny
    GEMM, fills and a copy timed right after the cold method's 512 MiB write, after that write and
    an idle millisecond, after a 512 MiB read, and right after themselves: whether the flush leaves
    a write-back backlog that the next call pays for (docs/validation-log.md, stop 33).
``gemm_residency.csv``
    Section ``gemm_residency`` (not run by default; added in stop 35, not yet run): an add after a
    GEMM whose weights of 2-64 MiB stream through the L2, against the same add after a fill of its
    input: whether a GEMM's output stays in the L2 for its consumer (docs/validation-log.md, stop 35).
``l2.csv``
    Section ``l2`` (not run by default): per-call bandwidth of a working set reused from the L2,
    4-256 MiB, in place and read only.
``concurrency_graph.csv``, ``concurrency_graph_kernels.csv``
    Section ``concurrency_graph`` (not run by default): the concurrent GEMMs with every call in one
    CUDA graph (no host cost), and when each kernel of the largest concurrent graphs ran.
``chain.csv``
    Section ``chain`` (not run by default; added in stop 21, not yet run): the duration of each
    kernel of out-of-place chains over 4-64 MiB tensors from a CUDA graph, starting from a tensor
    or from a GEMM's output: how much of a producer's output the L2 keeps for its consumer.
``reduction_costs.csv``
    Section ``reduction_costs`` (not run by default; added in stop 21, not yet run): small row
    sums, column sums, layer and RMS norms, with the profiled duration of each of their kernels.
``attention.csv``
    Section ``attention`` (not run by default; added in stop 31, not yet run): fused attention
    (``F.scaled_dot_product_attention``, flash backend) forward and backward over prompts and
    decoding steps, with each kernel's name, grid and duration.

Timing methods, per case (all medians; times in ms):

``graph_ms``
    ``reps`` calls back to back on the same buffers, captured in one CUDA graph and replayed
    between two CUDA events, divided by ``reps`` (DeepBench's back-to-back method without host
    dispatch; inputs that fit stay in the L2).
``cold_ms``
    One call between two CUDA events after a 512 MiB write that evicts the L2.
``host_ms``
    Host wall clock of one call followed by ``torch.cuda.synchronize()`` (LLMCompass's method).

Usage: ``python3 measure.py --out DIR [--budget-s 480] [--dry-run]`` (``--dry-run``: tiny sizes on
the CPU, to check the script without a GPU).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
MEASURED = HERE.parent
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


class Bench:
    """Timers on one device; on the CPU (``--dry-run``) every method falls back to host timing."""

    def __init__(self, device: str, deadline: float, log) -> None:
        self.device = device
        self.cuda = device == "cuda"
        self.deadline = deadline
        self.log = log
        flush_bytes = 512 * 2**20 if self.cuda else 2**20
        self.flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device=device)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def host_ms(self, fn: Callable[[], object], repeats: int) -> float:
        samples = []
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    def cold_ms(self, fn: Callable[[], object], repeats: int) -> float:
        if not self.cuda:
            return self.host_ms(fn, repeats)
        return self.after_ms(lambda: self.flush.fill_(1.0), fn, repeats)

    def after_ms(self, prepare: Callable[[], object], fn: Callable[[], object], repeats: int) -> float:
        """Median time of ``fn`` between two CUDA events, each call queued right behind ``prepare()``
        (host-timed on the CPU)."""
        samples = []
        for _ in range(repeats):
            prepare()
            if not self.cuda:
                start_s = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - start_s) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    def graph_ms(self, fn: Callable[[], object], reps: int, replays: int = 5) -> float:
        """Per-call time of ``reps`` back-to-back calls replayed from one CUDA graph."""
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - start) * 1e3 / reps
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        self.sync()
        samples = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / reps)
        del graph
        return statistics.median(samples)

    def eager_ms(self, fn: Callable[[], object], calls: int) -> float:
        """Per-call time of ``calls`` eager calls back to back, between two device syncs (host clock)."""
        self.sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        return (time.perf_counter() - start) * 1e3 / calls

    def profile_kernels(self, fn: Callable[[], object]) -> list[dict]:
        """The GPU kernels ``fn`` runs, from the PyTorch profiler (name, ts and dur in us, and the
        launch's grid and block as the profiler records them; empty on the CPU)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            fn()
            self.sync()
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as handle:
                events = json.load(handle).get("traceEvents", [])
        wanted = "kernel" if self.cuda else "cpu_op"
        kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == wanted]
        return sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"]),
                        "grid": e.get("args", {}).get("grid", []), "block": e.get("args", {}).get("block", [])}
                       for e in kernels), key=lambda e: e["ts"])


def reps_for(estimate_ms: float, target_ms: float = 2.0, most: int = 200) -> int:
    """Calls per graph so that one replay lasts about ``target_ms`` (at least 1, at most ``most``)."""
    return max(1, min(most, math.ceil(target_ms / max(estimate_ms, 1e-4))))


def timed_case(bench: Bench, fn: Callable[[], object], cold_repeats: int = 10) -> dict[str, float]:
    """graph_ms, cold_ms and host_ms of one case (see the module docstring)."""
    fn()
    estimate = bench.host_ms(fn, 3)
    repeats = cold_repeats if estimate < 5 else 3
    cold = bench.cold_ms(fn, repeats)
    host = bench.host_ms(fn, repeats)
    try:
        graph = bench.graph_ms(fn, reps_for(cold), replays=5 if cold < 5 else 2)
    except RuntimeError as error:  # an op that cannot be captured keeps its other two times
        bench.log(f"graph capture failed: {error}")
        graph = math.nan
    return {"graph_ms": graph, "cold_ms": cold, "host_ms": host}


class Table:
    """A CSV written row by row (flushed), so that a failure keeps what was measured."""

    def __init__(self, path: Path, fields: list[str]) -> None:
        self.handle = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.handle, fieldnames=fields, extrasaction="raise")
        self.writer.writeheader()
        self.rows = 0

    def add(self, row: dict) -> None:
        self.writer.writerow({key: (f"{value:.6g}" if isinstance(value, float) else value) for key, value in row.items()})
        self.handle.flush()
        self.rows += 1

    def close(self) -> None:
        self.handle.close()


# -- ceilings and environment -------------------------------------------------------------------
def nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *query.split()], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi failed: {error}"


def ceilings(bench: Bench, dry: bool) -> dict:
    elements = 2**20 if dry else 2**30  # 2 GiB of fp16 per tensor
    src = torch.randn(elements, dtype=torch.float16, device=bench.device)
    dst = torch.empty_like(src)
    copy = bench.graph_ms(lambda: dst.copy_(src), reps=4 if not dry else 2, replays=5)
    size = 256 if dry else 8192
    out = {"copy_gib_per_tensor": elements * 2 / 2**30, "copy_ms": copy,
           "copy_read_plus_write_tb_per_s": 2 * elements * 2 / (copy * 1e-3) / 1e12}
    for name in ("fp16", "bf16"):
        a = torch.randn(size, size, dtype=DTYPES[name], device=bench.device)
        b = torch.randn(size, size, dtype=DTYPES[name], device=bench.device)
        c = torch.empty(size, size, dtype=DTYPES[name], device=bench.device)
        ms = bench.graph_ms(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), reps=10 if not dry else 2)
        out[f"gemm_{name}_{size}_ms"] = ms
        out[f"gemm_{name}_{size}_tflops"] = 2 * size**3 / (ms * 1e-3) / 1e12
    return out


# -- launch cost ----------------------------------------------------------------------------------
def gaps_and_durations(kernels: list[dict]) -> tuple[float, float]:
    """Median kernel duration and median gap between one kernel's end and the next one's start, us."""
    durations = [k["dur"] for k in kernels]
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(kernels, kernels[1:])]
    return (statistics.median(durations) if durations else math.nan, statistics.median(gaps) if gaps else math.nan)


def launch(bench: Bench, out: Path, dry: bool) -> None:
    table = Table(out / "launch.csv", ["kernel", "elements", "method", "us_per_kernel", "note"])
    calls = 50 if dry else 2000
    for elements in (1, 2**16, 2**20):
        x = torch.zeros(elements, dtype=torch.float32, device=bench.device)

        def tiny(x=x) -> None:
            x.add_(1.0)

        tiny()
        rows = {
            "eager_back_to_back": (bench.eager_ms(tiny, calls) * 1e3, "host clock over many eager calls / calls"),
            "graph_back_to_back": (bench.graph_ms(tiny, reps=calls // 2) * 1e3, "CUDA graph replay / kernels"),
            "single_call_round_trip": (bench.host_ms(tiny, 50) * 1e3, "one call + synchronize, host clock"),
        }
        for method, (value, note) in rows.items():
            table.add({"kernel": "add_scalar_inplace", "elements": elements, "method": method,
                       "us_per_kernel": value, "note": note})
        kernels = bench.profile_kernels(lambda: [tiny() for _ in range(200)])
        duration, gap = gaps_and_durations(kernels[-150:])
        table.add({"kernel": "add_scalar_inplace", "elements": elements, "method": "profiler_kernel_duration",
                   "us_per_kernel": duration, "note": "eager, 200 calls"})
        table.add({"kernel": "add_scalar_inplace", "elements": elements, "method": "profiler_gap_eager",
                   "us_per_kernel": gap, "note": "end of one kernel to start of the next, eager"})
        if bench.cuda:
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                tiny()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                for _ in range(200):
                    tiny()
            graph.replay()
            kernels = bench.profile_kernels(graph.replay)
            duration, gap = gaps_and_durations(kernels)
            table.add({"kernel": "add_scalar_inplace", "elements": elements, "method": "profiler_kernel_duration_graph",
                       "us_per_kernel": duration, "note": "CUDA graph, 200 kernels"})
            table.add({"kernel": "add_scalar_inplace", "elements": elements, "method": "profiler_gap_graph",
                       "us_per_kernel": gap, "note": "end of one kernel to start of the next, CUDA graph"})
    table.close()


# -- GEMMs ----------------------------------------------------------------------------------------
def gemm_cases(dry: bool) -> list[dict]:
    """The shapes: DeepBench's and LLMCompass's (from the sibling CSVs), a transformer grid, squares."""
    cases = []
    with open(MEASURED / "deepbench_v100_gemm_fp16.csv") as handle:
        for row in csv.DictReader(handle):
            # DeepBench is column-major: an operand that is not transposed ("N") is transposed when
            # read row-major (the convention gpusim.validation uses for this file).
            cases.append({"set": "deepbench", "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                          "trans_a": row["trans_a"] == "N", "trans_b": row["trans_b"] == "N", "dtype": "fp16"})
    with open(MEASURED / "llmcompass_mi210_gemm_fp16.csv") as handle:
        for row in csv.DictReader(handle):
            cases.append({"set": "llmcompass", "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                          "trans_a": False, "trans_b": False, "dtype": "fp16"})
    for tokens in (1, 16, 128, 512, 2048, 8192):
        for hidden in (4096, 8192):
            for n, k in ((3 * hidden, hidden), (hidden, hidden), (4 * hidden, hidden), (hidden, 4 * hidden)):
                cases.append({"set": "transformer", "m": tokens, "n": n, "k": k, "trans_a": False, "trans_b": True,
                              "dtype": "fp16"})
    for dtype in ("fp16", "bf16", "tf32", "fp32"):
        for size in (512, 1024, 2048, 4096, 8192, 16384):
            cases.append({"set": "square", "m": size, "n": size, "k": size, "trans_a": False, "trans_b": False,
                          "dtype": dtype})
    if dry:
        cases = [dict(case, m=min(case["m"], 64), n=min(case["n"], 64), k=min(case["k"], 64)) for case in cases[::25]]
    return cases


def operand(rows: int, cols: int, transposed: bool, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A rows x cols operand, stored transposed (a transposed view of a cols x rows tensor) if asked."""
    if transposed:
        return torch.randn(cols, rows, dtype=dtype, device=device).t()
    return torch.randn(rows, cols, dtype=dtype, device=device)


def gemms(bench: Bench, out: Path, dry: bool) -> None:
    fields = ["set", "m", "n", "k", "trans_a", "trans_b", "dtype", "graph_ms", "cold_ms", "host_ms", "tflops_graph",
              "tflops_cold"]
    table = Table(out / "gemm.csv", fields)
    cases = gemm_cases(dry)
    for index, case in enumerate(cases):
        if bench.left_s() < 60:
            bench.log(f"gemm: out of time after {index} of {len(cases)} cases")
            break
        torch.backends.cuda.matmul.allow_tf32 = case["dtype"] == "tf32"
        dtype = DTYPES[case["dtype"]]
        a = operand(case["m"], case["k"], case["trans_a"], dtype, bench.device)
        b = operand(case["k"], case["n"], case["trans_b"], dtype, bench.device)
        c = torch.empty(case["m"], case["n"], dtype=dtype, device=bench.device)
        times = timed_case(bench, lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))
        flops = 2.0 * case["m"] * case["n"] * case["k"]
        table.add({**case, **times, "tflops_graph": flops / (times["graph_ms"] * 1e-3) / 1e12,
                   "tflops_cold": flops / (times["cold_ms"] * 1e-3) / 1e12})
        del a, b, c
    torch.backends.cuda.matmul.allow_tf32 = False
    table.close()
    bench.log(f"gemm: {table.rows} cases")


def gemm_kernels(bench: Bench, out: Path, dry: bool) -> None:
    """The kernels cuBLAS picks for the fp16 GEMMs of :func:`gemm_cases` and the concurrency
    sections, with their grids: the library's choice of tile, cluster and split against the SMs,
    which gpusim's heuristic follows on the shapes whose tiles were known (docs/validation-log.md, stop
    22) and guesses on the rest (skinny GEMMs, split-K counts).  Each GEMM is
    replayed from a CUDA graph and profiled once (about a second a case)."""
    table = Table(out / "gemm_kernels.csv", ["set", "m", "n", "k", "trans_a", "trans_b", "kernel", "name", "grid",
                                             "block", "duration_us"])
    cases = [case for case in gemm_cases(dry) if case["dtype"] == "fp16"]
    cases += [{"set": "concurrency", "m": m, "n": n, "k": k, "trans_a": False, "trans_b": False, "dtype": "fp16"}
              for m, n, k in CONCURRENT_GEMMS]
    for index, case in enumerate(cases):
        if bench.left_s() < 30:
            bench.log(f"gemm_kernels: out of time after {index} of {len(cases)} cases")
            break
        a = operand(case["m"], case["k"], case["trans_a"], torch.float16, bench.device)
        b = operand(case["k"], case["n"], case["trans_b"], torch.float16, bench.device)
        c = torch.empty(case["m"], case["n"], dtype=torch.float16, device=bench.device)
        for number, kernel in enumerate(graph_kernels(bench, lambda a=a, b=b, c=c: torch.matmul(a, b, out=c),
                                                      flush=False)):
            table.add({key: case[key] for key in ("set", "m", "n", "k", "trans_a", "trans_b")}
                      | {"kernel": number, "name": kernel["name"][:200], "grid": "x".join(map(str, kernel["grid"])),
                         "block": "x".join(map(str, kernel["block"])), "duration_us": kernel["dur"]})
        del a, b, c
    table.close()
    bench.log(f"gemm_kernels: {table.rows} kernels")


VECTOR_PRODUCTS = (
    # (label, batch, m, n, k, bias): a decoding step's attention against an odd and an even cache
    # length, and one token through linear layers with and without a bias
    ("qk_odd", 192, 1, 3073, 128, False),
    ("qk_even", 192, 1, 3072, 128, False),
    ("av_odd", 192, 1, 128, 3073, False),
    ("av_even", 192, 1, 128, 3072, False),
    ("linear", 1, 1, 7680, 2560, False),
    ("linear_bias", 1, 1, 7680, 2560, True),
    ("linear", 1, 1, 16384, 4096, False),
    ("linear_bias", 1, 1, 16384, 4096, True),
    ("linear", 1, 2, 16384, 4096, False),
    # weights narrow and deep, whose K cuBLAS splits, and their wide twins (vidur's Llama-2-7B and
    # phi-2 layers at 1-64 tokens, docs/validation.md "Skinny weight-streaming GEMMs on Hopper")
    *[("linear", 1, tokens, n, k, False) for tokens in (1, 16, 64)
      for n, k in ((4096, 4096), (4096, 11008), (22016, 4096), (2560, 2560), (2560, 10240), (10240, 2560))],
)
"""One-row and few-row products: which kernels the BLAS runs for them (GEMV or tiles,
``gemv_kernels`` in the presets; split K or not) and how fast they stream their matrix.  The batched
ones multiply by ``B [k, n]`` (a ``bmm``), the others by ``W [n, k]`` (``F.linear``, gpusim's
``trans_b``)."""


def vector_products(bench: Bench, out: Path, dry: bool) -> None:
    """:data:`VECTOR_PRODUCTS` as ``torch.bmm`` (batch > 1) or ``F.linear``: the times of
    :func:`timed_case` and, from one CUDA-graph replay after an L2 flush, each kernel's name, grid
    and duration (``vector_products.csv``, one row per kernel)."""
    table = Table(out / "vector_products.csv", ["label", "batch", "m", "n", "k", "bias", "graph_ms", "cold_ms",
                                                 "host_ms", "kernel", "name", "grid", "block", "duration_us"])
    scale = 16 if dry else 1
    for label, batch, m, n, k, bias in VECTOR_PRODUCTS:
        if bench.left_s() < 20:
            bench.log(f"vector_products: out of time at {label}")
            break
        n, k = max(1, n // scale), max(1, k // scale)
        if batch > 1:
            a = torch.randn(batch, m, k, dtype=torch.float16, device=bench.device)
            b = torch.randn(batch, k, n, dtype=torch.float16, device=bench.device)

            def call(a=a, b=b) -> torch.Tensor:
                return torch.bmm(a, b)
        else:
            x = torch.randn(m, k, dtype=torch.float16, device=bench.device)
            w = torch.randn(n, k, dtype=torch.float16, device=bench.device)
            c = torch.randn(n, dtype=torch.float16, device=bench.device) if bias else None

            def call(x=x, w=w, c=c) -> torch.Tensor:
                return torch.nn.functional.linear(x, w, c)
        times = timed_case(bench, call)
        case = {"label": label, "batch": batch, "m": m, "n": n, "k": k, "bias": bias, **times}
        for number, kernel in enumerate(graph_kernels(bench, call, flush=True)):
            table.add(case | {"kernel": number, "name": kernel["name"][:200],
                              "grid": "x".join(map(str, kernel["grid"])),
                              "block": "x".join(map(str, kernel["block"])), "duration_us": kernel["dur"]})
    table.close()
    bench.log(f"vector_products: {table.rows} kernels")


ATTENTION_CASES = (
    # (label, batch, heads, kv_heads, q_len, kv_len, head_dim, causal): prompts of 512-16384 tokens
    # at head dimensions 64 and 128, causal and not, and decoding steps with grouped keys
    *[("prompt", 16384 // seq, 16, 16, seq, seq, dim, causal)
      for seq in (512, 2048, 8192, 16384) for dim in (64, 128) for causal in (False, True)],
    ("decode", 1, 32, 32, 1, 8192, 128, False),
    ("decode", 8, 32, 32, 1, 4096, 128, False),
    ("decode_gqa", 8, 32, 8, 1, 4096, 128, False),
    ("decode_gqa", 64, 32, 8, 1, 1024, 128, False),
)
"""Fused attention calls for gpusim's ``ops.Attention`` (FlashAttention-2's kernels).  A decoding
step's one query sees every cached key, so it has no mask (SDPA would align a causal mask at the
first key when the lengths differ)."""


def attention(bench: Bench, out: Path, dry: bool) -> None:
    """:data:`ATTENTION_CASES` through ``F.scaled_dot_product_attention`` with the flash backend,
    forward and (prompts) backward: the times of :func:`timed_case` and, from one CUDA-graph replay
    after an L2 flush, each kernel's name, grid and duration (``attention.csv``, one row per kernel).
    The tensors are ``[batch, seq, heads, head_dim]`` viewed as SDPA's ``[batch, heads, seq, head_dim]``."""
    table = Table(out / "attention.csv", ["label", "direction", "batch", "heads", "kv_heads", "q_len", "kv_len",
                                          "head_dim", "causal", "graph_ms", "cold_ms", "host_ms", "kernel", "name",
                                          "grid", "block", "duration_us"])
    scale = 32 if dry else 1
    dtype = torch.float32 if dry else torch.float16
    for label, batch, heads, kv_heads, q_len, kv_len, dim, causal in ATTENTION_CASES:
        if bench.left_s() < 30:
            bench.log(f"attention: out of time at {label} {q_len}x{kv_len}x{dim}")
            break
        q_len, kv_len = max(1, q_len // scale), max(1, kv_len // scale)
        training = label == "prompt"
        leaves = [torch.randn(batch, seq, count, dim, dtype=dtype, device=bench.device, requires_grad=training)
                  for seq, count in ((q_len, heads), (kv_len, kv_heads), (kv_len, kv_heads))]
        q, k, v = (leaf.transpose(1, 2) for leaf in leaves)
        backend = torch.nn.attention.SDPBackend.MATH if dry else torch.nn.attention.SDPBackend.FLASH_ATTENTION

        def attend(q=q, k=k, v=v, causal=causal, grouped=kv_heads < heads, backend=backend) -> torch.Tensor:
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped)

        def forward(attend=attend) -> torch.Tensor:
            with torch.no_grad():
                return attend()

        calls = [("forward", forward)]
        if training:
            output = attend()
            grad = torch.randn_like(output)

            def backward(output=output, grad=grad, leaves=leaves) -> None:
                torch.autograd.grad(output, leaves, grad, retain_graph=True)

            calls.append(("backward", backward))
        for direction, call in calls:
            if direction == "forward":
                times = timed_case(bench, call)
                kernels = graph_kernels(bench, call, flush=True)
            else:  # autograd is not captured in a graph: cold and host times, the kernels profiled eagerly
                call()
                times = {"graph_ms": math.nan, "cold_ms": bench.cold_ms(call, 5), "host_ms": bench.host_ms(call, 5)}
                kernels = bench.profile_kernels(call)
            case = {"label": label, "direction": direction, "batch": batch, "heads": heads, "kv_heads": kv_heads,
                    "q_len": q_len, "kv_len": kv_len, "head_dim": dim, "causal": causal, **times}
            for number, kernel in enumerate(kernels):
                table.add(case | {"kernel": number, "name": kernel["name"][:200],
                                  "grid": "x".join(map(str, kernel["grid"])),
                                  "block": "x".join(map(str, kernel["block"])), "duration_us": kernel["dur"]})
        del q, k, v, leaves
    table.close()
    bench.log(f"attention: {table.rows} kernels")


# -- element-wise and row reductions -------------------------------------------------------------
ELEMENTWISE: dict[str, tuple[int, Callable]] = {
    # kind (gpusim's ELEMENTWISE_KINDS) -> (inputs, function of the inputs)
    "copy": (1, lambda x, out: out.copy_(x)),
    "fill": (0, lambda out: out.fill_(1.0)),
    "add": (2, lambda x, y, out: torch.add(x, y, out=out)),
    "mul": (2, lambda x, y, out: torch.mul(x, y, out=out)),
    "scale": (1, lambda x, out: torch.mul(x, 0.5, out=out)),
    "relu": (1, lambda x, out: torch.clamp_min(x, 0.0, out=out)),
    "gelu": (1, lambda x, out: torch.ops.aten.gelu.out(x, approximate="tanh", out=out)),
    "sigmoid": (1, lambda x, out: torch.sigmoid(x, out=out)),
    "tanh": (1, lambda x, out: torch.tanh(x, out=out)),
}


PROFILED_SHAPES = ((4096, 4096), (4096, 32768), (64, 64))
"""Row-reduction shapes whose kernels are counted (the profiler costs about a second a case)."""


def streaming(bench: Bench, out: Path, dry: bool) -> None:
    fields = ["op", "kind", "elements", "rows", "cols", "dtype", "graph_ms", "cold_ms", "host_ms", "kernels",
              "gb_per_s_graph"]
    table = Table(out / "streaming.csv", fields)
    largest = 14 if dry else 30
    for kind, (inputs, function) in ELEMENTWISE.items():
        exponents = range(10, largest + 1) if kind in ("copy", "add") else range(10, largest + 1, 2)
        for dtype_name in ("fp16", "fp32") if kind in ("copy", "add") else ("fp16",):
            for exponent in exponents:
                if bench.left_s() < 60:
                    bench.log(f"streaming: out of time at {kind} 2^{exponent}")
                    table.close()
                    return
                elements = 2**exponent
                dtype = DTYPES[dtype_name]
                args = [torch.randn(elements, dtype=dtype, device=bench.device) for _ in range(inputs)]
                result = torch.empty(elements, dtype=dtype, device=bench.device)

                def run(args=args, result=result, function=function) -> None:
                    function(*args, result)

                times = timed_case(bench, run)
                kernels = len(bench.profile_kernels(run)) if exponent == 20 else ""
                moved = (inputs + 1) * elements * dtype.itemsize
                table.add({"op": "elementwise", "kind": kind, "elements": elements, "rows": "", "cols": "",
                           "dtype": dtype_name, **times, "kernels": kernels,
                           "gb_per_s_graph": moved / (times["graph_ms"] * 1e-3) / 1e9})
                del args, result
    shapes = []
    with open(MEASURED / "llmcompass_mi210_softmax_fp16.csv") as handle:
        shapes = [(int(row["m"]), int(row["n"])) for row in csv.DictReader(handle)]
    shapes += [(16384, 1024), (8192, 12288), (1024, 65536)]
    if dry:
        shapes = [(min(m, 64), min(n, 64)) for m, n in shapes[::6]]
    for m, n in shapes:
        x = torch.randn(m, n, dtype=torch.float16, device=bench.device)
        weight = torch.randn(n, dtype=torch.float16, device=bench.device)
        bias = torch.randn(n, dtype=torch.float16, device=bench.device)
        reductions = {
            "softmax": (lambda x=x: torch.softmax(x, dim=-1), 2),
            "layernorm": (lambda x=x, w=weight, b=bias: F.layer_norm(x, (x.shape[-1],), w, b), 2),
            "rmsnorm": (lambda x=x, w=weight: F.rms_norm(x, (x.shape[-1],), w), 2),
            "sum": (lambda x=x: x.sum(dim=-1), 1),
        }
        for kind, (run, passes) in reductions.items():
            if bench.left_s() < 60:
                bench.log(f"streaming: out of time at {kind} {m}x{n}")
                table.close()
                return
            times = timed_case(bench, run)
            kernels = len(bench.profile_kernels(run)) if (m, n) in PROFILED_SHAPES else ""
            moved = passes * m * n * 2
            table.add({"op": "rowreduce", "kind": kind, "elements": m * n, "rows": m, "cols": n, "dtype": "fp16",
                       **times, "kernels": kernels, "gb_per_s_graph": moved / (times["graph_ms"] * 1e-3) / 1e9})
        del x
    table.close()
    bench.log(f"streaming: {table.rows} cases")


# -- memory bandwidth by access kind --------------------------------------------------------------
def memory(bench: Bench, out: Path, dry: bool) -> None:
    """Read-only (a sum), write-only (a fill) and read-write (a copy) streams from 1 MiB to 4 GiB:
    the L2's and the HBM's bandwidth for each kind of access."""
    table = Table(out / "memory.csv", ["access", "bytes", "graph_ms", "cold_ms", "host_ms", "tb_per_s_graph",
                                       "tb_per_s_cold"])
    largest = 22 if dry else 32
    for exponent in range(20, largest + 1):
        elements = 2**exponent // 4
        source = torch.randn(elements, dtype=torch.float32, device=bench.device)
        target = torch.empty_like(source)
        cases = {"read": (lambda x=source: torch.sum(x), 1),
                 "write": (lambda y=target: y.fill_(1.0), 1),
                 "read_write": (lambda x=source, y=target: torch.add(x, 1.0, out=y), 2)}
        for access, (run, tensors) in cases.items():
            if bench.left_s() < 60:
                bench.log(f"memory: out of time at {access} 2^{exponent} B")
                table.close()
                return
            times = timed_case(bench, run)
            moved = tensors * 2**exponent
            table.add({"access": access, "bytes": 2**exponent, **times,
                       "tb_per_s_graph": moved / (times["graph_ms"] * 1e-3) / 1e12,
                       "tb_per_s_cold": moved / (times["cold_ms"] * 1e-3) / 1e12})
        del source, target
    table.close()
    bench.log(f"memory: {table.rows} cases")


# -- what the cold method's flush leaves behind ---------------------------------------------------------
FLUSH_IDLE_CYCLES = 2_000_000
"""GPU cycles of ``torch.cuda._sleep`` between the flush and the timed call in the ``idle`` method
(about 1 ms: longer than any write-back the flush could leave)."""


def flush_residue(bench: Bench, out: Path, dry: bool) -> None:
    """Whether the cold method's 512 MiB write leaves work behind in the L2 that the next call pays for.
    Each call is timed between two events right after one of four preparations: ``write`` (the
    cold method's fill), ``write_idle`` (the fill, then the GPU sleeps before the first event),
    ``read`` (a sum over the flush buffer: evicts the call's data but leaves no dirty line) and
    ``none`` (the call right after itself). A read-only call (a sum, a skinny GEMM) that is slower
    after ``write`` than after ``write_idle`` and ``read`` pays for a write-back backlog; a write-only
    call tells whether the L2 absorbs writes when no backlog is pending."""
    table = Table(out / "flush_residue.csv", ["call", "bytes", "preparation", "ms"])
    scale = 2**-8 if dry else 1
    source = torch.randn(int(64 * 2**20 * scale), dtype=torch.float32, device=bench.device)
    target = torch.empty_like(source)
    small = torch.empty(int(4 * 2**20 * scale), dtype=torch.float32, device=bench.device)
    rows = max(16, int(7680 * scale))
    weight = torch.randn(rows, 2560, dtype=torch.float16, device=bench.device)
    tokens = torch.randn(16, 2560, dtype=torch.float16, device=bench.device)
    calls = {"sum_256mib": (lambda: torch.sum(source), source.numel() * 4),
             "gemm_7680x16x2560": (lambda: torch.matmul(tokens, weight.t()), weight.numel() * 2),
             "fill_256mib": (lambda: target.fill_(1.0), target.numel() * 4),
             "fill_16mib": (lambda: small.fill_(1.0), small.numel() * 4),
             "copy_256mib": (lambda: torch.add(source, 1.0, out=target), 2 * source.numel() * 4)}

    def prepare(how: str) -> None:
        if how in ("write", "write_idle"):
            bench.flush.fill_(1.0)
            if how == "write_idle" and bench.cuda:
                torch.cuda._sleep(FLUSH_IDLE_CYCLES)
        elif how == "read":
            torch.sum(bench.flush)

    for name, (call, nbytes) in calls.items():
        call()
        for how in ("write", "write_idle", "read", "none"):
            if bench.left_s() < 30:
                bench.log(f"flush_residue: out of time at {name} {how}")
                table.close()
                return
            ms = bench.after_ms(lambda how=how: prepare(how), call, 10)
            table.add({"call": name, "bytes": nbytes, "preparation": how, "ms": ms})
    table.close()
    bench.log(f"flush_residue: {table.rows} cases")


# -- the L2's effective capacity ---------------------------------------------------------------------
L2_FOOTPRINTS_MIB = (4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80, 96, 128, 192, 256)
"""Working sets of the L2 sweep (MiB): fine steps around the 50 MB (H100) and 60 MiB (H200) L2s."""


def l2_capacity(bench: Bench, out: Path, dry: bool) -> None:
    """The same buffer read and written back (an in-place scale) and read only (row sums of 2048
    values), over and over from a CUDA graph, for working sets from 4 MiB to 256 MiB: where the
    per-call bandwidth falls from the L2's to the HBM's is the capacity the L2 holds for data that
    every SM touches."""
    table = Table(out / "l2.csv", ["access", "bytes", "graph_ms", "cold_ms", "host_ms", "tb_per_s_graph",
                                   "tb_per_s_cold"])
    footprints = (1, 2) if dry else L2_FOOTPRINTS_MIB
    for mib in footprints:
        elements = mib * 2**20 // 4
        buffer = torch.randn(elements, dtype=torch.float32, device=bench.device)
        rows = buffer.view(-1, 2048)
        cases = {"read_write_inplace": (lambda x=buffer: x.mul_(1.0), 2),
                 "read_rowsum": (lambda x=rows: torch.sum(x, dim=1), 1)}
        for access, (run, passes) in cases.items():
            if bench.left_s() < 30:
                bench.log(f"l2: out of time at {access} {mib} MiB")
                table.close()
                return
            times = timed_case(bench, run)
            moved = passes * mib * 2**20
            table.add({"access": access, "bytes": mib * 2**20, **times,
                       "tb_per_s_graph": moved / (times["graph_ms"] * 1e-3) / 1e12,
                       "tb_per_s_cold": moved / (times["cold_ms"] * 1e-3) / 1e12})
        del buffer, rows
    table.close()
    bench.log(f"l2: {table.rows} cases")


# -- concurrent GEMMs -------------------------------------------------------------------------------
CONCURRENT_GEMMS = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                    (512, 4096, 4096), (128, 12288, 4096), (4096, 4096, 512), (16384, 1024, 1024),
                    (2048, 8192, 2048), (256, 256, 16384))
"""GEMM shapes (m, n, k; fp16, row-major, no transposes) run 1, 2, 4 and 8 at a time."""


def gemm_copies(bench: Bench, m: int, n: int, k: int, copies: int) -> list[tuple[torch.Tensor, ...]]:
    """``copies`` independent fp16 operand triples ``(a [m, k], b [k, n], c [m, n])`` of one GEMM."""
    return [(torch.randn(m, k, dtype=torch.float16, device=bench.device),
             torch.randn(k, n, dtype=torch.float16, device=bench.device),
             torch.empty(m, n, dtype=torch.float16, device=bench.device)) for _ in range(copies)]


def concurrency(bench: Bench, out: Path, dry: bool) -> None:
    """``count`` independent copies of a GEMM, one after another on one stream (sequential) and
    each on its own stream (concurrent, as a framework's Default), timed between two events on the
    launching stream; eager launches, so the host's per-call cost is in both."""
    table = Table(out / "concurrency.csv", ["m", "n", "k", "dtype", "count", "mode", "ms", "ms_min", "repeats"])
    shapes = [(64, 64, 64), (128, 128, 128)] if dry else CONCURRENT_GEMMS
    counts = (1, 2) if dry else (1, 2, 4, 8)
    streams = [torch.cuda.Stream() for _ in range(max(counts))] if bench.cuda else []
    for m, n, k in shapes:
        operands = gemm_copies(bench, m, n, k, max(counts))
        for count in counts:
            if bench.left_s() < 45:
                bench.log(f"concurrency: out of time at {m}x{n}x{k} x{count}")
                table.close()
                return
            for mode in ("sequential", "concurrent"):
                samples = []
                for repeat in range(12):
                    bench.flush.fill_(1.0)
                    if not bench.cuda:
                        start = time.perf_counter()
                        for a, b, c in operands[:count]:
                            torch.matmul(a, b, out=c)
                        samples.append((time.perf_counter() - start) * 1e3)
                        continue
                    main = torch.cuda.current_stream()
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record(main)
                    if mode == "sequential":
                        for a, b, c in operands[:count]:
                            torch.matmul(a, b, out=c)
                    else:
                        for stream, (a, b, c) in zip(streams, operands[:count]):
                            stream.wait_event(begin)
                            with torch.cuda.stream(stream):
                                torch.matmul(a, b, out=c)
                        for stream in streams[:count]:
                            main.wait_stream(stream)
                    end.record(main)
                    end.synchronize()
                    if repeat >= 2:  # the first two warm up the streams and the library
                        samples.append(begin.elapsed_time(end))
                table.add({"m": m, "n": n, "k": k, "dtype": "fp16", "count": count, "mode": mode,
                           "ms": statistics.median(samples), "ms_min": min(samples), "repeats": len(samples)})
        del operands
    table.close()
    bench.log(f"concurrency: {table.rows} cases")


def capture_graph(bench: Bench, work: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``work`` captured in a CUDA graph, after two eager calls on a side stream (PyTorch's warm-up
    before capture)."""
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        work()
        work()
    torch.cuda.current_stream().wait_stream(capture)
    bench.sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph


def concurrency_graph(bench: Bench, out: Path, dry: bool) -> None:
    """The ``concurrency`` section's GEMMs with every call captured in one CUDA graph (on one stream,
    or forked onto ``count`` streams and joined), so that the host's launches cost nothing: timed
    between two events around the graph's replay after the L2 flush.  For the concurrent graphs of
    the largest count the profiler also records when each kernel ran, to show how the GPU's
    dispatcher shares the SMs between concurrent kernels (``concurrency_graph_kernels.csv``)."""
    table = Table(out / "concurrency_graph.csv", ["m", "n", "k", "dtype", "count", "mode", "ms", "ms_min", "repeats"])
    kernels_table = Table(out / "concurrency_graph_kernels.csv", ["m", "n", "k", "count", "kernel", "name",
                                                                  "start_us", "duration_us"])
    shapes = [(64, 64, 64)] if dry else CONCURRENT_GEMMS
    counts = (1, 2) if dry else (1, 2, 4, 8)
    streams = [torch.cuda.Stream() for _ in range(max(counts))] if bench.cuda else []
    for m, n, k in shapes:
        operands = gemm_copies(bench, m, n, k, max(counts))
        for count in counts:
            if bench.left_s() < 45:
                bench.log(f"concurrency_graph: out of time at {m}x{n}x{k} x{count}")
                table.close()
                kernels_table.close()
                return
            for mode in ("sequential", "concurrent"):
                def work(mode=mode, count=count, operands=operands) -> None:
                    if mode == "sequential" or not bench.cuda:
                        for a, b, c in operands[:count]:
                            torch.matmul(a, b, out=c)
                        return
                    fork = torch.cuda.current_stream()
                    for stream, (a, b, c) in zip(streams, operands[:count]):
                        stream.wait_stream(fork)
                        with torch.cuda.stream(stream):
                            torch.matmul(a, b, out=c)
                    for stream in streams[:count]:
                        fork.wait_stream(stream)

                if not bench.cuda:
                    table.add({"m": m, "n": n, "k": k, "dtype": "fp16", "count": count, "mode": mode,
                               "ms": bench.host_ms(work, 3), "ms_min": math.nan, "repeats": 3})
                    continue
                graph = capture_graph(bench, work)
                samples = []
                for repeat in range(12):
                    bench.flush.fill_(1.0)
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    if repeat >= 2:
                        samples.append(begin.elapsed_time(end))
                table.add({"m": m, "n": n, "k": k, "dtype": "fp16", "count": count, "mode": mode,
                           "ms": statistics.median(samples), "ms_min": min(samples), "repeats": len(samples)})
                if mode == "concurrent" and count == max(counts):
                    bench.flush.fill_(1.0)
                    kernels = [e for e in bench.profile_kernels(graph.replay) if "fill" not in e["name"].lower()]
                    first = kernels[0]["ts"] if kernels else 0.0
                    for index, kernel in enumerate(kernels):
                        kernels_table.add({"m": m, "n": n, "k": k, "count": count, "kernel": index,
                                           "name": kernel["name"][:120], "start_us": kernel["ts"] - first,
                                           "duration_us": kernel["dur"]})
                del graph
        del operands
    table.close()
    kernels_table.close()
    bench.log(f"concurrency_graph: {table.rows} cases, {kernels_table.rows} profiled kernels")


# -- producer -> consumer chains and small reductions (stop 21) -------------------------------------
CHAIN_FOOTPRINTS_MIB = (4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64)
"""Tensor sizes of the chains (MiB): two of them live at once, so 20-32 MiB straddle the shared L2."""
CHAIN_LENGTH = 6
"""Kernels after the chain's start."""
REDUCTION_COST_CASES = (("sum", 4096, 32), ("sum", 32, 4096), ("sum", 1024, 4096), ("sum", 4096, 4096),
                        ("colsum", 4096, 768), ("colsum", 4096, 2304), ("colsum", 4096, 3072), ("colsum", 8, 393216),
                        ("layernorm", 4096, 32), ("rmsnorm", 4096, 32), ("layernorm", 4096, 768),
                        ("rmsnorm", 4096, 768), ("layernorm", 4096, 4096), ("rmsnorm", 4096, 4096), ("add", 4096, 32))
"""(kind, rows, cols) of the ``reduction_costs`` section, fp16."""


def graph_kernels(bench: Bench, work: Callable[[], None], flush: bool) -> list[dict]:
    """The kernels of one replay of ``work`` captured in a CUDA graph, after two replays that warm
    it (with ``flush``, the L2 is flushed before the profiled replay); eagerly on the CPU."""
    if not bench.cuda:
        return bench.profile_kernels(work)
    graph = capture_graph(bench, work)
    graph.replay()
    graph.replay()
    if flush:
        bench.flush.fill_(1.0)
    kernels = [e for e in bench.profile_kernels(graph.replay) if not (flush and "fill" in e["name"].lower())]
    del graph
    return kernels


def chains(bench: Bench, out: Path, dry: bool) -> None:
    """Out-of-place chains ``y1 = 2 x``, ``y2 = 2 y1``, ... of fp16 tensors, replayed from a CUDA
    graph without a flush: each kernel reads its predecessor's output while writing its own, so two
    tensors are live at once, and its duration says how much of the producer's output the L2 kept.
    The chain starts from a tensor or from the output of a GEMM of the same size (m x 1024 x 1024),
    whose tiles are written a few hundred bytes at a time."""
    table = Table(out / "chain.csv", ["start", "bytes", "kernel", "name", "duration_us"])
    for mib in (1,) if dry else CHAIN_FOOTPRINTS_MIB:
        elements = mib * 2**20 // 2
        tensors = [torch.randn(elements, dtype=torch.float16, device=bench.device) for _ in range(CHAIN_LENGTH + 1)]
        a = torch.randn(elements // 1024, 1024, dtype=torch.float16, device=bench.device)
        b = torch.randn(1024, 1024, dtype=torch.float16, device=bench.device)
        c = torch.empty(elements // 1024, 1024, dtype=torch.float16, device=bench.device)
        for start in ("tensor", "gemm"):
            if bench.left_s() < 30:
                bench.log(f"chain: out of time at {start} {mib} MiB")
                table.close()
                return

            def work(start=start, tensors=tensors, a=a, b=b, c=c) -> None:
                source = tensors[0]
                if start == "gemm":
                    torch.matmul(a, b, out=c)
                    source = c.view(-1)
                for target in tensors[1:]:
                    torch.mul(source, 2.0, out=target)
                    source = target

            for index, kernel in enumerate(graph_kernels(bench, work, flush=False)):
                table.add({"start": start, "bytes": mib * 2**20, "kernel": index, "name": kernel["name"][:120],
                           "duration_us": kernel["dur"]})
        del tensors, a, b, c
    table.close()
    bench.log(f"chain: {table.rows} kernels")


RESIDENCY_OUTPUT_MIB = (4, 8, 16, 24)
"""Output sizes of the ``gemm_residency`` section (MiB)."""
RESIDENCY_DEPTHS = (1024, 8192, 32768)
"""K of its GEMMs: weights of 2, 16 and 64 MiB streamed through the L2 while the output is written."""


def gemm_residency(bench: Bench, out: Path, dry: bool) -> None:
    """Does a GEMM's output stay in the L2 for the kernel after it when the GEMM streams large
    weights? ``y = x @ w`` (``m x k @ k x 1024``, fp16) then ``z = y + r`` with ``r`` a fresh
    tensor, replayed from a CUDA graph without a flush; the add's duration against the same add
    after a fill of ``y`` (its input warm) says how much of ``y`` the L2 kept. vidur's layer profiles
    time such adds (after a down projection of 52-90 MiB of weights) as if both inputs came from the
    HBM (docs/validation-log.md, stop 35)."""
    table = Table(out / "gemm_residency.csv", ["producer", "k", "bytes", "kernel", "name", "duration_us"])
    for mib in (1,) if dry else RESIDENCY_OUTPUT_MIB:
        rows = mib * 2**20 // 2 // 1024
        y = torch.empty(rows, 1024, dtype=torch.float16, device=bench.device)
        r = torch.randn(rows, 1024, dtype=torch.float16, device=bench.device)
        z = torch.empty(rows, 1024, dtype=torch.float16, device=bench.device)
        for k in (0, *((256,) if dry else RESIDENCY_DEPTHS)):
            if bench.left_s() < 30:
                bench.log(f"gemm_residency: out of time at {mib} MiB, k = {k}")
                table.close()
                return
            x = torch.randn(rows, max(k, 1), dtype=torch.float16, device=bench.device) if k else None
            w = torch.randn(max(k, 1), 1024, dtype=torch.float16, device=bench.device) if k else None

            def work(x=x, w=w, y=y, r=r, z=z) -> None:
                if x is None:
                    y.fill_(1.0)
                else:
                    torch.matmul(x, w, out=y)
                torch.add(y, r, out=z)

            for index, kernel in enumerate(graph_kernels(bench, work, flush=False)):
                table.add({"producer": "gemm" if k else "fill", "k": k, "bytes": mib * 2**20, "kernel": index,
                           "name": kernel["name"][:120], "duration_us": kernel["dur"]})
            del x, w
        del y, r, z
    table.close()
    bench.log(f"gemm_residency: {table.rows} kernels")


def reduction_call(kind: str, rows: int, cols: int, device: str) -> Callable[[], object]:
    """One call of a reduction (or ``add``, a tiny in-place add for reference) over a fresh random
    ``rows x cols`` fp16 tensor, with a weight (and bias) where the kind takes them."""
    x = torch.randn(rows, cols, dtype=torch.float16, device=device)
    weight = torch.randn(cols, dtype=torch.float16, device=device)
    bias = torch.randn(cols, dtype=torch.float16, device=device)
    return {"sum": lambda: x.sum(dim=1), "colsum": lambda: x.sum(dim=0), "softmax": lambda: torch.softmax(x, dim=-1),
            "layernorm": lambda: F.layer_norm(x, (cols,), weight, bias), "rmsnorm": lambda: F.rms_norm(x, (cols,), weight),
            "add": lambda: x.add_(1.0)}[kind]


def reduction_costs(bench: Bench, out: Path, dry: bool) -> None:
    """Reductions whose fixed costs the model lacks (docs/validation-log.md, stop 21): row sums of one and
    of 16 dependent loads per lane, GPT-2's column sums (bias gradients), layer norm beside RMS norm,
    and a tiny add for reference: graph, cold and host times, and each kernel's profiled duration in
    a graph replay after an L2 flush."""
    table = Table(out / "reduction_costs.csv", ["kind", "rows", "cols", "dtype", "graph_ms", "cold_ms", "host_ms",
                                                "kernel", "name", "duration_us"])
    cases = [(kind, min(rows, 64), min(cols, 64)) for kind, rows, cols in REDUCTION_COST_CASES] if dry \
        else REDUCTION_COST_CASES
    for kind, rows, cols in cases:
        if bench.left_s() < 30:
            bench.log(f"reduction_costs: out of time at {kind} {rows}x{cols}")
            break
        run = reduction_call(kind, rows, cols, bench.device)
        times = timed_case(bench, run)
        for index, kernel in enumerate(graph_kernels(bench, run, flush=True)):
            table.add({"kind": kind, "rows": rows, "cols": cols, "dtype": "fp16", **times, "kernel": index,
                       "name": kernel["name"][:120], "duration_us": kernel["dur"]})
    table.close()
    bench.log(f"reduction_costs: {table.rows} kernels")


REDUCTION_GRID_ROWS = (512, 1024, 2048, 4096, 8192, 16384)
REDUCTION_GRID = (
    [(kind, rows, cols) for kind in ("layernorm", "rmsnorm") for rows in REDUCTION_GRID_ROWS
     for cols in (32, 128, 512, 768, 1024, 2048, 4096)]
    + [("softmax", rows, cols) for rows in REDUCTION_GRID_ROWS for cols in (32, 128, 512, 1024)]
    + [("colsum", rows, cols) for rows in (64, 256, 1024, 4096, 16384) for cols in (768, 3072)]
)
"""(kind, rows, cols) of the ``reduction_grid`` section, fp16: rows and columns varied apart, so that
a kernel's cost per row (its block reduction) and per element separate."""


def reduction_grid(bench: Bench, out: Path, dry: bool) -> None:
    """Layer and RMS norms, softmax and column sums over :data:`REDUCTION_GRID`: each kernel's
    profiled duration in a graph replay after an L2 flush (``duration_us``, cold), and the per-call
    time of calls back to back from a CUDA graph (``graph_ms``, warm)."""
    table = Table(out / "reduction_grid.csv", ["kind", "rows", "cols", "dtype", "graph_ms", "kernel", "name",
                                               "grid", "block", "duration_us"])
    cases = [(kind, min(rows, 64), min(cols, 64)) for kind, rows, cols in REDUCTION_GRID[:4]] if dry else REDUCTION_GRID
    for kind, rows, cols in cases:
        if bench.left_s() < 20:
            bench.log(f"reduction_grid: out of time at {kind} {rows}x{cols}")
            break
        run = reduction_call(kind, rows, cols, bench.device)
        run()
        graph = bench.graph_ms(run, reps_for(bench.host_ms(run, 3) / 4, most=100), replays=3)
        for index, kernel in enumerate(graph_kernels(bench, run, flush=True)):
            table.add({"kind": kind, "rows": rows, "cols": cols, "dtype": "fp16", "graph_ms": graph, "kernel": index,
                       "name": kernel["name"][:120], "grid": "x".join(map(str, kernel["grid"])),
                       "block": "x".join(map(str, kernel["block"])), "duration_us": kernel["dur"]})
    table.close()
    bench.log(f"reduction_grid: {table.rows} kernels")


# -- optimizers -----------------------------------------------------------------------------------
def models(dry: bool) -> dict[str, list[tuple[int, ...]]]:
    """Parameter shapes of the optimizer models, from Hugging Face ``transformers`` (on the meta device)."""
    from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification

    configs = {
        "bert-base-classifier": (BertForSequenceClassification, BertConfig()),
        "bert-large": (BertForPreTraining, BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                      intermediate_size=4096)),
    }
    shapes = {}
    for name, (cls, config) in configs.items():
        if dry:
            config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                vocab_size=1000)
        with torch.device("meta"):
            model = cls(config)
        shapes[name] = [tuple(p.shape) for p in model.parameters()]
    return shapes


def optimizer_steps(params: list[torch.Tensor], algorithm: str, impl: str) -> Callable[[], None]:
    """One ``step()`` of ``algorithm`` over ``params`` in the implementation ``impl``."""
    cls, options = {"adam": (torch.optim.Adam, {"lr": 1e-6}), "adamw": (torch.optim.AdamW, {"lr": 1e-6}),
                    "sgd": (torch.optim.SGD, {"lr": 1e-6, "momentum": 0.9})}[algorithm]
    flags = {"unfused": {"foreach": False}, "fused": {"fused": True}, "multi_unfused": {"foreach": True},
             "multi_fused": {"fused": True}}[impl]
    if impl == "fused":  # one fused kernel per tensor: one single-tensor optimizer each
        optimizers = [cls([p], **options, **flags) for p in params]
    else:
        optimizers = [cls(params, **options, **flags)]

    def step() -> None:
        for optimizer in optimizers:
            optimizer.step()

    return step


def optimizers(bench: Bench, out: Path, shapes: dict[str, list[tuple[int, ...]]]) -> None:
    fields = ["model", "tensors", "parameters", "algorithm", "impl", "dtype", "step_ms", "step_min_ms",
              "kernels_per_step", "kernel_busy_ms", "kernel_span_ms"]
    table = Table(out / "optimizer.csv", fields)
    for model, model_shapes in shapes.items():
        params = [torch.randn(shape, dtype=torch.float32, device=bench.device) * 0.02 for shape in model_shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        for algorithm in ("adam", "adamw", "sgd"):
            for impl in ("unfused", "fused", "multi_unfused", "multi_fused"):
                if bench.left_s() < 45:
                    bench.log(f"optimizer: out of time at {model} {algorithm} {impl}")
                    table.close()
                    return
                if impl in ("fused", "multi_fused") and not bench.cuda:
                    continue
                try:
                    step = optimizer_steps(params, algorithm, impl)
                    for _ in range(3):
                        step()
                    bench.sync()
                    samples = [bench.host_ms(step, 1) for _ in range(10)]
                    kernels = bench.profile_kernels(step)
                except (RuntimeError, TypeError, ValueError) as error:  # an implementation this torch lacks
                    bench.log(f"optimizer: {model} {algorithm} {impl} failed: {error}")
                    continue
                span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) / 1e3 if kernels else math.nan
                table.add({"model": model, "tensors": len(params), "parameters": sum(p.numel() for p in params),
                           "algorithm": algorithm, "impl": impl, "dtype": "fp32",
                           "step_ms": statistics.median(samples), "step_min_ms": min(samples),
                           "kernels_per_step": len(kernels), "kernel_busy_ms": sum(k["dur"] for k in kernels) / 1e3,
                           "kernel_span_ms": span})
        del params
        if bench.cuda:
            torch.cuda.empty_cache()
    table.close()
    bench.log(f"optimizer: {table.rows} cases")


# -- a profiled training step ----------------------------------------------------------------------
def training_trace(bench: Bench, out: Path, dry: bool, name: str = "gpt2_train_step", **sizes: int) -> None:
    """A profiled forward + backward step of GPT-2 (``sizes``: GPT2Config fields, e.g. fewer layers)."""
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000) if dry else GPT2Config(**sizes)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(bench.device)
    if bench.cuda:
        model = model.half()
    batch, sequence = (2, 32) if dry else (8, 512)
    tokens = torch.randint(0, config.vocab_size, (batch, sequence), device=bench.device)

    def step() -> None:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    bench.sync()
    iteration_ms = bench.host_ms(step, 5)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.cuda else [])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        with profile(activities=activities, record_shapes=True,
                     schedule=schedule(wait=1, warmup=1, active=1, repeat=1)) as prof:
            for _ in range(3):
                step()
                bench.sync()
                prof.step()
        prof.export_chrome_trace(path)
        with open(path, "rb") as source, gzip.open(out / f"{name}.json.gz", "wb") as target:
            target.write(source.read())
    bench.log(f"trace {name}: GPT-2 {sizes or 'small'} fp16 forward+backward, batch {batch} x {sequence}: "
              f"{iteration_ms:.3f} ms per step")


# -- main -----------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting new cases after this long")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--sections", default="ceilings,launch,gemm,streaming,optimizer,trace")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "log.txt", "a")

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        log("no CUDA device")
        return 1
    torch.manual_seed(0)
    bench = Bench(device, time.monotonic() + args.budget_s, log)
    env: dict = {"python": sys.version, "platform": platform.platform(), "torch": torch.__version__,
                 "cuda": torch.version.cuda, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if bench.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update({"device": props.name, "multiprocessors": props.multi_processor_count,
                    "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None),
                    "capability": f"{props.major}.{props.minor}", "cudnn_version": torch.backends.cudnn.version(),
                    "nvidia_smi": nvidia_smi("--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                                             "power.limit,pstate --format=csv")})
    sections = args.sections.split(",")
    shapes: dict = {}

    def section(name: str, body: Callable[[], None]) -> None:
        if name not in sections:
            return
        log(f"{name}: start ({bench.left_s():.0f} s left)")
        try:
            body()
        except Exception:  # a failed section is logged; the others still run
            log(f"{name}: FAILED\n{traceback.format_exc()}")
        bench.sync()
        if bench.cuda:
            torch.cuda.empty_cache()

    def write_env() -> None:
        (args.out / "env.json").write_text(json.dumps(env, indent=1, default=str))

    def run_ceilings() -> None:
        env["ceilings"] = ceilings(bench, args.dry_run)
        log(f"ceilings: {env['ceilings']}")

    def run_models() -> None:
        shapes.update(models(args.dry_run))
        env["optimizer_models"] = {name: [list(shape) for shape in value] for name, value in shapes.items()}

    section("ceilings", run_ceilings)
    write_env()
    section("launch", lambda: launch(bench, args.out, args.dry_run))
    section("gemm", lambda: gemms(bench, args.out, args.dry_run))
    section("streaming", lambda: streaming(bench, args.out, args.dry_run))
    section("optimizer", run_models)
    write_env()
    if shapes:
        section("optimizer", lambda: optimizers(bench, args.out, shapes))
    section("trace", lambda: training_trace(bench, args.out, args.dry_run))
    section("memory", lambda: memory(bench, args.out, args.dry_run))
    section("flush_residue", lambda: flush_residue(bench, args.out, args.dry_run))
    section("concurrency", lambda: concurrency(bench, args.out, args.dry_run))
    section("small_trace", lambda: training_trace(bench, args.out, args.dry_run, name="gpt2_2layers_train_step",
                                                  n_layer=2, vocab_size=8192))
    section("l2", lambda: l2_capacity(bench, args.out, args.dry_run))
    section("concurrency_graph", lambda: concurrency_graph(bench, args.out, args.dry_run))
    section("chain", lambda: chains(bench, args.out, args.dry_run))
    section("gemm_residency", lambda: gemm_residency(bench, args.out, args.dry_run))
    section("reduction_costs", lambda: reduction_costs(bench, args.out, args.dry_run))
    section("gemm_kernels", lambda: gemm_kernels(bench, args.out, args.dry_run))
    section("reduction_grid", lambda: reduction_grid(bench, args.out, args.dry_run))
    section("vector_products", lambda: vector_products(bench, args.out, args.dry_run))
    section("attention", lambda: attention(bench, args.out, args.dry_run))
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
