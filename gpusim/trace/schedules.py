"""Pipeline-parallel schedules: the order in which a stage runs forward and backward microbatches.

* GPipe (Huang et al. 2019): every forward, then every backward.  Bubble fraction (p - 1) / m.
* 1F1B / PipeDream-Flush (Narayanan et al. 2019, 2021): ``p - s - 1`` warm-up forwards at stage
  ``s``, then one forward and one backward alternately, then the remaining backwards.  Same bubble
  as GPipe, but at most ``p`` microbatches in flight (seeds/001 sections 1.2.3.1-1.2.3.2).
* Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's virtual pipeline stages): each stage holds
  ``v`` model chunks, chunk ``c`` of stage ``s`` being virtual stage ``c * p + s``; the bubble
  shrinks to ``(p - 1) / (v m)`` at the cost of ``v`` times as many sends
  (:func:`interleaved_order`).
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


def interleaved_order(stage: int, stages: int, microbatches: int, chunks: int,
                      backward: bool = True) -> list[tuple[str, int, int]]:
    """``[("F", chunk, microbatch), ...]`` for one stage of the interleaved 1F1B schedule, as
    Megatron-LM's ``forward_backward_pipelining_with_interleaving`` orders them.

    The stage runs ``v m`` forward and ``v m`` backward passes of (chunk, microbatch) pairs, the
    ``k``-th of each being chunk ``(k mod pv) // p`` (backward: counted from the last chunk) of
    microbatch ``(k // pv) p + k mod p``: groups of ``p`` microbatches go through one chunk, then
    the next.  ``2 (p - s - 1) + (v - 1) p`` warm-up forwards (at most all), then one forward and
    one backward alternately, then the remaining backwards.  Inference runs the forwards only.

    Parameters
    ----------
    stage, stages, microbatches
        As :func:`stage_order`; ``microbatches`` must be a multiple of ``stages``.
    chunks
        Model chunks per stage, v.
    backward
        Whether there are backward passes.

    Raises
    ------
    ValueError
        ``microbatches`` is not a multiple of ``stages``, or ``chunks`` is not positive.
    """
    if chunks < 1 or microbatches % stages:
        raise ValueError(f"interleaved_order: needs microbatches ({microbatches}) a multiple of stages ({stages}) "
                         f"and at least one chunk (got {chunks})")
    group = stages * chunks
    total = microbatches * chunks

    def pass_of(action: str, k: int) -> tuple[str, int, int]:
        chunk = (k % group) // stages
        if action == "B":
            chunk = chunks - 1 - chunk
        return action, chunk, (k // group) * stages + k % stages

    forwards = [pass_of("F", k) for k in range(total)]
    if not backward:
        return forwards
    backwards = [pass_of("B", k) for k in range(total)]
    warmup = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
    order = forwards[:warmup]
    for index in range(total - warmup):
        order += [forwards[warmup + index], backwards[index]]
    return order + backwards[total - warmup:]
