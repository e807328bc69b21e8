"""Pipeline-parallel schedules: the order in which a stage runs forward and backward microbatches.

* GPipe (Huang et al. 2019): every forward, then every backward.  Bubble fraction (p - 1) / m.
* 1F1B / PipeDream-Flush (Narayanan et al. 2019, 2021): ``p - s - 1`` warm-up forwards at stage
  ``s``, then one forward and one backward alternately, then the remaining backwards.  Same bubble
  as GPipe, but at most ``p`` microbatches in flight (seeds/001 sections 1.2.3.1-1.2.3.2).
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def stage_order(schedule: str, stage: int, stages: int, microbatches: int, backward: bool = True) -> list[tuple[str, int]]:
    """``[("F", 0), ("F", 1), ("B", 0), ...]`` for one stage.

    Parameters
    ----------
    schedule
        ``"gpipe"`` or ``"1f1b"``.
    stage
        The stage (0 is the first).
    stages
        Pipeline depth p.
    microbatches
        Microbatches m.
    backward
        Whether there are backward passes (training); inference runs forwards only.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    forwards = [("F", mb) for mb in range(microbatches)]
    if not backward:
        return forwards
    backwards = [("B", mb) for mb in range(microbatches)]
    if schedule == "gpipe":
        return forwards + backwards
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for index in range(microbatches - warmup):
        order += [forwards[warmup + index], backwards[index]]
    return order + backwards[microbatches - warmup:]
