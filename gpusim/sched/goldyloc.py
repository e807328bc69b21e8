"""GOLDYLOC's offline logic: resource-constrained tuning, GO-kernel choice and the concurrency predictor.

Dissertation chapter 7, section 7.3:

* *Resource-constrained (RC) tuning* tunes every GEMM on the full GPU and on GPU/2 and GPU/4 (half
  and a quarter of the CUs and of the L2): :func:`resource_constrained_overrides`.
* For every concurrency degree (CD) the best kernels of the three are benchmarked running
  ``CD`` copies concurrently; the fastest is the *globally optimized* (GO) kernel of that degree:
  :func:`go_kernels`.
* Offline profiling labels each GEMM with its *preferred* degree, the one with the most speedup
  over sequential execution, or sequential when none gains 5 %: :func:`preferred_degree`.
* A multinomial logistic-regression predictor (one class per degree) on min-max-normalised
  features (M, N, K and the GO kernels' workgroups, occupancy and waves per degree) predicts it:
  :class:`ConcurrencyPredictor`; the executed degree is ``min(predicted, available GEMMs)``.

Everything here is arithmetic on measured (simulated) times; the simulations themselves run in
:mod:`gpusim.studies.concurrency`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpusim.config.gpu import GpuConfig

DEGREES = (1, 2, 4, 8, 16)
"""Concurrency degrees the predictor chooses between (1 = sequential)."""

RC_FRACTIONS = (1, 2, 4)
"""Resource-constrained tuning configurations: GPU, GPU/2, GPU/4."""

MIN_GAIN = 0.05
"""A degree is preferred over sequential execution only if it gains at least this much."""


def resource_constrained_overrides(gpu: GpuConfig, fraction: int) -> dict[str, int]:
    """Overrides that give a kernel ``1/fraction`` of the CUs and of the L2 capacity (GPU/``fraction``).

    Parameters
    ----------
    gpu
        The full GPU.
    fraction
        1 (the GPU itself), 2 (GPU/2) or 4 (GPU/4); any divisor of the CU count works.
    """
    if fraction < 1 or gpu.num_cus // fraction < 1:
        raise ValueError(f"resource constraint GPU/{fraction}: fraction must be at least 1 and leave a CU of {gpu.num_cus}")
    if fraction == 1:
        return {}
    return {"gpu.num_cus": gpu.num_cus // fraction, "gpu.l2.capacity_bytes": int(gpu.l2.capacity_bytes) // fraction}


def fastest(times: Mapping[str, float]) -> str:
    """The kernel with the smallest time (ties: the first name in sorted order)."""
    if not times:
        raise ValueError("fastest: no kernel times given")
    return min(sorted(times), key=lambda name: times[name])


def go_kernels(times: Mapping[tuple[int, str], float], isolated: str) -> dict[int, str]:
    """The globally optimized kernel of every degree.

    Parameters
    ----------
    times
        ``(degree, kernel) -> time`` of running ``degree`` copies concurrently (degree >= 2).
    isolated
        The isolation-tuned kernel (degree 1).

    Returns
    -------
    dict
        Degree -> kernel name; degree 1 is ``isolated``.
    """
    chosen = {1: isolated}
    for degree in sorted({degree for degree, _ in times}):
        chosen[degree] = fastest({kernel: t for (d, kernel), t in times.items() if d == degree})
    return chosen


def preferred_degree(speedups: Mapping[int, float], available: int | None = None, min_gain: float = MIN_GAIN) -> int:
    """The degree with the most speedup over sequential execution; 1 when none gains ``min_gain``.

    Parameters
    ----------
    speedups
        Degree -> speedup over sequential execution (degree 1 may be omitted).
    available
        Consider only degrees up to this many available GEMMs (the oracle's choice for them).
    min_gain
        Smallest gain that justifies concurrency.
    """
    usable = {d: s for d, s in speedups.items() if d > 1 and (available is None or d <= available)}
    if not usable:
        return 1
    best = max(sorted(usable), key=lambda d: usable[d])
    return best if usable[best] >= 1.0 + min_gain else 1


def waves(workgroups: int, occupancy: int, cus: int) -> float:
    """Waves of a kernel: its workgroups over the workgroups the GPU holds at once."""
    if occupancy < 1 or cus < 1:
        raise ValueError(f"waves: occupancy ({occupancy}) and CUs ({cus}) must be positive")
    return workgroups / (occupancy * cus)


def feature_names(degrees: Sequence[int] = DEGREES[1:]) -> list[str]:
    """Names of the predictor's features, in :func:`feature_vector` order."""
    names = ["m", "n", "k"]
    for degree in degrees:
        names += [f"workgroups_{degree}", f"occupancy_{degree}", f"waves_{degree}"]
    return names


def feature_vector(m: int, n: int, k: int, kernels: Mapping[int, tuple[int, int, float]],
                   degrees: Sequence[int] = DEGREES[1:]) -> np.ndarray:
    """The predictor's input for one GEMM.

    Parameters
    ----------
    m, n, k
        GEMM dimensions.
    kernels
        Degree -> ``(workgroups, occupancy, waves)`` of that degree's GO kernel.
    degrees
        Degrees whose kernels are features.
    """
    values: list[float] = [m, n, k]
    for degree in degrees:
        if degree not in kernels:
            raise ValueError(f"feature_vector: no GO kernel for degree {degree}")
        values += [float(v) for v in kernels[degree]]
    return np.asarray(values, dtype=float)


class ConcurrencyPredictor:
    """Multinomial logistic regression over min-max-normalised features (dissertation eq. 7.1).

    ``P = softmax(x W + b)``; the predicted degree is the class of highest probability.  Fitting
    minimises the mean cross-entropy plus ``l2 / 2`` times the squared weights (and biases) by
    Newton's method, which converges in a few dozen steps for this small model.

    Parameters
    ----------
    classes
        The degrees it may predict.
    l2
        Weight of the L2 penalty; default ``1 / samples``, the regularisation of scikit-learn's
        ``LogisticRegression`` defaults (``C = 1``).
    iterations
        Most Newton steps.
    """

    def __init__(self, classes: Sequence[int] = DEGREES, l2: float | None = None, iterations: int = 50):
        if len(set(classes)) < 2:
            raise ValueError(f"ConcurrencyPredictor: needs at least two classes, got {list(classes)}")
        if l2 is not None and l2 <= 0:
            raise ValueError(f"ConcurrencyPredictor: l2 must be positive, got {l2}")
        self.classes = np.asarray(sorted(set(classes)))
        self.l2 = l2
        self.iterations = iterations
        self.low: np.ndarray | None = None
        self.span: np.ndarray | None = None
        self.weights: np.ndarray | None = None
        """Shape (features + 1, classes); the last row is the bias."""

    def _design(self, features: np.ndarray) -> np.ndarray:
        x = (np.atleast_2d(np.asarray(features, dtype=float)) - self.low) / self.span
        return np.hstack([x, np.ones((len(x), 1))])

    @staticmethod
    def _loss(x: np.ndarray, targets: np.ndarray, weights: np.ndarray, penalty: float) -> float:
        logits = x @ weights
        logits = logits - logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return float(-(targets * log_p).sum() / len(x) + 0.5 * penalty * (weights**2).sum())

    def fit(self, features: np.ndarray, degrees: Sequence[int]) -> ConcurrencyPredictor:
        """Learn the weights from features (one row per GEMM) and preferred degrees."""
        features = np.asarray(features, dtype=float)
        degrees = np.asarray(degrees)
        if features.ndim != 2 or len(features) != len(degrees) or len(features) == 0:
            raise ValueError(f"fit: expected a 2-D feature array with one row per degree, got {features.shape} and {degrees.shape}")
        unknown = set(degrees.tolist()) - set(self.classes.tolist())
        if unknown:
            raise ValueError(f"fit: degrees {sorted(unknown)} are not among the classes {self.classes.tolist()}")
        self.low = features.min(axis=0)
        high = features.max(axis=0)
        self.span = np.where(high > self.low, high - self.low, 1.0)
        x = self._design(features)
        targets = (degrees[:, None] == self.classes[None, :]).astype(float)
        samples, width = x.shape
        classes = len(self.classes)
        weights = np.zeros((width, classes))
        penalty = self.l2 if self.l2 is not None else 1.0 / samples
        loss = self._loss(x, targets, weights, penalty)
        for _ in range(self.iterations):
            p = _softmax(x @ weights)
            gradient = x.T @ (p - targets) / samples + penalty * weights
            curvature = np.einsum("ik,kl->ikl", p, np.eye(classes)) - np.einsum("ik,il->ikl", p, p)
            hessian = np.einsum("ikl,ia,ib->kalb", curvature, x, x).reshape(classes * width, classes * width) / samples
            hessian += penalty * np.eye(classes * width)
            step = np.linalg.solve(hessian, gradient.T.reshape(-1)).reshape(classes, width).T
            scale = 1.0
            while scale > 1e-4:
                trial = weights - scale * step
                trial_loss = self._loss(x, targets, trial, penalty)
                if trial_loss <= loss:
                    break
                scale /= 2
            else:
                break
            converged = loss - trial_loss < 1e-10
            weights, loss = trial, trial_loss
            if converged:
                break
        self.weights = weights
        return self

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """Probability of every class (columns in :attr:`classes` order) for each row."""
        if self.weights is None:
            raise RuntimeError("ConcurrencyPredictor: call fit() before predicting")
        return _softmax(self._design(features) @ self.weights)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted degree of each row."""
        return self.classes[np.argmax(self.probabilities(features), axis=1)]

    def predict_degree(self, features: np.ndarray) -> int:
        """Predicted degree of one GEMM's feature vector."""
        return int(self.predict(features)[0])


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def executed_degree(predicted: int, available: int) -> int:
    """The degree the CP executes: ``min(predicted, available)``."""
    return max(1, min(int(predicted), int(available)))


def cross_validated_predictions(features: np.ndarray, degrees: Sequence[int], folds: int = 10, seed: int = 0,
                                **predictor_options) -> np.ndarray:
    """Out-of-fold predictions: each GEMM predicted by a model trained on the other folds.

    With 10 folds every model trains on 90 % of the GEMMs and is tested on the other 10 %
    (section 7.3.3), and every GEMM gets a prediction it was not trained on.
    """
    features = np.asarray(features, dtype=float)
    degrees = np.asarray(degrees)
    if folds < 2 or folds > len(degrees):
        raise ValueError(f"cross_validated_predictions: folds must be between 2 and {len(degrees)}, got {folds}")
    order = np.random.default_rng(seed).permutation(len(degrees))
    predictions = np.empty(len(degrees), dtype=int)
    for test in np.array_split(order, folds):
        train = np.setdiff1d(order, test)
        model = ConcurrencyPredictor(**predictor_options).fit(features[train], degrees[train])
        predictions[test] = model.predict(features[test])
    return predictions
