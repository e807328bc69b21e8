"""A mixture of experts' shared expert (``shared_expert_ffn``): its work, weights, memory and its
overlap with the all-to-alls (``shared_expert_overlap``)."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import ModelConfig, load_model, memory_footprint, transformer
from gpusim.trace.schema import parse_ints

SHARED = ModelConfig(name="tiny-shared", hidden=256, layers=2, heads=4, vocab=1024, seq_len=64, batch=4, experts=4,
                     experts_per_token=2, ffn_hidden=128, shared_expert_ffn=512, activation="swiglu", norm="rmsnorm",
                     position="rope", bias=False, tied_embeddings=False)


def _linear_flops(frame) -> float:
    """FLOPs of GPU 0's layer-0 GEMMs but the attention's score and context products."""
    gemms = frame[(frame["kind"] == "gemm") & (frame["gpu"] == 0) & (frame["layer"] == 0)
                  & ~frame["name"].str.contains("attn_score|attn_context")]
    return float((2 * gemms["m"] * gemms["n"] * gemms["k"] * gemms["batch"]).sum())


def test_qwen_moe_has_its_published_parameter_counts():
    """Qwen1.5-MoE-A2.7B: 14.3B parameters, 2.7B of them used per token (the shared expert is always used)."""
    qwen = load_model("qwen1.5-moe-a2.7b")
    assert qwen.parameters() == pytest.approx(14.3e9, rel=0.005)
    assert qwen.active_parameters() == pytest.approx(2.7e9, rel=0.01)
    shared = 3 * qwen.hidden * qwen.shared_expert_ffn * qwen.layers
    assert qwen.parameters() - load_model(qwen, shared_expert_ffn=None).parameters() == shared


@settings(max_examples=15, deadline=None)
@given(ep=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]), overlap=st.booleans())
def test_every_token_runs_through_the_shared_expert_beside_its_routed_ones(ep, tp, overlap):
    """A rank's forward linear GEMMs do 2 x tokens x (attention, router, two routed experts and the
    shared expert), sliced by tp; the backward pass twice that."""
    trace = transformer(SHARED, dp=4, ep=ep, tp=tp, batch=4, seq_len=64, optimizer=None, head=False,
                        shared_expert_overlap=overlap and ep > 1)
    h = SHARED.hidden
    per_token = (4 * h * h + 3 * h * (SHARED.top_k * SHARED.intermediate + SHARED.shared_expert_ffn)) / tp + h * 4
    forward = _linear_flops(trace.frame[trace.frame["phase"] == "fwd"])
    assert forward == pytest.approx(2 * 64 * per_token)
    assert _linear_flops(trace.frame[trace.frame["phase"] == "bwd"]) == pytest.approx(2 * forward)


def test_the_optimizer_and_the_footprint_hold_the_shared_expert():
    frame = transformer(SHARED, dp=4, ep=4, batch=4).frame
    steps = frame[(frame["kind"] == "optimizer") & (frame["gpu"] == 0)]
    held = sum(sum(parse_ints(text)) for text in steps["tensor_sizes"])
    routed = 3 * SHARED.hidden * SHARED.intermediate
    assert held == SHARED.parameters() - SHARED.layers * (SHARED.experts - 1) * routed  # one routed expert a rank
    without = SHARED.model_copy(update={"shared_expert_ffn": None})
    more = memory_footprint(transformer(SHARED, dp=4, ep=4, batch=4))
    fewer = memory_footprint(transformer(without, dp=4, ep=4, batch=4))
    assert (more["activations_bytes"] > fewer["activations_bytes"]).all()
    assert (more["weights_bytes"] > fewer["weights_bytes"]).all()


def test_the_overlapped_shared_expert_runs_while_the_tokens_travel():
    """Qwen1.5-MoE's prompt layer on 4 GPUs of a switch slowed to 25 GB/s a port: overlapped, the
    shared expert's first GEMM starts before the dispatch ends, and the layer is faster."""
    system = gpusim.load_system("hgx-h100", overrides={"num_gpus": 4,
                                                        "switch": {"port_bandwidth_bytes_per_s": "25 GB/s"}})

    def layer(overlap: bool):
        trace = transformer("qwen1.5-moe-a2.7b", phase="prompt", dp=4, ep=4, batch=4, seq_len=2048, layers=1,
                            head=False, attention="flash", shared_expert_overlap=overlap)
        return trace.replay(system, mode="auto", progress=False)

    in_turn, overlapped = layer(False), layer(True)
    ops = overlapped.ops[overlapped.ops["gpu"] == 0].set_index("name")
    assert ops.loc["L0.shared_fc1", "start_s"] < ops.loc["L0.moe_dispatch", "end_s"]
    assert ops.loc["L0.moe_dispatch", "stream"] == "ep_comm"
    assert overlapped.time_s < 0.97 * in_turn.time_s


@pytest.mark.parametrize(("model", "options", "message"), [
    ("mixtral-8x7b", {"dp": 2, "ep": 2, "shared_expert_overlap": True},
     r"shared_expert_overlap .* needs a model with a shared expert \('shared_expert_ffn'; mixtral-8x7b has none\)"),
    (SHARED, {"shared_expert_overlap": True}, r"and ep > 1 \(got 1\)"),
    (SHARED, {"dp": 2, "ep": 2, "shared_expert_overlap": "yes"}, "'shared_expert_overlap' must be True or False"),
])
def test_bad_shared_expert_options_are_refused(model, options, message):
    with pytest.raises(TraceError, match=message):
        transformer(model, batch=4, **options)


def test_a_shared_expert_needs_experts():
    with pytest.raises((ConfigError, ValueError), match="shared_expert_ffn is a mixture of experts' shared expert"):
        load_model("llama2-7b", shared_expert_ffn=1024)


def test_the_command_line_runs_qwen_moe_with_the_overlap(tmp_path):
    from gpusim.cli import main

    common = ["simulate", "--model", "qwen1.5-moe-a2.7b", "--phase", "prompt", "--layers", "1", "--batch", "4",
              "--seq-len", "64", "--dp", "4", "--ep", "4", "--system", "hgx-h100", "--quiet"]
    assert main([*common, "--shared-expert-overlap", "--out", str(tmp_path / "one")]) == 0
    assert main([*common, "--vary", "shared_expert_overlap=false,true", "--workers", "1",
                 "--out", str(tmp_path / "sweep")]) == 0
    points = pd.read_csv(tmp_path / "sweep" / "points.csv")
    assert points["total_s"].iloc[1] < points["total_s"].iloc[0]
