"""Command-line argument checks shared by the ``gpusim`` command and the study scripts.

Each check runs before any simulation, so that a bad argument costs nothing and leaves nothing
half-written.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from gpusim.errors import ConfigError, GpusimError

SEED_MAX = 2**32 - 1
"""The largest random seed (numpy's and pandas' random states take 32-bit seeds)."""


def _number(text: str, convert: Callable[[str], float], fits: Callable[[float], bool], expected: str):
    """``convert(text)`` when it ``fits``, else an argparse error saying what was ``expected``."""
    message = f"expected {expected}, got {text!r}"
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(message) from None
    if not fits(value):
        raise argparse.ArgumentTypeError(message)
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    return _number(text, int, lambda value: value > 0, "a positive integer")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0 (a tolerance, a fraction)."""
    return _number(text, float, lambda value: math.isfinite(value) and value >= 0, "a finite number of at least 0")


def random_seed(text: str) -> int:
    """An argparse type: a random seed, a whole number from 0 to :data:`SEED_MAX`."""
    return _number(text, int, lambda value: 0 <= value <= SEED_MAX, f"a whole number from 0 to {SEED_MAX}")


CREATED_FOLDERS: set[Path] = set()
"""Output folders :func:`output_folder` created in this process, with the parents it created for them
(removed again, while still empty, when the command that asked for them fails:
:func:`gpusim.output_files.staged_outputs`)."""


def blocking_file(folder: Path) -> Path | None:
    """The first of ``folder`` and its parents that exists and is not a folder (a file where a
    folder should be), or None."""
    return next((path for path in (folder, *folder.parents) if path.exists() and not path.is_dir()), None)


def output_folder(text: str | None, option: str = "--out") -> Path | None:
    """Check and create the folder an output option names.

    Parameters
    ----------
    text
        The folder as given on the command line; None when the option was not given.
    option
        The option's name, for the message.

    Returns
    -------
    pathlib.Path or None
        The folder, created with its parents when missing; None for None (nothing is to be written).

    Raises
    ------
    GpusimError
        An empty path, a path onto or through a file, or a folder that cannot be created or
        written to.
    """
    if text is None:
        return None
    if not text.strip():
        raise GpusimError(f"{option}: expected a folder, got an empty path")
    folder = Path(text)
    blocking = blocking_file(folder)
    if blocking is not None:
        raise GpusimError(f"{option} {text}: {blocking} is a file, not a folder")
    missing = [path.resolve() for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpusimError(f"{option} {text}: cannot create the folder: {exc.strerror or exc}") from None
    CREATED_FOLDERS.update(missing)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise GpusimError(f"{option} {text}: the folder is not writable")
    return folder


def output_folder_or_exit(parser: argparse.ArgumentParser, text: str | None, option: str = "--out") -> Path | None:
    """:func:`output_folder` for a script: a bad folder ends it with ``parser.error`` (exit code 2)."""
    try:
        return output_folder(text, option)
    except GpusimError as exc:
        parser.error(str(exc))


def run_script(main: Callable[[], int], name: str) -> int:
    """Run a study script's ``main`` and end its known failures with one line instead of a traceback.

    A :class:`~gpusim.errors.ConfigError` that surfaces while it runs (e.g. its Dask scheduler
    went away) prints ``name: error: ...`` and gives status 2, as a bad argument does; Ctrl-C
    prints ``name: interrupted`` and gives status 130.  Either way its sweeps' finished points stay
    in their cache.
    """
    try:
        return main()
    except ConfigError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def model_sweep_main(argv: list[str] | None, doc: str, sweep_function: Callable, points: Callable[[list[str]], list],
                     table: Callable, csv_name: str, models: Iterable[str], default_models: Iterable[str]) -> int:
    """The ``main`` of a study script that sweeps ``sweep_function`` over the points of the models given.

    It takes ``--out`` (the folder of ``csv_name`` and the sweep's cache), ``--models`` (of
    ``models``; default ``default_models``) and ``--workers``, runs :func:`gpusim.sweep.sweep` over
    ``points(models)`` with a progress bar, writes ``table(raw)`` to ``csv_name`` and prints it.

    Parameters
    ----------
    argv
        The script's arguments (``None``: the command line's).
    doc
        The script's docstring: its first paragraph describes the script in ``--help``.
    """
    import pandas as pd

    from gpusim.sweep import sweep

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", required=True, help=f"output folder ({csv_name}, sweep cache)")
    parser.add_argument("--models", nargs="+", default=list(default_models), choices=list(models),
                        help=f"models to run (default: {' '.join(default_models)})")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes (default: the CPUs available)")
    args = parser.parse_args(argv)
    out = output_folder_or_exit(parser, args.out, "--out")
    raw = sweep(sweep_function, points(args.models), workers=args.workers, cache=out / "cache",
                description=csv_name.removesuffix(".csv").replace("_", " "))
    result = table(raw)
    result.to_csv(out / csv_name, index=False)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(result.to_string(index=False, float_format="{:.4g}".format))
    print(f"wrote {out}/{csv_name}")
    return 0
