"""How much the GOLDYLOC predictor's accuracy owes to its regularisation and feature scaling.

Usage::

    python validation/concurrency/predictor_variants.py out/concurrency/shapes.csv [--system mi100]

Reads the ``shapes.csv`` of a ``reproduce.py`` run (no simulation: the GO kernels and the preferred
degrees are in it), recomputes the predictor's features (:meth:`ConcurrencyStudy.features`) and
prints, for each variant of the predictor, its out-of-fold accuracy per number of available GEMMs
(the 10-fold cross-validation of ``reproduce.py``, as ``predictor.csv`` counts it) and how many of
its own training labels a model fitted on every shape reproduces.  The variants: the study's
predictor (L2 weight ``1 / samples``), other L2 weights, the features' base-2 logarithms before the
min-max scaling, and always predicting the commonest degree.  The first row reproduces the run's
``predictor.csv``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from gpusim.sched.goldyloc import ConcurrencyPredictor, cross_validated_predictions
from gpusim.studies.concurrency import ConcurrencyStudy

L2_WEIGHTS = (1e-4, 1e-3, 1e-2, 1e-1)
"""L2 weights tried besides the study's ``1 / samples``."""
LOG_FLOOR = 1e-3
"""Smallest feature value before the logarithm (fractional waves stay positive)."""


def accuracy(study: ConcurrencyStudy, shapes: pd.DataFrame, predicted: np.ndarray) -> list[float]:
    """Share of shapes whose executed degree is the oracle's, per available count (``study.degrees``),
    as the study counts it (:meth:`ConcurrencyStudy.accuracy`)."""
    return study.accuracy(shapes.assign(predicted=predicted))["accuracy"].tolist()


def variants(study: ConcurrencyStudy, shapes: pd.DataFrame, folds: int = 10) -> pd.DataFrame:
    """One row per predictor variant: ``variant``, ``accuracy_{available}`` for each of the study's
    degrees and ``training_fit`` (share of its own labels a model fitted on all shapes reproduces;
    NaN for the commonest-degree rule)."""
    features = np.vstack([study.features(row) for _, row in shapes.iterrows()])
    labels = shapes["preferred"].to_numpy()
    folds = max(2, min(folds, len(labels)))
    logs = np.log2(np.maximum(features, LOG_FLOOR))
    candidates = [("study (l2 = 1/samples)", features, {})]
    candidates += [(f"l2 = {weight:g}", features, {"l2": weight}) for weight in L2_WEIGHTS]
    candidates += [("log2 features", logs, {}), ("log2 features, l2 = 0.001", logs, {"l2": 1e-3})]
    columns = [f"accuracy_{d}" for d in study.degrees]
    rows = []
    for name, x, options in candidates:
        predicted = cross_validated_predictions(x, labels, folds=folds, **options)
        fitted = ConcurrencyPredictor(**options).fit(x, labels)
        rows.append({"variant": name, **dict(zip(columns, accuracy(study, shapes, predicted))),
                     "training_fit": float(np.mean(fitted.predict(x) == labels))})
    values, counts = np.unique(labels, return_counts=True)
    commonest = values[np.argmax(counts)]
    rows.append({"variant": f"always {int(commonest)}",
                 **dict(zip(columns, accuracy(study, shapes, np.full(len(labels), commonest)))),
                 "training_fit": float("nan")})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", help="shapes.csv of a reproduce.py run")
    parser.add_argument("--system", default="mi100", help="the preset the run used (default: mi100)")
    args = parser.parse_args(argv)
    shapes = pd.read_csv(args.shapes)
    study = ConcurrencyStudy(args.system, progress=False)
    labels = shapes["preferred"].value_counts().sort_index()
    print(f"{len(shapes)} shapes; preferred degrees: {', '.join(f'{d}: {n}' for d, n in labels.items())}")
    print(variants(study, shapes).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
