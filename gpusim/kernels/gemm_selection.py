"""How a GEMM's kernel is selected when its op names none (``gpu.gemm_selection``).

``heuristic``: the library heuristic's estimate (:func:`gpusim.kernels.gemm.choose_kernel`), as
cuBLAS and rocBLAS ship it.  The estimate does not see everything the simulation does (DRAM row
activations, how a last wave shares the CUs), so on what-if hardware it can pick a kernel that
runs slower than another of the library.

``tuned``: what a library tuned for this hardware would ship.  The heuristic's pick and the
:data:`TUNED_CANDIDATES` best-estimated other kernels of the GPU's library each run alone on one
GPU of this description (cold caches, the op's CUs), and the fastest is kept.  The picks are
remembered per GEMM shape, GPU description and CU count for the life of the process.
"""

from __future__ import annotations

from functools import lru_cache

from gpusim.config.gpu import GpuConfig
from gpusim.kernels.gemm import (
    GemmKernelSpec,
    GemmProblem,
    candidates,
    choose_kernel,
    estimate_ns,
    library_for,
)

TUNED_CANDIDATES = 4
"""Kernels benchmarked besides the heuristic's pick under ``tuned`` selection: the best by the
estimate, counting once kernels it cannot tell apart (the same estimate, tile area and K split:
a transposed tile or a deeper K-tile)."""


def select_kernel(problem: GemmProblem, gpu: GpuConfig, cus: int | None = None) -> GemmKernelSpec:
    """The kernel ``gpu``'s BLAS runs ``problem`` with on ``cus`` CUs (default: all), by
    ``gpu.gemm_selection``: the heuristic's pick, or the fastest of :func:`benchmarked_kernels`
    simulated alone."""
    if gpu.gemm_selection == "heuristic":
        return choose_kernel(problem, gpu, cus)
    return _tuned_kernel(problem, gpu.model_dump_json(), cus or gpu.num_cus)


def benchmarked_kernels(problem: GemmProblem, gpu: GpuConfig, cus: int | None = None) -> list[GemmKernelSpec]:
    """The kernels ``tuned`` selection simulates: the heuristic's pick, then the
    :data:`TUNED_CANDIDATES` best-estimated others of the library that ``gpu`` runs ``problem``'s
    operands with, kernels the estimate cannot tell apart counted once."""
    rated = gpu.as_rated()
    library = library_for(rated, problem.dtype, problem.row_alignment)
    estimates = {spec: estimate_ns(problem, spec, rated, cus) for spec in candidates(problem, library)}

    def trade_off(spec: GemmKernelSpec) -> tuple[float, int, int]:
        return estimates[spec], spec.tile_m * spec.tile_n, spec.split_k

    pick = choose_kernel(problem, gpu, cus)  # one of the same candidates
    kernels, seen = [pick], {trade_off(pick)}
    for spec in sorted(estimates, key=lambda spec: (estimates[spec], spec.name)):
        if len(kernels) > TUNED_CANDIDATES:
            break
        if trade_off(spec) not in seen:
            seen.add(trade_off(spec))
            kernels.append(spec)
    return kernels


def isolated_time_s(problem: GemmProblem, spec: GemmKernelSpec, gpu: GpuConfig, cus: int) -> float:
    """Time of ``problem`` with kernel ``spec`` alone on one GPU described by ``gpu``, on its
    first ``cus`` CUs, from a cold cache, s."""
    from gpusim import ops
    from gpusim.config.node import SystemConfig
    from gpusim.simulate import Stream, run
    from gpusim.system import System

    config = SystemConfig.model_validate({"name": f"{gpu.name}-gemm-tuning", "num_gpus": 1, "gpu": gpu})
    op = ops.Gemm(problem.m, problem.n, problem.k, dtype=problem.dtype, trans_a=problem.trans_a,
                  trans_b=problem.trans_b, batch=problem.batch, kernel=spec.name)
    stream = Stream("tuning", cu_mask=range(cus)) if cus < gpu.num_cus else "tuning"
    return run(System(config, config.name), [op], streams=[stream]).time_s


@lru_cache(maxsize=4096)
def _tuned_kernel(problem: GemmProblem, gpu_json: str, cus: int) -> GemmKernelSpec:
    """:func:`select_kernel`'s ``tuned`` pick, remembered per shape, GPU description (as JSON, so
    that it hashes) and CU count."""
    gpu = GpuConfig.model_validate_json(gpu_json)
    kernels = benchmarked_kernels(problem, gpu, cus)
    times = [isolated_time_s(problem, spec, gpu, cus) for spec in kernels]
    return kernels[times.index(min(times))]
