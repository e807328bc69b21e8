"""GOLDYLOC's offline logic: degree labels, GO-kernel choice, resource constraints, the predictor."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.config import load_gpu_config
from gpusim.sched.goldyloc import (
    DEGREES,
    ConcurrencyPredictor,
    cross_validated_predictions,
    executed_degree,
    feature_names,
    feature_vector,
    go_kernels,
    preferred_degree,
    resource_constrained_overrides,
    waves,
)


def test_preferred_degree_is_the_fastest_unless_none_gains_five_percent():
    assert preferred_degree({2: 1.10, 4: 1.30, 8: 1.20, 16: 0.90}) == 4
    assert preferred_degree({2: 1.04, 4: 1.03, 8: 0.9, 16: 0.8}) == 1
    assert preferred_degree({2: 1.05, 4: 1.0}) == 2
    assert preferred_degree({2: 1.10, 4: 1.30, 8: 1.50}, available=4) == 4
    assert preferred_degree({2: 0.9, 4: 1.30}, available=2) == 1


def test_executed_degree_is_min_of_prediction_and_available():
    assert executed_degree(16, 4) == 4
    assert executed_degree(2, 16) == 2
    assert executed_degree(1, 8) == 1


def test_go_kernel_is_the_fastest_at_each_degree():
    times = {(2, "a"): 1.0, (2, "b"): 0.9, (4, "a"): 1.5, (4, "b"): 1.7}
    assert go_kernels(times, "a") == {1: "a", 2: "b", 4: "a"}


def test_resource_constraints_halve_and_quarter_cus_and_l2():
    gpu = load_gpu_config("mi100")
    assert resource_constrained_overrides(gpu, 1) == {}
    for fraction in (2, 4):
        constrained = gpusim.load_system("mi100", resource_constrained_overrides(gpu, fraction)).gpu
        assert constrained.num_cus == gpu.num_cus // fraction
        assert constrained.l2.capacity_bytes == gpu.l2.capacity_bytes // fraction
        assert constrained.hbm.bandwidth_bytes_per_s == gpu.hbm.bandwidth_bytes_per_s  # bandwidth is not constrained
    with pytest.raises(ValueError, match="fraction"):
        resource_constrained_overrides(gpu, 0)


def test_features_are_dimensions_and_per_degree_kernel_properties():
    kernels = {d: (64 * d, 2, waves(64 * d, 2, 120)) for d in DEGREES[1:]}
    vector = feature_vector(4096, 128, 1024, kernels)
    assert len(vector) == len(feature_names()) == 3 + 3 * 4
    assert vector[:3].tolist() == [4096, 128, 1024]
    assert vector[3:6].tolist() == pytest.approx([128, 2, 128 / 240])
    with pytest.raises(ValueError, match="no GO kernel for degree 4"):
        feature_vector(1, 1, 1, {2: (1, 1, 1.0)})


def synthetic(samples=400, seed=3):
    """A rule a linear model can learn: the preferred degree falls as 'size' grows."""
    rng = np.random.default_rng(seed)
    size = rng.uniform(0, 1, samples)
    noise = rng.uniform(0, 1, (samples, 3))
    degrees = np.select([size < 0.2, size < 0.4, size < 0.6, size < 0.8], [16, 8, 4, 2], 1)
    return np.column_stack([size * 1e4, noise * 50]), degrees


def test_predictor_learns_a_separable_rule():
    features, degrees = synthetic()
    model = ConcurrencyPredictor(l2=1e-5).fit(features[:300], degrees[:300])
    assert (model.predict(features[300:]) == degrees[300:]).mean() > 0.9
    regularised = ConcurrencyPredictor().fit(features[:300], degrees[:300])  # scikit-learn's default strength
    assert 0.6 < (regularised.predict(features[300:]) == degrees[300:]).mean() <= (model.predict(features[300:]) == degrees[300:]).mean()
    probabilities = model.probabilities(features[:5])
    assert probabilities.shape == (5, len(DEGREES))
    assert probabilities.sum(axis=1) == pytest.approx(np.ones(5))
    assert model.predict_degree(features[0]) in DEGREES


@settings(max_examples=10, deadline=None)
@given(st.floats(0.01, 1e4), st.floats(-1e4, 1e4))
def test_min_max_normalisation_makes_predictions_scale_free(scale, offset):
    features, degrees = synthetic(120)
    plain = ConcurrencyPredictor().fit(features, degrees).predict(features)
    moved = ConcurrencyPredictor().fit(features * scale + offset, degrees).predict(features * scale + offset)
    assert (plain == moved).mean() > 0.97


def test_cross_validation_predicts_every_gemm_out_of_fold():
    features, degrees = synthetic(200)
    first = cross_validated_predictions(features, degrees, folds=10, l2=1e-5)
    again = cross_validated_predictions(features, degrees, folds=10, l2=1e-5)
    assert len(first) == 200 and (first == again).all()
    assert (first == degrees).mean() > 0.85
    with pytest.raises(ValueError, match="folds"):
        cross_validated_predictions(features, degrees, folds=1)


def test_predictor_rejects_bad_input():
    with pytest.raises(ValueError, match="not among the classes"):
        ConcurrencyPredictor().fit(np.zeros((3, 2)), [1, 3, 2])
    with pytest.raises(RuntimeError, match="fit"):
        ConcurrencyPredictor().predict(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="two classes"):
        ConcurrencyPredictor(classes=[2])
