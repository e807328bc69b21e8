"""The transformer trace generator: shapes (Table 4.3), communication volumes, schedules, models."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import ModelConfig, list_models, load_model, transformer
from gpusim.trace.lowering import op_of_row
from gpusim.trace.schedules import interleaved_order, stage_order
from gpusim.trace.schema import parse_ints, validate

TINY = ModelConfig(name="tiny", hidden=256, layers=3, heads=4, vocab=1024, seq_len=64, batch=4)
TINY8 = load_model(TINY, heads=8)
"""TINY with as many heads as the largest tensor-parallel degree the tests use."""


def gemms(frame, phase, layer=0, step=0):
    """The layer's GEMMs as Table 4.3 writes them (cuBLAS's M x N x K: the trace's n x m x k)."""
    rows = frame[(frame["kind"] == "gemm") & (frame["phase"] == phase) & (frame["layer"] == layer)
                 & (frame["step"] == step) & (frame["gpu"] == 0)]
    return Counter(zip(rows["n"], rows["m"], rows["k"], rows["batch"]))


def test_bert_large_gemms_equal_table_4_3():
    """seeds/002 Table 4.3 (M x N x K, batch) for one BERT-Large layer (B=4, n=128 keeps shapes distinct)."""
    B, n, d, dff, h = 4, 128, 1024, 4096, 16
    frame = transformer("bert-large", batch=B, seq_len=n, layers=2).frame
    linear_fwd = (d, n * B, d, 1)
    table_fwd = Counter([linear_fwd] * 4 + [(n, n, d // h, B * h), (d // h, n, n, B * h),
                                            (dff, n * B, d, 1), (d, n * B, dff, 1)])
    table_bwd = Counter(
        [(d, n * B, d, 1)] * 4 + [(d, d, n * B, 1)] * 4  # Linear: activation and weight gradients (Q, K, V, output)
        + [(n, d // h, n, B * h), (d // h, n, n, B * h)]  # Attn. Score: activation, weight gradient
        + [(d // h, n, n, B * h), (n, n, d // h, B * h)]  # Attn. O/p: activation, weight gradient
        + [(d, n * B, dff, 1), (d, dff, n * B, 1)]  # FC-1: activation, weight gradient
        + [(dff, n * B, d, 1), (dff, d, n * B, 1)]  # FC-2: activation, weight gradient
    )
    assert gemms(frame, "fwd") == table_fwd
    assert gemms(frame, "bwd") == table_bwd


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_all_reduces_match_the_closed_form(tp):
    """Four all-reduces of B*SL*H elements per layer per training iteration (seeds/002 eq. 5.5)."""
    batch, seq = 4, 64
    trace = transformer(TINY8, tp=tp, batch=batch, seq_len=seq, optimizer=None)
    comm = trace.communication_bytes()
    in_layers = comm[(comm["layer"] >= 0) & (comm["collective"] == "allreduce")]
    per_layer = in_layers.groupby("layer")["bytes"].agg(["count", "first", "nunique"])
    assert (per_layer["count"] == 4).all() and (per_layer["nunique"] == 1).all()
    assert (per_layer["first"] == batch * seq * TINY.hidden * 2).all()
    assert len(per_layer) == TINY.layers
    groups = set(in_layers["group"])
    assert groups == {" ".join(str(r) for r in range(tp))}
    recomputed = transformer(TINY8, tp=tp, batch=batch, seq_len=seq, optimizer=None, recompute=True)
    comm = recomputed.communication_bytes()
    assert (comm[comm["layer"] >= 0].groupby("layer").size() == 6).all()


def test_tensor_slicing_divides_the_layer_flops():
    one = transformer(TINY, batch=4, seq_len=64, head=False, optimizer=None).frame
    four = transformer(TINY, tp=4, batch=4, seq_len=64, head=False, optimizer=None).frame

    def flops(frame):
        rows = frame[(frame["kind"] == "gemm") & (frame["gpu"] == 0)]
        return float((2 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]).sum())

    assert flops(four) == pytest.approx(flops(one) / 4)


def test_data_parallel_buckets_cover_the_gradients_and_follow_weight_gradients():
    bucket = 2**20
    trace = transformer(TINY, dp=2, batch=4, seq_len=64, bucket_bytes=bucket, head=False, optimizer=None)
    frame = trace.frame
    grads = frame[(frame["stream"] == "comm") & (frame["gpu"] == 0)]
    assert set(grads["collective"]) == {"allreduce"} and set(grads["group"]) == {"0 1"}
    per_layer = grads.groupby("layer")["bytes"].sum()
    weights = TINY.layer_parameters() * 2  # fp16 gradients of one layer (tp = 1)
    assert (per_layer == weights).all()
    assert (grads["bytes"] <= max(bucket, TINY.hidden * TINY.intermediate * 2 * 2)).all()
    by_id = frame[frame["gpu"] == 0].set_index("op_id")
    for deps in grads["deps"]:
        assert deps and all(by_id.loc[int(d), "kind"] == "gemm" or by_id.loc[int(d), "phase"] == "bwd"
                            for d in deps.split())


def test_optimizer_steps_cover_every_parameter_once():
    frame = transformer(TINY, batch=4, seq_len=64).frame
    steps = frame[frame["kind"] == "optimizer"]
    assert list(steps["layer"]) == [0, 1, 2, -1] and set(steps["function"]) == {"adam"}
    sizes = steps["tensor_sizes"].map(lambda text: sum(int(v) for v in text.split()))
    assert sizes.iloc[:3].tolist() == [TINY.layer_parameters()] * 3
    assert sizes.sum() == TINY.parameters()
    offloaded = transformer(TINY, batch=4, seq_len=64, optimizer="lamb", optimizer_impl="nmc", layers=1)
    result = gpusim.run(gpusim.load_system("t3-table8.1"), offloaded)
    step = result.ops[result.ops["kind"] == "optimizer"]
    assert set(step["impl"]) == {"lamb_nmc"}


def test_without_head_the_embedding_is_still_updated_but_never_run():
    for pp in (1, 3):
        frame = transformer(TINY, pp=pp, batch=3, microbatches=1, seq_len=64, head=False).frame
        steps = frame[frame["kind"] == "optimizer"].drop_duplicates("op_id")
        assert set(steps["layer"]) == {-1, 0, 1, 2}  # the embedding on the first stage, its tied copy on the last
        assert not frame[frame["kind"] != "optimizer"]["name"].str.startswith(("embedding", "lm_head", "final_norm")).any()


def test_pipeline_layers_microbatches_and_sends():
    trace = transformer(TINY, pp=3, microbatches=4, batch=4, seq_len=64, head=False, optimizer=None)
    frame = trace.frame
    assert trace.gpus == [0, 1, 2]
    stage_layers = frame[frame["layer"] >= 0].groupby("gpu")["layer"].unique()
    assert [sorted(stage_layers[g]) for g in range(3)] == [[0], [1], [2]]
    sends = frame[frame["kind"] == "sendrecv"].drop_duplicates("op_id")
    assert len(sends) == 2 * 4 * 2  # (p - 1) boundaries x m microbatches x forward and backward
    assert set(sends["bytes"]) == {1 * 64 * TINY.hidden * 2}


@given(st.integers(1, 6), st.integers(1, 12))
def test_1f1b_keeps_at_most_p_microbatches_in_flight(stages, microbatches):
    for stage in range(stages):
        order = stage_order("1f1b", stage, stages, microbatches)
        assert sorted(order) == sorted(stage_order("gpipe", stage, stages, microbatches))
        in_flight = peak = 0
        done_forward = set()
        for action, mb in order:
            if action == "F":
                in_flight += 1
                done_forward.add(mb)
            else:
                assert mb in done_forward
                in_flight -= 1
            peak = max(peak, in_flight)
        assert peak <= min(stages - stage, microbatches)


def test_inference_phases():
    prompt = transformer(TINY, phase="prompt", batch=2, seq_len=64).frame
    assert not prompt["function"].isin(["dropout", "residual_dropout"]).any()
    assert set(prompt["phase"]) == {"prompt"}
    decode = transformer(TINY, phase="decode", batch=2, seq_len=64, decode_tokens=3).frame
    scores = decode[decode["name"] == "L0.attn_score"]
    assert scores["n"].tolist() == [65, 66, 67]  # the prompt's keys and each step's own, one more a step
    assert set(scores["m"]) == {1}
    qkv = decode[decode["name"] == "L0.qkv"]
    assert set(qkv["m"]) == {2}  # one token per sequence (the trace's rows are the tokens)


@pytest.mark.parametrize(("pp", "dp", "microbatches"), [(1, 1, 1), (3, 1, None), (1, 1, 6), (2, 1, None), (2, 3, 2)])
def test_decode_processes_the_whole_batch_whatever_the_pipeline(pp, dp, microbatches):
    """Every generated token runs every sequence: GEMM FLOPs over all GPUs do not depend on pp, dp or microbatches."""
    batch, seq, tokens, h = 6, 16, 3, TINY.hidden
    trace = transformer(TINY, phase="decode", pp=pp, dp=dp, microbatches=microbatches, batch=batch, seq_len=seq,
                        decode_tokens=tokens)
    rows = trace.frame[trace.frame["kind"] == "gemm"]
    flops = (2 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]).sum()
    per_token = [TINY.layers * (24 * batch * h * h + 4 * batch * h * (seq + t + 1)) + 2 * batch * TINY.vocab * h
                 for t in range(tokens)]  # linear layers, attention over the prompt and t + 1 tokens, output layer
    assert flops == sum(per_token)
    m = trace.metadata["microbatches"]
    sends = trace.frame[trace.frame["name"] == "send_token"].drop_duplicates("op_id")
    assert len(sends) == (dp * (tokens - 1) * m if pp > 1 else 0)  # each microbatch's token back to stage 0
    first_stage = trace.frame[(trace.frame["name"] == "L0.qkv") & (trace.frame["gpu"] == 0)]
    assert first_stage["step"].tolist() == list(range(tokens * m))  # token by token, every microbatch


def test_swiglu_gqa_model():
    llama = load_model("llama2-70b", layers=1)
    frame = transformer(llama, tp=8, batch=1, seq_len=128, head=False, optimizer=None).frame
    qkv = frame[(frame["name"] == "L0.qkv") & (frame["gpu"] == 0)].iloc[0]
    assert qkv["n"] == 8192 // 8 + 2 * 1 * 128  # 8 query heads and 1 key/value head per rank (output features)
    fc1 = frame[(frame["name"] == "L0.fc1") & (frame["gpu"] == 0)].iloc[0]
    assert fc1["n"] == 2 * 28672 // 8


def test_rotary_embeddings_rotate_each_ranks_queries_and_keys_forward_and_backward(tmp_path):
    """LLaMA's layers rotate their queries and keys (a row per token); GPT-2's learned positions are
    added outside the layers. The rows survive a round trip through a trace file."""
    frame = transformer("llama2-70b", tp=8, layers=1, batch=2, seq_len=64, head=False, optimizer=None).frame
    rope = frame[(frame["function"] == "rope") & (frame["gpu"] == 0)]
    assert rope["name"].tolist() == ["L0.rope", "L0.rope_bwd"]
    assert rope["elements"].tolist() == [2 * 64 * (8 + 1) * 128] * 2 and rope["rows"].tolist() == [128, 128]
    decode = transformer("llama2-7b", phase="decode", layers=1, batch=4, seq_len=32, head=False).frame
    assert decode.loc[decode["function"] == "rope", "rows"].unique().tolist() == [4]  # one new token a sequence
    assert not (transformer(TINY, layers=1, head=False).frame["function"] == "rope").any()
    trace = transformer("llama2-7b", phase="prompt", layers=1, batch=1, seq_len=32, head=False)
    path = tmp_path / "llama.csv"
    again = gpusim.trace.read(trace.write(path)).frame
    assert again.loc[again["function"] == "rope", "rows"].tolist() == [32]


@pytest.mark.parametrize("phase", ["train", "prompt", "decode"])
def test_flash_attention_replaces_the_score_gemms_softmax_and_dropout(phase):
    """One fused attention row per layer and pass, with the same attention FLOPs as the two batched GEMMs
    it replaces where nothing is masked (the causal mask halves them)."""
    unfused = transformer(TINY, phase=phase, batch=2, seq_len=64, head=False).frame
    fused = transformer(TINY, phase=phase, batch=2, seq_len=64, head=False, attention="flash").frame
    attention = fused[fused["kind"] == "attention"]
    assert set(attention["function"]) == ({"forward", "backward"} if phase == "train" else {"forward"})
    assert not fused["name"].str.contains("attn_score|softmax|attn_context|attn_dropout").any()
    forward = attention[attention["function"] == "forward"].iloc[0]
    assert (forward["batch"], forward["heads"], forward["head_dim"]) == (2, TINY.heads, TINY.hidden // TINY.heads)
    assert forward["q_len"] == (1 if phase == "decode" else 64) and forward["kv_len"] == (65 if phase == "decode" else 64)
    scores = unfused[unfused["name"] == "L0.attn_score"].iloc[0]
    op = op_of_row(next(attention.head(1).itertuples(index=False)), [0])
    unmasked = 2 * scores["m"] * scores["n"] * scores["k"] * scores["batch"] * 2
    if phase == "decode":  # one query per sequence: its mask hides nothing
        assert op.flops == unmasked
    else:
        assert unmasked / 2 < op.flops < 0.52 * unmasked


def test_an_encoder_attends_to_the_whole_sequence_and_a_decoder_to_the_tokens_before():
    bert = transformer("bert-base", phase="prompt", layers=1, batch=2, seq_len=128, attention="flash").frame
    llama = transformer("llama2-7b", phase="prompt", layers=1, batch=1, seq_len=64, attention="flash").frame
    assert bert.loc[bert["kind"] == "attention", "causal"].tolist() == [False]
    assert llama.loc[llama["kind"] == "attention", "causal"].tolist() == [True]


def test_generator_errors():
    with pytest.raises(TraceError, match="'phase' must be one of"):
        transformer(TINY, phase="finetune")
    with pytest.raises(TraceError, match="batch 3 does not divide into dp=2"):
        transformer(TINY, dp=2, batch=3)
    with pytest.raises(TraceError, match="'tp' must be a positive integer"):
        transformer(TINY, tp=0)
    with pytest.raises(TraceError, match="'optimizer' must be one of"):
        transformer(TINY, optimizer="adagrad")
    with pytest.raises(ConfigError, match="unknown model 'gpt5'"):
        transformer("gpt5")
    with pytest.raises(TraceError, match="'attention' must be one of unfused, flash"):
        transformer(TINY, attention="paged")
    with pytest.raises(TraceError, match="attention='flash' needs dtype fp16 or bf16"):
        transformer(TINY, attention="flash", dtype="fp32")


def test_models_carry_table_8_2_and_published_sizes():
    names = set(list_models())
    assert {"bert-base", "bert-large", "megatron-gpt2", "t-nlg", "gpt3", "palm", "mt-nlg", "llama2-7b",
            "llama2-70b"} <= names
    table_8_2 = {"megatron-gpt2": (3072, 74), "t-nlg": (4256, 78), "gpt3": (12288, 96), "palm": (18432, 118),
                 "mt-nlg": (20480, 105)}
    for name, (hidden, layers) in table_8_2.items():
        model = load_model(name)
        assert (model.hidden, model.layers) == (hidden, layers)
        assert model.sources
    assert load_model("gpt3").parameters() == pytest.approx(175e9, rel=0.01)
    assert load_model("bert-large").parameters() == pytest.approx(335e6, rel=0.02)
    assert load_model("llama2-70b").parameters() == pytest.approx(69e9, rel=0.02)


def test_a_misspelled_model_field_names_file_and_field(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("hidden: 64\nlayer: 2\nheads: 2\nvocab: 10\nseq_len: 8\n")
    with pytest.raises(ConfigError, match=r"m.yaml: .*field 'layers'.*field 'layer'"):
        load_model(path)


def test_ring_traffic_of_a_tensor_parallel_layer_is_2_n_minus_1_over_n_S():
    """Each GPU sends 2(n-1)/n * S per ring all-reduce of S bytes (replayed on the ring)."""
    tp, batch, seq = 8, 2, 64
    trace = transformer(TINY8, phase="prompt", tp=tp, batch=batch, seq_len=seq, layers=1, head=False)
    result = gpusim.run(gpusim.load_system("t3-ring8"), trace, mode="symmetric")
    size = batch * seq * TINY.hidden * 2
    sent = result.links[result.links["src"] == 0]["bytes"].sum()
    assert sent == pytest.approx(2 * 2 * (tp - 1) / tp * size, rel=0.01)


def test_more_layers_than_the_model_has_is_an_error():
    with pytest.raises(TraceError, match=r"'layers' \(13\) exceeds the 12 layers of bert-base"):
        transformer("bert-base", layers=13)


def test_a_decoding_step_of_three_sequences_keeps_the_linear_layers_rows_aligned():
    """The linear layers' operand rows are the hidden and output widths, whatever the token count:
    three sequences decoding on the H100 run the library's TMA kernels, not the fallback kernels for
    unaligned rows (``_V<bytes>``), and as fast as eight sequences' within 15%."""
    def linear(batch):
        trace = transformer(TINY, phase="decode", batch=batch, seq_len=64, layers=1, head=False)
        result = gpusim.run("h100-sxm5", trace)
        return result.ops[result.ops["name"].isin(["L0.qkv", "L0.attn_out", "L0.fc1", "L0.fc2"])]

    three, eight = linear(3), linear(8)
    assert len(three) == 4 and not three["impl"].str.contains("_V").any()
    assert three["duration_s"].sum() == pytest.approx(eight["duration_s"].sum(), rel=0.15)


def test_models_have_their_published_parameter_counts():
    """Llama-2's and Llama 3's checkpoints (no biases, RMSNorm scales, an untied output layer) to the
    parameter, and PaLM 540B's 540.35B (Chowdhery et al. 2022, Table 1), which needs its heads of 256
    values."""
    assert load_model("llama2-7b").parameters() == 6_738_415_616
    assert load_model("llama2-70b").parameters() == 68_976_648_192
    assert load_model("llama3-8b").parameters() == 8_030_261_248
    assert load_model("llama3-70b").parameters() == 70_553_706_496
    assert load_model("palm").parameters() == pytest.approx(540.35e9, rel=1e-4)


LLAMA_LIKE = load_model(TINY, activation="swiglu", norm="rmsnorm", bias=False, tied_embeddings=False, ffn_hidden=688)
PALM_LIKE = load_model(TINY, activation="swiglu", kv_heads=1, d_head=48, bias=False)


@pytest.mark.parametrize("model", [TINY, LLAMA_LIKE, PALM_LIKE], ids=["gpt", "llama", "palm"])
def test_the_optimizer_and_the_gradient_all_reduces_cover_every_parameter_once(model):
    """Summed over the optimizer rows, and over the data-parallel gradient all-reduces, of one replica
    without tensor slicing: exactly the model's parameters, whatever its biases, norms and output layer
    (with pipeline stages the last one holds a copy of a tied embedding table)."""
    for pp in (1, 3):
        frame = transformer(model, dp=2, pp=pp, batch=2, microbatches=1, seq_len=16).frame
        replica = frame[frame["gpu"].isin([0, 2, 4])]  # replica 0 of every stage
        held = model.parameters() + (model.vocab * model.hidden if pp > 1 and model.tied_embeddings else 0)
        steps = replica[replica["kind"] == "optimizer"]
        assert steps["tensor_sizes"].map(lambda text: sum(int(v) for v in text.split())).sum() == held
        grads = replica[(replica["stream"] == "comm") & (replica["name"] != "embedding_grad_allreduce")]
        assert grads["bytes"].sum() == 2 * held  # fp16 gradients


@pytest.mark.parametrize(("model", "tp", "heads", "kv_heads", "d_head"),
                         [("t-nlg", 8, 4, 4, 152), ("t-nlg", 16, 2, 2, 152), ("palm", 32, 2, 1, 256),
                          ("gpt3", 8, 12, 12, 128)])
def test_attention_projections_are_as_wide_as_the_heads_of_a_rank(model, tp, heads, kv_heads, d_head):
    """The query, key and value columns and the output projection's rows are those of the rank's heads
    (the busiest rank's where tp does not divide them: T-NLG's 28 heads over 8 GPUs give 4 heads of
    152 = 608 query columns, not 4256 / 8 = 532), and PaLM's heads have 256 values, not 18432 / 48."""
    frame = transformer(model, tp=tp, layers=1, batch=1, seq_len=64, head=False, optimizer=None).frame
    rank0 = frame[frame["gpu"] == 0].set_index("name")
    assert rank0.loc["L0.qkv", "n"] == (heads + 2 * kv_heads) * d_head
    assert rank0.loc["L0.attn_out", "k"] == heads * d_head
    assert rank0.loc["L0.attn_score", "k"] == d_head and rank0.loc["L0.attn_score", "batch"] == heads


def test_tensor_parallelism_over_more_ranks_than_heads_and_decoding_an_encoder_are_errors():
    with pytest.raises(TraceError, match="tp=16 exceeds the 12 attention heads of bert-base"):
        transformer("bert-base", tp=16, layers=1)
    with pytest.raises(TraceError, match=r"phase='decode' .* bert-base is an encoder \(causal: false\)"):
        transformer("bert-base", phase="decode", layers=1)


def test_a_head_width_that_is_not_whole_needs_d_head():
    with pytest.raises(ConfigError, match=r"hidden \(256\) must be a multiple of heads \(6\), or d_head"):
        load_model(TINY, heads=6)
    assert load_model(TINY, heads=6, d_head=32).attention_width == 192


@pytest.mark.parametrize(("options", "kinds", "collective_bytes", "allreduces", "gemm_volume", "elements", "norm_cells"), [
    (dict(tp=4, dp=2, batch=4, seq_len=62, recompute=True),
     {"gemm": 600, "elementwise": 408, "reduction": 240, "collective": 200, "optimizer": 32}, 7837088, 58,
     2629926912, 9487488, 5886528),
    (dict(tp=2, phase="prompt", batch=2, seq_len=30),
     {"gemm": 38, "elementwise": 32, "reduction": 20, "collective": 14}, 215040, 7, 144846848, 513120, 236640),
])
def test_traces_without_sequence_parallelism_or_vocabulary_padding_are_unchanged(
        options, kinds, collective_bytes, allreduces, gemm_volume, elements, norm_cells):
    """Golden figures of two traces built before sequence parallelism and vocabulary padding existed:
    rows per kind, bytes and count of the collectives (one row per op), GEMM volume (m*n*k*batch),
    element-wise elements and reduction cells, all summed over the GPUs; the new options at their
    defaults, and sequence parallelism over a single rank, give exactly the same frame."""
    frame = transformer(TINY, **options).frame
    assert frame["kind"].value_counts().to_dict() == kinds
    comm = frame[frame["kind"] == "collective"].drop_duplicates("op_id")
    assert comm["bytes"].sum() == collective_bytes and comm["collective"].value_counts().to_dict() == {"allreduce": allreduces}
    gemm, elementwise, reduction = (frame[frame["kind"] == kind] for kind in ("gemm", "elementwise", "reduction"))
    assert (gemm["m"] * gemm["n"] * gemm["k"] * gemm["batch"]).sum() == gemm_volume
    assert elementwise["elements"].sum() == elements
    assert (reduction["rows"] * reduction["cols"]).sum() == norm_cells
    explicit = transformer(TINY, **options, sequence_parallel=False, vocab_divisible_by=1).frame
    assert explicit.equals(frame)
    one_rank = {**options, "tp": 1}
    assert transformer(TINY, **one_rank, sequence_parallel=True).frame.equals(transformer(TINY, **one_rank).frame)


def tp_collectives(frame, phase, layer=0):
    """``(name, collective, bytes)`` of rank 0's collectives of one layer and pass, in trace order."""
    rows = frame[(frame["kind"] == "collective") & (frame["gpu"] == 0) & (frame["phase"] == phase)
                 & (frame["layer"] == layer) & (frame["step"] == 0)]
    return list(zip(rows["name"], rows["collective"], rows["bytes"]))


def test_sequence_parallelism_gathers_and_scatters_and_slices_the_norms():
    """Megatron-LM's sequence parallelism (Korthikanti et al. 2022, Fig. 5): per layer forward two
    all-gathers and two reduce-scatters of the all-reduces' B*SL*H activations, the norms and residual
    additions on ceil(tokens / tp) tokens (62 tokens over 4 ranks: 16), the GEMMs as without it; the
    backward pass has their conjugates and all-gathers the norms' outputs again for the weight gradients."""
    tp, batch, seq, h = 4, 2, 31, TINY.hidden
    tokens, sliced, nbytes = batch * seq, 16, batch * seq * h * 2
    plain = transformer(TINY8, tp=tp, batch=batch, seq_len=seq).frame
    sp = transformer(TINY8, tp=tp, batch=batch, seq_len=seq, sequence_parallel=True).frame
    assert tp_collectives(plain, "fwd") == [("L0.attn_allreduce", "allreduce", nbytes),
                                            ("L0.mlp_allreduce", "allreduce", nbytes)]
    assert tp_collectives(sp, "fwd") == [("L0.ln1_allgather", "allgather", nbytes),
                                         ("L0.attn_reducescatter", "reducescatter", nbytes),
                                         ("L0.ln2_allgather", "allgather", nbytes),
                                         ("L0.mlp_reducescatter", "reducescatter", nbytes)]
    assert tp_collectives(sp, "bwd") == [("L0.mlp_allgather_bwd", "allgather", nbytes),
                                         ("L0.ln2_allgather_wgrad", "allgather", nbytes),
                                         ("L0.mlp_reducescatter_bwd", "reducescatter", nbytes),
                                         ("L0.attn_allgather_bwd", "allgather", nbytes),
                                         ("L0.ln1_allgather_wgrad", "allgather", nbytes),
                                         ("L0.attn_reducescatter_bwd", "reducescatter", nbytes)]
    layers = sp[(sp["layer"] >= 0) & (sp["kind"] == "collective")]
    assert "allreduce" not in set(layers["collective"]) and set(layers["group"]) == {"0 1 2 3"}
    assert set(layers["stream"]) == {"compute"}
    rank0 = sp[(sp["gpu"] == 0) & (sp["step"] == 0)].set_index("name")
    plain0 = plain[(plain["gpu"] == 0) & (plain["step"] == 0)].set_index("name")
    for layer in range(TINY.layers):
        for norm in ("ln1", "ln2", "ln1_bwd", "ln2_bwd"):
            assert rank0.loc[f"L{layer}.{norm}", "rows"] == sliced and plain0.loc[f"L{layer}.{norm}", "rows"] == tokens
        for residual in ("attn_residual", "mlp_residual", "mlp_residual_bwd", "attn_residual_bwd", "residual_bwd"):
            assert rank0.loc[f"L{layer}.{residual}", "elements"] == sliced * h
    assert rank0.loc["final_norm", "rows"] == rank0.loc["final_norm_bwd", "rows"] == sliced
    assert gemms(sp, "fwd") == gemms(plain, "fwd") and gemms(sp, "bwd") == gemms(plain, "bwd")
    # the embedding scatters into the sequence-parallel region; the output layer gathers from it
    outside = dict((name, collective) for name, collective, _ in tp_collectives(sp, "fwd", -1) + tp_collectives(sp, "bwd", -1))
    assert outside == {"embedding_reducescatter": "reducescatter", "final_norm_allgather": "allgather",
                       "cross_entropy_allreduce": "allreduce", "final_norm_allgather_wgrad": "allgather",
                       "lm_head_reducescatter_bwd": "reducescatter", "embedding_allgather_bwd": "allgather",
                       "sequence_parallel_grad_allreduce": "allreduce"}
    # the norms' and row-parallel biases' gradients, partial on each rank, all-reduced once per iteration
    grads = sp[sp["name"] == "sequence_parallel_grad_allreduce"].drop_duplicates("op_id")
    per_layer = 2 * TINY.norm_parameters() + 2 * h
    assert grads["bytes"].tolist() == [(TINY.layers * per_layer + TINY.norm_parameters()) * 2]


def test_sequence_parallelism_with_recomputation_and_pipeline_stages():
    """The recomputed forward pass gathers and scatters again; pipeline stages send each rank's slice
    of the tokens (Megatron-LM's ``seq_length // tp`` tensor shape); each stage all-reduces its own
    layers' norm gradients once, after the last microbatch."""
    tp, batch, seq, h = 2, 4, 64, TINY.hidden
    frame = transformer(TINY, tp=tp, pp=3, microbatches=2, batch=batch, seq_len=seq, recompute=True,
                        sequence_parallel=True).frame
    recomputed = frame[frame["name"].str.startswith("recompute.") & (frame["kind"] == "collective")]
    assert set(recomputed["collective"]) == {"allgather", "reducescatter"}
    assert len(recomputed.drop_duplicates("op_id")) == 4 * TINY.layers * 2  # 4 a layer, 2 microbatches, one replica
    sends = frame[frame["kind"] == "sendrecv"]
    assert set(sends["bytes"]) == {batch // 2 * seq // tp * h * 2}
    grads = frame[frame["name"] == "sequence_parallel_grad_allreduce"].drop_duplicates("op_id")
    assert grads["step"].tolist() == [1, 1, 1] and len(set(grads["group"])) == 3


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2, 4]), st.integers(1, 3), st.integers(1, 40),
       st.sampled_from([64, 128, 192]))
def test_sequence_parallel_communication_volume_equals_the_all_reduces(heads, tp, batch, seq, head_dim):
    """On a ring an all-reduce of S bytes sends 2(n-1)/n S per rank, a reduce-scatter or an all-gather
    (n-1)/n S (the trace's ``bytes``: the input of an all-reduce or a reduce-scatter, the output of an
    all-gather): a layer's forward pass sends as much with sequence parallelism as without, and its
    backward pass two all-gathers more (the norms' outputs again for the weight gradients)."""
    tp = min(tp, heads)
    model = load_model(TINY, heads=heads, d_head=head_dim, layers=1)

    def sent(frame, phase):
        return sum((2 if collective == "allreduce" else 1) * (tp - 1) / tp * nbytes
                   for _, collective, nbytes in tp_collectives(frame, phase))

    plain = transformer(model, tp=tp, batch=batch, seq_len=seq, optimizer=None).frame
    sp = transformer(model, tp=tp, batch=batch, seq_len=seq, optimizer=None, sequence_parallel=True).frame
    assert sent(sp, "fwd") == pytest.approx(sent(plain, "fwd"))
    regather = 2 * (tp - 1) / tp * batch * seq * TINY.hidden * 2
    assert sent(sp, "bwd") == pytest.approx(sent(plain, "bwd") + regather)


def test_a_sequence_parallel_iteration_replays_with_faster_norms():
    """A small model's training iteration at TP=4 replays end to end with and without sequence
    parallelism; the norms on a quarter of the tokens take less than half the time on each rank."""
    model = ModelConfig(name="small", hidden=1024, layers=1, heads=8, vocab=4096, seq_len=512, batch=2)
    norms = {}
    for sp in (False, True):
        result = gpusim.run(gpusim.load_system("t3-ring8"), transformer(model, tp=4, sequence_parallel=sp),
                            mode="symmetric")
        assert result.time_s > 0
        ops = result.ops[result.ops["gpu"] == 0]
        assert ops["name"].str.contains("reducescatter").any() == sp
        norms[sp] = ops.loc[ops["name"].str.contains(r"ln[12]|final_norm") & (ops["kind"] == "reduction"),
                            "duration_s"].sum()
    assert 0 < norms[True] < 0.5 * norms[False]


def test_the_vocabulary_is_padded_to_a_multiple_of_n_times_tp():
    """Megatron-LM pads GPT-2's 50257 words to 50304 (make_vocab_size_divisible_by=128) on one GPU and
    to 51200 over 8 (a multiple of 1024): 6400 output features a rank, where ceil(50257 / 8) = 6283."""
    def head_width(**options):
        frame = transformer("megatron-gpt2", layers=1, batch=1, seq_len=64, **options).frame
        rank0 = frame[frame["gpu"] == 0].set_index("name")
        assert rank0.loc["lm_head_wgrad", "m"] == rank0.loc["lm_head", "n"]
        return rank0.loc["lm_head", "n"]

    assert head_width() == 50257 and head_width(vocab_divisible_by=128) == 50304
    assert head_width(tp=8) == 6283 and head_width(tp=8, vocab_divisible_by=128) == 6400
    steps = transformer(TINY, tp=4, batch=4, seq_len=64, vocab_divisible_by=3).frame
    embedding = steps[(steps["name"] == "embedding.adam") & (steps["gpu"] == 0)]["tensor_sizes"].iloc[0]
    assert int(embedding.split()[0]) == 1032 // 4 * TINY.hidden  # 1024 words padded to a multiple of 12


def test_sequence_parallelism_and_vocabulary_padding_errors():
    with pytest.raises(TraceError, match=r"'sequence_parallel' applies to phase='train' and 'prompt'.*not to "
                                         r"phase='decode'"):
        transformer(TINY, tp=2, phase="decode", sequence_parallel=True)
    with pytest.raises(TraceError, match="'sequence_parallel' must be True or False, got 'yes'"):
        transformer(TINY, tp=2, sequence_parallel="yes")
    with pytest.raises(TraceError, match="'vocab_divisible_by' must be a positive integer, got 0"):
        transformer(TINY, vocab_divisible_by=0)
    prompt = transformer(TINY, tp=2, phase="prompt", batch=2, seq_len=64, sequence_parallel=True).frame
    collectives = prompt[(prompt["layer"] >= 0) & (prompt["kind"] == "collective")]
    assert set(collectives["collective"]) == {"allgather", "reducescatter"}


def deps_of(frame, name, gpu=0):
    """The op_ids a named row of ``gpu`` depends on (besides its stream order)."""
    row = frame[(frame["name"] == name) & (frame["gpu"] == gpu) & (frame["step"] == 0)].iloc[0]
    return set(parse_ints(row["deps"]))


def op_id_of(frame, name, gpu=0):
    return int(frame[(frame["name"] == name) & (frame["gpu"] == gpu) & (frame["step"] == 0)]["op_id"].iloc[0])


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_async_tensor_parallel_backward_overlaps_the_column_layers_collectives(sequence_parallel):
    """Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication: the sum of a column-parallel
    layer's activation gradients goes to the ``tp_comm`` stream once they are done, the weight
    gradients run beside it, and the next op waits for it; with sequence parallelism the all-gather
    of the layer's input is launched first, after the compute stream's work, beside the activation
    gradients, and the weight gradients wait for it.  The ops and their sizes are the synchronous
    trace's."""
    options = dict(tp=4, batch=2, seq_len=32, sequence_parallel=sequence_parallel)
    sync = transformer(TINY8, **options).frame
    overlapped = transformer(TINY8, **options, async_tp_backward=True).frame
    ops = ["name", "kind", "collective", "bytes", "m", "n", "k", "gpu"]
    assert Counter(map(tuple, sync[ops].astype(str).values)) == Counter(map(tuple, overlapped[ops].astype(str).values))
    reduce = "reducescatter" if sequence_parallel else "allreduce"
    column_layers = {"L0.qkv": (f"L0.attn_{reduce}_bwd", "L0.ln1_allgather_wgrad", "L0.ln1_bwd", "L0.attn_score_wgrad"),
                     "L0.fc1": (f"L0.mlp_{reduce}_bwd", "L0.ln2_allgather_wgrad", "L0.ln2_bwd", "L0.gelu_bwd"),
                     "lm_head": (f"lm_head_{reduce}_bwd", "final_norm_allgather_wgrad", "final_norm_bwd",
                                 "cross_entropy_bwd")}
    on_comm = overlapped[overlapped["stream"] == "tp_comm"]
    for layer, (summed, gathered, following, before) in column_layers.items():  # before: the last compute op
        assert set(sync.loc[sync["name"] == summed, "stream"]) == {"compute"}
        assert set(overlapped.loc[overlapped["name"] == summed, "stream"]) == {"tp_comm"}
        assert deps_of(overlapped, summed) == {op_id_of(overlapped, f"{layer}_dgrad")}
        assert op_id_of(overlapped, summed) in deps_of(overlapped, following)
        if sequence_parallel:
            assert set(overlapped.loc[overlapped["name"] == gathered, "stream"]) == {"tp_comm"}
            assert deps_of(overlapped, gathered) == {op_id_of(overlapped, before)}
            assert deps_of(overlapped, f"{layer}_wgrad") == {op_id_of(overlapped, gathered)}
        else:
            assert deps_of(overlapped, f"{layer}_wgrad") == set()
    expected = {"allreduce"} if not sequence_parallel else {"allgather", "reducescatter"}
    assert set(on_comm["collective"]) == expected and set(on_comm["phase"]) == {"bwd"}
    # one row after another on the stream: the sum is queued before the weight gradient it overlaps
    rank0 = overlapped[(overlapped["gpu"] == 0) & (overlapped["step"] == 0)]["name"].tolist()
    assert rank0.index(f"L0.mlp_{reduce}_bwd") < rank0.index("L0.fc1_wgrad")


def test_async_tensor_parallel_backward_changes_nothing_without_a_backward_pass_or_tensor_parallelism():
    for options in (dict(tp=1), dict(tp=2, phase="prompt"), dict(tp=2, phase="decode")):
        assert transformer(TINY, **options, async_tp_backward=True).frame.equals(transformer(TINY, **options).frame)
    assert transformer(TINY, tp=2, async_tp_backward=False).frame.equals(transformer(TINY, tp=2).frame)
    assert transformer(TINY, tp=2, async_tp_backward=True).metadata["async_tp_backward"] is True
    with pytest.raises(TraceError, match="'async_tp_backward' must be True or False, got 1"):
        transformer(TINY, tp=2, async_tp_backward=1)


def test_async_tensor_parallel_backward_separate_projections_sum_after_all_their_gradients():
    """Without a fused QKV (Llama's q, k and v projections) the three activation gradients come
    first and the sum of their total overlaps the three weight gradients."""
    model = load_model(TINY8, fused_qkv=False)
    frame = transformer(model, tp=2, async_tp_backward=True).frame
    rank0 = frame[(frame["gpu"] == 0) & (frame["step"] == 0) & (frame["layer"] == 0)]["name"].tolist()
    order = [name for name in rank0 if name.endswith(("_dgrad", "_wgrad", "attn_allreduce_bwd"))
             and name.split(".")[1][0] in "qkva"]
    projections = [f"L0.{part}_{grad}" for grad in ("dgrad", "wgrad") for part in "qkv"]
    assert order[-7:] == projections[:3] + ["L0.attn_allreduce_bwd"] + projections[3:]


def test_an_async_tensor_parallel_backward_replays_faster_with_communication_overlapped():
    """At TP=4 on a ring, the overlapped trace's iteration is shorter than the synchronous one's,
    with communication overlapped with compute (none without), and the column layers' sums run
    while their weight gradients do."""
    model = ModelConfig(name="small", hidden=1024, layers=1, heads=8, vocab=4096, seq_len=512, batch=2)
    system = gpusim.load_system("t3-ring8")
    results = {flag: gpusim.run(system, transformer(model, tp=4, async_tp_backward=flag), mode="symmetric")
               for flag in (False, True)}
    parts = {flag: gpusim.trace.breakdown(result.ops).iloc[0] for flag, result in results.items()}
    assert parts[False]["overlapped_comm_s"] == 0 < parts[True]["overlapped_comm_s"]
    assert results[True].time_s < results[False].time_s
    ops = results[True].ops.set_index("name")
    summed, wgrad = ops.loc["L0.mlp_allreduce_bwd"], ops.loc["L0.fc1_wgrad"]
    assert summed["start_s"] < wgrad["end_s"] and wgrad["start_s"] < summed["end_s"]


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([2, 4]), st.booleans(), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.booleans())
def test_async_tensor_parallel_backward_keeps_the_work_and_cannot_deadlock(tp, sequence_parallel, dp, pp,
                                                                           microbatches, recompute):
    """Whatever the parallelism: the same ops as the synchronous trace, a dependency graph without
    cycles, and within each tensor-parallel group every rank's ``tp_comm`` stream queues the same
    collectives in the same order (so none waits for a rank that waits for it)."""
    options = dict(tp=tp, dp=dp, pp=pp, microbatches=microbatches, batch=2 * dp * microbatches, seq_len=16,
                   recompute=recompute, sequence_parallel=sequence_parallel, layers=2)
    sync = transformer(TINY8, **options).frame
    overlapped = transformer(TINY8, **options, async_tp_backward=True).frame
    fields = ["name", "gpu", "kind", "collective", "bytes", "m", "n", "k", "step"]
    assert Counter(map(tuple, sync[fields].astype(str).values)) == Counter(map(tuple, overlapped[fields].astype(str).values))
    validate(overlapped)
    comm = overlapped[overlapped["stream"] == "tp_comm"]
    for group, rows in comm.groupby("group"):
        sequences = {tuple(ranks["op_id"]) for _, ranks in rows.groupby("gpu")}
        assert len(sequences) == 1 and len(rows) == len(group.split()) * len(next(iter(sequences)))


def optimizer_rows(frame):
    return frame[(frame["kind"] == "optimizer") & (frame["gpu"] == 0)].set_index("name")


def test_the_distributed_optimizer_reduce_scatters_updates_a_shard_and_gathers_the_parameters():
    """Megatron-LM's distributed optimizer (ZeRO-1) over dp=4: every gradient bucket is
    reduce-scattered (the all-reduce's bytes), each rank updates ceil(1/4) of every tensor, and
    each optimizer op is followed on the comm stream by the all-gather of its layer's fp16
    parameters; the rest of the trace is the replicated optimizer's."""
    options = dict(tp=2, dp=4, batch=8, seq_len=32)
    replicated = transformer(TINY, **options).frame
    sharded = transformer(TINY, **options, distributed_optimizer=True).frame
    buckets = replicated[replicated["name"].str.endswith("grad_allreduce")]
    scattered = sharded[sharded["name"].str.endswith("grad_reducescatter")]
    assert set(scattered["collective"]) == {"reducescatter"} and set(scattered["stream"]) == {"comm"}
    assert scattered["bytes"].tolist() == buckets["bytes"].tolist()
    assert scattered["group"].tolist() == buckets["group"].tolist()
    full, shard = optimizer_rows(replicated), optimizer_rows(sharded)
    assert list(full.index) == list(shard.index)
    for name in full.index:
        sizes = [int(v) for v in full.loc[name, "tensor_sizes"].split()]
        assert [int(v) for v in shard.loc[name, "tensor_sizes"].split()] == [-(-size // 4) for size in sizes]
        prefix = name.split(".")[0]
        gather = sharded[(sharded["name"] == f"{prefix}.param_allgather") & (sharded["gpu"] == 0)].iloc[0]
        assert (gather["collective"], gather["stream"], gather["bytes"]) == ("allgather", "comm", sum(sizes) * 2)
        assert gather["deps"] == str(shard.loc[name, "op_id"])
    others = ~sharded["name"].str.contains("grad_reducescatter|param_allgather") & (sharded["kind"] != "optimizer")
    kept = ~replicated["name"].str.contains("grad_allreduce") & (replicated["kind"] != "optimizer")
    columns = ["name", "gpu", "stream", "kind", "m", "n", "k", "bytes"]
    assert sharded.loc[others, columns].reset_index(drop=True).equals(replicated.loc[kept, columns].reset_index(drop=True))


def test_the_distributed_optimizer_changes_nothing_without_data_parallelism_or_an_optimizer():
    for options in (dict(dp=1, tp=2), dict(dp=2, optimizer=None, batch=8), dict(dp=2, phase="prompt", batch=8)):
        assert transformer(TINY, **options, distributed_optimizer=True).frame.equals(transformer(TINY, **options).frame)
    with pytest.raises(TraceError, match="'distributed_optimizer' must be True or False, got 'no'"):
        transformer(TINY, dp=2, batch=8, distributed_optimizer="no")


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([2, 3, 4, 8]), st.integers(1, 2), st.integers(1, 3), st.integers(1 << 16, 1 << 26))
def test_the_distributed_optimizer_sends_what_the_all_reduces_sent(dp, pp, microbatches, bucket_bytes):
    """On a ring a reduce-scatter and an all-gather of S bytes each send (n-1)/n S per rank, an
    all-reduce 2(n-1)/n S: with fp16 gradients and parameters the sharded optimizer's data-parallel
    traffic equals the replicated one's, and its shards cover every parameter."""
    options = dict(dp=dp, pp=pp, microbatches=microbatches, batch=dp * microbatches, seq_len=16, layers=2,
                   bucket_bytes=bucket_bytes)
    frames = {flag: transformer(TINY, **options, distributed_optimizer=flag).frame for flag in (False, True)}

    def sent(frame):
        rows = frame[(frame["stream"] == "comm")].drop_duplicates("op_id")
        return sum((2 if c == "allreduce" else 1) * (dp - 1) / dp * b for c, b in zip(rows["collective"], rows["bytes"]))

    assert sent(frames[True]) == pytest.approx(sent(frames[False]))
    for name, row in optimizer_rows(frames[False]).iterrows():
        full = [int(v) for v in row["tensor_sizes"].split()]
        shard = [int(v) for v in optimizer_rows(frames[True]).loc[name, "tensor_sizes"].split()]
        assert all(dp * s >= f > dp * (s - 1) for s, f in zip(shard, full))


def test_a_distributed_optimizer_iteration_replays_with_a_shorter_optimizer_step():
    """Over dp=4 in full mode the optimizer ops take well under half their replicated time (a quarter
    of the parameters, the same per-kernel costs) and the iteration gets its parameter all-gathers."""
    model = ModelConfig(name="small", hidden=1024, layers=1, heads=8, vocab=4096, seq_len=256, batch=4)
    system = gpusim.load_system("t3-ring8")
    steps = {}
    for flag in (False, True):
        ops = gpusim.run(system, transformer(model, dp=4, distributed_optimizer=flag), mode="full").ops
        steps[flag] = ops.loc[(ops["gpu"] == 0) & (ops["kind"] == "optimizer"), "duration_s"].sum()
        assert ops["name"].str.endswith("param_allgather").any() == flag
    assert 0 < steps[True] < 0.5 * steps[False]


@pytest.mark.parametrize("pp, virtual_stages", [(1, 1), (2, 1), (2, 2)])
def test_overlapped_parameter_gathers_start_the_iteration_and_each_layer_waits_for_its_own(pp, virtual_stages):
    """Megatron-LM's --overlap-param-gather: the same all-gathers, now before every forward op and
    after no optimizer op; each layer's (and the embedding's and output layer's) first forward op
    depends on its own gather, later microbatches do not."""
    options = dict(tp=2, dp=2, pp=pp, microbatches=2 * pp, batch=4 * pp, seq_len=16,
                   virtual_stages=virtual_stages, distributed_optimizer=True)
    model = load_model(TINY, layers=4)
    after_step = transformer(model, **options).frame
    frame = transformer(model, **options, overlap_param_gather=True).frame
    validate(frame)
    gathers = frame[frame["name"].str.endswith("param_allgather")]
    columns = ["name", "gpu", "group", "bytes"]
    assert sorted(map(tuple, gathers[columns].astype(str).values)) == sorted(
        map(tuple, after_step.loc[after_step["name"].str.endswith("param_allgather"), columns].astype(str).values))
    assert (gathers["deps"].fillna("") == "").all() and set(gathers["stream"]) == {"comm"}
    assert gathers["op_id"].max() < frame.loc[frame["phase"] == "fwd", "op_id"].min()
    for gpu, rows in frame.groupby("gpu"):
        own = dict(zip(rows.loc[rows["name"].str.endswith("param_allgather"), "layer"],
                       rows.loc[rows["name"].str.endswith("param_allgather"), "op_id"]))
        forward = rows[rows["phase"] == "fwd"]
        first_ops = forward[forward["name"].str.match(r"(L\d+\.ln1|embedding|final_norm)$")]
        for row in first_ops.itertuples():
            waits = own[row.layer] in parse_ints(row.deps)
            assert waits == (row.step == 0), (gpu, row.name, row.step)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.integers(1, 2),
       st.integers(1 << 16, 1 << 24))
def test_overlapped_parameter_gathers_keep_every_trace_acyclic(dp, pp, virtual_stages, rounds, bucket_bytes):
    """Queued first on the comm stream, ahead of the gradient reductions that share it, the gathers
    close no dependency cycle (validate counts stream order and collectives) and are the same ones."""
    microbatches = pp * rounds
    options = dict(dp=dp, pp=pp, microbatches=microbatches, batch=dp * microbatches, seq_len=16,
                   virtual_stages=virtual_stages if pp > 1 else 1, bucket_bytes=bucket_bytes, distributed_optimizer=True)
    model = load_model(TINY, layers=4)
    frame = validate(transformer(model, **options, overlap_param_gather=True).frame)
    after_step = transformer(model, **options).frame
    gathered = [Counter(f.loc[f["name"].str.endswith("param_allgather"), "bytes"]) for f in (frame, after_step)]
    assert gathered[0] == gathered[1] and sum(gathered[0].values()) > 0


def test_overlapped_parameter_gathers_hide_behind_the_forward_pass():
    model = ModelConfig(name="small", hidden=1024, layers=2, heads=8, vocab=4096, seq_len=256, batch=4)
    system = gpusim.load_system("t3-ring8", {"num_gpus": 4})
    times = {flag: gpusim.run(system, transformer(model, dp=4, distributed_optimizer=True,
                                                  overlap_param_gather=flag), mode="symmetric").time_s
             for flag in (False, True)}
    assert times[True] < times[False]


def test_overlapping_parameter_gathers_needs_the_distributed_optimizer():
    with pytest.raises(TraceError, match="'overlap_param_gather' .* needs distributed_optimizer=True"):
        transformer(TINY, dp=2, batch=8, overlap_param_gather=True)
    options = dict(dp=1, tp=2, distributed_optimizer=True)
    assert transformer(TINY, **options, overlap_param_gather=True).frame.equals(transformer(TINY, **options).frame)


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_a_tied_embedding_split_over_stages_all_reduces_its_gradients_between_its_copies(distributed_optimizer):
    """Megatron-LM's _allreduce_word_embedding_grads: with the embedding tied to the output layer on
    another stage, one all-reduce of the (sliced) table's gradient per (replica, tensor-parallel rank)
    between the first and the last stage, after both copies' data-parallel reductions; the two
    copies' optimizer steps wait for it.  Untied, on one stage, or without the head: none."""
    tp, dp, pp = 2, 2, 2
    frame = transformer(TINY, tp=tp, dp=dp, pp=pp, microbatches=2, batch=4, seq_len=16,
                        distributed_optimizer=distributed_optimizer).frame
    synced = frame[frame["name"] == "embedding_grad_allreduce"]
    assert set(synced["stream"]) == {"comm"} and set(synced["collective"]) == {"allreduce"}
    assert sorted(synced["group"].unique()) == ["0 4", "1 5", "2 6", "3 7"]
    assert set(synced["bytes"]) == {TINY.vocab // tp * TINY.hidden * 2}
    reduced = frame[frame["name"].str.startswith("grad_") & (frame["layer"] == -1)]
    for _, row in synced.iterrows():
        bucket = reduced[reduced["gpu"] == row["gpu"]]["op_id"].iloc[0]
        assert bucket in parse_ints(row["deps"])
        step = frame[(frame["name"] == "embedding.adam") & (frame["gpu"] == row["gpu"])].iloc[0]
        assert row["op_id"] in parse_ints(step["deps"])
    validate(frame)
    for options in (dict(pp=1), dict(pp=2, head=False)):
        assert "embedding_grad_allreduce" not in set(transformer(TINY, batch=4, seq_len=16, **options).frame["name"])
    untied = load_model(TINY, tied_embeddings=False)
    assert "embedding_grad_allreduce" not in set(transformer(untied, pp=2, batch=4, seq_len=16).frame["name"])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 4), st.booleans())
def test_the_interleaved_schedule_runs_every_chunk_of_every_microbatch_once_and_builds(stages, groups, chunks,
                                                                                    backward):
    """Each stage runs a forward (and backward) of every (chunk, microbatch) once, a backward only
    after its forward, and with at most ``2 (p - s - 1) + (v - 1) p + 1`` forwards in flight; the
    whole trace builds (the generator raises if the schedule ever deadlocks) and has no cycle."""
    microbatches = groups * stages
    everything = {(c, mb) for c in range(chunks) for mb in range(microbatches)}
    for stage in range(stages):
        order = interleaved_order(stage, stages, microbatches, chunks, backward=backward)
        forwards = [(c, mb) for action, c, mb in order if action == "F"]
        backwards = [(c, mb) for action, c, mb in order if action == "B"]
        assert sorted(forwards) == sorted(everything) and sorted(backwards) == (sorted(everything) if backward else [])
        in_flight = peak = 0
        seen = set()
        for action, c, mb in order:
            if action == "F":
                seen.add((c, mb))
                in_flight += 1
            else:
                assert (c, mb) in seen
                in_flight -= 1
            peak = max(peak, in_flight)
        if backward:
            assert peak <= 2 * (stages - stage - 1) + (chunks - 1) * stages + 1
    if stages > 1 and chunks > 1:
        model = load_model(TINY, layers=stages * chunks)
        frame = transformer(model, pp=stages, microbatches=microbatches, batch=microbatches, seq_len=8,
                            virtual_stages=chunks, phase="train" if backward else "prompt").frame
        validate(frame)


def test_interleaved_stages_hold_every_pp_th_chunk_and_send_around_the_ring_of_stages():
    """pp=2 with 2 chunks of a 4-layer model: stage 0 holds layers 0 and 2, stage 1 layers 1 and 3;
    activations go 0 -> 1 -> 0 -> 1 (the last stage sends its chunk's output back to the first),
    gradients the other way: 3 transfers each way a microbatch."""
    model = load_model(TINY, layers=4)
    frame = transformer(model, pp=2, microbatches=4, batch=4, seq_len=16, virtual_stages=2).frame
    layers = frame[frame["layer"] >= 0].groupby("gpu")["layer"].unique()
    assert sorted(layers[0]) == [0, 2] and sorted(layers[1]) == [1, 3]
    sends = frame[frame["kind"] == "sendrecv"].drop_duplicates("op_id")
    assert Counter(zip(sends["name"], sends["group"])) == {("send_activations", "0 1"): 8, ("send_activations", "1 0"): 4,
                                                           ("send_gradients", "1 0"): 8, ("send_gradients", "0 1"): 4}
    assert transformer(model, pp=2, microbatches=4, batch=4, seq_len=16, virtual_stages=1).frame.equals(
        transformer(model, pp=2, microbatches=4, batch=4, seq_len=16).frame)
    assert transformer(model, pp=2, microbatches=4, batch=4, virtual_stages=2).metadata["virtual_stages"] == 2


@pytest.mark.parametrize(("options", "message"), [
    (dict(pp=1), "needs pp > 1"),
    (dict(pp=2, schedule="gpipe", microbatches=2), "needs schedule='1f1b'"),
    (dict(pp=2, microbatches=3, batch=3), r"needs microbatches \(3\) a multiple of pp \(2\)"),
    (dict(pp=2, phase="decode"), "needs phase 'train' or 'prompt'"),
    (dict(pp=2, virtual_stages=3), r"needs at least one of the 3 layers for each of pp x virtual_stages = 6 chunks"),
])
def test_interleaving_errors_name_what_it_needs(options, message):
    with pytest.raises(TraceError, match=r"virtual_stages=\d \(the interleaved 1F1B schedule\) " + message):
        transformer(TINY, **{"virtual_stages": 2, "batch": 4, **options})


def test_an_interleaved_pipeline_replays_with_a_smaller_bubble():
    """Four microbatches over two stages, replayed in full mode: two chunks a stage shorten the
    iteration (the bubble falls from (p-1)/m to (p-1)/(vm)) though they send twice as often."""
    model = ModelConfig(name="small", hidden=512, layers=4, heads=8, vocab=2048, seq_len=128, batch=8)
    system = gpusim.load_system("t3-ring8")
    times = {v: gpusim.run(system, transformer(model, pp=2, microbatches=4, virtual_stages=v), mode="full").time_s
             for v in (1, 2)}
    assert times[2] < times[1]


def test_selective_recomputation_reruns_only_the_core_attention_before_its_backward():
    """Megatron-LM's selective recomputation (Korthikanti et al. 2022): the scores, scaling and
    mask, softmax, dropout and context of each layer again, in the backward pass, right before
    their gradients; full recomputation reruns the whole layer; with FlashAttention nothing."""
    options = dict(tp=2, batch=2, seq_len=32)
    plain = transformer(TINY, **options).frame
    selective = transformer(TINY, **options, recompute="selective").frame
    core = ["attn_score", "attn_scale_mask", "softmax", "attn_dropout", "attn_context"]
    rank0 = selective[(selective["gpu"] == 0) & (selective["step"] == 0) & (selective["layer"] == 1)]
    names = rank0["name"].tolist()
    again = [name for name in names if name.startswith("recompute.")]
    assert again == [f"recompute.L1.{op}" for op in core]
    assert set(rank0.loc[rank0["name"].isin(again), "phase"]) == {"bwd"}
    assert names.index(again[-1]) + 1 == names.index("L1.attn_context_dgrad")
    forward = rank0.set_index("name")
    for op in core:
        assert forward.loc[f"recompute.L1.{op}", ["m", "n", "k", "elements", "rows", "cols"]].equals(
            forward.loc[f"L1.{op}", ["m", "n", "k", "elements", "rows", "cols"]])
    assert len(selective) == len(plain) + 2 * len(core) * TINY.layers  # 2 GPUs
    full = transformer(TINY, **options, recompute="full").frame
    assert full.equals(transformer(TINY, **options, recompute=True).frame)
    assert (full["name"].str.startswith("recompute.") & full["name"].str.contains("ln1")).any()
    flash = dict(options, attention="flash")
    assert transformer(TINY, **flash, recompute="selective").frame.equals(transformer(TINY, **flash).frame)
    with pytest.raises(TraceError, match="'recompute' must be one of False, True, 'full', 'selective', got 'some'"):
        transformer(TINY, recompute="some")
