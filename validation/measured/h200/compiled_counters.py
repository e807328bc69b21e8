"""Nsight Compute counters of the Triton kernels ``torch.compile`` (Inductor) generates for layer
norms, a softmax and GeLU, and of PyTorch's eager element-wise kernels, row sum and long-row softmax (this
project; runs on the GPU machine, imports nothing from gpusim): the companion of
``reduction_counters.py``, for the kernels that script does not profile.

Each case is compiled (or warmed) and run once untimed, then once inside ``torch.cuda.profiler``
start/stop, so that ``ncu --profile-from-start off`` profiles only that call.

Usage: ``ncu --profile-from-start off ... python3 compiled_counters.py`` (see the README beside this file).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from reduction_counters import profile_once

COMPILED = (("layernorm", 4096, 32), ("layernorm", 4096, 768), ("layernorm", 4096, 4096), ("layernorm", 32, 4096),
            ("layernorm", 4096, 16384), ("softmax", 4096, 4096), ("gelu", 4096, 4096))
"""(kind, rows, cols), fp16, compiled: Inductor's persistent (up to 1024 values) and looped reductions."""
EAGER = (("gelu", 4096, 4096), ("add", 4096, 4096), ("sum", 4096, 4096), ("softmax", 4096, 32768),
         ("gelu_tanh", 4096, 4096), ("gelu_backward", 4096, 4096), ("sigmoid", 4096, 4096), ("tanh", 4096, 4096),
         ("relu", 4096, 4096), ("mul", 4096, 4096), ("copy", 4096, 4096), ("fill", 4096, 4096),
         ("fill_fp32", 4096, 4096))
"""(kind, rows, cols), fp16 (``fill_fp32``: fp32), eager: the element-wise kernels (the instructions per
element behind ``gpusim.kernels.elementwise.INSTRUCTION_MIXES``; added in stop 34, not yet run beyond
the first four), ``reduce_kernel`` and ``cunn_SoftMaxForward``."""


def call(kind: str, rows: int, cols: int) -> Callable[[], object]:
    """One call of ``kind`` over fresh random ``rows x cols`` fp16 tensors."""
    x = torch.randn(rows, cols, dtype=torch.float16, device="cuda")
    y = torch.randn(rows, cols, dtype=torch.float16, device="cuda")
    weight = torch.randn(cols, dtype=torch.float16, device="cuda")
    bias = torch.randn(cols, dtype=torch.float16, device="cuda")
    wide = torch.empty(rows, cols, dtype=torch.float32, device="cuda")
    return {"layernorm": lambda: F.layer_norm(x, (cols,), weight, bias), "softmax": lambda: torch.softmax(x, dim=-1),
            "gelu": lambda: F.gelu(x), "add": lambda: x + y, "sum": lambda: x.sum(dim=1),
            "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
            "gelu_backward": lambda: torch.ops.aten.gelu_backward(y, x), "sigmoid": lambda: torch.sigmoid(x),
            "tanh": lambda: torch.tanh(x), "relu": lambda: torch.relu(x), "mul": lambda: x * y,
            "copy": lambda: x.clone(), "fill": lambda: x.fill_(1.0), "fill_fp32": lambda: wide.fill_(1.0)}[kind]


def main() -> int:
    with torch.no_grad():  # twice untimed: compiling, autotuning, warming
        for kind, rows, cols in COMPILED:
            run = torch.compile(call(kind, rows, cols), dynamic=False)
            profile_once(run, f"compiled {kind} {rows}x{cols}", warmups=2)
        for kind, rows, cols in EAGER:
            profile_once(call(kind, rows, cols), f"eager {kind} {rows}x{cols}", warmups=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
