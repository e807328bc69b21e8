"""Parameter sweeps: many independent simulations, in parallel, cached, resumable.

A sweep calls a top-level function ``fn(**point)`` for every point (a dict of plain values) and
returns one DataFrame of the rows the calls return.  Points run in local processes by default, or
on a Dask cluster given its scheduler address.  With a cache folder, every finished point is
stored under a key made of the function's name, the point and gpusim's version, so an
interrupted sweep resumes without losing or repeating work.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import pickle
import signal
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpusim.errors import ConfigError, SweepError
from gpusim.ops import as_int
from gpusim.output_files import write_whole

Row = dict[str, Any]


def _plain(value: Any) -> Any:
    """A JSON stand-in for a value ``json`` cannot write: numpy scalars as Python numbers (the
    call sees the same number), an object with a ``sweep_key()`` method (a digest of its contents,
    e.g. :meth:`gpusim.trace.Trace.sweep_key`) by that key, anything else by its ``repr``; both tagged
    with the type, so that ``np.int64(1)`` and ``"1"`` do not share a key."""
    if isinstance(value, np.generic):
        return value.item()
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if callable(getattr(value, "sweep_key", None)):
        return {"__type__": kind, "key": value.sweep_key()}
    return {"__type__": kind, "repr": repr(value)}


def code_of(source: str) -> str:
    """The code of a Python module without its docstrings and comments (editing those keeps caches)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


@functools.lru_cache(maxsize=1)
def simulator_fingerprint() -> str:
    """Identity of what any point simulates: gpusim's code (:func:`code_of` of every module), and the
    hardware presets and model definitions it finds (``$GPUSIM_HWCONFIGS``, ``$GPUSIM_MODELS`` and the
    repository's), read once per process."""
    from gpusim.config.loader import hwconfig_dirs
    from gpusim.trace.models import model_dirs

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for file in sorted(package.rglob("*.py")):
        digest.update(file.relative_to(package).as_posix().encode())
        digest.update(code_of(file.read_text()).encode())
    for folder in (*hwconfig_dirs(), *model_dirs()):
        for file in sorted(folder.rglob("*.yaml")) if folder.is_dir() else []:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:20]


def point_key(fn: Callable, point: dict[str, Any]) -> str:
    """A stable key of ``fn`` applied to ``point`` and the simulator it runs on
    (:func:`simulator_fingerprint`: a changed model or preset is simulated again)."""
    text = json.dumps(
        {"fn": f"{fn.__module__}.{fn.__qualname__}", "point": point, "simulator": simulator_fingerprint()},
        sort_keys=True,
        default=_plain,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


CACHE_MAGIC = b"gpusim-sweep-1\n"
"""First bytes of a cache entry, before the SHA-256 of the pickled rows and the rows themselves."""


class ResultCache:
    """Finished points on disk, one pickle each (written atomically), behind the SHA-256 of its
    bytes: an entry that is damaged (cut short, altered on disk) or was not written by this cache is
    a miss, reported with a warning, and its point is simulated again.

    Parameters
    ----------
    folder
        Where to keep them.

    Raises
    ------
    ConfigError
        ``folder`` is a file, or it cannot be created (the message names it and the reason).
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(f"sweep cache {self.folder}: is a file, not a folder")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"sweep cache {self.folder}: cannot create the folder: {exc.strerror or exc}") from exc

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> list[Row] | None:
        """The stored rows of ``key``, or ``None`` (none stored, or a damaged entry: warned)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._damaged(path, f"cannot be read ({exc.strerror or exc})")
        body = data[len(CACHE_MAGIC):]
        digest, payload = body[:32], body[32:]
        if not data.startswith(CACHE_MAGIC) or hashlib.sha256(payload).digest() != digest:
            return self._damaged(path, "its checksum does not match its contents (cut short or altered)")
        try:
            rows = pickle.loads(payload)
        except Exception as exc:  # any failure to unpickle makes the entry a miss
            return self._damaged(path, f"cannot be unpickled ({type(exc).__name__}: {exc})")
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            return self._damaged(path, f"holds a {type(rows).__name__}, not a list of rows")
        return rows

    @staticmethod
    def _damaged(path: Path, why: str) -> None:
        warnings.warn(f"sweep cache {path}: {why}; the point is simulated again", UserWarning, stacklevel=3)
        return None

    def put(self, key: str, rows: list[Row]) -> None:
        """Store the rows of ``key``.

        Raises
        ------
        ConfigError
            The entry cannot be written (a full disk, the folder removed); the message names the
            file and the reason, and no partial file is left.
        """
        payload = pickle.dumps(rows)
        entry = CACHE_MAGIC + hashlib.sha256(payload).digest() + payload
        write_whole(self._path(key), lambda tmp: tmp.write_bytes(entry), "a sweep point's cached rows", ConfigError)


def _as_rows(value: Any, point: dict[str, Any]) -> list[Row]:
    expected = "a sweep function must return a dict, a list of dicts or a DataFrame"
    if isinstance(value, pd.DataFrame):
        rows = value.to_dict("records")
    elif isinstance(value, Mapping):
        rows = [dict(value)]
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        rows = list(value)
        if not all(isinstance(row, Mapping) for row in rows):
            raise TypeError(f"{expected}; got a {type(value).__name__} holding {sorted({type(r).__name__ for r in rows})}")
        rows = [dict(row) for row in rows]
    else:
        raise TypeError(f"{expected}, got {type(value).__name__}")
    for row in rows:
        clash = [key for key in row if key in point and not _same(row[key], point[key])]
        if clash:
            raise ValueError(f"the function returned {clash[0]!r} = {row[clash[0]]!r}, but the point's {clash[0]!r} is "
                             f"{point[clash[0]]!r}; a point's keys are columns of their own, name the result otherwise")
    return [{**point, **row} for row in rows]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. arrays, whose == is elementwise
        return a is b


def _call(fn: Callable, point: dict[str, Any]) -> list[Row]:
    return _as_rows(fn(**point), point)


def default_workers() -> int:
    """Processes to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _die_on_interrupt() -> None:
    """A worker process ends at Ctrl-C without a traceback of its own (the caller reports it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def dask_client(scheduler: str):
    """A Dask client connected to the scheduler at ``scheduler`` (close it, or use it in ``with``).

    Parameters
    ----------
    scheduler
        The scheduler's address, ``tcp://host:port`` as the scheduler prints it.

    Returns
    -------
    dask.distributed.Client

    Raises
    ------
    ConfigError
        dask.distributed is not installed, the address is not one, or no scheduler answers there
        within Dask's connect timeout (the ``distributed.comm.timeouts.connect`` setting, 30 s by
        default).
    """
    if not isinstance(scheduler, str):
        raise ConfigError(f"scheduler: expected a Dask scheduler address such as tcp://host:8786, got {scheduler!r}")
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError(f"scheduler {scheduler}: running on a Dask cluster needs dask.distributed "
                          "(pip install -e \".[dist]\")") from None
    try:
        return Client(scheduler)
    except (OSError, ValueError) as exc:  # OSError: nothing answers (a timeout); ValueError: not an address
        raise ConfigError(f"cannot reach the Dask scheduler at {scheduler} ({exc}); check that a scheduler runs there, "
                          "that the address is tcp://host:port as the scheduler printed it, and that this machine "
                          "can reach that port") from None


def check_scheduler(scheduler: str) -> None:
    """Connect to the Dask scheduler at ``scheduler`` once and disconnect, so that a script can refuse an
    unreachable one before it starts any work.

    Raises
    ------
    ConfigError
        As :func:`dask_client`.
    """
    dask_client(scheduler).close()


def sweep(
    fn: Callable[..., Any],
    points: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    cache: str | os.PathLike | None = None,
    progress: bool = True,
    description: str = "sweep",
    labels: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Run ``fn(**point)`` for every point and collect the rows.

    Parameters
    ----------
    fn
        A picklable top-level function returning a dict, a list of dicts or a DataFrame.
    points
        Keyword arguments of each call (plain, JSON-serialisable values).
    workers
        Local processes, at least 1 (default: the CPUs available; 1 runs in this process).
    scheduler
        Address of a Dask scheduler (``tcp://host:8786``) to run the points on instead (see
        :func:`dask_client`; it is contacted only when a point is not in the cache).
    cache
        Folder of finished points; those already there are not run again.
    progress
        Show a progress bar.
    description
        Label of the progress bar.
    labels
        How a failed point is named in the :class:`SweepError`, one label per point (default: the
        point's keyword arguments); a caller whose points carry bulky arguments gives the values
        that tell them apart.

    Returns
    -------
    pandas.DataFrame
        One row per returned row, with the point's keys as columns, in the order of ``points``; a
        point given twice is run once.

    Raises
    ------
    ConfigError
        ``workers`` is not a positive integer, ``labels`` is not one per point, ``cache`` is a file
        or cannot be created, or the scheduler cannot be reached (:func:`dask_client`).
    SweepError
        A point failed (its error is the cause); the points that finished are cached.
    """
    if workers is not None and (as_int(workers) is None or workers < 1):
        raise ConfigError(f"sweep: workers must be a positive integer (or None for every CPU), got {workers!r}")
    if labels is not None and len(labels) != len(points):
        raise ConfigError(f"sweep: labels must name each of the {len(points)} points, got {len(labels)} labels")
    store = ResultCache(cache) if cache is not None else None
    keys = [point_key(fn, point) for point in points]
    results: dict[int, list[Row]] = {}
    todo = []
    first_of: dict[str, int] = {}
    for index, key in enumerate(keys):
        if first_of.setdefault(key, index) != index:
            continue  # the same point again: it takes the first one's rows
        cached = store.get(key) if store is not None else None
        if cached is not None:
            results[index] = cached
        else:
            todo.append(index)
    bar = None
    if progress:
        from gpusim.progress import progress_bar

        bar = progress_bar(len(points), description, "pt", initial=len(points) - len(todo))

    failed: list[tuple[int, BaseException]] = []

    def finished(index: int, outcome: Callable[[], list[Row]]) -> None:
        """Keep (and cache) a point's rows, or note its failure; after a failure no new point starts."""
        try:
            rows = outcome()
        except Exception as exc:  # reported below, with the point it belongs to
            failed.append((index, exc))
            return
        results[index] = rows
        if store is not None:
            try:
                store.put(keys[index], rows)
            except ConfigError as exc:  # the cache cannot keep it: stop as after a failed point
                failed.append((index, exc))
                return
        if bar is not None:
            bar.update()

    try:
        if scheduler is not None and todo:
            with dask_client(scheduler) as client:
                from dask.distributed import as_completed as dask_completed

                futures = {client.submit(_call, fn, points[i], pure=False): i for i in todo}
                for future in dask_completed(futures):
                    finished(futures[future], future.result)
                    if failed:
                        client.cancel([f for f in futures if not f.done()])
                        break
        elif (workers or default_workers()) > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=workers or default_workers(), initializer=_die_on_interrupt) as pool:
                futures = {pool.submit(_call, fn, points[i]): i for i in todo}
                for future in as_completed(futures):
                    if future.cancelled():
                        continue
                    finished(futures[future], future.result)
                    if failed:  # let the running points finish (and be cached), start no more
                        for other in futures:
                            other.cancel()
        else:
            for index in todo:
                finished(index, lambda index=index: _call(fn, points[index]))
                if failed:
                    break
    finally:
        if bar is not None:
            bar.close()
    if failed:
        index, exc = failed[0]
        label = labels[index] if labels is not None else repr(points[index])
        raise SweepError(f"{description}: point {index} {label} failed: {type(exc).__name__}: {exc}"
                         + (f" ({len(failed) - 1} more points failed)" if len(failed) > 1 else "")) from exc
    rows = [row for index in range(len(points)) for row in results[first_of[keys[index]]]]
    return pd.DataFrame(rows)
