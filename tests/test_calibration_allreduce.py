"""NCCL all-reduce on the dgx-a100 and hgx-h100 presets against vidur's measurements (a subset of
sizes; the full sets run in ``gpusim validate`` and validation/calibration/allreduce_dgx_a100.py)."""

from __future__ import annotations

import pandas as pd

from gpusim import validation


def evenly(frame: pd.DataFrame, per_group: int) -> pd.DataFrame:
    """``per_group`` sizes spread evenly over 1-64 MiB for every GPU count."""
    parts = []
    for _, part in frame.groupby("gpus"):
        part = part.sort_values("size_bytes")
        picks = [round(i * (len(part) - 1) / (per_group - 1)) for i in range(per_group)]
        parts.append(part.iloc[picks])
    return pd.concat(parts)


def test_dgx_a100_allreduce_within_tolerance():
    dataset = validation.get("allreduce-dgx-a100")
    rows = dataset.load()
    chosen = pd.concat([evenly(rows[rows["gpus"] < 16], 8), evenly(rows[rows["gpus"] == 16], 4)])
    frame = validation.compare(dataset, chosen, mode="symmetric", workers=1, progress=False)
    stats = validation.error_stats(frame)
    assert not validation.violations(frame, dataset), stats
    in_node = validation.error_stats(frame[frame["gpus"] < 16])
    assert in_node["median"] <= dataset.tolerances["median"], in_node


def test_two_node_allreduce_within_tolerance():
    dataset = validation.get("allreduce-dgx-a100-2nodes")
    frame = validation.compare(dataset, evenly(dataset.load(), 4), workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)


def test_hgx_h100_allreduce_within_tolerance():
    dataset = validation.get("allreduce-hgx-h100")
    frame = validation.compare(dataset, evenly(dataset.load(), 8), workers=1, progress=False)
    assert not validation.violations(frame, dataset), validation.error_stats(frame)
