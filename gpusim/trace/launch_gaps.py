"""How long a GPU waits between kernels of one stream, measured in a Kineto trace.

Two latencies of the command processor, both counted from after the host's launch call returned:

* **queued gap**: the next kernel's launch call had returned before its stream predecessor ended,
  so its packet was waiting in the queue; the gap from the predecessor's end to its start is the
  GPU's completion-to-dispatch latency (``GpuConfig.dependent_launch_ns``).
* **idle latency**: the stream was idle when the launch call returned; the time from that return to
  the kernel's start adds the doorbell and the packet fetch to the dispatch.

Both are the time from the later of the launch's return and the predecessor's end to the start, so
they cannot be negative.  An activity that started before its launch call returned gives neither
(kind ``in_call``, no wait): the call returned only after the GPU had begun, because it blocked on
the work (a synchronous copy such as ``hipMemcpyWithStream``) or the host lingered in it after
submitting, so when the packet reached the queue is unknown.  Neither does one that started before
its stream predecessor ended (kind ``overlap``; activities of one stream of one device never
overlap, so the trace is inconsistent there).  Streams are told apart per device.

Times in the result are microseconds, as in the traces.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gpusim.trace.kineto import GPU_CATEGORIES, launch_calls, load_json

GAP_COLUMNS = ["device", "stream", "name", "previous", "start_us", "launch_return_us", "previous_end_us", "kind",
               "wait_us"]
"""Columns of :func:`stream_gaps`."""
SUMMARY_COLUMNS = ["count", "min_us", "median_us", "p90_us"]
"""Columns of :func:`summarize` (indexed by kind)."""


def stream_gaps(path: str | os.PathLike) -> pd.DataFrame:
    """Every GPU activity of a Kineto trace with its launch and its stream predecessor.

    Parameters
    ----------
    path
        A Kineto trace (``.json`` or ``.json.gz``).

    Returns
    -------
    pandas.DataFrame
        One row per GPU activity that has a launch call (:data:`GAP_COLUMNS`): ``device`` (the
        event's ``args.device``, else its ``pid``), ``stream``, ``name``, ``previous`` (the
        predecessor's name on the device's stream, empty for a stream's first), ``start_us``,
        ``launch_return_us`` (end of the launch call), ``previous_end_us`` (NaN for a stream's
        first), ``kind`` and ``wait_us``: ``"in_call"`` when the activity started before its launch
        returned, ``"overlap"`` when it started before its predecessor ended (both without a wait:
        NaN), else ``"queued"`` when the launch returned before the predecessor ended (wait: start
        minus the predecessor's end) or ``"idle"`` (wait: start minus the launch's return).  Waits
        are never negative.
    """
    events = load_json(Path(path))["traceEvents"]
    launches = launch_calls(events)
    streams: dict[tuple[object, object], list[dict]] = {}
    for event in events:
        if event.get("cat") in GPU_CATEGORIES and event.get("ph") == "X":
            args = event.get("args", {})
            streams.setdefault((args.get("device", event.get("pid")), args.get("stream", event.get("tid"))),
                               []).append(event)
    rows = []
    for (device, stream), activities in streams.items():
        activities.sort(key=lambda e: float(e["ts"]))
        previous: dict | None = None
        for event in activities:
            launch = launches.get(event.get("args", {}).get("correlation"))
            start = float(event["ts"])
            previous_end = float(previous["ts"]) + float(previous.get("dur", 0.0)) if previous else float("nan")
            if launch is not None:
                returned = float(launch["ts"]) + float(launch.get("dur", 0.0))
                if start < returned:
                    kind, wait = "in_call", float("nan")
                elif start < previous_end:
                    kind, wait = "overlap", float("nan")
                elif returned < previous_end:
                    kind, wait = "queued", start - previous_end
                else:
                    kind, wait = "idle", start - returned
                rows.append({"device": device, "stream": stream, "name": event.get("name", ""),
                             "previous": previous.get("name", "") if previous else "", "start_us": start,
                             "launch_return_us": returned, "previous_end_us": previous_end, "kind": kind,
                             "wait_us": wait})
            previous = event
    gaps = pd.DataFrame(rows, columns=GAP_COLUMNS)
    return gaps.astype({column: float for column in ("start_us", "launch_return_us", "previous_end_us", "wait_us")})


def summarize(gaps: pd.DataFrame) -> pd.DataFrame:
    """Count, minimum, median and 90th percentile of ``wait_us`` per kind (rows of :func:`stream_gaps`).

    Parameters
    ----------
    gaps
        Rows of :func:`stream_gaps`, possibly none.

    Returns
    -------
    pandas.DataFrame
        :data:`SUMMARY_COLUMNS` indexed by ``kind``; no rows when ``gaps`` has none, and NaN
        statistics for the kinds without a wait (``in_call``, ``overlap``).
    """
    waits = gaps["wait_us"].astype(float)
    grouped = waits.groupby(gaps["kind"].rename("kind"))
    summary = pd.DataFrame({"count": grouped.size(), "min_us": grouped.min(), "median_us": grouped.median(),
                            "p90_us": grouped.quantile(0.9)}, columns=SUMMARY_COLUMNS)
    summary.index.name = "kind"
    return summary
