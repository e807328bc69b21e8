"""End-to-end iterations with concurrent GEMMs (dissertation section 7.5.10): GNMT and BERT.

An iteration is cut into *GEMM groups* — GEMMs that become available to the command processor
(CP) together because none of them consumes another's output — and the *rest* (everything else,
run as today).  Each distinct group is simulated through the CP under every policy, and the
iteration time of a policy is the rest plus the sum over groups (times their repeats):

* **GNMT** (Wu et al. 2016): 8 LSTM encoder and 8 decoder layers over ``steps`` time steps.  A cell
  (layer ``l``, step ``t``) needs cell ``(l-1, t)`` (its input) and ``(l, t-1)`` (its state), so the
  cells of one anti-diagonal ``l + t`` are independent: up to ``layers`` gate GEMMs at once in the
  forward pass (the dissertation's "up to eight (layer) GEMMs in parallel").  A cell multiplies the
  concatenated input and state by its gate matrix (one GEMM, as TensorFlow's ``LSTMCell`` that GNMT's
  reference implementation uses); decoder layers also read the attention context (input width
  2 x hidden).  In the backward pass a cell's input-gradient and weight-gradient GEMMs are
  independent too, so an anti-diagonal of ``c`` cells offers ``2c`` GEMMs.  Only the layer GEMMs
  are modelled (not the LSTM's point-wise ops, the attention or the softmax layer), so GNMT's
  figure is the speedup of its layer GEMMs.
* **BERT** (from the trace generator, :func:`gpusim.trace.generator.transformer`): in each layer
  the Q, K and V projections read the same input (3 GEMMs at once in the forward pass, 6 gradient
  GEMMs in the backward pass), and every linear or attention GEMM's input gradient and weight
  gradient are independent (pairs).  The rest of the trace (the other GEMMs, element-wise ops,
  reductions and the optimizer) is replayed once; it is the same under every policy.

Policies: *sequential* (the group's GEMMs in order on one stream, isolation-tuned kernels),
*default* (every available GEMM at once, isolation-tuned kernels) and *goldyloc* (degree
``min(predicted, available)``, GO kernels, CP decision time).  The packets are in the CP's queues
already, so the groups run without the host's per-call launch overhead (``kernel_launch_ns`` = 0);
a group's time is the span of its kernels: the CP's first decision overlaps the op before the group
(as in the study's GOLDYLOC composition), later ones show where the batch before cannot hide them.  Kernels and predictions come from the concurrency study
(:meth:`gpusim.studies.concurrency.ConcurrencyStudy.measure` and a trained
:class:`gpusim.sched.goldyloc.ConcurrencyPredictor`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpusim.checks import as_real, one_of, positive_int
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import ConfigError
from gpusim.sched.goldyloc import ConcurrencyPredictor
from gpusim.studies.concurrency import ConcurrencyStudy, _check_model, packets_point
from gpusim.studies.concurrency_workloads import GATES, SHAPE_COLUMNS, linear_gemms, shape_key, with_shapes
from gpusim.system import load_system
from gpusim.trace.trace import Trace

POLICIES = ("sequential", "default", "goldyloc")
"""Command-processor policies an iteration is timed under."""
GPU_TIME = {"gpu.kernel_launch_ns": 0}
"""Override for timing an iteration on the GPU alone: packets are queued already, no host launch cost."""

_GRADIENT_SUFFIX = re.compile(r"_(dgrad|wgrad)$")
_LAYER_PREFIX = re.compile(r"^L\d+\.")
_QKV = {"q", "k", "v"}


@dataclass(frozen=True)
class GemmGroup:
    """GEMMs that the command processor finds available together.

    Attributes
    ----------
    name
        Label (e.g. ``encoder fwd x4`` or ``qkv bwd``).
    gemms
        ``(shape, copies)`` pairs; a shape is a tuple of :data:`SHAPE_COLUMNS` values.
    repeat
        Occurrences of the group per iteration.
    """

    name: str
    gemms: tuple[tuple[tuple, int], ...]
    repeat: int

    @property
    def size(self) -> int:
        """GEMMs in the group."""
        return sum(copies for _, copies in self.gemms)


def _shape(gemm: dict, dtype: str) -> tuple:
    return tuple({**gemm, "batch": gemm.get("batch", 1), "dtype": dtype}[c] for c in SHAPE_COLUMNS)


def gnmt_groups(hidden: int = 1024, batch: int = 128, layers: int = 8, steps: int = 32,
                dtype: str = "fp32") -> list[GemmGroup]:
    """The layer-GEMM groups of one GNMT training iteration (encoder and decoder, both passes).

    Parameters
    ----------
    hidden
        LSTM units per layer.
    batch
        Sequences per iteration (the GEMMs' ``m``).
    layers
        LSTM layers of the encoder and of the decoder each.
    steps
        Time steps of the encoder and of the decoder each.
    dtype
        GEMM element type.

    Returns
    -------
    list of GemmGroup
        One group per distinct anti-diagonal size, stack (encoder, decoder) and pass, with the
        number of anti-diagonals of that size as ``repeat``.

    Raises
    ------
    ConfigError
        A size that is not a positive integer, or an unknown ``dtype``.
    """
    for name, value in (("hidden", hidden), ("batch", batch), ("layers", layers), ("steps", steps)):
        positive_int(name, value, "gnmt_groups")
    one_of("dtype", dtype, DTYPE_BYTES, "gnmt_groups")
    sizes = Counter(sum(1 for layer in range(layers) if 0 <= diagonal - layer < steps)
                    for diagonal in range(layers + steps - 1))
    groups = []
    for stack, width in (("encoder", 1), ("decoder", 2)):
        forward, input_grad, weight_grad = linear_gemms(batch, (width + 1) * hidden, GATES["lstm"] * hidden)
        for cells, repeat in sorted(sizes.items()):
            groups.append(GemmGroup(f"{stack} fwd x{cells}", ((_shape(forward, dtype), cells),), repeat))
            groups.append(GemmGroup(f"{stack} bwd x{cells}",
                                    ((_shape(input_grad, dtype), cells), (_shape(weight_grad, dtype), cells)), repeat))
    return groups


def _group_key(name: str) -> str:
    stem = _GRADIENT_SUFFIX.sub("", _LAYER_PREFIX.sub("", name))
    return "qkv" if stem in _QKV else stem


def trace_groups(trace: Trace) -> tuple[list[GemmGroup], Trace]:
    """Split a single-GPU transformer trace into concurrent GEMM groups and the rest.

    Consecutive GEMM rows of one layer and phase form a group when they are the Q, K and V
    projections (or their gradients) or the input- and weight-gradient GEMMs of one op; groups
    of one GEMM stay in the rest.  Groups of the same GEMM shapes are simulated once: they become
    one :class:`GemmGroup` (labelled by the first) whose ``repeat`` counts them all.

    Returns
    -------
    (groups, rest)
        Distinct groups with their repeats, and the trace without the grouped rows.

    Raises
    ------
    ConfigError
        ``trace`` is not a :class:`~gpusim.trace.trace.Trace`, or has rows on several GPUs.
    """
    if not isinstance(trace, Trace):
        raise ConfigError(f"trace_groups: expected a Trace (e.g. gpusim.trace.generator.transformer(...)), got {trace!r}")
    frame = trace.frame
    if frame["gpu"].nunique() != 1:
        raise ConfigError(f"trace_groups: {trace.source} has rows on GPUs {trace.gpus}; give a single-GPU trace")
    runs: list[list[int]] = []
    previous = None
    for position, row in enumerate(frame.itertuples(index=False)):
        key = (row.layer, row.phase, _group_key(str(row.name))) if row.kind == "gemm" else None
        if key is not None and key == previous:
            runs[-1].append(position)
        elif key is not None:
            runs.append([position])
        previous = key
    counted: Counter = Counter()
    labels: dict[tuple, str] = {}
    grouped: list[int] = []
    for run in runs:
        if len(run) < 2:
            continue
        rows = frame.iloc[run]
        shapes = Counter(tuple(row[c] for c in SHAPE_COLUMNS) for _, row in rows.iterrows())
        gemms = tuple(sorted(shapes.items()))
        counted[gemms] += 1
        first = rows.iloc[0]
        labels.setdefault(gemms, f"{_group_key(str(first['name']))} {first['phase']}")
        grouped.extend(run)
    groups = [GemmGroup(labels[gemms], gemms, repeat) for gemms, repeat in counted.items()]
    rest = frame.drop(index=frame.index[grouped])
    kept = set(rest["op_id"])
    rest = rest.assign(deps=[" ".join(d for d in str(deps).split() if int(d) in kept) for deps in rest["deps"].fillna("")])
    return groups, Trace(rest.reset_index(drop=True), source=f"{trace.source} (ungrouped rows)", metadata=trace.metadata)


def _gemm_frame(groups: list[GemmGroup], app: str) -> pd.DataFrame:
    shapes = {shape for group in groups for shape, _ in group.gemms}
    frame = pd.DataFrame([dict(zip(SHAPE_COLUMNS, shape)) for shape in sorted(shapes)])
    frame.insert(0, "app", app)
    return with_shapes(frame)


def iteration(study: ConcurrencyStudy, model: ConcurrencyPredictor, groups: list[GemmGroup], app: str,
              rest_s: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time an iteration's GEMM groups under every policy.

    Parameters
    ----------
    study
        Measures the groups' GEMM shapes (tuning and degree benchmarks on its system).
    model
        Trained concurrency predictor (from :meth:`ConcurrencyStudy.run`).
    groups
        The iteration's groups (:func:`gnmt_groups`, :func:`trace_groups`).
    app
        Label.
    rest_s
        Time of everything outside the groups (the same under every policy), s.

    Returns
    -------
    (groups, totals)
        ``groups``: one row per group and policy with ``size``, ``repeat``, ``span_s`` (kernels of one
        occurrence) and the ``degrees`` run.  ``totals``: one row per policy with ``gemm_s``
        (grouped GEMMs), ``iteration_s`` (plus ``rest_s``) and speedups over sequential and default.

    Raises
    ------
    ConfigError
        ``study`` is not a :class:`ConcurrencyStudy`, ``model`` not a fitted predictor, ``groups``
        not a non-empty list of :class:`GemmGroup`, or ``rest_s`` not a finite time of at least 0.
    """
    if not isinstance(study, ConcurrencyStudy):
        raise ConfigError(f"iteration: study must be a ConcurrencyStudy, got {study!r}")
    _check_model(model, "iteration")
    if not isinstance(groups, list | tuple) or not groups or not all(isinstance(group, GemmGroup) for group in groups):
        raise ConfigError(f"iteration: groups must be a non-empty list of GemmGroup (gnmt_groups(), trace_groups()), "
                          f"got {groups!r}")
    if as_real(rest_s) is None or rest_s < 0:
        raise ConfigError(f"iteration: rest_s must be a finite time of at least 0 s, got {rest_s!r}")
    measured = study.measure(_gemm_frame(groups, app), partitions=False)
    shapes = measured.shapes.set_index("shape")
    predicted = dict(zip(shapes.index, model.predict(np.vstack(shapes["features"].to_numpy()))))
    points, tags = [], []
    for group in groups:
        keys = [(shape_key(dict(zip(SHAPE_COLUMNS, shape))), copies) for shape, copies in group.gemms]
        gemms = [study.packet_gemm(shapes.loc[key], copies, predicted[key]) for key, copies in keys]
        for policy in POLICIES:
            points.append(study.packets_point_args(gemms, policy, GPU_TIME))
            tags.append({"app": app, "group": group.name, "size": group.size, "repeat": group.repeat, "policy": policy})
    frame = study.simulate_points(packets_point, points, f"{app} groups")
    runs = pd.concat([pd.DataFrame(tags), frame[["span_s", "degrees", "cpu_s"]].reset_index(drop=True)], axis=1)
    runs["total_s"] = runs["span_s"] * runs["repeat"]
    totals = runs.groupby("policy", sort=False)["total_s"].sum().rename("gemm_s").reset_index()
    totals.insert(0, "app", app)
    totals["rest_s"] = rest_s
    totals["iteration_s"] = totals["gemm_s"] + rest_s
    by_policy = totals.set_index("policy")["iteration_s"]
    totals["speedup_over_sequential"] = by_policy["sequential"] / totals["iteration_s"]
    totals["speedup_over_default"] = by_policy["default"] / totals["iteration_s"]
    return runs.drop(columns=["total_s"]), totals


def trace_iteration(study: ConcurrencyStudy, model: ConcurrencyPredictor, trace: Trace,
                    app: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time a single-GPU iteration trace with its concurrent GEMM groups under every policy.

    The rows outside the groups are replayed once on the study's system (with the launch overhead
    set to 0, like the groups: a GPU-time iteration), and their time is added to every policy.

    Returns
    -------
    (groups, totals)
        As :func:`iteration`.

    Raises
    ------
    ConfigError
        As :func:`trace_groups` and :func:`iteration`, and a trace without concurrent GEMMs.
    """
    groups, rest = trace_groups(trace)
    if not groups:
        raise ConfigError(f"trace_iteration: {trace.source} has no GEMMs that could run concurrently (no Q/K/V "
                          "projections, no input- and weight-gradient pair); nothing to compare")
    system = load_system(study.system, {**study.overrides, **GPU_TIME})
    return iteration(study, model, groups, app, rest_s=rest.replay(system).time_s)
