"""Partitioning one GPU between concurrent streams: CU masks and full resource partitions.

* *CU-Partition* (CU masking): each stream's kernels may use only its share of the CUs; the L2 and
  HBM stay shared.  :func:`cu_masks` gives the masks for :class:`gpusim.Stream`.
* *Resource-Partition*: each stream gets its share of the CUs, of the L2 (capacity and bandwidth)
  and of the HBM channels, as a partitioned GPU (e.g. MIG) would.  Partitions then do not interact,
  so one partition is simulated as a smaller GPU (:func:`resource_partition_overrides`), as the
  dissertation did (section 7.4.5) — optimistic, since real partitions together usually have fewer
  resources than the whole GPU.
"""

from __future__ import annotations

import math

from gpusim.config.gpu import GpuConfig


def cu_masks(num_cus: int, parts: int) -> list[tuple[int, ...]]:
    """``parts`` disjoint, contiguous CU masks covering ``num_cus`` CUs (sizes differ by at most one)."""
    if parts < 1 or parts > num_cus:
        raise ValueError(f"cu_masks: parts must be between 1 and the {num_cus} CUs, got {parts}")
    bounds = [round(i * num_cus / parts) for i in range(parts + 1)]
    return [tuple(range(bounds[i], bounds[i + 1])) for i in range(parts)]


def resource_partition_overrides(gpu: GpuConfig, parts: int) -> dict[str, int | float]:
    """Overrides that turn ``gpu`` into one of ``parts`` equal resource partitions.

    The partition has ``1/parts`` of the CUs (rounded down: with equal work in every partition the
    smallest one decides the time), of the L2 capacity and banks (bandwidth) and of the HBM
    channels (bandwidth); the simulation granularity ``hbm.lockstep_channels`` shrinks when fewer
    channels remain.

    Raises
    ------
    ValueError
        When the L2 banks or HBM channels cannot be divided into ``parts`` (e.g. 32 channels into
        3), or there are fewer CUs than parts.
    """
    if parts < 1:
        raise ValueError(f"resource partition: parts must be at least 1, got {parts}")
    if parts == 1:
        return {}
    channels = gpu.hbm.channels
    if gpu.num_cus < parts:
        raise ValueError(f"resource partition: {gpu.name}'s {gpu.num_cus} CUs cannot be split into {parts} parts")
    for name, total in (("L2 banks", gpu.l2.banks), ("HBM channels", channels)):
        if total % parts:
            raise ValueError(f"resource partition: {gpu.name}'s {total} {name} cannot be split into {parts} equal parts")
    per_part = channels // parts
    lockstep = max(d for d in range(1, gpu.hbm.lockstep_channels + 1) if per_part % d == 0)
    return {
        "gpu.num_cus": gpu.num_cus // parts,
        "gpu.l2.capacity_bytes": int(gpu.l2.capacity_bytes) // parts,
        "gpu.l2.banks": gpu.l2.banks // parts,
        "gpu.hbm.stacks": 1,
        "gpu.hbm.channels_per_stack": per_part,
        "gpu.hbm.lockstep_channels": math.gcd(lockstep, per_part),
    }
