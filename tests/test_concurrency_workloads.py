"""GEMM workloads from model definitions, and the tuning library."""

import pytest

from gpusim.config import load_gpu_config
from gpusim.errors import ConfigError
from gpusim.kernels.gemm import LIBRARY, GemmProblem, estimate_ns
from gpusim.kernels.gemm_tuning import TUNING_LIBRARY, parse_kernel, shortlist, tuning_candidates
from gpusim.studies.concurrency_workloads import (
    attention_gemms,
    linear_gemms,
    model_gemms,
    systematic_sample,
    with_shapes,
)

GPU = load_gpu_config("mi100")


def test_a_linear_layer_has_forward_input_and_weight_gradient_gemms():
    forward, input_grad, weight_grad = linear_gemms(tokens=2048, fan_in=1024, fan_out=4096)
    assert (forward["m"], forward["n"], forward["k"]) == (2048, 4096, 1024)
    assert (input_grad["m"], input_grad["n"], input_grad["k"]) == (2048, 1024, 4096)
    assert (weight_grad["m"], weight_grad["n"], weight_grad["k"]) == (4096, 1024, 2048)
    assert weight_grad["trans_a"] and forward["trans_b"]


def test_table_7_3_gemms_come_from_the_model_definitions():
    gemms = with_shapes(model_gemms("table7.3"))
    assert set(gemms["app"]) == {"gnmt", "ds2", "rnnt", "transformer", "bert", "gpt2", "gpt3", "mega_bert", "mega_gpt", "tnlg"}
    assert (gemms["dtype"] == "fp32").all()  # the dissertation's main results are FP32 (FP16 is section 7.5.8)
    distinct = gemms.drop_duplicates(["m", "n", "k", "trans_a", "trans_b"])
    assert 400 <= len(distinct) <= 600  # "about 410 GEMMs"
    bert = gemms[(gemms["app"] == "bert") & (gemms["hidden"] == 1024) & (gemms["inputs"] == 2048)]
    assert {(r.m, r.n, r.k) for r in bert.itertuples()} >= {(2048, 1024, 1024), (2048, 4096, 1024), (2048, 1024, 4096)}
    gnmt = gemms[(gemms["app"] == "gnmt") & (gemms["hidden"] == 512) & (gemms["inputs"] == 64)]
    assert {(r.m, r.n, r.k) for r in gnmt[gnmt["pass"] == "forward"].itertuples()} == {(64, 2048, 512), (64, 2048, 1024)}
    assert gemms["flops"].min() > 0 and gemms["shape"].str.endswith("_fp32").all()


def test_extension_and_quick_sets():
    extension = model_gemms("extension")
    assert (extension["role"] == "train").all()
    quick = model_gemms("quick")
    assert 30 <= len(quick) <= 50 and with_shapes(quick)["flops"].max() <= 1e10  # cheap enough for CI
    assert {"gnmt", "ds2", "rnnt", "transformer", "bert"} <= set(quick["app"])
    assert model_gemms("quick", dtype="fp16")["dtype"].eq("fp16").all()


def test_an_app_keeps_the_passes_it_names(tmp_path):
    """``passes`` keeps some of a layer's three training GEMMs (the CI set's transformers keep the
    forward and weight-gradient ones, whose input-gradient twins repeat the forward m x n x k)."""
    path = tmp_path / "passes.yaml"
    path.write_text("apps:\n  - {name: all, layer: transformer, hidden: [64], tokens: [32]}\n"
                    "  - {name: some, layer: transformer, hidden: [64], tokens: [32], passes: [weight-grad, forward]}\n"
                    "  - {name: inference, layer: lstm, hidden: [16], batch: [8], passes: [forward]}\n")
    gemms = model_gemms(path)
    passes = gemms.groupby("app")["pass"].agg(set).to_dict()
    assert passes == {"all": {"forward", "input-grad", "weight-grad"}, "some": {"forward", "weight-grad"},
                      "inference": {"forward"}}
    every, some = gemms[gemms["app"] == "all"], gemms[gemms["app"] == "some"]
    assert len(every) == 9 and len(some) == 6  # three linear layers (qkvo, ffn1, ffn2)
    assert sorted(zip(some["m"], some["n"], some["k"])) == sorted(
        zip(*(every.loc[every["pass"] != "input-grad", column] for column in ("m", "n", "k"))))
    quick = model_gemms("quick")
    transformers = quick[quick["layer"] == "transformer"]
    assert set(transformers["pass"]) == {"forward", "weight-grad"} and len(quick) == 36


def test_attention_batched_gemms():
    gemms = attention_gemms()
    bert = gemms[(gemms["app"] == "bert_large") & (gemms["inputs"] == 512)]
    scores = bert[bert["linear"] == "scores"].iloc[0]
    assert (scores["m"], scores["n"], scores["k"], scores["batch"]) == (512, 512, 64, 8 * 16)
    context = bert[bert["linear"] == "context"].iloc[0]
    assert (context["m"], context["n"], context["k"]) == (512, 64, 512)


def test_bad_workload_definitions_name_the_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("apps:\n  - name: x\n    layer: cnn\n    hidden: [1]\n")
    with pytest.raises(ConfigError, match="bad.yaml: app 'x': field 'layer'"):
        model_gemms(path)
    path.write_text("apps:\n  - name: x\n    layer: transformer\n    hidden: [512]\n    tokens: []\n")
    with pytest.raises(ConfigError, match="field 'tokens' must be a non-empty list"):
        model_gemms(path)
    with pytest.raises(ConfigError, match="workload definitions in"):
        model_gemms("no-such-set")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dtyp: fp16\napps: [{name: x, layer: lstm, hidden: [8], batch: [4]}]", "bad.yaml: unknown field 'dtyp'"),
        ("apps: [{name: x, layer: lstm, hidden: [8], batch: [4], input_width: [2]}]",
         r"app 'x' \(lstm\): unknown field 'input_width'.*input_widths"),
        ("apps: [{name: x, layer: transformer, hidden: [8], tokens: [4], ffn_multipler: 8}]", "unknown field 'ffn_multipler'"),
        ("apps: [{name: x, layer: transformer, hidden: [8], tokens: [4], ffn_multiplier: x}]",
         "field 'ffn_multiplier' must be a positive integer, got 'x'"),
        ("apps: [{name: x, layer: transformer, hidden: ['768'], tokens: [4]}]", "field 'hidden' must be a non-empty list"),
        ("apps: [{name: x, layer: lstm, hidden: [8], batch: [4], passes: [backward]}]",
         r"app 'x': field 'passes' must be a non-empty list of names among forward, input-grad, weight-grad, got \['backward'\]"),
        ("apps: [{name: x, layer: transformer, hidden: [8], tokens: [4], passes: []}]", "field 'passes' must be a non-empty list"),
        ("apps: [{name: x, layer: gru, hidden: [8], batch: [4], passes: [forward, forward]}]",
         "app 'x': field 'passes' names a pass twice"),
        ("models: [{name: m, hidden: 64, heads: 0, sequences: 1, sequence_lengths: [8]}]",
         "model 'm': field 'heads' must be a positive integer, got 0"),
        ("models: [{name: m, hidden: 64, heads: 4, sequences: 1, sequence_lengths: 128}]",
         "field 'sequence_lengths' must be a non-empty list of positive integers, got 128"),
        ("models: [{name: m, hidden: 64, heads: 4, sequences: 1, sequence_lengths: [8], dtpe: fp16}]", "unknown field 'dtpe'"),
    ],
)
def test_misspelled_or_mistyped_workload_fields_are_errors(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    read = attention_gemms if text.startswith("models") else model_gemms
    with pytest.raises(ConfigError, match=message):
        read(path)


def test_bad_workload_arguments_are_config_errors_naming_them():
    with pytest.raises(ConfigError, match=r"model_gemms: dtype must be one of fp64, fp32, .*, got 'float16'"):
        model_gemms("quick", dtype="float16")
    with pytest.raises(ConfigError, match=r"attention_gemms: dtype must be one of .*, got 'half'"):
        attention_gemms(dtype="half")
    with pytest.raises(ConfigError, match=r"model_gemms: apps must name apps of .*table7.3.yaml, got \['gnmtt'\]; "
                                          r"known: .*gnmt"):
        model_gemms("table7.3", apps=["gnmtt"])
    with pytest.raises(ConfigError, match="apps must name apps of .*, got \\[\\]"):
        model_gemms("quick", apps=[])
    assert set(model_gemms("table7.3", apps=["gnmt", "bert"])["app"]) == {"gnmt", "bert"}
    assert set(model_gemms("table7.3", apps="gnmt")["app"]) == {"gnmt"}
    with pytest.raises(ConfigError, match="expected a workload file or the name of one in .*, got 7"):
        model_gemms(7)
    with pytest.raises(ConfigError, match="linear_gemms: fan_in must be a positive integer, got 0"):
        linear_gemms(8, 0, 16)
    gemms = model_gemms("quick")
    for every in (0, -1, 1.5):
        with pytest.raises(ConfigError, match=f"systematic_sample: every must be a positive integer, got {every}"):
            systematic_sample(gemms, every)
    with pytest.raises(ConfigError, match="systematic_sample: minimum must be a positive integer, got 0"):
        systematic_sample(gemms, 2, minimum=0)
    with pytest.raises(ConfigError, match="systematic_sample: gemms needs an 'app' column"):
        systematic_sample(gemms.drop(columns=["app"]), 2)
    with pytest.raises(ConfigError, match="with_shapes: the GEMM table lacks the column.s. m, batch"):
        with_shapes(gemms.drop(columns=["m", "batch"]))
    with pytest.raises(ConfigError, match="with_shapes: column 'n' must hold positive integers, got -4"):
        with_shapes(gemms.assign(n=-4))
    with pytest.raises(ConfigError, match=r"with_shapes: column 'trans_a' must hold True or False \(whether the operand "
                                          r"is transposed\), got 'yes'"):
        with_shapes(gemms.assign(trans_a="yes"))


def test_sampling_an_empty_set_is_empty():
    empty = with_shapes(model_gemms("quick")).iloc[0:0]
    assert systematic_sample(empty, every=4).empty


def test_tuning_library_spans_the_trade_offs():
    assert set(LIBRARY) <= set(TUNING_LIBRARY)  # the BLAS heuristic's kernels are among the tuner's
    assert {spec.lds_buffers for spec in TUNING_LIBRARY} == {1, 2}
    assert len({(spec.tile_m, spec.tile_n) for spec in TUNING_LIBRARY}) >= 12
    assert len({spec.threads for spec in TUNING_LIBRARY}) >= 3


@pytest.mark.parametrize("name", ["MT128x64x32_T256", "MT64x64x16_T128_LB1", "MT32x32x32_T128_LB1_SK4", "MT256x128x64_T512_SK2"])
def test_kernel_names_round_trip(name):
    assert parse_kernel(name).name == name


def test_bad_kernel_name():
    with pytest.raises(ValueError, match="must look like"):
        parse_kernel("gemm_fast")


def test_shortlist_ranks_by_estimate_without_twins_and_keeps_the_included():
    problem = GemmProblem(2048, 3072, 768, "fp32")
    heuristic = parse_kernel("MT256x256x32_T256")
    picks = shortlist(problem, GPU, 3, include=[heuristic])
    assert picks[-1] == heuristic and len(picks) == 4
    estimates = [estimate_ns(problem, spec, GPU) for spec in picks[:3]]
    assert estimates == sorted(estimates)
    best = min(estimate_ns(problem, spec, GPU) for spec in tuning_candidates(problem, GPU))
    assert estimates[0] == pytest.approx(best)
    with pytest.raises(ValueError, match="count"):
        shortlist(problem, GPU, 0)
