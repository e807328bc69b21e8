"""The larger GEMM kernel library a BLAS tuner searches, and the shortlist it benchmarks.

A BLAS library ships one kernel per GEMM size, picked by *tuning*: benchmarking many
implementations (macro tile, K depth, workgroup size, LDS buffering, split-K) and keeping the
fastest.  :data:`TUNING_LIBRARY` is that search space.  Its kernels differ in the resources that
decide how GEMMs share a GPU (dissertation section 7.2.1): larger tiles mean fewer workgroups and
less L2/DRAM traffic; fewer threads or single LDS buffering mean higher occupancy; together they
set how many *waves* a kernel needs.

Benchmarking every kernel by simulation is expensive, so a tuner here does what Tensile's
solution selection does with its own performance model: it ranks the candidates with the library
heuristic's estimate (:func:`gpusim.kernels.gemm.estimate_ns`) and benchmarks a shortlist
(:func:`shortlist`).  The simulation then decides which of them is fastest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpusim.config.gpu import GpuConfig
from gpusim.kernels.gemm import (
    ALIGNED_ROW_BYTES,
    FALLBACK_WIDTHS,
    GemmKernelSpec,
    GemmProblem,
    candidates,
    estimate_ns,
    for_operands,
    resident_workgroups,
)

TILES: tuple[tuple[int, int], ...] = (
    (256, 256), (256, 128), (128, 256), (256, 64), (64, 256), (128, 128), (128, 64), (64, 128),
    (128, 32), (32, 128), (64, 64), (64, 32), (32, 64), (32, 32), (64, 16), (16, 64),
)
"""Macro tiles ``(tile_m, tile_n)`` of the tuning library."""

TILE_DEPTHS = (16, 32, 64)
"""K depths staged in LDS per iteration (deeper: more LDS, but more bytes in flight per workgroup)."""

THREADS = (64, 128, 256, 512)
"""Workgroup sizes."""

MIN_OUTPUTS_PER_THREAD = 4
MAX_OUTPUTS_PER_THREAD = 256
"""A thread accumulates between this many outputs of the tile (fewer wastes threads, more does
not fit in registers)."""


def _library() -> tuple[GemmKernelSpec, ...]:
    specs = []
    for tile_m, tile_n in TILES:
        for tile_k in TILE_DEPTHS:
            for threads in THREADS:
                outputs = tile_m * tile_n // threads
                if not MIN_OUTPUTS_PER_THREAD <= outputs <= MAX_OUTPUTS_PER_THREAD:
                    continue
                for buffers in (2, 1):
                    specs.append(GemmKernelSpec(tile_m, tile_n, tile_k, threads, 1, buffers))
    return tuple(specs)


TUNING_LIBRARY: tuple[GemmKernelSpec, ...] = _library()
"""Every kernel the tuner may choose (without split-K; :func:`tuning_candidates` adds it)."""

_NAME = re.compile(r"^MT(\d+)x(\d+)x(\d+)_T(\d+)(?:_LB(\d+))?(?:_V(\d+))?(?:_SK(\d+))?$")


def parse_kernel(name: str) -> GemmKernelSpec:
    """The kernel called ``name`` (``MT128x64x32_T256``, optionally ``_LB1``, a fallback kernel's
    access width ``_V2`` and ``_SK4``).

    Raises
    ------
    ValueError
        When ``name`` is not a GEMM kernel name, or its access width is not one of
        :data:`gpusim.kernels.gemm.FALLBACK_WIDTHS`.
    """
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"GEMM kernel name {name!r} must look like "
                         "MT<tile_m>x<tile_n>x<tile_k>_T<threads>[_LB<buffers>][_V<access bytes>][_SK<splits>]")
    tile_m, tile_n, tile_k, threads = (int(group) for group in match.groups()[:4])
    buffers = int(match.group(5) or 2)
    vector = int(match.group(6) or ALIGNED_ROW_BYTES)
    if match.group(6) and vector not in FALLBACK_WIDTHS:
        raise ValueError(f"GEMM kernel name {name!r}: a fallback kernel's access width _V<bytes> is one of "
                         f"{', '.join(map(str, FALLBACK_WIDTHS))}, not {vector}")
    split = int(match.group(7) or 1)
    return GemmKernelSpec(tile_m, tile_n, tile_k, threads, split, buffers, vector)


def tuning_candidates(problem: GemmProblem, gpu: GpuConfig) -> list[GemmKernelSpec]:
    """Every tuning-library kernel (with sensible split-K factors), as ``gpu`` runs it on the
    operands' rows (:func:`gpusim.kernels.gemm.for_operands`), whose workgroup fits a CU of ``gpu``."""
    kernels = (for_operands(spec, problem, gpu) for spec in TUNING_LIBRARY)
    fits = [spec for spec in kernels if resident_workgroups(spec, problem.dtype, gpu) > 0]
    return candidates(problem, fits)


def shortlist(problem: GemmProblem, gpu: GpuConfig, count: int = 3, include: Iterable[GemmKernelSpec] = ()) -> list[GemmKernelSpec]:
    """The kernels a tuner benchmarks for ``problem`` on ``gpu``: the ``count`` best by the estimate.

    Kernels are ranked by :func:`gpusim.kernels.gemm.estimate_ns`; kernels the estimate cannot
    tell apart (same estimate, tile area, split-K and occupancy, e.g. a transposed tile or a larger
    workgroup) count once, so the shortlist spans different trade-offs.  ``include`` (e.g. the
    library heuristic's pick) is always benchmarked too.

    Parameters
    ----------
    problem
        The GEMM.
    gpu
        The GPU (or resource-constrained GPU) the kernels are tuned for.
    count
        Distinct kernels to benchmark besides ``include``.
    include
        Kernels benchmarked in any case.

    Returns
    -------
    list of GemmKernelSpec
        Without duplicates, best estimate first, then ``include``.
    """
    if count < 1:
        raise ValueError(f"shortlist: count must be at least 1, got {count}")
    options = tuning_candidates(problem, gpu)
    estimates = {spec: estimate_ns(problem, spec, gpu) for spec in options}
    ranked = sorted(options, key=lambda spec: (estimates[spec], -spec.tile_m * spec.tile_n, -spec.lds_buffers, spec.name))
    chosen: list[GemmKernelSpec] = []
    seen: set[tuple] = set()
    for spec in ranked:
        if len(chosen) == count:
            break
        twin = (round(estimates[spec], 1), spec.tile_m * spec.tile_n, spec.split_k,
                 resident_workgroups(spec, problem.dtype, gpu))
        if twin not in seen:
            seen.add(twin)
            chosen.append(spec)
    for spec in include:
        if spec not in chosen:
            chosen.append(spec)
    return chosen

