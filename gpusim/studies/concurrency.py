"""The concurrent-GEMM study (dissertation chapter 7): Default, GO-Kernels, GOLDYLOC, Oracle, partitions.

The study follows the dissertation's method (sections 7.3 and 7.4) with simulations in place of
measurements on an MI100:

1. *Tuning* — every GEMM shape is benchmarked in isolation with a shortlist of the tuning
   library's kernels (:mod:`gpusim.kernels.gemm_tuning`) on the full GPU (the fastest is the
   *isolation-tuned* kernel a BLAS library would ship) and on GPU/2 and GPU/4 (resource-constrained
   tuning, :func:`gpusim.sched.goldyloc.resource_constrained_overrides`).
2. *Degree benchmarks* — for each concurrency degree ``d`` the three winners run as ``d`` copies on
   ``d`` streams at once (the command processor dispatches them all); the fastest is the GO kernel
   of ``d``.  Two copies back to back on one stream give sequential execution.
3. *Partitions* — ``d`` copies with CU masks (CU-Partition) and one copy on a ``1/d`` resource
   partition (Resource-Partition).
4. *Predictor* — each shape's preferred degree (most speedup, or sequential below 5 %) labels
   min-max-normalised features; a multinomial logistic regression is trained and tested with
   10-fold cross-validation (90 % / 10 %), so every GEMM gets a prediction it was not trained on.
5. *Configurations* — per GEMM and number of available GEMMs ``D``: Sequential (``D`` back to
   back), Default (all ``D`` at once with isolation-tuned kernels), GO-Kernels (all ``D`` with the
   GO kernel of ``D``), GOLDYLOC (degree ``min(predicted, D)`` with its GO kernel, in ``D/d``
   batches, plus the command processor's decision time where the previous batch cannot hide it),
   Oracle (the degree up to ``D`` that runs them fastest, decision time included; sequential
   unless one gains 5 %), CU-Partition and Resource-Partition (isolation-tuned kernels).

Times are kernel execution spans (first workgroup start to last workgroup end), as a profiler
reports them; launch latencies are not part of them.  Every simulation is one point of
:func:`gpusim.sweep.sweep` (local processes or a Dask cluster), cached under a key that includes
the resolved hardware description and a hash of the simulator's source, so an interrupted study
resumes and a changed model is simulated again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpusim.checks import as_int, as_real, as_sequence, is_positive_int, known_name, one_of, positive_int, table_with
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import ConfigError
from gpusim.kernels.gemm import GemmProblem, choose_kernel, num_workgroups, resident_workgroups
from gpusim.kernels.gemm_tuning import parse_kernel, shortlist
from gpusim.ops import Gemm
from gpusim.sched.command_processor import (
    CommandProcessor,
    CommandProcessorTiming,
    DispatchAll,
    KernelPacket,
    PredictedDegree,
)
from gpusim.sched.executor import Stream
from gpusim.sched.goldyloc import (
    RC_FRACTIONS,
    ConcurrencyPredictor,
    cross_validated_predictions,
    executed_degree,
    fastest,
    feature_vector,
    go_kernels,
    preferred_degree,
    resource_constrained_overrides,
    waves,
)
from gpusim.sched.partitions import cu_masks, resource_partition_overrides
from gpusim.simulate import finish, prepare
from gpusim.studies.concurrency_workloads import check_gemms, with_shapes
from gpusim.sweep import sweep
from gpusim.system import System, load_system

DEGREES = (2, 4, 8, 16)
"""Numbers of available independent GEMMs (and concurrency degrees) studied: the degrees the
predictor chooses between besides sequential (:data:`gpusim.sched.goldyloc.DEGREES`), and the
only ones a study may use."""

ARRANGEMENTS = ("isolated", "sequential", "shared", "cu-partition")
"""How :func:`gemm_point` runs its copies."""

PACKET_POLICIES = ("sequential", "default", "go-kernels", "goldyloc")
"""Command-processor configurations of :func:`packets_point` (and :meth:`ConcurrencyStudy.mixes`)."""

CONFIGS = ("default", "go-kernels", "goldyloc", "oracle", "cu-partition", "resource-partition")
"""Configurations compared with Sequential in ``summary``."""

UNCHANGED_BAND = 0.02
"""GOLDYLOC counts as leaving a GEMM unchanged when within this fraction of Default."""

GO_PROPERTY_COLUMNS = ["shape", "degree", "isolated_kernel", "go_kernel", "waves_ratio", "l2_accesses_per_wave_ratio",
                       "l2_misses_per_wave_ratio"]
"""Columns of :meth:`ConcurrencyStudy.go_properties` (Fig. 7.12), one row per GEMM and degree whose GO kernel
differs from its isolation-tuned kernel."""
SIZE_TREND_SHAPES = ((4096, 128, 1024), (4096, 256, 1024), (4096, 512, 1024), (4096, 1024, 1024))
"""Fig. 7.1a's family, ``(m, n, k)``: M = 4K and K = 1K with N growing, FP32, no transposes.  Fig. 7.2
names its two smallest GEMMs (``4k_128_1K_00``, ``4k_256_1K_00``); the larger N are our reading of
"the size of GEMMs (particularly the dimension N) increasing from left to right"."""


# -- points ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _system(name: str, overrides: str) -> System:
    return load_system(name, json.loads(overrides))


def _gemm(m: int, n: int, k: int, trans_a: bool, trans_b: bool, batch: int, dtype: str, index: int) -> Gemm:
    return Gemm(m, n, k, dtype=dtype, trans_a=trans_a, trans_b=trans_b, batch=batch, a=f"a{index}", b=f"b{index}",
                out=f"c{index}")


def _spans(result) -> tuple[float, list[float]]:
    """Span of all kernels, and of each op's kernels (in op order), s."""
    kernels = result.kernels
    per_op = kernels.groupby("op_id", sort=True).agg(start=("start_s", "min"), end=("end_s", "max"))
    return float(kernels["end_s"].max() - kernels["start_s"].min()), list(per_op["end"] - per_op["start"])


def gemm_point(system: str, overrides: dict[str, Any], m: int, n: int, k: int, trans_a: bool, trans_b: bool, batch: int,
               dtype: str, kernel: str, copies: int, arrangement: str) -> dict[str, Any]:
    """Simulate ``copies`` independent copies of one GEMM with one kernel (a sweep point).

    Parameters
    ----------
    system, overrides
        Hardware preset and overrides.
    m, n, k, trans_a, trans_b, batch, dtype
        The GEMM shape.
    kernel
        Kernel name (:func:`gpusim.kernels.gemm_tuning.parse_kernel`).
    copies
        Number of GEMMs (each with its own tensors).
    arrangement
        ``isolated`` (one copy), ``sequential`` (copies back to back on one stream), ``shared``
        (one stream each, dispatched at once), ``cu-partition`` (one stream each, with disjoint
        CU masks).

    Returns
    -------
    dict
        ``span_s`` (first workgroup start to last workgroup end), ``first_s`` and ``next_s`` (span
        of the first copy and mean span of the others), ``l2_accesses``, ``l2_misses`` (blocks),
        ``dram_bytes``, ``events`` and ``cpu_s`` (simulator CPU time).
    """
    known_name("arrangement", arrangement, ARRANGEMENTS, "gemm_point")
    positive_int("copies", copies, "gemm_point")
    if arrangement == "isolated" and copies != 1:
        raise ConfigError(f"gemm_point: an isolated run has one copy, got copies={copies!r}")
    started = time.process_time()
    machine_system = _system(system, json.dumps(overrides, sort_keys=True))
    spec = parse_kernel(kernel)
    if arrangement == "sequential":
        streams = [Stream("s0")] * copies
    elif arrangement == "cu-partition":
        streams = [Stream(f"s{i}", mask) for i, mask in enumerate(cu_masks(machine_system.gpu.num_cus, copies))]
    else:
        streams = [Stream(f"s{i}") for i in range(copies)]
    packets = [KernelPacket(_gemm(m, n, k, trans_a, trans_b, batch, dtype, i), stream, {1: spec})
               for i, stream in enumerate(streams)]
    result = run_packets(machine_system, packets, DispatchAll())
    span, per_op = _spans(result)
    counters = result.counters
    return {
        "span_s": span,
        "first_s": per_op[0],
        "next_s": float(np.mean(per_op[1:])) if len(per_op) > 1 else per_op[0],
        "l2_accesses": counters.get("gpu0.l2_hits", 0.0) + counters.get("gpu0.l2_misses", 0.0),
        "l2_misses": counters.get("gpu0.l2_misses", 0.0),
        "dram_bytes": float(result.dram["bytes"].sum()) if not result.dram.empty else 0.0,
        "events": result.stats["events"],
        "cpu_s": time.process_time() - started,
    }


def packets_point(system: str, overrides: dict[str, Any], gemms: list[dict[str, Any]], policy: str,
                  timing: dict[str, float] | None = None) -> dict[str, Any]:
    """Simulate a mix of GEMMs through the command processor (a sweep point).

    Parameters
    ----------
    gemms
        Each ``{"m", "n", "k", "trans_a", "trans_b", "batch", "dtype", "copies", "kernels": {degree: name},
        "predicted"}``;
        every copy gets its own stream (except under ``sequential``).
    policy
        ``sequential`` (all copies in order on one stream, isolation-tuned kernels), ``default`` (all at once,
        isolation-tuned kernels), ``go-kernels`` (all at once, kernels
        for the resulting degree) or ``goldyloc`` (degree ``min(predicted, available)``).
    timing
        Fields of :class:`CommandProcessorTiming` (default: its defaults).

    Returns
    -------
    dict
        ``time_s`` (from the first decision to the last workgroup's end), ``span_s`` (kernels only),
        ``degrees`` (the degrees the GEMMs ran at), ``cpu_s``.
    """
    known_name("policy", policy, PACKET_POLICIES, "packets_point")
    started = time.process_time()
    machine_system = _system(system, json.dumps(overrides, sort_keys=True))
    policies = {
        "sequential": DispatchAll(),
        "default": DispatchAll(),
        "go-kernels": DispatchAll(tuned_for_degree=True),
        "goldyloc": PredictedDegree(lambda features: int(features[0])),
    }
    packets = []
    for gemm in gemms:
        kernels = {int(degree): parse_kernel(name) for degree, name in gemm["kernels"].items()}
        for _ in range(int(gemm["copies"])):
            index = len(packets)
            packets.append(KernelPacket(_gemm(gemm["m"], gemm["n"], gemm["k"], gemm["trans_a"], gemm["trans_b"], gemm["batch"],
                                              gemm["dtype"], index),
                                        Stream("s0" if policy == "sequential" else f"s{index}"), kernels,
                                        features=np.array([gemm.get("predicted", 1)])))
    result = run_packets(machine_system, packets, policies[policy], CommandProcessorTiming(**(timing or {})))
    span, _ = _spans(result)
    return {
        "time_s": float(result.kernels["end_s"].max()),
        "span_s": span,
        "degrees": ",".join(str(int(d)) for d in result.ops["degree"]),
        "cpu_s": time.process_time() - started,
    }


def run_packets(system: System, packets: Sequence[KernelPacket], policy, timing: CommandProcessorTiming | None = None,
                dispatch_policy: str | None = None):
    """Submit ``packets`` to GPU 0's command processor at time 0 and simulate them to the end.

    Returns
    -------
    gpusim.Result
    """
    started = time.perf_counter()
    system, sim, machine, executor = prepare(system, dispatch_policy=dispatch_policy)
    processor = CommandProcessor(executor, 0, policy, timing)
    for packet in packets:
        processor.submit(packet)
    return finish(system, sim, machine, executor, len(packets), started)


# -- the study ---------------------------------------------------------------------------------

def _distinct_integers(name: str, values: Any, fits: Callable[[int], bool], expected: str,
                       empty: bool = True) -> tuple[int, ...]:
    """``values`` (a list, tuple, range or array of distinct integers that each ``fits``) in order.

    Raises
    ------
    ConfigError
        Naming the :class:`ConcurrencyStudy` argument ``name``, the value and the ``expected``.
    """
    items = as_sequence(values)
    numbers = [as_int(value) for value in items] if items is not None else [None]
    if None in numbers or len(set(numbers)) != len(numbers) or not all(fits(n) for n in numbers) or (not numbers and not empty):
        raise ConfigError(f"ConcurrencyStudy: {name} must be {'' if empty else 'a non-empty list of '}{expected}, "
                          f"got {values!r}")
    return tuple(sorted(numbers))


def geomean(values) -> float:
    """Geometric mean."""
    values = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(values).mean())) if len(values) else float("nan")


@dataclass
class Measurements:
    """What the simulations of one GEMM set measured.

    Attributes
    ----------
    tuning
        Isolated runs: shape, rc (GPU/rc), kernel, span_s, l2_accesses, l2_misses, ...
    runs
        Concurrent, sequential and partitioned runs: shape, kind, degree, kernel, span_s, ...
    shapes
        One row per shape: isolation-tuned and RC-tuned kernels, GO kernel per degree, sequential
        time per degree (``seqD_s``), kernel spans of Default, GO-Kernels and the partitions per
        degree (``defaultD_s``, ``goD_s``, ``cu-partitionD_s``, ``resource-partitionD_s``), the
        predictor's ``features`` and the ``preferred`` degree.
    """

    tuning: pd.DataFrame
    runs: pd.DataFrame
    shapes: pd.DataFrame


@dataclass
class StudyResult:
    """The study's tables (DataFrames) and its predictor.

    Attributes
    ----------
    gemms
        The evaluated GEMMs (one row per GEMM of each app) with shape and label.
    shapes
        Per shape (evaluated and training): see :class:`Measurements`, plus the out-of-fold
        ``predicted`` degree and ``role``.
    speedups
        One row per evaluated GEMM, number of available GEMMs (``concurrency``) and configuration:
        speedup over Sequential and the degree executed.
    summary
        Geomean speedup over Sequential per concurrency and configuration, over the distinct
        evaluated GEMMs.
    per_app
        The same per application.
    predictor
        Predictor accuracy per number of available GEMMs (out-of-fold, all shapes).
    impact
        Share of GEMMs GOLDYLOC improves, leaves unchanged or degrades versus Default.
    go_properties
        GO kernel versus isolation-tuned kernel: ratios of waves and of L2 accesses and misses per
        wave (isolated runs on the full GPU).
    model
        The predictor trained on all shapes (for further GEMM sets).
    tuning, runs
        The raw measurements.
    cpu_s
        Simulator CPU time of all points (cached points count their original time).
    """

    gemms: pd.DataFrame
    shapes: pd.DataFrame
    speedups: pd.DataFrame
    summary: pd.DataFrame
    per_app: pd.DataFrame
    predictor: pd.DataFrame
    impact: pd.DataFrame
    go_properties: pd.DataFrame
    model: ConcurrencyPredictor
    tuning: pd.DataFrame
    runs: pd.DataFrame
    cpu_s: float = 0.0


def _splits(gpu, parts: int) -> bool:
    """Whether ``gpu`` splits into ``parts`` resource partitions (:func:`resource_partition_overrides`)."""
    try:
        resource_partition_overrides(gpu, parts)
    except ValueError:
        return False
    return True


class ConcurrencyStudy:
    """Runs the study's simulations through the sweep layer and assembles the results.

    Parameters
    ----------
    system, overrides
        Hardware preset (or YAML file) and overrides such as ``{"gpu.num_cus": 60}`` (the
        dissertation measured an MI100).
    degrees
        Numbers of available GEMMs / concurrency degrees, among :data:`DEGREES`.
    cu_partition_degrees, resource_partition_degrees
        Degrees at which CU-Partition and Resource-Partition are simulated, among ``degrees``
        (default: 2 and 4 where among ``degrees``, and every one of ``degrees`` that splits the GPU); a resource
        partition must divide the GPU's L2 banks and HBM channels.
    rc_fractions
        Resource-constrained tuning configurations GPU/``fraction``: distinct integers from 1 (the
        full GPU, which must be among them) to the GPU's CU count.
    shortlist_size
        Kernels benchmarked per shape and tuning configuration besides the library heuristic's (at
        least 1).
    timing
        The command processor's decision cost.
    workers, scheduler, cache, progress
        Passed to :func:`gpusim.sweep.sweep` (``workers``: a positive integer, or None for every
        CPU; ``scheduler``: a Dask scheduler address; ``cache``: a folder).

    Raises
    ------
    ConfigError
        An argument of the wrong type or out of range (the message names it, the value and what was
        expected), an unknown preset or a bad override.
    """

    def __init__(self, system: str | os.PathLike = "mi100", overrides: Mapping[str, Any] | None = None, *,
                 degrees: Sequence[int] = DEGREES, cu_partition_degrees: Sequence[int] | None = None,
                 resource_partition_degrees: Sequence[int] | None = None, rc_fractions: Sequence[int] = RC_FRACTIONS,
                 shortlist_size: int = 3, timing: CommandProcessorTiming | None = None, workers: int | None = None,
                 scheduler: str | None = None, cache: str | os.PathLike | None = None, progress: bool = True):
        if not isinstance(system, str | os.PathLike):
            raise ConfigError(f"ConcurrencyStudy: system must be a preset name or a YAML path, got {system!r}")
        if overrides is not None and not (isinstance(overrides, Mapping) and all(isinstance(key, str) for key in overrides)):
            raise ConfigError("ConcurrencyStudy: overrides must map setting paths to values, e.g. {'gpu.num_cus': 60}, "
                              f"got {overrides!r}")
        self.system = system
        self.overrides = dict(overrides or {})
        self.gpu = _system(system, json.dumps(self.overrides, sort_keys=True)).gpu
        cus = self.gpu.num_cus
        self.degrees = _distinct_integers("degrees", degrees, lambda d: d in DEGREES,
                                          f"distinct degrees among {', '.join(map(str, DEGREES))}", empty=False)
        among = f"distinct degrees among the study's degrees ({', '.join(map(str, self.degrees))})"
        self.cu_partition_degrees = _distinct_integers(
            "cu_partition_degrees", tuple(d for d in (2, 4) if d in self.degrees) if cu_partition_degrees is None
            else cu_partition_degrees, lambda d: d in self.degrees and d <= cus, f"{among}, at most the {cus} CUs")
        if resource_partition_degrees is None:  # the study's degrees that split this GPU
            resource_partition_degrees = tuple(d for d in self.degrees if _splits(self.gpu, d))
        self.resource_partition_degrees = _distinct_integers(
            "resource_partition_degrees", resource_partition_degrees, lambda d: d in self.degrees, among)
        for parts in self.resource_partition_degrees:
            try:
                resource_partition_overrides(self.gpu, parts)
            except ValueError as exc:
                raise ConfigError(f"ConcurrencyStudy: resource_partition_degrees: {exc}; leave {parts} out") from None
        self.rc_fractions = _distinct_integers("rc_fractions", rc_fractions, lambda rc: 1 <= rc <= cus,
                                               f"distinct integers from 1 to the {cus} CUs, 1 among them (the full GPU, "
                                               "for isolation tuning)", empty=False)
        if 1 not in self.rc_fractions:
            raise ConfigError(f"ConcurrencyStudy: rc_fractions must include 1 (the full GPU, for isolation tuning), "
                              f"got {rc_fractions!r}")
        positive_int("shortlist_size", shortlist_size, "ConcurrencyStudy")
        if timing is not None and not isinstance(timing, CommandProcessorTiming):
            raise ConfigError(f"ConcurrencyStudy: timing must be a CommandProcessorTiming or None, got {timing!r}")
        if workers is not None and not is_positive_int(workers):
            raise ConfigError(f"ConcurrencyStudy: workers must be a positive integer (or None for every CPU), got {workers!r}")
        if scheduler is not None and not isinstance(scheduler, str):
            raise ConfigError(f"ConcurrencyStudy: scheduler must be a Dask scheduler address such as tcp://host:8786, "
                              f"got {scheduler!r}")
        if cache is not None and (not isinstance(cache, str | os.PathLike) or Path(cache).is_file()):
            raise ConfigError(f"ConcurrencyStudy: cache must be a folder (existing or to be made), got {cache!r}")
        if not isinstance(progress, bool):
            raise ConfigError(f"ConcurrencyStudy: progress must be True or False, got {progress!r}")
        self.shortlist_size = int(shortlist_size)
        self.timing = timing or CommandProcessorTiming()
        self.workers = workers
        self.scheduler = scheduler
        self.cache = cache
        self.progress = progress
        self.cpu_s = 0.0

    # -- sweeps --------------------------------------------------------------------------------
    def simulate_points(self, fn: Callable, points: list[dict[str, Any]], description: str) -> pd.DataFrame:
        """Run ``fn`` on every point through the study's sweep (workers, scheduler, cache, progress)
        and add their simulator CPU time to :attr:`cpu_s`; one row per point."""
        if not points:
            return pd.DataFrame()
        frame = sweep(fn, points, workers=self.workers, scheduler=self.scheduler, cache=self.cache,
                      progress=self.progress, description=description)
        self.cpu_s += float(frame["cpu_s"].sum())
        return frame

    def _point(self, shape: Any, kernel: str, copies: int, arrangement: str,
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        merged = {**self.overrides, **(overrides or {})}
        return {
            "system": self.system, "overrides": merged, "m": int(shape["m"]), "n": int(shape["n"]), "k": int(shape["k"]),
            "trans_a": bool(shape["trans_a"]), "trans_b": bool(shape["trans_b"]), "batch": int(shape["batch"]),
            "dtype": str(shape["dtype"]), "kernel": kernel, "copies": int(copies),
            "arrangement": arrangement,
        }

    # -- measuring -----------------------------------------------------------------------------
    def tune(self, shapes: pd.DataFrame) -> pd.DataFrame:
        """Isolated runs of each shape's shortlist on GPU, GPU/2 and GPU/4."""
        points, tags = [], []
        for _, shape in shapes.iterrows():
            problem = _problem(shape)
            for rc in self.rc_fractions:
                overrides = resource_constrained_overrides(self.gpu, rc)
                gpu = _system(self.system, json.dumps({**self.overrides, **overrides}, sort_keys=True)).gpu
                for spec in shortlist(problem, gpu, self.shortlist_size, include=[choose_kernel(problem, gpu)]):
                    points.append(self._point(shape, spec.name, 1, "isolated", overrides))
                    tags.append({"shape": shape["shape"], "rc": rc})
        return _tagged(self.simulate_points(gemm_point, _by_cost(points), "tuning"), points, tags)

    def benchmark(self, shapes: pd.DataFrame, tuning: pd.DataFrame, partitions: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Degree benchmarks of the RC winners, sequential runs, partitions and isolated runs of every candidate.

        Returns the runs and ``tuning`` extended by full-GPU isolated runs of GO candidates that
        were tuned only on GPU/2 or GPU/4.
        """
        winners = _winners(tuning)
        tuned_full = set(zip(tuning.loc[tuning["rc"] == 1, "shape"], tuning.loc[tuning["rc"] == 1, "kernel"]))
        points, tags = [], []

        def add(shape, kernel, copies, arrangement, kind, degree, overrides=None):
            points.append(self._point(shape, kernel, copies, arrangement, overrides))
            tags.append({"shape": shape["shape"], "kind": kind, "degree": degree})

        for _, shape in shapes.iterrows():
            key = shape["shape"]
            isolated = winners[(key, 1)]
            add(shape, isolated, 2, "sequential", "sequential", 1)
            for kernel in sorted({winners[(key, rc)] for rc in self.rc_fractions}):
                for degree in self.degrees:
                    add(shape, kernel, degree, "shared", "shared", degree)
                if (key, kernel) not in tuned_full:
                    add(shape, kernel, 1, "isolated", "isolated", 1)
            if not partitions:
                continue
            for degree in self.cu_partition_degrees:
                add(shape, isolated, degree, "cu-partition", "cu-partition", degree)
            for degree in self.resource_partition_degrees:
                add(shape, isolated, 1, "isolated", "resource-partition", degree, resource_partition_overrides(self.gpu, degree))
        frame = _tagged(self.simulate_points(gemm_point, _by_cost(points), "concurrency"), points, tags)
        if frame.empty:
            return frame, tuning
        extra = frame[frame["kind"] == "isolated"].assign(rc=1)
        tuning = pd.concat([tuning, extra[[c for c in tuning.columns if c in extra.columns]]], ignore_index=True)
        return frame[frame["kind"] != "isolated"].reset_index(drop=True), tuning

    def assemble(self, shapes: pd.DataFrame, tuning: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
        """One row per shape: kernels, times per configuration and degree, features, preferred degree."""
        winners = _winners(tuning)
        by_shape = dict(tuple(runs.groupby("shape")))
        rows = []
        for _, shape in shapes.iterrows():
            key = shape["shape"]
            mine = by_shape[key]
            sequential = mine[mine["kind"] == "sequential"].iloc[0]
            shared = mine[mine["kind"] == "shared"]
            times = {(int(r.degree), r.kernel): float(r.span_s) for r in shared.itertuples()}
            isolated = winners[(key, 1)]
            go = go_kernels(times, isolated)
            row: dict[str, Any] = {"shape": key, "m": shape["m"], "n": shape["n"], "k": shape["k"],
                                   "trans_a": shape["trans_a"], "trans_b": shape["trans_b"], "batch": shape["batch"],
                                   "dtype": shape["dtype"], "flops": shape["flops"], "isolated_kernel": isolated,
                                   "first_s": sequential.first_s, "next_s": sequential.next_s}
            for rc in self.rc_fractions:
                row[f"rc{rc}_kernel"] = winners[(key, rc)]
            for degree in self.degrees:
                row[f"go{degree}_kernel"] = go[degree]
                row[f"default{degree}_s"] = times[(degree, isolated)]
                row[f"go{degree}_s"] = times[(degree, go[degree])]
                row[f"seq{degree}_s"] = sequential.first_s + (degree - 1) * sequential.next_s
            for kind in ("cu-partition", "resource-partition"):
                for r in mine[mine["kind"] == kind].itertuples():
                    row[f"{kind}{int(r.degree)}_s"] = float(r.span_s)
            row["preferred"] = preferred_degree(self.go_speedups(row))
            row["features"] = self.features(row)
            rows.append(row)
        return pd.DataFrame(rows)

    def measure(self, gemms: pd.DataFrame, partitions: bool = True) -> Measurements:
        """Tune, benchmark and assemble every shape of ``gemms`` (a frame of :func:`with_shapes`).

        Raises
        ------
        ConfigError
            ``gemms`` is not a non-empty table of GEMMs with shapes
            (:func:`gpusim.studies.concurrency_workloads.check_gemms`).
        """
        check_gemms(gemms, "ConcurrencyStudy.measure: gemms")
        if "shape" not in gemms or "flops" not in gemms:
            raise ConfigError("ConcurrencyStudy.measure: gemms needs 'shape' and 'flops' columns; pass with_shapes(gemms)")
        shapes = _unique_shapes(gemms)
        tuning = self.tune(shapes)
        runs, tuning = self.benchmark(shapes, tuning, partitions)
        return Measurements(tuning, runs, self.assemble(shapes, tuning, runs))

    # -- configurations ------------------------------------------------------------------------
    def features(self, row: Any) -> np.ndarray:
        """The predictor's features of a shape-table row (its dimensions and ``go{degree}_kernel``
        names): :func:`gpusim.sched.goldyloc.feature_vector` with each degree's GO kernel's
        workgroups, occupancy and waves on this study's GPU.  Also recomputes them from a
        ``shapes.csv``, which does not keep the array."""
        problem = _problem(row)
        kernel_stats = {}
        for degree in self.degrees:
            spec = parse_kernel(row[f"go{degree}_kernel"])
            groups = num_workgroups(problem, spec)
            resident = resident_workgroups(spec, problem.dtype, self.gpu)
            kernel_stats[degree] = (groups, resident, waves(groups, resident, self.gpu.num_cus))
        return feature_vector(int(row["m"]), int(row["n"]), int(row["k"]), kernel_stats, self.degrees)

    def go_speedups(self, row: Any) -> dict[int, float]:
        """Speedup over sequential of every degree with its GO kernel."""
        return {d: row[f"seq{d}_s"] / row[f"go{d}_s"] for d in self.degrees}

    def goldyloc_time(self, row: Any, degree: int, available: int) -> float:
        """Time of ``available`` GEMMs run ``degree`` at a time with GO kernels, with CP decision time, s.

        Each batch's decision overlaps the previous batch (the first one overlaps the application's
        preceding kernel, assumed no shorter), so only the part of the decision time that exceeds a
        batch shows.  Degree 1 is sequential execution.
        """
        decision = self.timing.decision_ns * 1e-9
        if degree == 1:
            return row[f"seq{available}_s"] + available * max(0.0, decision - row["next_s"])
        batch = row[f"go{degree}_s"]
        return available // degree * (batch + max(0.0, decision - batch))

    def oracle_degree(self, row: Any, available: int, min_gain: float = 0.0) -> int:
        """The degree (up to ``available``) that runs ``available`` GEMMs fastest, CP decision time included;
        sequential unless it gains ``min_gain`` (the Oracle configuration: none; the profiling labels
        of the predictor use :data:`gpusim.sched.goldyloc.MIN_GAIN`)."""
        options = [1] + [d for d in self.degrees if d <= available]
        times = {d: self.goldyloc_time(row, d, available) for d in options}
        best = min(options, key=lambda d: (times[d], d))
        return best if times[1] >= (1.0 + min_gain) * times[best] else 1

    def configurations(self, gemms: pd.DataFrame, shapes: pd.DataFrame) -> pd.DataFrame:
        """Speedup over Sequential of every configuration, per GEMM and number of available GEMMs."""
        by_shape = shapes.set_index("shape")
        rows = []
        for gemm in gemms.itertuples():
            row = by_shape.loc[gemm.shape]
            for available in self.degrees:
                sequential = row[f"seq{available}_s"]
                oracle = self.oracle_degree(row, available)
                chosen = executed_degree(row["predicted"], available)
                times = {
                    "default": (row[f"default{available}_s"], available),
                    "go-kernels": (row[f"go{available}_s"], available),
                    "goldyloc": (self.goldyloc_time(row, chosen, available), chosen),
                    "oracle": (self.goldyloc_time(row, oracle, available), oracle),
                }
                for kind in ("cu-partition", "resource-partition"):
                    value = row.get(f"{kind}{available}_s", float("nan"))
                    if not pd.isna(value):
                        times[kind] = (value, available)
                for config, (t, degree) in times.items():
                    rows.append({"app": gemm.app, "label": gemm.label, "shape": gemm.shape, "concurrency": available,
                                 "config": config, "speedup": sequential / t, "degree": degree})
        return pd.DataFrame(rows)

    def accuracy(self, shapes: pd.DataFrame) -> pd.DataFrame:
        """Share of shapes whose executed degree is the oracle's, per number of available GEMMs."""
        rows = []
        for available in self.degrees:
            correct = [executed_degree(row["predicted"], available) == preferred_degree(self.go_speedups(row), available)
                       for _, row in shapes.iterrows()]
            rows.append({"concurrency": available, "accuracy": float(np.mean(correct)), "shapes": len(correct)})
        return pd.DataFrame(rows)

    def go_properties(self, shapes: pd.DataFrame, tuning: pd.DataFrame) -> pd.DataFrame:
        """Waves and L2 accesses/misses per wave of GO kernels relative to isolation-tuned kernels (Fig. 7.12)."""
        full = tuning[tuning["rc"] == 1].drop_duplicates(subset=["shape", "kernel"]).set_index(["shape", "kernel"])
        rows = []

        def stats(problem: GemmProblem, shape: str, name: str) -> tuple[float, float, float]:
            spec = parse_kernel(name)
            count = waves(num_workgroups(problem, spec), resident_workgroups(spec, problem.dtype, self.gpu), self.gpu.num_cus)
            run = full.loc[(shape, name)]
            return count, run["l2_accesses"] / math.ceil(count), run["l2_misses"] / math.ceil(count)

        for _, row in shapes.iterrows():
            problem = _problem(row)
            base = stats(problem, row["shape"], row["isolated_kernel"])
            for degree in self.degrees:
                go = row[f"go{degree}_kernel"]
                if go == row["isolated_kernel"]:
                    continue
                mine = stats(problem, row["shape"], go)
                rows.append({
                    "shape": row["shape"], "degree": degree, "isolated_kernel": row["isolated_kernel"], "go_kernel": go,
                    "waves_ratio": mine[0] / base[0], "l2_accesses_per_wave_ratio": mine[1] / base[1],
                    "l2_misses_per_wave_ratio": mine[2] / base[2] if base[2] else float("nan"),
                })
        return pd.DataFrame(rows, columns=GO_PROPERTY_COLUMNS)

    # -- everything ----------------------------------------------------------------------------
    def run(self, gemms: pd.DataFrame, training: pd.DataFrame | None = None, folds: int = 10) -> StudyResult:
        """Run the study for ``gemms`` (evaluated) plus ``training`` GEMMs (predictor only).

        Parameters
        ----------
        gemms
            GEMMs of the evaluated apps (:func:`gpusim.studies.concurrency_workloads.model_gemms`).
        training
            Further GEMMs that train and test the predictor (no partition runs for them).
        folds
            Cross-validation folds of the predictor (10: 90 % train, 10 % test; at most one per shape).

        Raises
        ------
        ConfigError
            ``gemms`` is not a non-empty table of GEMMs with an ``app`` column, ``training`` is not
            a table of GEMMs, fewer than two distinct shapes are given in all (the predictor's
            cross-validation needs two), or ``folds`` is not an integer of at least 2.
        """
        check_gemms(gemms, "ConcurrencyStudy.run: gemms")
        if "app" not in gemms:
            raise ConfigError("ConcurrencyStudy.run: gemms needs an 'app' column (results are summarised per app)")
        if training is not None:
            check_gemms(training, "ConcurrencyStudy.run: training", empty=True)
        if as_int(folds) is None or folds < 2:
            raise ConfigError(f"ConcurrencyStudy.run: folds must be an integer of at least 2, got {folds!r}")
        gemms = with_shapes(gemms)
        distinct = set(gemms["shape"]) | (set(with_shapes(training)["shape"]) if training is not None else set())
        if len(distinct) < 2:
            raise ConfigError(f"ConcurrencyStudy.run: the predictor's cross-validation needs at least 2 distinct GEMM "
                              f"shapes, got {len(distinct)} ({', '.join(sorted(distinct))})")
        self.cpu_s = 0.0
        evaluated = self.measure(gemms)
        pools = [evaluated.shapes.assign(role="evaluate")]
        tuning, runs = [evaluated.tuning], [evaluated.runs]
        if training is not None and len(training):
            extra = with_shapes(training)
            extra = extra[~extra["shape"].isin(evaluated.shapes["shape"])]
            if len(extra):
                trained = self.measure(extra, partitions=False)
                pools.append(trained.shapes.assign(role="train"))
                tuning.append(trained.tuning)
                runs.append(trained.runs)
        shapes = pd.concat(pools, ignore_index=True)
        features = np.vstack(shapes["features"].to_numpy())
        shapes["predicted"] = cross_validated_predictions(features, shapes["preferred"].to_numpy(),
                                                          folds=max(2, min(folds, len(shapes))))
        model = ConcurrencyPredictor().fit(features, shapes["preferred"].to_numpy())
        mine = shapes[shapes["role"] == "evaluate"]
        speedups = self.configurations(gemms, mine)
        summary, per_app, effect = self.summarize(gemms, speedups)
        return StudyResult(
            gemms=gemms, shapes=shapes, speedups=speedups, summary=summary, per_app=per_app,
            predictor=self.accuracy(shapes), impact=effect, go_properties=self.go_properties(mine, evaluated.tuning),
            model=model, tuning=pd.concat(tuning, ignore_index=True), runs=pd.concat(runs, ignore_index=True),
            cpu_s=self.cpu_s,
        )

    def summarize(self, gemms: pd.DataFrame, speedups: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """Geomeans over the distinct GEMMs and per app, and GOLDYLOC's impact versus Default."""
        distinct = speedups.drop_duplicates(subset=["label", "concurrency", "config"])
        summary = distinct.groupby(["concurrency", "config"], sort=False)["speedup"].agg(geomean).reset_index(name="geomean_speedup")
        per_app = speedups.groupby(["app", "concurrency", "config"], sort=False)["speedup"].agg(geomean).reset_index(name="geomean_speedup")
        return summary, per_app, impact(distinct)

    def evaluate(self, gemms: pd.DataFrame, model: ConcurrencyPredictor) -> tuple[Measurements, pd.DataFrame]:
        """Measure another GEMM set (e.g. attention's batched GEMMs) and predict with a trained ``model``.

        Returns the measurements (shapes with ``predicted``) and the per-GEMM speedups.

        Raises
        ------
        ConfigError
            ``gemms`` is not a non-empty table of GEMMs with ``app`` column, or ``model`` is not a
            fitted :class:`~gpusim.sched.goldyloc.ConcurrencyPredictor` (:attr:`StudyResult.model`).
        """
        check_gemms(gemms, "ConcurrencyStudy.evaluate: gemms")
        if "app" not in gemms:
            raise ConfigError("ConcurrencyStudy.evaluate: gemms needs an 'app' column (speedups are given per app)")
        _check_model(model, "ConcurrencyStudy.evaluate")
        gemms = with_shapes(gemms)
        measured = self.measure(gemms, partitions=False)
        shapes = measured.shapes.copy()
        shapes["predicted"] = model.predict(np.vstack(shapes["features"].to_numpy()))
        measured.shapes = shapes
        return measured, self.configurations(gemms, shapes)

    def packet_gemm(self, row: Any, copies: int, predicted: int) -> dict[str, Any]:
        """One GEMM of a :func:`packets_point`: ``row`` of a shape table (shape, isolation-tuned and GO
        kernels), ``copies`` of it, and the predictor's degree for it."""
        kernels = {"1": row["isolated_kernel"], **{str(d): row[f"go{d}_kernel"] for d in self.degrees}}
        return {"m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]), "trans_a": bool(row["trans_a"]),
                "trans_b": bool(row["trans_b"]), "batch": int(row["batch"]), "dtype": str(row["dtype"]),
                "copies": int(copies), "kernels": kernels, "predicted": int(predicted)}

    def packets_point_args(self, gemms: list[dict[str, Any]], policy: str,
                           overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The arguments of a :func:`packets_point` on the study's system (plus ``overrides``)."""
        merged = {**self.overrides, **(overrides or {})}
        return {"system": self.system, "overrides": merged, "gemms": gemms, "policy": policy,
                "timing": dataclasses.asdict(self.timing)}

    def mixes(self, mixes: Sequence[tuple[Any, Any]], shapes: pd.DataFrame, policies: Sequence[str] = ("default", "go-kernels", "goldyloc"),
              degrees: Sequence[int] | None = None) -> pd.DataFrame:
        """Heterogeneous concurrency: ``D/2`` copies each of two GEMM shapes through the command processor.

        Parameters
        ----------
        mixes
            Pairs of shape keys.
        shapes
            Shape table with kernels, times and ``predicted`` (from :meth:`run` or :meth:`evaluate`).
        policies
            Command-processor configurations to run, among :data:`PACKET_POLICIES`.
        degrees
            Numbers of available GEMMs, among the study's (default: all of them).

        Returns
        -------
        pandas.DataFrame
            One row per pair, degree and policy: span_s, sequential_s (both shapes' sequential
            time), speedup and the degrees the GEMMs ran at.

        Raises
        ------
        ConfigError
            No pair, a pair that is not two shapes of ``shapes``, a ``shapes`` table without
            predictions, or an unknown policy or degree.
        """
        where = "ConcurrencyStudy.mixes"
        if not isinstance(shapes, pd.DataFrame) or not {"shape", "predicted"} <= set(shapes.columns):
            raise ConfigError(f"{where}: shapes must be a shape table with predictions (StudyResult.shapes, or "
                              "the measurements of evaluate())")
        pairs = as_sequence(mixes)
        if not pairs:
            raise ConfigError(f"{where}: mixes must be a non-empty list of (shape, shape) pairs, got {mixes!r}")
        known = set(shapes["shape"])
        for pair in pairs:
            keys = as_sequence(pair)
            if keys is None or len(keys) != 2 or not all(isinstance(key, str) and key in known for key in keys):
                raise ConfigError(f"{where}: every mix must be a pair of shape keys of the shapes table, got {pair!r}")
        chosen = as_sequence(policies)
        if not chosen or any(policy not in PACKET_POLICIES for policy in chosen):
            raise ConfigError(f"{where}: policies must be a non-empty list among {', '.join(PACKET_POLICIES)}, got {policies!r}")
        if degrees is not None:
            numbers = as_sequence(degrees)
            if not numbers or any(degree not in self.degrees for degree in numbers):
                raise ConfigError(f"{where}: degrees must be a non-empty list among the study's degrees "
                                  f"({', '.join(map(str, self.degrees))}), got {degrees!r}")
        table = shapes.set_index("shape")
        points, tags = [], []
        for first, second in pairs:
            for available in degrees or self.degrees:
                half = available // 2
                gemms = [self.packet_gemm(table.loc[key], half, table.loc[key, "predicted"]) for key in (first, second)]
                sequential = sum(table.loc[key, "first_s"] + (half - 1) * table.loc[key, "next_s"] for key in (first, second))
                for policy in policies:
                    points.append(self.packets_point_args(gemms, policy))
                    tags.append({"first": first, "second": second, "concurrency": available, "sequential_s": sequential})
        frame = self.simulate_points(packets_point, points, "mixes")
        frame = pd.concat([frame.drop(columns=["gemms", "overrides"]).reset_index(drop=True), pd.DataFrame(tags)], axis=1)
        frame["speedup"] = frame["sequential_s"] / frame["span_s"]
        return frame

    def size_trend(self, shapes: Sequence[tuple[int, int, int]] = SIZE_TREND_SHAPES, degrees: Sequence[int] = (2, 4),
                   dtype: str = "fp32") -> pd.DataFrame:
        """Fig. 7.1a: how much copies of one GEMM gain from running concurrently, by GEMM size.

        Each shape is tuned in isolation on the full GPU (its shortlist, as :meth:`tune`); then
        ``d`` copies with that kernel on ``d`` streams are timed against the same copies back to
        back, for each of ``degrees`` (Fig. 7.1a's 2 and 4 by default).

        Parameters
        ----------
        shapes
            ``(m, n, k)`` of each GEMM, positive integers.
        degrees
            Numbers of copies, among :data:`DEGREES`.
        dtype
            Element type of every GEMM.

        Returns
        -------
        pandas.DataFrame
            One row per shape: m, n, k, gflop, kernel, workgroups, isolated_s and
            ``speedup{d}`` (over sequential) per degree.

        Raises
        ------
        ConfigError
            An empty ``shapes``, a shape that is not three positive integers, a degree outside
            :data:`DEGREES`, or an unknown ``dtype``.
        """
        where = "ConcurrencyStudy.size_trend"
        listed = as_sequence(shapes)
        if not listed:
            raise ConfigError(f"{where}: shapes must be a non-empty list of (m, n, k), got {shapes!r}")
        for shape in listed:
            sizes = as_sequence(shape)
            if sizes is None or len(sizes) != 3 or not all(is_positive_int(size) for size in sizes):
                raise ConfigError(f"{where}: every shape must be (m, n, k) of positive integers, got {shape!r}")
        if not as_sequence(degrees) or any(degree not in DEGREES for degree in as_sequence(degrees)):
            raise ConfigError(f"{where}: degrees must be a non-empty list among {', '.join(map(str, DEGREES))}, got {degrees!r}")
        one_of("dtype", dtype, DTYPE_BYTES, where)
        gemms = with_shapes(pd.DataFrame([{"m": m, "n": n, "k": k, "trans_a": False, "trans_b": False, "batch": 1,
                                           "dtype": dtype} for m, n, k in shapes]))
        isolated = ConcurrencyStudy(self.system, self.overrides, degrees=degrees, cu_partition_degrees=(),
                                    resource_partition_degrees=(), rc_fractions=(1,), shortlist_size=self.shortlist_size, timing=self.timing, workers=self.workers,
                                    scheduler=self.scheduler, cache=self.cache, progress=self.progress)
        table = isolated.measure(gemms, partitions=False).shapes
        self.cpu_s += isolated.cpu_s
        rows = []
        for row in table.itertuples():
            problem = GemmProblem(int(row.m), int(row.n), int(row.k), dtype)
            entry = {"m": row.m, "n": row.n, "k": row.k, "gflop": row.flops / 1e9, "kernel": row.isolated_kernel,
                     "workgroups": num_workgroups(problem, parse_kernel(row.isolated_kernel)), "isolated_s": row.first_s}
            for degree in degrees:
                entry[f"speedup{degree}"] = getattr(row, f"seq{degree}_s") / getattr(row, f"default{degree}_s")
            rows.append(entry)
        return pd.DataFrame(rows)


def impact(speedups: pd.DataFrame, band: float = UNCHANGED_BAND) -> pd.DataFrame:
    """Share of GEMMs GOLDYLOC improves / leaves unchanged / degrades versus Default, per concurrency.

    Parameters
    ----------
    speedups
        :attr:`StudyResult.speedups` (or a frame with its label, concurrency, config and speedup).
    band
        Fraction of Default's speedup within which a GEMM counts as unchanged, from 0 to below 1.

    Raises
    ------
    ConfigError
        ``band`` is not a fraction from 0 to below 1.
    """
    if as_real(band) is None or not 0 <= band < 1:
        raise ConfigError(f"impact: band must be a fraction from 0 to below 1, got {band!r}")
    table_with("speedups", speedups, ["label", "concurrency", "config", "speedup"], "impact", "StudyResult.speedups")
    if not {"goldyloc", "default"} <= set(speedups["config"]):
        raise ConfigError("impact: speedups needs rows of the configurations goldyloc and default")
    table = speedups.pivot_table(index=["label", "concurrency"], columns="config", values="speedup").reset_index()
    rows = []
    for available, group in table.groupby("concurrency"):
        ratio = group["goldyloc"] / group["default"]
        rows.append({"concurrency": available, "improved": float((ratio > 1 + band).mean()),
                     "unchanged": float(((ratio >= 1 - band) & (ratio <= 1 + band)).mean()),
                     "degraded": float((ratio < 1 - band).mean()), "gemms": len(group)})
    return pd.DataFrame(rows)


def _check_model(model: Any, where: str) -> None:
    """A ConfigError unless ``model`` is a fitted concurrency predictor."""
    if not isinstance(model, ConcurrencyPredictor) or model.weights is None:
        raise ConfigError(f"{where}: model must be a fitted ConcurrencyPredictor (StudyResult.model), got {model!r}")


def _problem(shape: Any) -> GemmProblem:
    return GemmProblem(int(shape["m"]), int(shape["n"]), int(shape["k"]), str(shape["dtype"]), bool(shape["trans_a"]),
                       bool(shape["trans_b"]), int(shape["batch"]))


def _unique_shapes(gemms: pd.DataFrame) -> pd.DataFrame:
    columns = ["shape", "m", "n", "k", "trans_a", "trans_b", "batch", "dtype", "flops"]
    return gemms.drop_duplicates(subset=["shape"])[columns].reset_index(drop=True)


def _by_cost(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points with the most work first (better load balance across workers); the order does not change results."""
    return sorted(points, key=lambda p: -(p["m"] * p["n"] * p["k"] * p["batch"] * p["copies"]))


_POINT_FIELDS = ("system", "overrides", "m", "n", "k", "trans_a", "trans_b", "batch", "dtype", "kernel", "copies", "arrangement")


def _tagged(frame: pd.DataFrame, points: list[dict[str, Any]], tags: list[dict[str, Any]]) -> pd.DataFrame:
    """Sweep rows with the tags of their points (matched by the point's fields)."""
    if frame.empty:
        return frame

    def key(point) -> str:
        return json.dumps({f: point[f] for f in _POINT_FIELDS}, sort_keys=True, default=str)

    by_key = {key(point): tag for point, tag in zip(points, tags)}
    extra = pd.DataFrame([by_key[key(row)] for _, row in frame.iterrows()], index=frame.index)
    return pd.concat([frame, extra], axis=1).reset_index(drop=True)


def _winners(tuning: pd.DataFrame) -> dict[tuple[str, int], str]:
    """Fastest kernel per (shape, rc) among the isolated tuning runs."""
    return {(shape, int(rc)): fastest(dict(zip(group["kernel"], group["span_s"])))
            for (shape, rc), group in tuning.groupby(["shape", "rc"])}
