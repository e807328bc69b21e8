"""How long a GPU waits between kernels of one stream, measured in a Kineto trace.

Two latencies of the command processor, both counted from after the host's launch call returned:

* **queued gap**: the next kernel's launch call had returned before its stream predecessor ended,
  so its packet was waiting in the queue; the gap from the predecessor's end to its start is the
  GPU's completion-to-dispatch latency (``GpuConfig.dependent_launch_ns``).
* **idle latency**: the stream was idle when the launch call returned; the time from that return to
  the kernel's start adds the doorbell and the packet fetch to the dispatch.

Times in the result are microseconds, as in the traces.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gpusim.trace.kineto import GPU_CATEGORIES, launch_calls, load_json


def stream_gaps(path: str | os.PathLike) -> pd.DataFrame:
    """Every GPU activity of a Kineto trace with its launch and its stream predecessor.

    Parameters
    ----------
    path
        A Kineto trace (``.json`` or ``.json.gz``).

    Returns
    -------
    pandas.DataFrame
        One row per GPU activity that has a launch call: ``stream``, ``name``, ``previous`` (the
        predecessor's name, empty for a stream's first), ``start_us``, ``launch_return_us`` (end of
        the launch call), ``previous_end_us`` (NaN for a stream's first), ``kind`` (``"queued"`` when
        the launch returned before the predecessor ended, else ``"idle"``) and ``wait_us`` (queued:
        start minus the predecessor's end; idle: start minus the launch's return).
    """
    events = load_json(Path(path))["traceEvents"]
    launches = launch_calls(events)
    streams: dict[object, list[dict]] = {}
    for event in events:
        if event.get("cat") in GPU_CATEGORIES and event.get("ph") == "X":
            streams.setdefault(event.get("args", {}).get("stream", event.get("tid")), []).append(event)
    rows = []
    for stream, activities in streams.items():
        activities.sort(key=lambda e: float(e["ts"]))
        previous: dict | None = None
        for event in activities:
            launch = launches.get(event.get("args", {}).get("correlation"))
            start = float(event["ts"])
            previous_end = float(previous["ts"]) + float(previous.get("dur", 0.0)) if previous else float("nan")
            if launch is not None:
                returned = float(launch["ts"]) + float(launch.get("dur", 0.0))
                queued = previous is not None and returned < previous_end
                rows.append({"stream": stream, "name": event.get("name", ""),
                             "previous": previous.get("name", "") if previous else "", "start_us": start,
                             "launch_return_us": returned, "previous_end_us": previous_end,
                             "kind": "queued" if queued else "idle",
                             "wait_us": start - (previous_end if queued else returned)})
            previous = event
    return pd.DataFrame(rows, columns=["stream", "name", "previous", "start_us", "launch_return_us",
                                       "previous_end_us", "kind", "wait_us"])


def summarize(gaps: pd.DataFrame) -> pd.DataFrame:
    """Count, minimum, median and 90th percentile of ``wait_us`` per kind (rows of :func:`stream_gaps`)."""
    grouped = gaps.groupby("kind")["wait_us"]
    return pd.DataFrame({"count": grouped.size(), "min_us": grouped.min(), "median_us": grouped.median(),
                         "p90_us": grouped.quantile(0.9)})
