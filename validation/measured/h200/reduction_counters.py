"""Nsight Compute counters of PyTorch's row-reduction kernels (softmax, layer and RMS norms) on a few
shapes, to test the model's picture of each kernel: registers and occupancy, instructions and global
loads per element, and what its warps stall on (this project; runs on the GPU machine, imports
nothing from gpusim).

Each case runs once untimed, then once inside ``torch.cuda.profiler`` start/stop, so that
``ncu --profile-from-start off`` profiles only that call (see the README beside this file).

Usage: ``ncu --profile-from-start off ... python3 reduction_counters.py`` (the full command is in the
README beside this file).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from measure import reduction_call

CASES = (
    [("softmax", 4096, cols) for cols in (1024, 2048, 4096, 8192, 16384)]
    + [("softmax", 1024, 4096), ("softmax", 16384, 4096)]
    + [(kind, rows, cols) for kind in ("layernorm", "rmsnorm")
       for rows, cols in ((4096, 32), (4096, 768), (4096, 4096), (32, 4096))]
    + [("add", 64, 64)]
)
"""(kind, rows, cols), fp16: the softmax's three kernels (warp softmax to 1024 values, the register
kernel to 8192, the looped one beyond) and the norms' short, medium and long rows."""


def profile_once(run: Callable[[], object], label: str, warmups: int = 1) -> None:
    """Call ``run`` ``warmups`` times untimed (compiling, tuning, warming), then once between
    ``torch.cuda.profiler`` start and stop (what ``ncu --profile-from-start off`` profiles); print ``label``."""
    for _ in range(warmups):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(label, flush=True)


def main() -> int:
    for kind, rows, cols in CASES:
        profile_once(reduction_call(kind, rows, cols, "cuda"), f"{kind} {rows}x{cols}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
