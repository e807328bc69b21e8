"""Uneven (dropless) expert routing: all-to-allv, its trace rows, the generator's plan, the footprint."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim import ops
from gpusim.cli import main
from gpusim.errors import OpError, TraceError
from gpusim.trace import ModelConfig, Trace, memory_footprint, transformer
from gpusim.trace.generator import apportion
from gpusim.trace.schema import parse_ints

MIB = 2**20
MOE = ModelConfig(name="tiny-moe", hidden=256, layers=2, heads=4, vocab=1024, seq_len=64, batch=4, experts=4,
                  experts_per_token=2, activation="swiglu", norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False)
SWITCH4 = {"num_gpus": 4}


@settings(max_examples=60, deadline=None)
@given(total=st.integers(0, 10_000), shares=st.lists(st.floats(0, 100), min_size=1, max_size=16).filter(any))
def test_apportion_hands_out_every_item_within_one_of_its_exact_share(total, shares):
    counts = apportion(total, shares)
    assert sum(counts) == total
    for count, share in zip(counts, shares):
        assert abs(count - total * share / sum(shares)) < 1


def _link_bytes(result) -> dict[tuple[int, int], float]:
    """Bytes that left each GPU for each other GPU (the links out of the GPUs)."""
    out = result.links[result.links["link"].str.startswith("gpu")]
    return out.groupby(["src", "dst"])["bytes"].sum().to_dict()


def test_an_uneven_all_to_all_sends_exactly_each_pair_s_bytes():
    send = [[0, 3 * MIB, 100, 0], [5 * MIB, 0, 6, MIB], [0, 0, 4096, 0], [2 * MIB, 2, MIB, 0]]
    system = gpusim.load_system("hgx-h100", overrides=SWITCH4)
    result = gpusim.run(system, [ops.AllToAll(8 * MIB, send_bytes=send, ranks=[0, 1, 2, 3])], mode="full")
    expected = {(i, j): float(send[i][j]) for i in range(4) for j in range(4) if i != j and send[i][j]}
    assert _link_bytes(result) == expected  # the diagonal stays in place; empty pieces are not sent
    assert result.ops.set_index("gpu")["bytes"].to_dict() == {i: sum(row) for i, row in enumerate(send)}


@settings(max_examples=15, deadline=None)
@given(send=st.lists(st.lists(st.sampled_from([0, 2, 100, 4096, 65538, MIB]), min_size=3, max_size=3),
                     min_size=3, max_size=3),
       channels=st.sampled_from([None, 1, 2, 5]))
def test_any_uneven_exchange_finishes_and_conserves_bytes(send, channels):
    """Whatever the sizes (empty pieces, odd element counts, fewer bytes than channels) and channels, every
    rank finishes and the links carry each pair's bytes exactly."""
    system = gpusim.load_system("hgx-h100", overrides={"num_gpus": 3})
    nbytes = max(2, *map(sum, send), *map(sum, zip(*send)))
    result = gpusim.run(system, [ops.AllToAll(nbytes, send_bytes=send, channels=channels, ranks=[0, 1, 2])],
                        mode="full")
    assert sorted(result.ops["gpu"]) == [0, 1, 2]
    expected = {(i, j): float(send[i][j]) for i in range(3) for j in range(3) if i != j and send[i][j]}
    assert _link_bytes(result) == expected


def test_an_even_matrix_is_the_even_all_to_all_and_a_hot_receiver_slows_it():
    system = gpusim.load_system("hgx-h100", overrides=SWITCH4)
    ranks = [0, 1, 2, 3]

    def duration(op) -> float:
        return gpusim.run(system, [op], mode="full").ops["duration_s"].max()

    even = duration(ops.AllToAll(64 * MIB, ranks=ranks))
    assert duration(ops.AllToAll(64 * MIB, send_bytes=[[16 * MIB] * 4] * 4, ranks=ranks)) == pytest.approx(even,
                                                                                                         rel=1e-9)
    hot = [[48 * MIB if j == 0 else 16 * MIB // 6 * 2 for j in range(4)] for _ in range(4)]
    assert sum(hot[1]) == pytest.approx(64 * MIB, rel=0.01)  # each rank sends as much as before
    assert duration(ops.AllToAll(192 * MIB, send_bytes=hot, ranks=ranks)) > 2 * even  # rank 0 takes 144 MiB, not 48


@pytest.mark.parametrize("send, ranks, message", [
    ([[0, 1], [1, 0]], None, "square matrix with a row and a column per rank of 'ranks' \\(no ranks\\)"),
    ([[0, 1], [1, 0]], [0, 1, 2], "\\(3 ranks\\)"),
    ([[0, 1], [1]], [0, 1], "row 1 of field 'send_bytes' must be 2 non-negative integers"),
    ([[0, -1], [1, 0]], [0, 1], "row 0 of field 'send_bytes'"),
    ([[0, 1.5], [1, 0]], [0, 1], "row 0 of field 'send_bytes'"),
    ([[0, 600], [0, 0]], [0, 1], "must fit in field 'nbytes' \\(512\\), but one rank sends 600"),
    ([[0, 300], [0, 300]], [0, 1], "one receives 600 bytes"),
])
def test_bad_send_bytes_are_refused(send, ranks, message):
    with pytest.raises(OpError, match=message):
        ops.AllToAll(512, send_bytes=send, ranks=ranks)


def test_symmetric_mode_refuses_an_uneven_all_to_all():
    system = gpusim.load_system("hgx-h100", overrides=SWITCH4)
    op = ops.AllToAll(4 * MIB, send_bytes=[[MIB] * 4] * 4, ranks=[0, 1, 2, 3])
    with pytest.raises(OpError, match="needs mode='full'"):
        gpusim.run(system, [op], mode="symmetric")
    assert gpusim.run(system, [op], mode="auto").stats["mode"] == "full"


def _exchange_rows(sends: list[str], nbytes: int = 4 * MIB, group: str = "0 1 2 3") -> pd.DataFrame:
    return pd.DataFrame([{"op_id": 1, "gpu": gpu, "stream": "compute", "kind": "collective", "collective": "alltoall",
                          "bytes": nbytes, "group": group, "send_bytes": text} for gpu, text in enumerate(sends)])


def test_a_trace_s_uneven_all_to_all_replays_each_rank_s_sends():
    sends = [f"0 {MIB} 0 0", f"{2 * MIB} 0 0 0", "0 0 0 0", f"0 {MIB} {MIB} 0"]
    trace = Trace(_exchange_rows(sends))
    result = trace.replay(gpusim.load_system("hgx-h100", overrides=SWITCH4), mode="auto")
    assert result.stats["mode"] == "full"
    assert _link_bytes(result) == {(0, 1): MIB, (1, 0): 2 * MIB, (3, 1): MIB, (3, 2): MIB}
    with pytest.raises(TraceError, match="symmetric mode cannot replay an uneven all-to-all"):
        trace.replay(gpusim.load_system("hgx-h100", overrides=SWITCH4), mode="symmetric")


@pytest.mark.parametrize("change, message", [
    (lambda f: f.assign(collective="allgather"), "must be blank except on an alltoall collective row"),
    (lambda f: f.assign(send_bytes=["1 2 3"] * 4), "must list the non-negative bytes sent to each of the 4 ranks"),
    (lambda f: f.assign(send_bytes=["1 2 3 x"] * 4), "must list the non-negative bytes"),
    (lambda f: f.assign(send_bytes=["0 -1 0 0"] * 4), "must list the non-negative bytes"),
    (lambda f: f.assign(send_bytes=[f"0 {4 * MIB} 1 0"] * 4), "must add up to at most the row's bytes"),
    (lambda f: f.assign(send_bytes=["0 1 1 1", "", "1 0 1 1", "1 1 0 1"]), "is blank, but other rows"),
    (lambda f: f.assign(group="0 1 2 3 4"), "needs a row on every rank of the group '0 1 2 3 4'"),
])
def test_bad_send_bytes_rows_are_refused_naming_the_row(change, message):
    frame = change(_exchange_rows(["0 1 1 1", "1 0 1 1", "1 1 0 1", "1 1 1 0"]))
    if "group" in message:
        frame["send_bytes"] = "0 1 1 1 1"
    with pytest.raises(TraceError, match=f"trace: row .*field 'send_bytes'.*{message}"):
        Trace(frame)


def _place_of(frame: pd.DataFrame, group_rows: pd.DataFrame) -> dict[int, int]:
    return {gpu: parse_ints(group).index(gpu) for gpu, group in zip(group_rows["gpu"], group_rows["group"])}


SHARES = st.lists(st.integers(0, 9), min_size=4, max_size=4).filter(any)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), ep=st.sampled_from([1, 2, 4]), phase=st.sampled_from(["train", "prompt", "decode"]),
       tp=st.sampled_from([1, 2]), per_place=st.booleans())
def test_dropless_routing_runs_every_routed_copy_through_one_expert_once(data, ep, phase, tp, per_place):
    """Summed over the ranks, the experts' rows are every replica's routed copies, no more (no
    padding) and no fewer (no drops); each rank's dispatch sends what the ranks of its place receive
    and the combine sends it back; whether every rank routes alike or each place its own way."""
    load = data.draw(st.lists(SHARES, min_size=ep, max_size=ep) if per_place else SHARES)
    trace = transformer(MOE, phase=phase, dp=4, ep=ep, tp=tp, batch=4, seq_len=32, optimizer=None, head=False,
                        expert_load=load)
    frame = trace.frame[trace.frame["layer"] == 0]
    forward = frame[frame["phase"] != "bwd"]
    fc1 = forward[forward["name"] == "L0.expert_fc1"]
    rows = {gpu: sum(parse_ints(shapes)[::3]) for gpu, shapes in zip(fc1["gpu"], fc1["shapes"])}  # each problem's m
    tokens = 1 if phase == "decode" else 32
    replicas = 4
    assert set(fc1["kind"]) == {"grouped_gemm"}
    assert sum(rows.values()) == tp * replicas * tokens * MOE.top_k  # each tp rank runs its slice of every row
    dispatch = forward[forward["name"] == "L0.moe_dispatch"]
    combine = forward[forward["name"] == "L0.moe_combine"]
    assert dispatch.empty == (ep == 1)
    row_bytes = MOE.hidden * 2
    for (_, sent), (_, back) in zip(dispatch.groupby("op_id"), combine.groupby("op_id")):
        matrix = [parse_ints(text) for text in sent.sort_values("gpu")["send_bytes"]]
        returned = [parse_ints(text) for text in back.sort_values("gpu")["send_bytes"]]
        assert returned == [list(column) for column in zip(*matrix)]
        for place, gpu in enumerate(parse_ints(sent["group"].iloc[0])):
            received = sum(matrix[sender][place] for sender in range(ep))
            assert received == rows.get(gpu, 0) * row_bytes


def test_a_hot_expert_slows_the_layer_on_every_rank():
    system = gpusim.load_system("hgx-h100", overrides=SWITCH4)
    wide = MOE.model_copy(update={"hidden": 1024, "heads": 8, "intermediate": 4096})

    def layer(load, capacity: float | None = None) -> pd.Series:
        trace = transformer(wide, phase="prompt", dp=4, ep=4, batch=4, seq_len=512, layers=1, head=False,
                            attention="flash", expert_load=load, expert_capacity_factor=capacity)
        result = trace.replay(system, mode="auto", progress=False)
        assert result.stats["mode"] == ("symmetric" if load is None else "full")
        return result.ops.groupby("gpu")["end_s"].max()

    balanced = layer(None)  # GPU 0 stands for all
    even = layer([1, 1, 1, 1])
    assert even.to_numpy() == pytest.approx([balanced[0]] * 4, rel=0.02)
    hot = layer([5, 1, 1, 1])  # expert 0 (rank 0) takes 5/8 of the copies, 2.5x its balanced share
    assert (hot > 1.1 * even).all()  # every rank waits for rank 0 in the combine
    capped = layer([5, 1, 1, 1], capacity=1.25)  # rank 0's expert takes 1.25 x its balanced share, no more
    assert (capped < hot).all() and (capped > even).all()


@settings(max_examples=20, deadline=None)
@given(shares=SHARES, capacity=st.sampled_from([0.5, 0.9, 1.0, 1.25, 2.0]), ep=st.sampled_from([2, 4]))
def test_a_capacity_bounds_every_expert_and_every_copy_is_kept_or_dropped(shares, capacity, ep):
    trace = transformer(MOE, phase="prompt", dp=4, ep=ep, batch=4, seq_len=32, optimizer=None, head=False,
                        layers=1, expert_load=shares, expert_capacity_factor=capacity)
    frame = trace.frame
    copies = 32 * MOE.top_k  # a rank's
    limit = math.ceil(capacity * copies / MOE.experts)  # of one rank's copies, for one expert
    fc1 = frame[frame["name"] == "L0.expert_fc1"]
    rows = [m for shapes in fc1["shapes"] for m in parse_ints(shapes)[::3]]
    assert max(rows) <= ep * limit
    assert sum(rows) + round(trace.metadata["expert_dropped"][0] * 4 * copies) == 4 * copies


def test_a_capacity_drops_the_copies_beyond_it_without_padding():
    """64 copies a rank, shares 5:1:1:1 give expert 0 40 of each rank's copies; at capacity factor
    1.25 it keeps ceil(1.25 x 64 / 4) = 20 of them, and the other experts their 8; at 1 (Megatron-LM's
    capacity of exactly the balanced share, not dropless) 16; with no factor all 40."""
    options = dict(phase="prompt", dp=4, ep=4, batch=4, seq_len=32, optimizer=None, head=False)
    trace = transformer(MOE, expert_load=[5, 1, 1, 1], expert_capacity_factor=1.25, **options)
    frame = trace.frame
    row_bytes = MOE.hidden * 2
    dispatch = frame[frame["name"] == "L0.moe_dispatch"].sort_values("gpu")["send_bytes"]
    assert dispatch.tolist() == [" ".join(str(rows * row_bytes) for rows in (20, 8, 8, 8))] * 4
    fc1 = frame[frame["name"] == "L0.expert_fc1"].set_index("gpu")["shapes"]
    assert [parse_ints(fc1[gpu])[0] for gpu in range(4)] == [80, 32, 32, 32]
    assert trace.metadata["expert_dropped"] == [80 / 256] * 2
    balanced_share = transformer(MOE, expert_load=[5, 1, 1, 1], expert_capacity_factor=1, **options)
    assert balanced_share.metadata["expert_dropped"] == [96 / 256] * 2
    roomy = transformer(MOE, expert_load=[1, 1, 1, 1], expert_capacity_factor=1.25, **options)
    assert roomy.metadata["expert_dropped"] == [0.0, 0.0]  # nothing beyond the capacity, and nothing padded:
    assert roomy.frame.equals(transformer(MOE, expert_load=[1, 1, 1, 1], **options).frame)
    assert transformer(MOE, expert_load=[5, 1, 1, 1], **options).metadata["expert_dropped"] == [0.0, 0.0]
    assert transformer(MOE, **options).metadata["expert_dropped"] is None  # balanced routing


def test_each_place_may_route_its_own_way():
    """Rank 0 sends all its copies to expert 2 (rank 1's), rank 1 keeps all of its own on expert 3
    (its own copies stay in place): an exchange in one direction only, and back."""
    trace = transformer(MOE, phase="prompt", dp=2, ep=2, batch=2, seq_len=32, optimizer=None, head=False,
                        layers=1, expert_load=[[0, 0, 1, 0], [0, 0, 0, 1]])
    frame = trace.frame
    copies_bytes = 32 * MOE.top_k * MOE.hidden * 2
    sends = {name: frame[frame["name"] == name].sort_values("gpu")["send_bytes"].tolist()
             for name in ("L0.moe_dispatch", "L0.moe_combine")}
    assert sends == {"L0.moe_dispatch": [f"0 {copies_bytes}", f"0 {copies_bytes}"],
                     "L0.moe_combine": ["0 0", f"{copies_bytes} {copies_bytes}"]}
    fc1 = frame[frame["name"] == "L0.expert_fc1"]
    copies, h, f = 32 * MOE.top_k, MOE.hidden, 2 * MOE.intermediate  # the gated MLP's two projections in one
    assert fc1[["gpu", "kind", "shapes"]].values.tolist() == [[1, "grouped_gemm", f"{copies} {f} {h} {copies} {f} {h}"]]
    assert trace.metadata["expert_load"] == [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    same = transformer(MOE, phase="prompt", dp=2, ep=2, batch=2, seq_len=32, optimizer=None, head=False, layers=1,
                       expert_load=np.array([[0, 0, 1, 0], [0, 0, 0, 1]]))
    assert same.frame.equals(frame)


def test_each_layer_may_route_its_own_way():
    """Layer 0 sends every copy to expert 0, layer 1 spreads them; a layer given one row of shares
    routes alike from every place, and layers alike are one set in the metadata."""
    options = dict(phase="prompt", dp=2, ep=2, batch=2, seq_len=32, optimizer=None, head=False)
    trace = transformer(MOE, expert_load=[[[1, 0, 0, 0]], [[1, 1, 1, 1], [0, 0, 1, 1]]], **options)
    frame = trace.frame
    copies_bytes = 32 * MOE.top_k * MOE.hidden * 2
    dispatch = {layer: frame[frame["name"] == f"L{layer}.moe_dispatch"].sort_values("gpu")["send_bytes"].tolist()
                for layer in (0, 1)}
    assert dispatch == {0: [f"{copies_bytes} 0", f"{copies_bytes} 0"],
                        1: [f"{copies_bytes // 2} {copies_bytes // 2}", f"0 {copies_bytes}"]}
    assert trace.metadata["expert_load"] == [[[1.0, 0.0, 0.0, 0.0]] * 2,
                                             [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]]
    alike = transformer(MOE, expert_load=np.array([[[3, 1, 1, 1]]] * 2), **options)
    assert alike.frame.equals(transformer(MOE, expert_load=[3, 1, 1, 1], **options).frame)
    assert alike.metadata["expert_load"] == [[3.0, 1.0, 1.0, 1.0]] * 2
    footprint = memory_footprint(trace)["activations_bytes"]
    assert (footprint == memory_footprint(transformer(MOE, expert_load=[1, 0, 0, 0], **options))["activations_bytes"]).all()


def _expert_flops(frame: pd.DataFrame) -> float:
    """FLOPs of the expert GEMM rows, grouped or not."""
    experts = frame[frame["name"].str.contains(r"\.expert\d*_fc")]
    plain = experts[experts["kind"] == "gemm"]
    flops = float((2 * plain["m"] * plain["n"] * plain["k"] * plain["batch"]).sum())
    for shapes in experts.loc[experts["kind"] == "grouped_gemm", "shapes"]:
        dims = parse_ints(shapes)
        flops += sum(2 * m * n * k for m, n, k in zip(dims[::3], dims[1::3], dims[2::3]))
    return flops


@pytest.mark.parametrize("load", [None, [5, 1, 0, 2]])
def test_sequential_experts_run_a_gemm_per_expert_and_the_same_work(load):
    options = dict(dp=2, ep=2, batch=2, seq_len=32, optimizer=None, head=False, layers=1, expert_load=load)
    grouped = transformer(MOE, **options).frame
    sequential = transformer(MOE, expert_gemm="sequential", **options).frame
    assert _expert_flops(grouped) > 0
    assert _expert_flops(sequential) == pytest.approx(_expert_flops(grouped))
    forward = sequential[(sequential["phase"] == "fwd") & sequential["name"].str.endswith("_fc1")]
    assert set(forward["kind"]) == {"gemm"} and (forward["batch"] == 1).all()
    names = sorted(set(forward["name"]))
    assert names == (["L0.expert0_fc1", "L0.expert1_fc1"] if load is None else  # the rank's two experts
                     ["L0.expert0_fc1", "L0.expert1_fc1", "L0.expert3_fc1"])  # expert 2 receives no rows
    assert ("grouped_gemm" in set(grouped["kind"])) == (load is not None)


def test_the_footprint_counts_the_busiest_rank_s_experts():
    balanced = memory_footprint(transformer(MOE, dp=4, ep=4, batch=4, seq_len=64, optimizer=None))
    hot = memory_footprint(transformer(MOE, dp=4, ep=4, batch=4, seq_len=64, optimizer=None,
                                       expert_load=[5, 1, 1, 1]))
    even = memory_footprint(transformer(MOE, dp=4, ep=4, batch=4, seq_len=64, optimizer=None,
                                        expert_load=[1, 1, 1, 1]))
    assert even["activations_bytes"].tolist() == balanced["activations_bytes"].tolist()
    assert (hot["activations_bytes"] > balanced["activations_bytes"]).all()


@pytest.mark.parametrize("options, message", [
    ({"model": "llama2-7b", "expert_load": [1, 1]}, "'expert_load' applies to a mixture-of-experts model"),
    ({"expert_load": [1, 1, 1]}, "'expert_load' must give 4 non-negative shares, one per expert"),
    ({"expert_load": [1, -1, 1, 1]}, "must give 4 non-negative shares"),
    ({"expert_load": [0, 0, 0, 0]}, "not all zero"),
    ({"expert_load": [1, 1, 1, math.inf]}, "must give 4 non-negative shares"),
    ({"expert_load": "1111"}, "must give 4 non-negative shares"),
    ({"dp": 2, "ep": 2, "expert_load": [[1, 1, 1, 1]] * 3}, "one row of shares, or one per place of an "
                                                            "expert-parallel group, ep=2, got 3 rows"),
    ({"expert_load": [[[1, 1, 1, 1]]] * 3}, "'expert_load' by layer must give one set of rows for each of the 2 "
                                           "layers generated, got 3"),
    ({"expert_load": [[[1, 1, 1, 1]], [[1, 1, 1]]]}, "'expert_load' of layer 1 must give 4 non-negative shares"),
    ({"dp": 2, "ep": 2, "expert_load": [[1, 1, 1, 1], [1, 1, 1]]}, "must give 4 non-negative shares.*got \\[1, 1, 1\\]"),
    ({"dp": 2, "ep": 2, "expert_load": [[1, 1, 1, 1], [0, 0, 0, 0]]}, "not all zero"),
    ({"expert_gemm": "fused"}, "'expert_gemm' must be one of grouped, sequential, got 'fused'"),
    ({"model": "llama2-7b", "expert_gemm": "sequential"}, "expert_gemm='sequential' applies to a mixture-of-experts"),
])
def test_bad_expert_loads_are_refused(options, message):
    options = {"model": MOE, "batch": 8, **options}
    with pytest.raises(TraceError, match=message):
        transformer(options.pop("model"), **options)


def test_cli_takes_and_varies_the_expert_load(tmp_path, capsys):
    common = ["simulate", "--model", "mixtral-8x7b", "--phase", "prompt", "--layers", "1", "--batch", "4",
              "--seq-len", "32", "--dp", "4", "--ep", "4", "--system", "hgx-h100", "--quiet"]
    assert main([*common, "--expert-load", "1,1,1,1,1,1,1,1", "--expert-gemm", "sequential",
                 "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    assert main([*common, "--vary", "expert_load=1:1:1:1:1:1:1:1,8:1:1:1:1:1:1:1", "--workers", "1",
                 "--out", str(tmp_path / "sweep")]) == 0
    points = pd.read_csv(tmp_path / "sweep" / "points.csv")
    assert points["total_s"].iloc[1] > points["total_s"].iloc[0]
    assert main([*common, "--layers", "2", "--expert-load", "8,1,1,1,1,1,1,1/1,1,1,1,1,1,1,8", "--out",
                 str(tmp_path / "by_layer")]) == 0
    by_layer = pd.read_parquet(tmp_path / "by_layer" / "ops.parquet")
    hot = by_layer[by_layer["name"].str.endswith("expert_fc1")].set_index(["name", "gpu"])["duration_s"]
    # rank 0 holds experts 0 and 1, rank 3 experts 6 and 7: 9 / 15 of the copies against 2 / 15 (weight-bound)
    assert hot["L0.expert_fc1", 0] > 1.1 * hot["L0.expert_fc1", 3]
    assert hot["L1.expert_fc1", 3] > 1.1 * hot["L1.expert_fc1", 0]
    capsys.readouterr()
    assert main([*common, "--expert-load", "8,1,1,1,1,1,1,1", "--vary", "expert_capacity_factor=none,1",
                 "--workers", "1", "--out", str(tmp_path / "capacity")]) == 0
    capped = pd.read_csv(tmp_path / "capacity" / "points.csv")
    assert capped["expert_dropped"].iloc[0] == 0 and capped["expert_dropped"].iloc[1] > 0.3  # dropless, then 1
    assert capped["total_s"].iloc[1] < capped["total_s"].iloc[0]
    assert "expert_dropped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*common, "--expert-load", "4,x"])
    assert "--expert-load: expected the experts' shares as numbers" in capsys.readouterr().err
    assert main([*common, "--vary", "expert_load=1:y"]) == 2
    assert "--vary expert_load: expected the experts' shares" in capsys.readouterr().err


def _duration(system, op_list) -> float:
    return float(gpusim.run(system, op_list).ops["duration_s"].sum())


def test_a_grouped_gemm_of_equal_problems_is_the_batched_gemm():
    system = gpusim.load_system("h100-sxm5")
    grouped = gpusim.run(system, [ops.GroupedGemm([(512, 2048, 1024)] * 4, dtype="bf16")]).ops.iloc[0]
    batched = gpusim.run(system, [ops.Gemm(512, 2048, 1024, dtype="bf16", batch=4)]).ops.iloc[0]
    assert grouped["duration_s"] == pytest.approx(batched["duration_s"], rel=1e-9)
    assert grouped["flops"] == pytest.approx(2 * 4 * 512 * 2048 * 1024)


@pytest.mark.parametrize("shapes", [[(2048, 4096, 1024), (128, 4096, 1024), (16, 4096, 1024)],
                                    [(1024, 1024, 4096), (1024, 1024, 256), (1024, 1024, 64)]])
def test_a_grouped_gemm_costs_at_least_its_largest_problem_and_at_most_the_problems_one_by_one(shapes):
    """Rows (or depths) that differ per problem, as experts' do: one kernel fills the GPU with every
    problem's tiles, so it is no faster than its largest problem alone and, without a launch per
    problem and a tail per kernel, not much slower than running them one after another."""
    system = gpusim.load_system("h100-sxm5")
    grouped = _duration(system, [ops.GroupedGemm(shapes, dtype="bf16")])
    alone = [_duration(system, [ops.Gemm(*shape, dtype="bf16")]) for shape in shapes]
    assert max(alone) < grouped < 1.05 * sum(alone)


@pytest.mark.parametrize("options, message", [
    ({"shapes": []}, "field 'shapes' must list the \\(m, n, k\\) of at least one problem"),
    ({"shapes": [(1, 2)]}, "problem 0 of field 'shapes' must be three positive integers"),
    ({"shapes": [(1, 2, 3), (4, 0, 6)]}, "problem 1 of field 'shapes'"),
    ({"shapes": [(1, 2, 3)], "kernel": "MT128x128x32_T256_SK2"}, "field 'kernel' must not split K"),
    ({"shapes": [(1, 2, 3)], "dtype": "fp8x"}, "dtype"),
])
def test_bad_grouped_gemms_are_refused(options, message):
    with pytest.raises(OpError, match=message):
        ops.GroupedGemm(**options)


def test_a_trace_s_grouped_gemm_row_replays_and_bad_shapes_are_refused():
    row = {"op_id": 1, "gpu": 0, "stream": "compute", "kind": "grouped_gemm", "shapes": "512 2048 1024 64 2048 1024",
           "dtype": "bf16"}
    result = Trace(pd.DataFrame([row])).replay("h100-sxm5")
    assert result.ops["flops"].iloc[0] == pytest.approx(2 * (512 + 64) * 2048 * 1024)
    for shapes in ("512 2048", "512 2048 0", "", "a b c"):
        with pytest.raises(TraceError, match="row 0 .*field 'shapes'.*must list the positive m n k of every problem"):
            Trace(pd.DataFrame([{**row, "shapes": shapes}]))


def test_layers_whose_exchanges_differ_only_in_their_sends_are_all_simulated():
    """Layer caching reuses a layer only where every row is alike, an uneven all-to-all's sends too."""
    rows = []
    for layer in range(4):
        hot = MIB * 4**layer
        for gpu, sends in enumerate((f"0 {hot}", f"{MIB} 0")):
            rows.append({"op_id": layer, "gpu": gpu, "stream": "s", "layer": layer, "kind": "collective",
                         "collective": "alltoall", "bytes": 64 * MIB, "group": "0 1", "send_bytes": sends})
    trace = Trace(pd.DataFrame(rows))
    system = gpusim.load_system("hgx-h100", overrides={"num_gpus": 2})
    cached = trace.replay(system, mode="full")
    every = trace.replay(system, mode="full", cache_layers=False)
    assert cached.time_s == pytest.approx(every.time_s, rel=1e-9)
    assert every.ops.groupby("op_id")["duration_s"].max().is_monotonic_increasing


def test_the_command_line_takes_a_grouped_gemm(tmp_path):
    from gpusim.cli import parse_op
    from gpusim.errors import GpusimError

    op = parse_op("grouped_gemm shapes=512x4096x1024,64X4096x1024 dtype=bf16")
    assert op.shapes == ((512, 4096, 1024), (64, 4096, 1024)) and op.dtype == "bf16"
    with pytest.raises(OpError, match="problem 1 of field 'shapes' must be three positive integers"):
        parse_op("grouped_gemm shapes=512x4096x1024,64x4096")
    with pytest.raises(GpusimError, match="field 'shapes' expects a whole number"):
        parse_op("grouped_gemm shapes=axbxc")
    assert main(["sweep", "--system", "h100-sxm5", "--op", "grouped_gemm shapes=512x4096x1024,64x4096x1024",
                 "--vary", "gpu.num_cus=66,132", "--workers", "1", "--quiet", "--out", str(tmp_path / "s")]) == 0
    points = pd.read_csv(tmp_path / "s" / "points.csv")
    assert points["total_s"].iloc[0] > points["total_s"].iloc[1]
