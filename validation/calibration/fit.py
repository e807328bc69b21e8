"""Fit calibration parameters of a preset by grid search, and report the error on held-out data.

A parameter is fitted *globally*: one value for the whole GPU (or node), chosen to minimise the
median absolute error over the fitting rows (with several data sets: the largest of their medians);
the chosen values are then judged on rows that took no part in the choice (a random half of each
data set, or another data set).  Example::

    python validation/calibration/fit.py --dataset gemm-v100-deepbench \\
        --param "gpu.gemm_efficiency.fp16=0.84,0.88,0.92" --query "2*m*n*k > 1e11" --out out/fit

Writes ``fit-<datasets>.csv`` (one row per grid point: its parameters and the error statistics on
the fitting rows) and ``fit-<datasets>-holdout.csv`` (the held-out rows with the chosen values).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import pandas as pd

import gpusim
from gpusim import validation
from gpusim.arguments import output_folder_or_exit, positive_int, random_seed
from gpusim.errors import GpusimError


def parse_param(option: str, text: str) -> tuple[str, list[str]]:
    """``"path=v1,v2"`` -> ``(path, [v1, v2])`` (values stay strings; the loader parses units).

    Raises
    ------
    ValueError
        Without a path or a value (the message names ``option``).
    """
    path, equals, values = text.partition("=")
    parsed = [value.strip() for value in values.split(",") if value.strip()]
    if not (equals and path.strip() and parsed):
        raise ValueError(f"{option} {text!r}: expected path=value1,value2,...")
    return path.strip(), parsed


def as_value(text: str):
    """A number when the text is one, else the text (``"5.5 us"``)."""
    try:
        return float(text)
    except ValueError:
        return text


def rows_of(name: str, query: str | None, points: int | None, seed: int) -> pd.DataFrame:
    """The rows of data set ``name`` selected by ``query`` (a random ``points`` of them).

    Raises
    ------
    ValueError
        When ``query`` cannot be evaluated on the data set.
    """
    dataset = validation.get(name)
    rows = dataset.load()
    if query:
        try:
            rows = rows.query(query)
        except Exception as error:  # the user's expression can fail in any way (syntax, names, types)
            reason = str(error).splitlines()[0] if str(error) else ""
            raise ValueError(f"{query!r} on {name}: {type(error).__name__}: {reason}") from error
    return validation.sample(rows, points, seed, by=dataset.group)


def query_target(query: str) -> tuple[str | None, str]:
    """The data set a ``--query`` names (``DATASET:QUERY``; None: every data set) and its expression."""
    prefix, _, rest = query.partition(":")
    if prefix.strip() in validation.DATASETS:
        return prefix.strip(), rest
    return None, query


def query_for(name: str, queries: list[str]) -> str | None:
    """The queries of ``--query`` that apply to data set ``name`` (those without a data set prefix,
    and those prefixed ``name:``), joined with ``and``."""
    own = [expression for target, expression in map(query_target, queries) if target in (None, name)]
    if len(own) <= 1:
        return own[0] if own else None
    return " and ".join(f"({query})" for query in own)


def compare_all(parts: dict[str, pd.DataFrame], overrides: dict, args) -> pd.DataFrame:
    """Simulate the rows of every data set with ``overrides``; one frame with a ``dataset`` column."""
    frames = [validation.compare(name, rows, overrides=overrides, mode=args.mode, workers=args.workers,
                                 progress=False) for name, rows in parts.items()]
    return pd.concat(frames, ignore_index=True)


def describe(frame: pd.DataFrame) -> str:
    """Median / p90 / max of every data set in ``frame``."""
    texts = []
    for name, part in frame.groupby("dataset", sort=False):
        stats = validation.error_stats(part)
        texts.append(f"{name}: median {stats['median']:.1%}, p90 {stats['p90']:.1%}, max {stats['max']:.1%} "
                     f"({stats['points']} points)")
    return "; ".join(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", action="append", required=True, choices=list(validation.DATASETS),
                        help="data set to fit on (repeatable: the fit minimises the largest median)")
    parser.add_argument("--param", action="append", required=True,
                        help="override path=value1,value2,... to fit (repeatable: every combination is tried)")
    parser.add_argument("--fixed", action="append", default=[], help="override path=value held fixed (repeatable)")
    parser.add_argument("--query", action="append", default=[],
                        help="pandas query selecting the rows to use (e.g. '2*m*n*k > 1e11'); 'DATASET:QUERY' "
                             "applies to that data set only (repeatable: the queries of a data set all apply)")
    parser.add_argument("--points", type=positive_int, help="random subset of this many rows per data set")
    parser.add_argument("--holdout-dataset", choices=list(validation.DATASETS),
                        help="judge the chosen values on this data set instead of a random half")
    parser.add_argument("--holdout-query", help="pandas query on the hold-out data set")
    parser.add_argument("--holdout-points", type=positive_int, help="random subset of this many hold-out rows")
    parser.add_argument("--seed", type=random_seed, default=0,
                        help="seed of the random row subsets and of the hold-out half (default 0)")
    parser.add_argument("--mode", default="symmetric", choices=["full", "symmetric"],
                        help="simulation mode of single-node rows (default symmetric)")
    parser.add_argument("--workers", type=positive_int, help="processes (default: the CPUs available)")
    parser.add_argument("--out", default="out/fit", help="output folder (default out/fit)")
    args = parser.parse_args(argv)

    if not args.holdout_dataset and (args.holdout_query or args.holdout_points):
        parser.error("--holdout-query and --holdout-points need --holdout-dataset")
    try:
        grid = dict(parse_param("--param", text) for text in args.param)
        fixed = dict(parse_param("--fixed", text) for text in args.fixed)
    except ValueError as error:
        parser.error(str(error))
    if len(grid) < len(args.param) or len(fixed) < len(args.fixed) or grid.keys() & fixed.keys():
        parser.error("each override path may be given once, in --param or in --fixed")
    if any(len(values) > 1 for values in fixed.values()):
        parser.error("--fixed takes one value per path (path=value)")
    fixed = {path: as_value(values[0]) for path, values in fixed.items()}
    for query in args.query:
        target = query_target(query)[0]
        if target is not None and target not in args.dataset:
            parser.error(f"--query {query!r} is for {target}, which is not among the --dataset ones")
    fit_parts, holdout_parts = {}, {}
    for name in args.dataset:
        try:
            rows = rows_of(name, query_for(name, args.query), args.points, args.seed)
        except ValueError as error:
            parser.error(f"--query {error}")
        needed = 1 if args.holdout_dataset else 2
        if len(rows) < needed:
            parser.error(f"{name}: --query/--points leave {len(rows)} of its rows; the fit needs at least {needed}"
                         + ("" if args.holdout_dataset else " (half of them are held out)"))
        if args.holdout_dataset:
            fit_parts[name] = rows
        else:
            fit_parts[name], holdout_parts[name] = validation.holdout_split(rows, args.seed)
    if args.holdout_dataset:
        try:
            rows = rows_of(args.holdout_dataset, args.holdout_query, args.holdout_points, args.seed)
        except ValueError as error:
            parser.error(f"--holdout-query {error}")
        if rows.empty:
            parser.error(f"{args.holdout_dataset}: --holdout-query/--holdout-points leave none of its rows")
        holdout_parts[args.holdout_dataset] = rows
    systems = {validation.get(name).system for name in [*fit_parts, *holdout_parts]}
    for system, (path, values) in itertools.product(sorted(systems), grid.items()):
        for value in values:  # every override the runs will use, before any of them
            try:
                gpusim.load_system(system, {**fixed, path: as_value(value)})
            except GpusimError as error:
                parser.error(f"--param {path}={value} on {system}: {error}")
    out = output_folder_or_exit(parser, args.out, "--out")
    print("fitting on " + ", ".join(f"{len(rows)} rows of {name}" for name, rows in fit_parts.items())
          + "; holding out " + ", ".join(f"{len(rows)} rows of {name}" for name, rows in holdout_parts.items()))

    results = []
    for values in itertools.product(*grid.values()):
        overrides = {**fixed, **{path: as_value(value) for path, value in zip(grid, values)}}
        frame = compare_all(fit_parts, overrides, args)
        medians = [validation.error_stats(part)["median"] for _, part in frame.groupby("dataset")]
        stats = validation.error_stats(frame)
        results.append({**dict(zip(grid, values)), "objective": max(medians), **stats})
        print("  " + ", ".join(f"{path}={value}" for path, value in zip(grid, values)) + ": " + describe(frame),
              flush=True)
    table = pd.DataFrame(results)
    best = table.sort_values(["objective", "p90"]).iloc[0]
    chosen = {**fixed, **{path: as_value(best[path]) for path in grid}}
    fitted = compare_all(fit_parts, chosen, args)
    holdout = compare_all(holdout_parts, chosen, args)
    print("chosen: " + ", ".join(f"{path}={best[path]}" for path in grid))
    print("  fitting rows:  " + describe(fitted))
    print("  held-out rows: " + describe(holdout))
    stem = "+".join(args.dataset)
    table.to_csv(out / f"fit-{stem}.csv", index=False)
    holdout.to_csv(out / f"fit-{stem}-holdout.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
