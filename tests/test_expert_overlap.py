"""A mixture of experts whose all-to-alls overlap its experts' GEMMs (``expert_overlap_chunks``)."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.errors import TraceError
from gpusim.trace import ModelConfig, transformer
from gpusim.trace.schema import parse_ints

MOE = ModelConfig(name="tiny-moe", hidden=256, layers=2, heads=4, vocab=1024, seq_len=64, batch=4, experts=4,
                  experts_per_token=2, activation="swiglu", norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False)


def _exchanged(frame: pd.DataFrame, name: str) -> np.ndarray:
    """Bytes each GPU sends each other GPU in the all-to-alls named ``name`` (and its chunks ``name.c``)."""
    rows = frame[frame["name"].str.fullmatch(rf"{name}(\.\d+)?")]
    matrix = np.zeros((4, 4), dtype=np.int64)
    for _, group in rows.groupby(["name", "op_id"]):
        ranks = parse_ints(group["group"].iloc[0])
        for gpu, sends, nbytes in zip(group["gpu"], group["send_bytes"], group["bytes"]):
            pieces = parse_ints(sends) if sends else [nbytes // len(ranks)] * len(ranks)
            for rank, piece in zip(ranks, pieces):
                matrix[gpu, rank] += piece
    return matrix


def _expert_rows(frame: pd.DataFrame, name: str) -> dict[int, int]:
    """Rows each GPU's experts process in the GEMMs named ``name`` (and its chunks)."""
    rows = frame[frame["name"].str.fullmatch(rf"{name}(\.\d+)?")]
    counts: dict[int, int] = {}
    for row in rows.itertuples():
        if row.kind == "grouped_gemm":
            processed = sum(parse_ints(row.shapes)[::3])  # each problem's m: its rows
        else:
            processed = int(row.m) * int(row.batch)
        counts[row.gpu] = counts.get(row.gpu, 0) + processed
    return counts


@settings(max_examples=10, deadline=None)
@given(chunks=st.integers(2, 5), phase=st.sampled_from(["train", "prompt"]),
       load=st.one_of(st.none(), st.lists(st.integers(0, 9), min_size=4, max_size=4).filter(any)))
def test_the_chunks_add_up_to_the_whole_exchange_and_the_whole_work(chunks, phase, load):
    options = dict(phase=phase, dp=4, ep=4, batch=4, seq_len=32, optimizer=None, head=False, layers=1,
                   expert_load=load)
    whole = transformer(MOE, **options).frame
    split = transformer(MOE, expert_overlap_chunks=chunks, **options).frame
    for name in ("L0.moe_dispatch", "L0.moe_combine", "L0.moe_dispatch_bwd", "L0.moe_combine_bwd"):
        if phase == "prompt" and name.endswith("_bwd"):
            continue
        assert (_exchanged(split, name) == _exchanged(whole, name)).all(), name
        assert set(split.loc[split["name"].str.startswith(f"{name}."), "stream"]) == {"ep_comm"}
    for name in ("L0.expert_fc1", "L0.expert_fc2"):
        assert _expert_rows(split, name) == _expert_rows(whole, name)
    assert len(set(split["name"])) > len(set(whole["name"]))  # the chunks are ops of their own


def test_one_chunk_is_the_exchange_in_turn_with_the_gemms():
    options = dict(phase="train", dp=4, ep=4, batch=4, seq_len=32, optimizer=None, head=False, layers=1)
    assert transformer(MOE, expert_overlap_chunks=1, **options).frame.equals(transformer(MOE, **options).frame)
    few = transformer(MOE, phase="decode", dp=4, ep=4, batch=4, seq_len=32, optimizer=None, head=False, layers=1,
                      expert_overlap_chunks=8).frame  # a token a rank: 2 copies, so 2 chunks of one row
    assert sorted(set(few.loc[few["name"].str.startswith("L0.moe_dispatch."), "name"])) == [
        "L0.moe_dispatch.0", "L0.moe_dispatch.1"]


def test_overlapping_hides_a_slow_exchange_behind_the_experts():
    """On a slow switch (25 GB/s a port) the exchanges of a Mixtral prompt layer cost as much as its
    experts; in four chunks they run beside them."""
    system = gpusim.load_system("hgx-h100", overrides={"switch": {"port_bandwidth_bytes_per_s": "25 GB/s"}})

    def layer(chunks: int) -> float:
        trace = transformer("mixtral-8x7b", phase="prompt", dp=8, ep=8, batch=8, seq_len=512, layers=1, head=False,
                            attention="flash", expert_overlap_chunks=chunks)
        return trace.replay(system, mode="auto", progress=False).time_s  # symmetric: balanced routing

    assert layer(4) < 0.9 * layer(1)


def test_symmetric_and_full_mode_agree_on_an_overlapped_layer():
    """Balanced routing, the exchanges beside the GEMMs on a 4-GPU NVSwitch node: GPU 0 stands for all."""
    model = MOE.model_copy(update={"hidden": 1024, "heads": 8, "ffn_hidden": 4096, "layers": 1})
    trace = transformer(model, phase="prompt", dp=4, ep=4, batch=4, seq_len=512, head=False, attention="flash",
                        expert_overlap_chunks=3)
    system = gpusim.load_system("hgx-h100", overrides={"num_gpus": 4})
    symmetric = trace.replay(system, mode="symmetric").time_s
    assert symmetric == pytest.approx(trace.replay(system, mode="full").time_s, rel=0.01)


@pytest.mark.parametrize(("options", "message"), [
    ({"expert_overlap_chunks": 2}, "expert_overlap_chunks=2 overlaps the all-to-alls .* it needs ep > 1"),
    ({"expert_overlap_chunks": 0, "dp": 2, "ep": 2}, "'expert_overlap_chunks' must be a positive integer, got 0"),
    ({"expert_overlap_chunks": 1.5, "dp": 2, "ep": 2}, "'expert_overlap_chunks' must be a positive integer, got 1.5"),
])
def test_bad_chunks_are_refused(options, message):
    with pytest.raises(TraceError, match=message):
        transformer(MOE, batch=4, **options)


def test_the_command_line_varies_the_chunks(tmp_path):
    from gpusim.cli import main

    assert main(["simulate", "--model", "mixtral-8x7b", "--phase", "prompt", "--layers", "1", "--batch", "8",
                 "--seq-len", "512", "--dp", "8", "--ep", "8", "--attention", "flash", "--system", "hgx-h100",
                 "--set", "switch.port_bandwidth_bytes_per_s=25GB/s", "--vary", "expert_overlap_chunks=1,4",
                 "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    points = pd.read_csv(tmp_path / "points.csv")
    assert points["total_s"].iloc[1] < 0.9 * points["total_s"].iloc[0]
