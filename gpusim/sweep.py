"""Parameter sweeps: many independent simulations, in parallel, cached, resumable.

A sweep calls a top-level function ``fn(**point)`` for every point (a dict of plain values) and
returns one DataFrame of the rows the calls return.  Points run in local processes by default, or
on a Dask cluster given its scheduler address.  With a cache folder, every finished point is
stored under a key made of the function's name, the point and gpusim's version, so an
interrupted sweep resumes without losing or repeating work.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

Row = dict[str, Any]


def point_key(fn: Callable, point: dict[str, Any]) -> str:
    """A stable key of ``fn`` applied to ``point`` (includes gpusim's version)."""
    from gpusim import __version__

    text = json.dumps(
        {"fn": f"{fn.__module__}.{fn.__qualname__}", "point": point, "version": __version__},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class ResultCache:
    """Finished points on disk, one pickle each (written atomically).

    Parameters
    ----------
    folder
        Where to keep them.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> list[Row] | None:
        """The stored rows of ``key``, or ``None``."""
        path = self._path(key)
        if not path.exists():
            return None
        try:
            return pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, EOFError):
            return None

    def put(self, key: str, rows: list[Row]) -> None:
        """Store the rows of ``key``."""
        path = self._path(key)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(rows))
        tmp.replace(path)


def _as_rows(value: Any, point: dict[str, Any]) -> list[Row]:
    if isinstance(value, pd.DataFrame):
        rows = value.to_dict("records")
    elif isinstance(value, dict):
        rows = [value]
    elif isinstance(value, Iterable):
        rows = [dict(row) for row in value]
    else:
        raise TypeError(f"a sweep function must return a dict, a list of dicts or a DataFrame, got {type(value).__name__}")
    return [{**point, **row} for row in rows]


def _call(fn: Callable, point: dict[str, Any]) -> list[Row]:
    return _as_rows(fn(**point), point)


def default_workers() -> int:
    """Processes to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def sweep(
    fn: Callable[..., Any],
    points: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    cache: str | os.PathLike | None = None,
    progress: bool = True,
    description: str = "sweep",
) -> pd.DataFrame:
    """Run ``fn(**point)`` for every point and collect the rows.

    Parameters
    ----------
    fn
        A picklable top-level function returning a dict, a list of dicts or a DataFrame.
    points
        Keyword arguments of each call (plain, JSON-serialisable values).
    workers
        Local processes (default: the CPUs available; 1 runs in this process).
    scheduler
        Address of a Dask scheduler (``tcp://host:8786``) to run the points on instead.
    cache
        Folder of finished points; those already there are not run again.
    progress
        Show a progress bar.
    description
        Label of the progress bar.

    Returns
    -------
    pandas.DataFrame
        One row per returned row, with the point's keys as columns, in the order of ``points``.
    """
    store = ResultCache(cache) if cache is not None else None
    keys = [point_key(fn, point) for point in points]
    results: dict[int, list[Row]] = {}
    todo = []
    for index, key in enumerate(keys):
        cached = store.get(key) if store is not None else None
        if cached is not None:
            results[index] = cached
        else:
            todo.append(index)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=description, unit="pt")

    def finished(index: int, rows: list[Row]) -> None:
        results[index] = rows
        if store is not None:
            store.put(keys[index], rows)
        if bar is not None:
            bar.update()

    try:
        if scheduler is not None and todo:
            from dask.distributed import Client
            from dask.distributed import as_completed as dask_completed

            with Client(scheduler) as client:
                futures = {client.submit(_call, fn, points[i], pure=False): i for i in todo}
                for future in dask_completed(futures):
                    finished(futures[future], future.result())
        elif (workers or default_workers()) > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=workers or default_workers()) as pool:
                futures = {pool.submit(_call, fn, points[i]): i for i in todo}
                for future in as_completed(futures):
                    finished(futures[future], future.result())
        else:
            for index in todo:
                finished(index, _call(fn, points[index]))
    finally:
        if bar is not None:
            bar.close()
    rows = [row for index in range(len(points)) for row in results[index]]
    return pd.DataFrame(rows)
