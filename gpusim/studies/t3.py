"""The T3 study (dissertation chapter 8): fused GEMM -> reduce-scatter against the sequential baseline.

Every number here comes out of simulations of the sub-layers' GEMMs and collectives on the
dissertation's Table 8.1 system; the "ideal" configurations combine isolated simulated times as
section 8.4.3 defines them.  The functions return DataFrames; ``validation/t3/reproduce.py`` puts the
dissertation's numbers beside them and ``notebooks/t3_explore.ipynb`` sweeps parameters.

Workloads (Table 8.2) are given by their hyperparameters; the sub-layer GEMMs follow from Megatron's
tensor slicing (:func:`sublayer_gemm`).  Configurations (section 8.4.3):

``sequential``
    the sliced GEMM, then a CU-driven ring reduce-scatter on all CUs, then the all-gather
    (the GPU's default memory-controller policy, FR-FCFS);
``t3``
    :class:`gpusim.ops.GemmReduceScatter` (track & trigger, DMA, near-memory updates, staggering)
    then the all-gather, with the naive round-robin memory-controller arbitration between streams;
``t3-mca``
    the same with T3's communication-aware arbitration (``memory_policy="t3-mca"``);
``ideal-overlap``
    ``max(GEMM, RS) + AG`` of the sequential run's isolated (non-overlapping) kernels;
``ideal-rs-nmc``
    ``max(GEMM, RS with NMC) + AG``, the reduce-scatter driven by DMA with near-memory updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpusim import ops
from gpusim.simulate import run
from gpusim.system import load_system

DTYPE = "fp16"
DTYPE_BYTES = 2


@dataclass(frozen=True)
class TransformerSetup:
    """A model of Table 8.2 and how it is deployed.

    Attributes
    ----------
    name
        Model name.
    hidden
        Hidden size H.
    layers
        Transformer layers L.
    seq_len, batch
        Input sequence length and batch size (tokens = seq_len x batch).
    tp
        Tensor-parallel degrees studied.
    """

    name: str
    hidden: int
    layers: int
    seq_len: int
    batch: int
    tp: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """Tokens per iteration (rows of the activations)."""
        return self.seq_len * self.batch


MODELS: dict[str, TransformerSetup] = {
    setup.name: setup
    for setup in (
        TransformerSetup("Mega-GPT-2", 3072, 74, 1024, 16, (8, 16)),
        TransformerSetup("T-NLG", 4256, 78, 1024, 8, (8, 16)),
        TransformerSetup("GPT-3", 12288, 96, 1024, 2, (32,)),
        TransformerSetup("PaLM", 18432, 118, 1024, 2, (32,)),
        TransformerSetup("MT-NLG", 20480, 105, 1024, 2, (32,)),
    )
}
"""Dissertation Table 8.2 (GPT-3 12K, PaLM 18K and MT-NLG 20K hidden sizes are the models' 12288,
18432 and 20480)."""

MAIN_MODELS = ("Mega-GPT-2", "T-NLG")
LARGE_MODELS = ("GPT-3", "PaLM", "MT-NLG")
SUBLAYERS = ("OP", "FC-2", "FC-1", "IP")
"""Sub-layers whose sliced GEMM is followed by an all-reduce: output projection and FC-2 in the
forward pass, FC-1 and input projection in the backward pass."""
PASSES = {"OP": "fwd", "FC-2": "fwd", "FC-1": "bwd", "IP": "bwd"}
CONFIGS = ("sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc")
SIMULATED = ("sequential", "t3", "t3-mca", "rs-nmc")
"""What :func:`simulate_case` runs; the ideal configurations are combined from these."""
POLICIES = {"sequential": None, "t3": "round-robin", "t3-mca": "t3-mca", "rs-nmc": None}
DRAM_CATEGORIES = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write")


def sublayer_gemm(model: str, sublayer: str, tp: int) -> dict[str, Any]:
    """The sliced GEMM of a sub-layer under Megatron tensor slicing over ``tp`` GPUs.

    Each GPU multiplies the activations (tokens x a 1/tp slice of the inner dimension) by its slice
    of the weights and produces a full-size partial output (tokens x H) that must be all-reduced:

    - OP (fwd): ``[T, H/tp] x [H/tp, H]``, weights transposed (``y = x W^T``);
    - FC-2 (fwd): ``[T, 4H/tp] x [4H/tp, H]``, weights transposed;
    - FC-1 (bwd, input gradient): ``[T, 4H/tp] x [4H/tp, H]``, not transposed;
    - IP (bwd, input gradient of the QKV projection): ``[T, 3H/tp] x [3H/tp, H]``, not transposed.

    Returns
    -------
    dict
        ``m, n, k, trans_a, trans_b`` of :class:`gpusim.ops.Gemm`.
    """
    setup = MODELS[model]
    inner = {"OP": 1, "FC-2": 4, "FC-1": 4, "IP": 3}
    if sublayer not in inner:
        raise ValueError(f"unknown sub-layer {sublayer!r}; known: {', '.join(SUBLAYERS)}")
    if setup.hidden * inner[sublayer] % tp:
        raise ValueError(f"{model}: {inner[sublayer]} x H = {setup.hidden * inner[sublayer]} does not split {tp} ways")
    return {
        "m": setup.tokens,
        "n": setup.hidden,
        "k": setup.hidden * inner[sublayer] // tp,
        "trans_a": False,
        "trans_b": PASSES[sublayer] == "fwd",
    }


def node_for(tp: int) -> str:
    """The ring node preset with ``tp`` GPUs (``t3-ring8``, ``t3-ring16``, ``t3-ring32``)."""
    return f"t3-ring{tp}"


def case_ops(model: str, sublayer: str, tp: int, simulated: str) -> list[ops.Op]:
    """The ops of one sub-layer in one simulated configuration (see :data:`SIMULATED`)."""
    shape = sublayer_gemm(model, sublayer, tp)
    nbytes = shape["m"] * shape["n"] * DTYPE_BYTES
    gather = ops.AllGather(nbytes, dtype=DTYPE, input="y", name="AG")
    if simulated == "sequential":
        return [
            ops.Gemm(**shape, dtype=DTYPE, out="y", name="GEMM"),
            ops.ReduceScatter(nbytes, dtype=DTYPE, input="y", name="RS"),
            gather,
        ]
    if simulated in ("t3", "t3-mca"):
        return [ops.GemmReduceScatter(**shape, dtype=DTYPE, out="y", name="GEMM+RS"), gather]
    if simulated == "rs-nmc":
        return [ops.ReduceScatter(nbytes, dtype=DTYPE, input="y", driver="dma", name="RS+NMC")]
    raise ValueError(f"unknown simulated configuration {simulated!r}; known: {', '.join(SIMULATED)}")


def dram_categories(result, fused: bool) -> dict[str, float]:
    """DRAM bytes of GPU 0 split into GEMM, RS and AG reads and writes (Fig. 8.16).

    Compute-stream traffic is the GEMM's (its reads, and its output's writes, write-backs included);
    communication-stream traffic belongs to the reduce-scatter until the all-gather starts and to the
    all-gather after.  Updates count as writes.
    """
    dram = result.dram[result.dram["gpu"] == 0]
    gather_start = result.ops.loc[(result.ops["name"] == "AG") & (result.ops["gpu"] == 0), "start_s"]
    boundary = float(gather_start.iloc[0]) if len(gather_start) else math.inf
    write = dram["direction"] != "read"
    compute = dram["stream"] == "compute"
    before = dram["t_s"] + result.bin_s / 2 < boundary
    totals = {
        "gemm_read": dram.loc[compute & ~write, "bytes"].sum(),
        "gemm_write": dram.loc[compute & write, "bytes"].sum(),
        "rs_read": dram.loc[~compute & ~write & before, "bytes"].sum(),
        "rs_write": dram.loc[~compute & write & before, "bytes"].sum(),
        "ag_read": dram.loc[~compute & ~write & ~before, "bytes"].sum(),
        "ag_write": dram.loc[~compute & write & ~before, "bytes"].sum(),
    }
    return {f"dram_{name}": float(value) for name, value in totals.items()}


def simulate_case(
    model: str,
    tp: int,
    sublayer: str,
    config: str,
    mode: str = "symmetric",
    overrides: dict[str, Any] | None = None,
    bin_s: float = 2e-6,
) -> dict[str, Any]:
    """Simulate one sub-layer in one configuration of :data:`SIMULATED`; a top-level sweep function.

    Returns
    -------
    dict
        ``time_s`` (the sub-layer), ``gemm_s``, ``rs_s``, ``ag_s`` (the kernels' durations; for the
        fused configurations ``gemm_s`` is the fused GEMM kernel and ``rs_s`` the rest of the fused
        op), ``dram_*`` categories of GPU 0, the MCA's threshold and simulator statistics.
    """
    system = load_system(node_for(tp), overrides or {})
    result = run(system, case_ops(model, sublayer, tp, config), mode=mode, memory_policy=POLICIES[config], bin_s=bin_s)
    frame = result.ops[result.ops["gpu"] == 0].set_index("name")
    row: dict[str, Any] = {"time_s": result.time_s, "wall_s": result.stats["wall_s"], "events": result.stats["events"]}
    if config == "sequential":
        row.update(gemm_s=frame.at["GEMM", "duration_s"], rs_s=frame.at["RS", "duration_s"], ag_s=frame.at["AG", "duration_s"])
    elif config == "rs-nmc":
        row.update(rs_s=frame.at["RS+NMC", "duration_s"])
    else:
        kernels = result.kernels[(result.kernels["gpu"] == 0) & result.kernels["name"].str.startswith("gemm_rs")]
        gemm = float(kernels["duration_s"].iloc[0])
        fused = frame.at["GEMM+RS", "duration_s"]
        row.update(gemm_s=gemm, rs_s=fused - gemm, ag_s=frame.at["AG", "duration_s"])
        threshold = frame.get("mca_threshold")
        if threshold is not None and not pd.isna(threshold.get("GEMM+RS")):
            row.update(mca_threshold=float(threshold["GEMM+RS"]), mca_intensity=float(frame.at["GEMM+RS", "mca_intensity"]))
        for name in ("evictions", "max_entries"):
            row[f"tracker_{name}"] = result.counters.get(f"gpu0.tracker_{name}", 0.0)
    if config != "rs-nmc":
        row.update(dram_categories(result, config != "sequential"))
    return row


def geomean(values) -> float:
    """Geometric mean."""
    values = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(values).mean()))
