"""What a generated iteration keeps in each GPU's memory, against the published closed forms."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.cli import main
from gpusim.errors import TraceError
from gpusim.trace import ModelConfig, load_model, memory_footprint, transformer
from gpusim.trace.memory import optimizer_state_arrays

GPT = ModelConfig(name="gpt", hidden=1024, layers=4, heads=16, vocab=5000, seq_len=512, batch=1)
"""A GPT layer as Korthikanti et al. 2022 count it: GeLU MLP of 4h, multi-head attention, dropouts."""
S, B, H, A, L = 512, 1, 1024, 16, 4


def activations(model=GPT, stage=0, **options):
    trace = transformer(model, head=False, optimizer=None, **options)
    return int(memory_footprint(trace).loc[stage, "activations_bytes"])


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_follow_korthikanti_et_al_table_2(t):
    """sbh(10 + 24/t + 5as/(ht)) per layer with tensor parallelism; sbh/t (34 + 5as/h) with sequence
    parallelism; 34 sbh/t with selective recomputation too; full recomputation keeps each layer's
    input (2 sbh/t) and one layer's activations while its backward pass runs."""
    per_layer = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert activations(tp=t) == L * per_layer
    if t > 1:
        sequence_parallel = S * B * H / t * (34 + 5 * A * S / H)
        assert activations(tp=t, sequence_parallel=True) == L * sequence_parallel
        assert activations(tp=t, sequence_parallel=True, recompute="selective") == L * 34 * S * B * H / t
        assert activations(tp=t, sequence_parallel=True, recompute="full") == L * 2 * S * B * H / t + sequence_parallel


def test_flash_attention_keeps_its_log_sum_exp_instead_of_the_scores():
    scores = 5 * A * S * S * B
    kept = 4 * B * A * S  # the fp32 log-sum-exp; its output is the output projection's input, counted already
    assert activations(attention="flash") == activations() - L * (scores - kept)


def test_the_output_layer_is_held_for_the_last_chunks_passes_only():
    """With the interleaved schedule the output layer follows the last stage's last chunk, whose
    passes are in flight one at a time: with or without it, the activations differ by one
    microbatch's output-layer input and fp32 logits."""
    tokens = S * B
    head = 2 * tokens * H + 2 * tokens * H + 4 * tokens * GPT.vocab
    for virtual_stages in (1, 2):
        options = dict(pp=2, microbatches=4, batch=4, virtual_stages=virtual_stages, optimizer=None)
        with_head = memory_footprint(transformer(GPT, **options)).loc[1, "activations_bytes"]
        without = memory_footprint(transformer(GPT, head=False, **options)).loc[1, "activations_bytes"]
        assert with_head - without == head


def test_a_pipeline_stage_holds_the_microbatches_its_schedule_has_in_flight():
    """1F1B: stage i holds pp - i microbatches; GPipe: all of them; interleaved 1F1B: the first stage
    holds L (1 + (p - 1) / (p v)) layers' worth (Korthikanti et al. 2022, section 4.2.3)."""
    layer = S * B * H * (34 + 5 * A * S / H)
    one_f_one_b = [activations(pp=2, microbatches=4, batch=4, stage=stage) for stage in (0, 1)]
    assert one_f_one_b == [2 * 2 * layer, 1 * 2 * layer]  # 2 layers a stage
    assert activations(pp=2, microbatches=4, batch=4, schedule="gpipe") == 4 * 2 * layer
    interleaved = activations(pp=2, microbatches=4, batch=4, virtual_stages=2)
    assert interleaved == L * (1 + (2 - 1) / (2 * 2)) * layer


def test_training_state_is_16_bytes_a_parameter_and_zero_1_shards_the_optimizer():
    """Rajbhandari et al. 2020 (ZeRO), Figure 1: mixed-precision Adam keeps 2 + 2 + 12 bytes per
    parameter (120 GB for 7.5B parameters) and 2 + 2 + 12/N_d with the optimizer state partitioned
    (31.4 GB on 64 GPUs)."""
    assert optimizer_state_arrays("adam") == 2 and optimizer_state_arrays("lamb") == 3
    assert optimizer_state_arrays("adan") == 4 and optimizer_state_arrays("sgd") == 1
    model = load_model("llama2-7b", layers=2)
    options = dict(dp=64, batch=64, seq_len=16)
    plain = memory_footprint(transformer(model, **options)).iloc[0]
    sharded = memory_footprint(transformer(model, **options, distributed_optimizer=True)).iloc[0]
    psi = plain["parameters"]
    assert psi == model.parameters()
    assert plain[["weights_bytes", "gradients_bytes", "optimizer_bytes"]].sum() == 16 * psi
    assert sharded["optimizer_bytes"] == 12 * -(-psi // 64)
    assert sharded[["weights_bytes", "gradients_bytes", "optimizer_bytes"]].sum() / (16 * psi) == pytest.approx(
        31.4 / 120, rel=0.002)
    fp32 = memory_footprint(transformer(model, dtype="fp32", batch=1, seq_len=16)).iloc[0]
    assert fp32["optimizer_bytes"] == 8 * psi  # no master copy


def test_inference_keeps_the_weights_and_the_key_value_cache():
    """Llama-2-7B's cache is 2 x 32 layers x 4096 values x 2 bytes = 512 KiB a token."""
    table = memory_footprint(transformer("llama2-7b", phase="decode", batch=8, seq_len=1000, decode_tokens=24))
    row = table.iloc[0]
    assert row["kv_cache_bytes"] == 8 * 1024 * 512 * 1024
    assert row["weights_bytes"] == 2 * load_model("llama2-7b").parameters()
    assert row[["gradients_bytes", "optimizer_bytes", "activations_bytes"]].sum() == 0
    grouped = memory_footprint(transformer("llama2-70b", phase="prompt", tp=8, batch=2, seq_len=4096)).iloc[0]
    assert grouped["kv_cache_bytes"] == 2 * 80 * 1 * 128 * 2 * 4096 * 2  # one of the 8 key/value heads a rank


def test_experts_spread_over_the_expert_parallel_ranks_lighten_each_gpu():
    mixtral = load_model("mixtral-8x7b", layers=2)
    one = memory_footprint(transformer(mixtral, dp=8, ep=1, batch=8, seq_len=256)).iloc[0]
    eight = memory_footprint(transformer(mixtral, dp=8, ep=8, batch=8, seq_len=256)).iloc[0]
    expert = 3 * 4096 * 14336
    assert one["parameters"] - eight["parameters"] == 2 * 7 * expert
    assert eight["activations_bytes"] > 0


def test_fits_compares_each_stage_with_the_gpus_memory():
    system = gpusim.load_system("hgx-h100")
    alone = memory_footprint(transformer("llama2-70b", batch=1, seq_len=1024, layers=20), system)
    assert list(alone.columns[-2:]) == ["capacity_bytes", "fits"] and not alone["fits"].any()
    split = memory_footprint(transformer("llama2-70b", tp=8, pp=4, batch=4, seq_len=1024, layers=20), system)
    assert split["fits"].all() and len(split) == 4
    assert (split["total_bytes"] == split[["weights_bytes", "gradients_bytes", "optimizer_bytes",
                                           "activations_bytes", "kv_cache_bytes"]].sum(axis=1)).all()


def test_an_imported_trace_has_no_footprint():
    trace = gpusim.trace.Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "compute", "kind": "gemm", "m": 8, "n": 8, "k": 8}]),
                               source="mine.csv")
    with pytest.raises(TraceError, match="mine.csv: memory_footprint needs a trace from gpusim.trace.transformer"):
        memory_footprint(trace)


def test_cli_prints_and_writes_the_footprint(tmp_path, capsys):
    assert main(["simulate", "--model", "llama2-70b", "--layers", "1", "--batch", "1", "--seq-len", "128",
                 "--phase", "prompt", "--system", "a100-sxm4", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU at the peak: 2.6 GiB of 80 GiB (stage 0: weights 2.6, KV cache 0.0)" in out
    table = pd.read_csv(tmp_path / "memory.csv")
    assert table["fits"].tolist() == [True]
    assert main(["simulate", "--model", "llama2-70b", "--layers", "60", "--batch", "1", "--seq-len", "16",
                 "--phase", "prompt", "--system", "a100-sxm4", "--quiet"]) == 0
    assert "does not fit: stage 0 need more than gpu.hbm.capacity_bytes" in capsys.readouterr().out


def test_a_sweep_says_which_points_fit(tmp_path, capsys):
    assert main(["simulate", "--model", "llama2-70b", "--phase", "prompt", "--layers", "10", "--batch", "1",
                 "--seq-len", "64", "--system", "hgx-h100", "--set", "gpu.hbm.capacity=16GiB", "--vary", "tp=1,2",
                 "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    points = pd.read_csv(tmp_path / "points.csv")
    assert points["fits"].tolist() == [False, True]
    assert points["memory_bytes"].iloc[0] == pytest.approx(2 * points["memory_bytes"].iloc[1], rel=0.1)
    assert "memory (GiB)" in capsys.readouterr().out
    rows = pd.read_csv(tmp_path / "sweep.csv")
    assert {"memory_bytes", "fits"} <= set(rows.columns)


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
       microbatches=st.integers(1, 4), flash=st.booleans(), sequence_parallel=st.booleans(),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]), optimizer=st.sampled_from(["adam", "lamb", "sgd", None]))
def test_memory_never_grows_with_more_sharing(tp, pp, dp, microbatches, flash, sequence_parallel, dtype, optimizer):
    """Invariants over random layouts: each stage's parts add up to its total; recomputing more never
    keeps more; the distributed optimizer never keeps more; twice the tensor parallelism never
    keeps more on any GPU."""
    options = dict(pp=pp, dp=dp, microbatches=microbatches, batch=dp * microbatches, seq_len=64, dtype=dtype,
                   optimizer=optimizer, attention="flash" if flash and dtype != "fp32" else "unfused")

    def table(**more):
        return memory_footprint(transformer(GPT, **{**options, "tp": tp, "sequence_parallel": sequence_parallel,
                                                    **more}))

    plain = table()
    parts = ["weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "kv_cache_bytes"]
    assert (plain[parts].sum(axis=1) == plain["total_bytes"]).all()
    selective = table(recompute="selective")["activations_bytes"]
    full = table(recompute="full")["activations_bytes"]
    assert (full <= selective).all() and (selective <= plain["activations_bytes"]).all()
    assert (table(distributed_optimizer=True)["total_bytes"] <= plain["total_bytes"]).all()
    assert (table(tp=2 * tp)["total_bytes"] <= plain["total_bytes"]).all()


def test_a_shortened_trace_also_says_what_the_whole_model_needs(capsys):
    """Simulating two of a model's layers is the quick way to time it; its memory is the whole
    model's, in the same layout, exactly as the full trace's."""
    options = dict(tp=8, pp=2, batch=4, microbatches=4, seq_len=512, attention="flash")
    short = transformer("llama2-70b", layers=4, **options)
    whole = transformer("llama2-70b", **options)
    pd.testing.assert_frame_equal(memory_footprint(short, whole_model=True), memory_footprint(whole))
    assert memory_footprint(short)["total_bytes"].max() < memory_footprint(whole)["total_bytes"].max() / 4
    pd.testing.assert_frame_equal(memory_footprint(whole, whole_model=True), memory_footprint(whole))
    assert main(["simulate", "--model", "llama2-70b", "--layers", "2", "--tp", "8", "--batch", "1", "--seq-len", "64",
                 "--phase", "prompt", "--system", "hgx-h100", "--quiet"]) == 0
    assert "the whole model, in this layout: 16.1 GiB per GPU at the peak (fits; 2 layers simulated)" in \
        capsys.readouterr().out
