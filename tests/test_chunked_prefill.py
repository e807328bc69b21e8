"""Decoding steps that also carry a chunk of a new prompt (chunked prefill, as Sarathi-Serve)."""

import pytest

import gpusim
from gpusim.cli import main
from gpusim.errors import TraceError
from gpusim.trace import memory_footprint, transformer


def layer_rows(frame, step=0, layer=0):
    rows = frame[(frame["gpu"] == 0) & (frame["step"] == step)]
    return rows[rows["name"].str.startswith(f"L{layer}.")].set_index("name")


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_the_chunk_joins_the_steps_tokens_and_attends_to_its_prompt_so_far(attention):
    frame = transformer("llama2-7b", phase="decode", batch=8, seq_len=1024, decode_tokens=3, prefill_tokens=256,
                        prefill_context=512, layers=1, attention=attention).frame
    for step in range(3):
        rows = layer_rows(frame, step)
        assert rows.loc["L0.qkv", "m"] == 8 + 256 and rows.loc["L0.fc2", "m"] == 8 + 256
        assert rows.loc["L0.ln1", "rows"] == 264
        assert rows.loc["L0.kv_cache_write", "elements"] == 2 * 4096 * 264
        keys = 512 + 256 * (step + 1)  # the prompt's tokens before this chunk, and the chunk's own
        if attention == "flash":
            assert rows.loc["L0.prefill_attention", ["batch", "q_len", "kv_len"]].tolist() == [1, 256, keys]
            assert rows.loc["L0.attention", ["batch", "q_len", "kv_len"]].tolist() == [8, 1, 1024 + step + 1]
        else:  # Q K^T as cuBLAS sees it: keys x queries over the chunk's heads
            assert rows.loc["L0.prefill_attn_score", ["m", "n", "batch"]].tolist() == [256, keys, 32]
    head = frame[(frame["gpu"] == 0) & (frame["name"] == "lm_head")]
    assert set(head["m"]) == {9}  # a row a sequence, and the chunk's last token


def test_piggybacked_decodes_cost_less_than_a_separate_step():
    """Sarathi-Serve's premise: the decoding sequences share the chunk's weight reads, so one mixed
    step takes less than a decoding step and the chunk's prefill apart, and more than either."""
    system = gpusim.load_system("h100-sxm5")

    def time(**options):
        trace = transformer("llama2-7b", layers=2, attention="flash", head=False, **options)
        return trace.replay(system, progress=False).time_s

    decode = time(phase="decode", batch=16, seq_len=1024)
    prefill = time(phase="prompt", batch=1, seq_len=512)
    mixed = time(phase="decode", batch=16, seq_len=1024, prefill_tokens=512)
    assert max(decode, prefill) < mixed < decode + prefill


def test_the_chunked_prompts_cache_grows_to_its_last_chunk():
    plain = memory_footprint(transformer("llama2-7b", phase="decode", batch=8, seq_len=1000, decode_tokens=24))
    mixed = memory_footprint(transformer("llama2-7b", phase="decode", batch=8, seq_len=1000, decode_tokens=24,
                                         prefill_tokens=100, prefill_context=300))
    per_token = 2 * 32 * 4096 * 2
    assert mixed["kv_cache_bytes"].iloc[0] - plain["kv_cache_bytes"].iloc[0] == (300 + 24 * 100) * per_token


@pytest.mark.parametrize("options, message", [
    ({"phase": "prompt", "prefill_tokens": 64}, "'prefill_tokens' adds a prompt's chunk to each decoding step; "
                                                 "it applies to phase='decode', not 'prompt'"),
    ({"phase": "decode", "prefill_context": 64}, "'prefill_context' .* it needs prefill_tokens"),
    ({"phase": "decode", "prefill_tokens": -1}, "'prefill_tokens' must be a whole number of tokens, at least 0, got -1"),
    ({"phase": "decode", "prefill_tokens": 8, "prefill_context": 2.5}, "'prefill_context' must be a whole number"),
    ({"phase": "decode", "prefill_tokens": True}, "'prefill_tokens' must be a whole number of tokens, at least 0, got True"),
])
def test_chunk_options_that_do_not_fit_are_refused(options, message):
    with pytest.raises(TraceError, match=message):
        transformer("llama2-7b", layers=1, batch=2, seq_len=16, **options)


def test_cli_takes_the_chunk(capsys):
    common = ["simulate", "--model", "llama2-7b", "--layers", "1", "--batch", "4", "--seq-len", "128",
              "--system", "h100-sxm5", "--quiet"]
    assert main([*common, "--phase", "decode", "--prefill-tokens", "64", "--prefill-context", "64"]) == 0
    assert "llama2-7b-decode-tp1-dp1-pp1 on h100-sxm5" in capsys.readouterr().out
    assert main([*common, "--phase", "prompt", "--prefill-tokens", "64"]) == 2
    assert "--prefill-tokens applies to --phase decode only, not to --phase prompt" in capsys.readouterr().err
