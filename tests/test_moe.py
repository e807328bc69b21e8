"""Mixture-of-experts layers in generated traces: routing, expert parallelism, gradients, errors."""

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.cli import main
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import ModelConfig, load_model, transformer
from gpusim.trace.generator import Parallelism
from gpusim.trace.schema import parse_ints, validate

MOE = ModelConfig(name="tiny-moe", hidden=256, layers=2, heads=4, vocab=1024, seq_len=64, batch=4, experts=4,
                  experts_per_token=2, activation="swiglu", norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False)


def rows(frame, gpu=0, phase=None, layer=0):
    picked = frame[(frame["gpu"] == gpu) & (frame["layer"] == layer)]
    return picked if phase is None else picked[picked["phase"] == phase]


def linear_flops(frame) -> float:
    """FLOPs of the non-batched and expert GEMMs of the rows (the attention's score and context left out)."""
    gemms = frame[(frame["kind"] == "gemm") & ~frame["name"].str.contains("attn_score|attn_context")]
    return float((2 * gemms["m"] * gemms["n"] * gemms["k"] * gemms["batch"]).sum())


def test_mixtral_has_its_published_parameter_counts():
    """Jiang et al. 2024: 47B parameters, 13B of them used per token (46.7B and 12.9B in the model card)."""
    mixtral = load_model("mixtral-8x7b")
    assert mixtral.parameters() == pytest.approx(46.7e9, rel=0.002)
    assert mixtral.active_parameters() == pytest.approx(12.9e9, rel=0.002)
    dense = load_model("llama2-7b")
    assert dense.active_parameters() == dense.parameters()


@settings(max_examples=25, deadline=None)
@given(ep=st.sampled_from([1, 2, 4]), top_k=st.integers(1, 4), tp=st.sampled_from([1, 2]))
def test_each_token_runs_through_its_experts_whatever_the_expert_parallelism(ep, top_k, tp):
    """A rank's forward linear GEMMs do 2 x tokens x the active weights of a layer (attention, router,
    ``top_k`` experts), sliced by tp, however many ranks hold the experts."""
    model = load_model(MOE, experts_per_token=top_k)
    trace = transformer(model, dp=4, ep=ep, tp=tp, batch=4, seq_len=64, optimizer=None, head=False)
    tokens = 64  # one sequence per replica
    h, f, e = model.hidden, model.intermediate, model.experts
    attention = (h * (h + 2 * h) + h * h) / tp  # QKV and the output projection (no GQA here)
    experts = top_k * 3 * h * f / tp
    expected = 2 * tokens * (attention + h * e + experts)
    assert linear_flops(rows(trace.frame, phase="fwd")) == pytest.approx(expected)
    backward = linear_flops(rows(trace.frame, phase="bwd"))
    assert backward == pytest.approx(2 * expected)  # activation and weight gradients


def test_experts_exchange_tokens_only_across_the_expert_parallel_group():
    dense = transformer(MOE, dp=4, ep=1, batch=4, optimizer=None)
    assert "alltoall" not in set(dense.frame["collective"].dropna())
    frame = transformer(MOE, dp=4, ep=2, batch=4, optimizer=None).frame
    exchanges = rows(frame)[rows(frame)["collective"] == "alltoall"]
    assert list(exchanges["name"]) == ["L0.moe_dispatch", "L0.moe_combine", "L0.moe_combine_bwd",
                                       "L0.moe_dispatch_bwd"]
    slots = 64 * 2 // 4  # a replica's 64 tokens, 2 copies each, over 4 experts
    assert set(exchanges["bytes"]) == {4 * slots * MOE.hidden * 2}
    everyone = frame[frame["collective"] == "alltoall"]
    assert set(everyone["group"]) == {"0 1", "2 3"}
    expert_gemms = rows(frame, phase="fwd")[rows(frame, phase="fwd")["name"] == "L0.expert_fc1"]
    assert expert_gemms[["m", "batch"]].values.tolist() == [[2 * slots, 2]]  # 2 local experts, 2 ranks' tokens each


def test_capacity_factor_pads_every_expert_and_the_exchange():
    plain = transformer(MOE, dp=2, ep=2, batch=2, optimizer=None).frame
    padded = transformer(MOE, dp=2, ep=2, batch=2, optimizer=None, expert_capacity_factor=1.25).frame

    def field(frame, name, column):
        return int(rows(frame).set_index("name").loc[name, column])

    assert field(padded, "L0.expert_fc1", "m") == 2 * 40  # ceil(1.25 x 64 x 2 / 4) = 40 slots per rank
    assert field(plain, "L0.expert_fc1", "m") == 2 * 32
    assert field(padded, "L0.moe_dispatch", "bytes") == 4 * 40 * MOE.hidden * 2


def test_expert_gradients_reduce_over_the_replicas_that_hold_the_same_experts():
    frame = transformer(MOE, dp=4, ep=2, batch=4).frame
    reduce = frame[frame["name"] == "L1.expert_grad_allreduce"]
    assert set(reduce["group"]) == {"0 2", "1 3"} and set(reduce["stream"]) == {"comm"}
    local_experts = 2 * 3 * MOE.hidden * MOE.intermediate
    assert set(reduce["bytes"]) == {local_experts * 2}
    step = frame[(frame["name"] == "L1.adam") & (frame["gpu"] == 0)]
    assert int(reduce[reduce["gpu"] == 0]["op_id"].iloc[0]) in parse_ints(step["deps"].iloc[0])
    dense_buckets = frame[(frame["name"] == "L1.grad_allreduce") & (frame["gpu"] == 0)]
    assert set(dense_buckets["group"]) == {"0 1 2 3"}
    assert frame[frame["name"].str.contains("expert_grad")].empty is False
    one_holder = transformer(MOE, dp=2, ep=2, batch=2).frame  # each expert on one rank: nothing to reduce
    assert not one_holder["name"].str.contains("expert_grad").any()


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_the_optimizer_updates_each_expert_on_its_holders(ep):
    frame = transformer(MOE, dp=4, ep=ep, batch=4).frame
    steps = frame[frame["kind"] == "optimizer"]

    def elements(gpu):
        sizes = steps[steps["gpu"] == gpu]["tensor_sizes"]
        return sum(sum(parse_ints(text)) for text in sizes)

    held = elements(0)
    expert = 3 * MOE.hidden * MOE.intermediate
    assert held == MOE.parameters() - MOE.layers * (MOE.experts - MOE.experts // ep) * expert
    group = Parallelism(dp=4, ep=ep).expert_groups(0)[0]
    assert sum(elements(g) for g in group) - (ep - 1) * (MOE.parameters() - MOE.layers * MOE.experts * expert) \
        == MOE.parameters()


def test_decoding_routes_each_new_token_to_its_experts_only():
    frame = transformer(MOE, phase="decode", dp=2, ep=2, batch=2, decode_tokens=2).frame
    fc1 = rows(frame, phase="decode")
    fc1 = fc1[fc1["name"] == "L0.expert_fc1"]
    assert fc1[["m", "batch"]].values.tolist() == [[1, 2], [1, 2]]  # 2 copies a replica, one to each of 2 experts
    assert (frame["collective"] == "alltoall").any()
    step = transformer("mixtral-8x7b", phase="decode", batch=1, layers=1, seq_len=128, head=False).frame
    experts = step[step["name"] == "L0.expert_fc1"]
    assert experts[["m", "batch"]].values.tolist() == [[1, 2]]  # one token reads 2 of the 8 experts' weights


def test_a_slower_network_slows_the_exchanges_and_padding_slows_the_experts():
    system = gpusim.load_system("hgx-h100", overrides={"num_gpus": 4})
    slow = gpusim.load_system("hgx-h100", overrides={"num_gpus": 4, "links.bandwidth": "50 GB/s",
                                                     "switch.port_bandwidth": "50 GB/s"})
    wide = load_model(MOE, hidden=1024, heads=8)

    def durations(system, **options):
        trace = transformer(wide, phase="prompt", dp=4, ep=4, batch=4, seq_len=2048, layers=1, head=False,
                            attention="flash", **options)
        result = trace.replay(system, mode="auto", progress=False)
        assert result.stats["mode"] == "symmetric"  # every rank alike on a switch
        summary = result.summary().set_index("name")
        return summary["duration_s"]

    base = durations(system)  # each rank sends 3/4 of an 8 MiB buffer
    assert durations(slow)["L0.moe_dispatch"] > 3 * base["L0.moe_dispatch"]
    padded = durations(system, expert_capacity_factor=2.0)
    assert padded["L0.expert_fc1"] > 1.3 * base["L0.expert_fc1"]
    assert padded["L0.moe_dispatch"] > 1.3 * base["L0.moe_dispatch"]


@pytest.mark.parametrize("options, message", [
    ({"model": "llama2-7b", "dp": 2, "ep": 2}, "ep=2 applies to a mixture-of-experts model"),
    ({"model": "llama2-7b", "expert_capacity_factor": 1.25}, "expert_capacity_factor=1.25 applies to a mixture"),
    ({"model": "llama2-7b", "expert_capacity_factor": 1}, "expert_capacity_factor=1 applies to a mixture"),
    ({"dp": 3, "ep": 2}, "ep=2 must divide dp=3"),
    ({"dp": 8, "ep": 8}, "ep=8 must divide the 4 experts"),
    ({"ep": 0}, "'ep' must be a positive integer"),
    ({"expert_capacity_factor": 0}, "'expert_capacity_factor' must be a positive number or None (dropless), got 0"),
    ({"expert_capacity_factor": True}, "must be a positive number or None (dropless), got True"),
    ({"expert_capacity_factor": float("nan")}, "must be a positive number or None (dropless), got nan"),
    ({"tp": 2, "sequence_parallel": True}, "'sequence_parallel' with a mixture of experts is not modelled"),
    ({"dp": 2, "ep": 2, "distributed_optimizer": True}, "'distributed_optimizer' with ep > 1 is not modelled"),
])
def test_expert_options_that_do_not_fit_are_refused(options, message):
    options = {"model": MOE, "batch": 8, **options}
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        transformer(options.pop("model"), **options)


def test_a_model_file_with_more_routed_experts_than_experts_is_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"hidden": 256, "layers": 2, "heads": 4, "vocab": 1024, "seq_len": 64,
                                    "experts": 4, "experts_per_token": 5}))
    with pytest.raises(ConfigError, match=r"m.yaml: .*experts_per_token \(5\) exceeds experts \(4\)"):
        load_model(path)
    with pytest.raises(ConfigError, match=r"field 'experts': .*greater than or equal to 2"):
        load_model(path, experts=1, experts_per_token=1)
    with pytest.raises(ConfigError, match="experts_per_token routes tokens in a mixture of experts; it needs experts"):
        load_model(path, experts=None, experts_per_token=2)
    assert load_model(path, experts_per_token=None).top_k == 2


def test_cli_simulates_and_sweeps_expert_options(tmp_path, capsys):
    common = ["simulate", "--model", "mixtral-8x7b", "--phase", "prompt", "--layers", "1", "--batch", "8",
              "--seq-len", "64", "--dp", "8", "--system", "hgx-h100", "--quiet"]
    assert main([*common, "--ep", "8", "--out", str(tmp_path / "one")]) == 0
    assert "mixtral-8x7b-prompt-tp1-dp8-pp1-ep8" in capsys.readouterr().out
    assert main([*common, "--ep", "8", "--vary", "expert_capacity_factor=1,2", "--workers", "1",
                 "--out", str(tmp_path / "sweep")]) == 0
    points = pd.read_csv(tmp_path / "sweep" / "points.csv")
    assert points["expert_capacity_factor"].tolist() == [1.0, 2.0]
    assert points["compute_s"].iloc[1] > points["compute_s"].iloc[0]
    assert main([*common, "--vary", "expert_capacity_factor=1,x"]) == 2
    assert "--vary expert_capacity_factor: expected numbers or none, got 'x'" in capsys.readouterr().err


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4]), ep_share=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2]), microbatches=st.integers(1, 2), phase=st.sampled_from(["train", "prompt", "decode"]),
       recompute=st.booleans(), async_tp=st.booleans())
def test_expert_traces_are_acyclic_and_every_group_queues_its_exchanges_alike(tp, dp, ep_share, pp, microbatches, phase,
                                                                               recompute, async_tp):
    """Whatever the parallelism: a valid trace whose dependencies have no cycle, in which every rank of
    an expert-parallel group queues the same all-to-alls in the same order (so none waits for a rank
    that waits for it), and every rank runs its ``experts / ep`` experts, or as many as the routed
    copies of a decoding step's tokens when they are fewer."""
    ep = min(ep_share, dp)
    train = phase == "train"
    frame = transformer(MOE, phase=phase, tp=tp, dp=dp, ep=ep, pp=pp, microbatches=microbatches,
                        batch=dp * microbatches, seq_len=16, recompute=recompute and train,
                        async_tp_backward=async_tp and train).frame
    validate(frame)
    exchanges = frame[frame["collective"] == "alltoall"]
    assert exchanges.empty == (ep == 1)
    for group, rows in exchanges.groupby("group"):
        sequences = {tuple(ranks["op_id"]) for _, ranks in rows.groupby("gpu")}
        assert len(group.split()) == ep and len(sequences) == 1
    fc1 = frame[frame["name"].str.endswith("expert_fc1")]
    copies = (1 if phase == "decode" else 16) * MOE.top_k  # a microbatch of one sequence
    assert set(fc1["batch"]) == {min(MOE.experts // ep, copies)}
