"""End-to-end iterations with concurrent GEMM groups (dissertation section 7.5.10)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.errors import ConfigError
from gpusim.sched.goldyloc import ConcurrencyPredictor
from gpusim.studies import concurrency_e2e as e2e
from gpusim.studies.concurrency import ConcurrencyStudy
from gpusim.trace.generator import transformer


@settings(max_examples=50, deadline=None)
@given(layers=st.integers(1, 10), steps=st.integers(1, 40))
def test_gnmt_wavefront_covers_every_cell_once(layers, steps):
    groups = e2e.gnmt_groups(hidden=64, batch=8, layers=layers, steps=steps)
    forward = [g for g in groups if g.name.startswith("encoder fwd")]
    assert sum(g.size * g.repeat for g in forward) == layers * steps
    assert max(g.size for g in forward) == min(layers, steps)
    assert sum(g.repeat for g in forward) == layers + steps - 1
    for group in groups:
        if " bwd " in group.name:  # input and weight gradient of every cell of the anti-diagonal
            assert [copies for _, copies in group.gemms] == [group.size // 2] * 2


def test_gnmt_decoder_cells_read_the_attention_context():
    groups = {g.name: g for g in e2e.gnmt_groups(hidden=256, batch=32, layers=2, steps=2)}
    (encoder, _), = groups["encoder fwd x1"].gemms
    (decoder, _), = groups["decoder fwd x1"].gemms
    assert encoder[:3] == (32, 1024, 512)   # batch x 4 gates x (input + state)
    assert decoder[:3] == (32, 1024, 768)   # the decoder's input is 2 x hidden wide


def test_gnmt_groups_reject_a_non_positive_size_or_an_unknown_dtype():
    with pytest.raises(ConfigError, match="layers must be a positive integer, got 0"):
        e2e.gnmt_groups(layers=0)
    with pytest.raises(ConfigError, match="steps must be a positive integer, got 2.5"):
        e2e.gnmt_groups(steps=2.5)
    with pytest.raises(ConfigError, match="gnmt_groups: dtype must be one of fp64, .*, got 'fp33'"):
        e2e.gnmt_groups(dtype="fp33")
    assert e2e.gnmt_groups(layers=np.int64(2), steps=2)  # NumPy integers are integers


def test_iteration_arguments_are_checked_before_any_simulation():
    study = ConcurrencyStudy("t3-table8.1", degrees=(2, 4), workers=1, progress=False)
    model = ConcurrencyPredictor().fit(np.array([[1.0], [2.0]]), [1, 2])
    groups = e2e.gnmt_groups(hidden=64, batch=8, layers=2, steps=2)
    for arguments, message in [
        ({"study": "mi100"}, "iteration: study must be a ConcurrencyStudy, got 'mi100'"),
        ({"model": ConcurrencyPredictor()}, "iteration: model must be a fitted ConcurrencyPredictor"),
        ({"groups": []}, r"iteration: groups must be a non-empty list of GemmGroup .*, got \[\]"),
        ({"rest_s": -1.0}, "iteration: rest_s must be a finite time of at least 0 s, got -1.0"),
        ({"rest_s": float("nan")}, "rest_s must be a finite time"),
    ]:
        with pytest.raises(ConfigError, match=message):
            e2e.iteration(**{"study": study, "model": model, "groups": groups, "app": "gnmt", **arguments})
    with pytest.raises(ConfigError, match="trace_groups: expected a Trace"):
        e2e.trace_groups("bert-base")
    _, ungrouped = e2e.trace_groups(transformer("bert-base", batch=2, seq_len=64, dtype="fp32", layers=1, head=False))
    with pytest.raises(ConfigError, match=r"trace_iteration: .*\(ungrouped rows\) has no GEMMs that could run concurrently"):
        e2e.trace_iteration(study, model, ungrouped, "bert")


def test_trace_groups_split_a_bert_iteration_and_keep_every_gemm():
    trace = transformer("bert-base", batch=2, seq_len=128, dtype="fp32", layers=3, head=False)
    groups, rest = e2e.trace_groups(trace)
    names = {g.name for g in groups}
    assert names == {"qkv fwd", "qkv bwd", "fc1 bwd", "fc2 bwd", "attn_out bwd", "attn_context bwd", "attn_score bwd"}
    assert all(g.repeat == 3 for g in groups)
    assert {g.name: g.size for g in groups}["qkv bwd"] == 6
    gemm_rows = int((trace.frame["kind"] == "gemm").sum())
    assert sum(g.size * g.repeat for g in groups) + int((rest.frame["kind"] == "gemm").sum()) == gemm_rows
    assert len(rest) == len(trace) - sum(g.size * g.repeat for g in groups)
    kept = set(rest.frame["op_id"])
    assert all(int(d) in kept for deps in rest.frame["deps"] for d in str(deps).split())


def test_trace_groups_need_a_single_gpu_trace():
    with pytest.raises(ConfigError, match="single-GPU trace"):
        e2e.trace_groups(transformer("bert-base", batch=2, seq_len=64, tp=2, layers=1, head=False))


def test_a_small_gnmt_iteration_gains_from_concurrency(tmp_path):
    study = ConcurrencyStudy("t3-table8.1", degrees=(2, 4), rc_fractions=(1, 2), shortlist_size=1, workers=1,
                             cache=tmp_path, progress=False)
    groups = e2e.gnmt_groups(hidden=128, batch=32, layers=3, steps=3, dtype="fp16")
    measured = study.measure(e2e._gemm_frame(groups, "gnmt"), partitions=False)
    model = ConcurrencyPredictor().fit(np.vstack(measured.shapes["features"].to_numpy()), measured.shapes["preferred"].to_numpy())
    runs, totals = e2e.iteration(study, model, groups, "gnmt", rest_s=1e-4)
    assert list(totals["policy"]) == list(e2e.POLICIES)
    by_policy = totals.set_index("policy")
    assert by_policy.loc["sequential", "speedup_over_sequential"] == 1.0
    # Small GEMMs leave most of the GPU idle: running an anti-diagonal's GEMMs together is faster.
    assert by_policy.loc["default", "speedup_over_sequential"] > 1.1
    assert (by_policy["iteration_s"] == by_policy["gemm_s"] + 1e-4).all()
    for row in runs.itertuples():
        degrees = [int(d) for d in row.degrees.split(",")]
        assert len(degrees) == row.size
        if row.policy != "goldyloc":
            assert set(degrees) == {1}
