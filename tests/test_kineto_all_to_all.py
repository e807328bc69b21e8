"""Uneven all-to-alls (all-to-allv) read from PyTorch profiler traces: the split sizes that
``record_param_comms`` writes become the rows' ``send_bytes``."""

import json

import pytest

import gpusim
from gpusim.errors import TraceError, UnsupportedTraceError
from gpusim.trace import read_kineto

A2A_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ROW = 256 * 1024
"""Elements of one row of the exchanged tensors (fp16: 512 KiB)."""


def _rank_file(tmp_path, rank, in_splits, out_splits=None, world=2, **args):
    """One rank's trace: a single NCCL all-to-all of ``in_splits`` rows to the ranks of the world."""
    fields = {"stream": 7, "Collective name": "all_to_allv", "dtype": "Half", "In msg nelems": sum(in_splits) * ROW,
              "Process Group Ranks": json.dumps(list(range(world))), "In split size": json.dumps(in_splits)}
    if out_splits is not None:
        fields.update({"Out msg nelems": sum(out_splits) * ROW, "Out split size": json.dumps(out_splits)})
    kernel = {"ph": "X", "cat": "kernel", "name": A2A_KERNEL, "ts": 10.0, "dur": 50.0, "args": {**fields, **args}}
    path = tmp_path / f"rank{rank}.json"
    path.write_text(json.dumps({"traceEvents": [kernel], "distributedInfo": {"rank": rank, "world_size": world}}))
    return path


def test_each_ranks_split_sizes_become_its_send_bytes(tmp_path):
    files = [_rank_file(tmp_path, 0, [3, 1], [3, 2]), _rank_file(tmp_path, 1, [2, 6], [1, 6])]
    frame = read_kineto(files).frame
    assert frame["op_id"].nunique() == 1
    assert frame["send_bytes"].tolist() == [f"{3 * ROW * 2} {1 * ROW * 2}", f"{2 * ROW * 2} {6 * ROW * 2}"]
    # bytes: the most any rank sends (rank 1: 8 rows) or receives (rank 1: 7 rows)
    assert frame["bytes"].tolist() == [8 * ROW * 2] * 2


def test_an_uneven_exchange_replays_in_full_mode_and_takes_longer_than_an_even_one(tmp_path):
    uneven = read_kineto([_rank_file(tmp_path, 0, [1, 7]), _rank_file(tmp_path, 1, [7, 1])])
    even = read_kineto([_rank_file(tmp_path, 0, [4, 4]), _rank_file(tmp_path, 1, [4, 4])])
    assert (even.frame["send_bytes"].fillna("") == "").all() and even.frame["bytes"].tolist() == [8 * ROW * 2] * 2
    system = gpusim.load_system("mi210-4")
    uneven_s = gpusim.run(system, uneven, mode="full").time_s
    even_s = gpusim.run(system, even, mode="full").time_s
    assert uneven_s > 1.2 * even_s  # 7 of 8 rows cross the link instead of 4 (1.35x)
    with pytest.raises(TraceError, match="symmetric mode cannot replay an uneven all-to-all"):
        gpusim.run(system, uneven, mode="symmetric")


def test_ranks_that_send_equal_pieces_of_different_sizes_are_uneven(tmp_path):
    frame = read_kineto([_rank_file(tmp_path, 0, [2, 2]), _rank_file(tmp_path, 1, [5, 5])]).frame
    assert frame["send_bytes"].tolist() == [f"{2 * ROW * 2} {2 * ROW * 2}", f"{5 * ROW * 2} {5 * ROW * 2}"]


def test_one_ranks_file_replays_its_uneven_exchange_as_an_even_one_and_says_so(tmp_path):
    trace = read_kineto(_rank_file(tmp_path, 1, [2, 6]))
    assert (trace.frame["send_bytes"].fillna("") == "").all() and trace.frame["bytes"].tolist() == [8 * ROW * 2]
    assert trace.metadata["even_all_to_alls"] == [
        {"op_id": 1, "gpu": 0, "name": trace.frame["name"].iloc[0], "send_bytes": [2 * ROW * 2, 6 * ROW * 2]}]
    assert gpusim.run(gpusim.load_system("mi210-4"), trace, mode="symmetric").time_s > 0
    assert read_kineto(_rank_file(tmp_path, 1, [4, 4])).metadata["even_all_to_alls"] == []


def test_split_sizes_the_profiler_cut_short_cannot_be_modelled(tmp_path):
    path = _rank_file(tmp_path, 0, [1, 1], **{"In split size": "[1, 1, ...]"})
    with pytest.raises(UnsupportedTraceError, match=r"'In split size' the profiler cut short \(\[1, 1, \.\.\.\]\)"):
        read_kineto(path)
    assert read_kineto(path, unsupported="delay").frame["kind"].tolist() == ["delay"]


@pytest.mark.parametrize(("value", "shown"), [
    ("[1, 2, 3]", r'"\[1, 2, 3\]"'),  # three sizes for two ranks
    ("[1, -2]", r'"\[1, -2\]"'),
    ("[0, 0]", r'"\[0, 0\]"'),
    ("[3, 2]", r'"\[3, 2\]"'),  # 5 rows do not divide 4 x 1024 elements
    ("rows", '"rows"'),
    (7, "7"),
])
def test_malformed_split_sizes_name_the_file_event_and_field(tmp_path, value, shown):
    path = _rank_file(tmp_path, 0, [2, 2], **{"In split size": value})
    with pytest.raises(TraceError, match=rf"rank0.json: event 0 \('ncclDevKernel_SendRecv'\): field 'In split size' "
                                         rf"must list one whole number >= 0 of rows per rank of the group \(2\), adding "
                                         rf"up to a divisor of the {4 * ROW} elements exchanged, got {shown}$"):
        read_kineto(path)


def test_a_rank_without_split_sizes_in_an_uneven_exchange_names_its_file(tmp_path):
    files = [_rank_file(tmp_path, 0, [3, 1]), _rank_file(tmp_path, 1, [2, 2], **{"In split size": "[]"})]
    with pytest.raises(TraceError, match=r"rank1.json: event 0 .*field 'In split size' is not recorded, but other "
                                         r"ranks of this all-to-all send uneven pieces"):
        read_kineto(files)


def test_received_pieces_that_disagree_with_the_senders_name_the_field(tmp_path):
    files = [_rank_file(tmp_path, 0, [3, 1], [3, 2]), _rank_file(tmp_path, 1, [2, 6], [2, 6])]
    with pytest.raises(TraceError, match=rf"rank1.json: event 0 .*field 'Out split size': this rank receives "
                                         rf"{2 * ROW * 2} {6 * ROW * 2} bytes from the ranks 0 1, but they send it "
                                         rf"{1 * ROW * 2} {6 * ROW * 2} \(their 'In split size'\)"):
        read_kineto(files)


def test_an_uneven_exchange_needs_every_ranks_file(tmp_path):
    files = [_rank_file(tmp_path, 0, [3, 1, 0], world=3), _rank_file(tmp_path, 1, [2, 2, 0], world=3)]
    with pytest.raises(TraceError, match=r"rank0.json: event 0 .*field 'Process Group Ranks': an uneven all-to-all "
                                         r"needs every rank's file, but ranks 2 of its group were not read"):
        read_kineto(files)


def test_simulate_says_how_many_uneven_exchanges_it_replays_as_even_ones(tmp_path, capsys):
    from gpusim.cli import main

    path = _rank_file(tmp_path, 1, [2, 6])
    assert main(["simulate", "--trace", str(path), "--system", "mi210-4", "--quiet"]) == 0
    assert "1 uneven all-to-alls replayed as even exchanges of this rank's total" in capsys.readouterr().out
