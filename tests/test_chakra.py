"""The Chakra importer: protobuf decoding, every collective on 4 and 8 ranks, synthetic node kinds."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpusim
from gpusim.errors import ConfigError, TraceError
from gpusim.trace import protobuf as pb
from gpusim.trace import read_chakra
from gpusim.trace.chakra import read_et
from tests.conftest import shared_data


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value) -> bytes:
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    if isinstance(value, str):
        return field(number, value.encode())
    return varint(number << 3) + varint(value)


def attribute(name: str, **value) -> bytes:
    (kind, raw), = value.items()
    numbers = {"int64": 9, "uint64": 13, "bool": 27, "string": 29, "sint64": 17}
    payload = raw if kind != "sint64" else (raw << 1) ^ (raw >> 63)
    return field(1, name) + field(numbers[kind], payload)


def node(node_id: int, name: str, node_type: int, deps=(), attrs=(), shapes: str = "", duration: int = 0) -> bytes:
    body = field(1, node_id) + field(2, name) + field(3, node_type)
    if deps:
        body += field(5, b"".join(varint(d) for d in deps))  # packed data_deps
    if duration:
        body += field(7, duration)
    if shapes:
        body += field(8, field(2, shapes) + field(3, '["c10::Half","c10::Half"]'))
    for attr in attrs:
        body += field(10, attr)
    return body


def et_file(path, nodes) -> None:
    messages = [field(1, "0.0.4")] + list(nodes)
    path.write_bytes(b"".join(varint(len(m)) + m for m in messages))


@given(st.integers(0, 2**63 - 1))
def test_varints_round_trip(value):
    assert pb.read_varint(varint(value), 0) == (value, len(varint(value)))


def test_field_decoding():
    data = field(1, 300) + field(2, "hi") + varint(3 << 3 | 1) + struct.pack("<d", 2.5)
    decoded = list(pb.fields(data))
    assert decoded[0] == (1, 0, 300) and decoded[1] == (2, 2, b"hi")
    assert pb.double(decoded[2][2]) == 2.5
    assert pb.zigzag(3) == -2 and pb.signed64(2**64 - 1) == -1
    assert pb.packed_varints(varint(1) + varint(300), pb.LENGTH_DELIMITED) == [1, 300]
    with pytest.raises(pb.ProtobufError, match="claims 10 bytes"):
        list(pb.fields(varint(2 << 3 | 2) + varint(10) + b"x"))


def test_decoding_a_shared_trace_file():
    metadata, nodes = read_et(shared_data("traces/chakra/all_reduce_4npus_1MB/all_reduce.2.et"))
    assert metadata == {"version": "0.0.4"}
    (only,) = nodes
    assert only.type_name == "COMM_COLL_NODE" and only.id == 2
    assert only.attrs == {"is_cpu_op": False, "comm_type": 0, "comm_size": 1048576}


COLLECTIVES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
               "all_to_all": "alltoall"}


@pytest.mark.parametrize("ranks", [4, 8])
@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_every_shared_collective_imports_and_replays(name, ranks):
    folder = shared_data(f"traces/chakra/{name}_{ranks}npus_1MB")
    trace = read_chakra(folder)
    frame = trace.frame
    assert trace.gpus == list(range(ranks)) and frame["op_id"].nunique() == 1
    assert set(frame["collective"]) == {COLLECTIVES[name]} and set(frame["bytes"]) == {2**20}
    system = gpusim.load_system("t3-ring8", {"num_gpus": ranks})
    result = gpusim.run(system, trace, mode="full")
    assert set(result.ops["gpu"]) == set(range(ranks))
    if name == "all_reduce":  # never faster than the ring bound 2 (n-1)/n S / B
        bound = 2 * (ranks - 1) / ranks * 2**20 / system.config.links.bandwidth_bytes_per_s
        assert result.time_s >= bound


def test_synthetic_nodes_map_onto_ops(tmp_path):
    rank0 = [
        node(10, "meta", 1),
        node(11, "aten::mm", 4, deps=[10], shapes="[[256,512],[512,128]]", duration=40),
        node(12, "send", 5, deps=[11], attrs=[attribute("comm_dst", int64=1), attribute("comm_size", int64=4096),
                                              attribute("comm_tag", int64=7)]),
        node(13, "ar", 7, deps=[11], attrs=[attribute("comm_type", int64=0), attribute("comm_size", uint64=8192)]),
    ]
    rank1 = [
        node(20, "recv", 6, attrs=[attribute("comm_src", int64=0), attribute("comm_size", int64=4096),
                                   attribute("comm_tag", int64=7)]),
        node(21, "ar", 7, deps=[20], attrs=[attribute("comm_type", int64=0), attribute("comm_size", uint64=8192)]),
    ]
    et_file(tmp_path / "job.0.et", rank0)
    et_file(tmp_path / "job.1.et", rank1)
    trace = read_chakra(tmp_path)
    frame = trace.frame.set_index(["gpu", "name"])
    gemm = frame.loc[(0, "aten::mm")]
    assert (gemm["m"], gemm["n"], gemm["k"], gemm["dtype"]) == (256, 128, 512, "fp16")
    assert gemm["measured_s"] == pytest.approx(40e-6)
    send, recv = frame.loc[(0, "send")], frame.loc[(1, "recv")]
    assert send["op_id"] == recv["op_id"] and send["group"] == "0 1" and send["bytes"] == 4096
    assert frame.loc[(0, "ar"), "op_id"] == frame.loc[(1, "ar"), "op_id"]
    assert frame.loc[(0, "ar"), "deps"] == str(gemm["op_id"])
    result = gpusim.run(gpusim.load_system("t3-ring8"), trace, mode="full")
    assert len(result.ops) == 6

    et_file(tmp_path / "job.0.et", [node(1, "load", 2, duration=5)])
    et_file(tmp_path / "job.1.et", [node(1, "conv", 4, duration=5)])
    with pytest.raises(TraceError, match=r"job.0.et: node 1 \('load'\): field 'type': cannot be modelled"):
        read_chakra(tmp_path)
    delayed = read_chakra(tmp_path, unsupported="delay").frame
    assert delayed["delay_s"].tolist() == pytest.approx([5e-6, 5e-6])


def test_broken_files_are_reported(tmp_path):
    (tmp_path / "x.0.et").write_bytes(varint(50) + b"short")
    with pytest.raises(TraceError, match="x.0.et: not a Chakra execution trace"):
        read_chakra(tmp_path / "x.0.et")
    with pytest.raises(TraceError, match="no .et files"):
        read_chakra(tmp_path / "nothing-*.et")


def test_wrong_wire_types_name_the_node_message_and_field(tmp_path):
    et_file(tmp_path / "x.0.et", [field(1, 1) + field(2, 5) + field(3, 4)])  # name as a varint
    with pytest.raises(TraceError, match=r"x.0.et: .*Node message 1: field 2 \('name'\) is varint-encoded, "
                                         r"expected length-delimited"):
        read_chakra(tmp_path / "x.0.et")
    et_file(tmp_path / "x.0.et", [node(1, "ar", 7, attrs=[field(1, 3) + field(9, 0)])])  # attribute name as a varint
    with pytest.raises(TraceError, match=r"Node message 1: field 1 \('attr.name'\) is varint-encoded"):
        read_chakra(tmp_path / "x.0.et")


def test_duplicate_ids_and_files_without_nodes_are_reported(tmp_path):
    et_file(tmp_path / "x.0.et", [node(1, "a", 1), node(1, "b", 1)])
    with pytest.raises(TraceError, match=r"x.0.et: node 1 \('b'\): field 'id': another node of the file has the same"):
        read_chakra(tmp_path / "x.0.et")
    et_file(tmp_path / "x.0.et", [])
    with pytest.raises(TraceError, match=r"x.0.et: the Chakra trace has no nodes"):
        read_chakra(tmp_path / "x.0.et")


def test_one_ranks_file_cannot_model_its_collectives(tmp_path):
    all_reduce = node(5, "ar", 7, duration=3,
                      attrs=[attribute("comm_type", int64=0), attribute("comm_size", int64=1024)])
    et_file(tmp_path / "job.2.et", [all_reduce])
    with pytest.raises(TraceError, match=r"job.2.et: node 5 \('ar'\): .*only one rank's file was given"):
        read_chakra(tmp_path / "job.2.et")
    trace = read_chakra(tmp_path / "job.2.et", unsupported="delay")
    assert trace.frame["kind"].tolist() == ["delay"] and trace.frame["delay_s"].tolist() == [pytest.approx(3e-6)]
    assert "only one rank's file" in trace.metadata["not_modelled"][0]["reason"]


@pytest.mark.parametrize(("kept", "missing"), [((0, 1, 3), "2"), ((2, 3), "0, 1")])
def test_files_with_ranks_missing_cannot_model_their_collectives(tmp_path, kept, missing):
    """A job's collective spans all its ranks: read with a rank's file missing, it would silently run
    over the others."""
    for rank in kept:
        et_file(tmp_path / f"job.{rank}.et", [_all_reduce(rank + 1)])
    with pytest.raises(TraceError, match=rf"node {kept[0] + 1} \('ar'\): .*the files read are ranks "
                                         rf"{', '.join(map(str, kept))}, without {missing} \(read the files"):
        read_chakra(tmp_path)
    trace = read_chakra(tmp_path, unsupported="delay")
    assert set(trace.frame["kind"]) == {"delay"} and len(trace.metadata["not_modelled"]) == len(kept)


@pytest.mark.parametrize(("number", "name"), [(4, "ctrl_deps"), (5, "data_deps")])
def test_a_dependency_on_a_node_not_in_the_file_names_both(tmp_path, number, name):
    mm = node(3, "aten::mm", 4, shapes="[[64,32],[32,16]]") + field(number, varint(1) + varint(77))
    et_file(tmp_path / "x.0.et", [node(1, "meta", 1), mm])
    with pytest.raises(TraceError, match=rf"x.0.et: node 3 \('aten::mm'\): field '{name}' names node 77, which is "
                                         r"not in the file$"):
        read_chakra(tmp_path / "x.0.et")
    et_file(tmp_path / "x.0.et", [node(1, "meta", 1), node(3, "aten::mm", 4, shapes="[[64,32],[32,16]]")
                                  + field(number, varint(1))])
    frame = read_chakra(tmp_path / "x.0.et").frame.set_index("name")
    assert frame.loc["aten::mm", "deps"] == str(frame.loc["meta", "op_id"])


def test_a_file_read_alone_is_rank_0_whatever_its_name(tmp_path):
    et_file(tmp_path / "w.3.et", [node(1, "aten::mm", 4, shapes="[[64,32],[32,16]]")])
    trace = read_chakra(tmp_path / "w.3.et")
    assert trace.gpus == [0]
    result = gpusim.run(gpusim.load_system("h100-sxm5"), trace)  # a one-GPU preset
    assert result.ops["gpu"].tolist() == [0]
    et_file(tmp_path / "w.5.et", [node(1, "aten::mm", 4, shapes="[[64,32],[32,16]]")])
    assert read_chakra(tmp_path).gpus == [3, 5]  # several files keep the ranks in their names


def test_ranks_are_the_numbers_that_end_the_names_and_each_is_one_files(tmp_path):
    """rank_10.et is rank 10, not the third file in name order; two files of one rank are an error."""
    for rank in (0, 1, 2, 10, 11):
        et_file(tmp_path / f"rank_{rank}.et", [node(1, "aten::mm", 4, shapes="[[64,32],[32,16]]")])
    assert read_chakra(tmp_path).gpus == [0, 1, 2, 10, 11]
    et_file(tmp_path / "copy_of_rank_1.et", [node(1, "aten::mm", 4, shapes="[[64,32],[32,16]]")])
    with pytest.raises(TraceError, match=r"rank_1.et: its name gives rank 1, as the name of .*copy_of_rank_1.et does"):
        read_chakra(tmp_path)


def _all_reduce(node_id: int, size: int = 1024, comm_type: int = 0) -> bytes:
    return node(node_id, "ar", 7, attrs=[attribute("comm_type", int64=comm_type), attribute("comm_size", int64=size)])


def test_ranks_whose_collectives_disagree_name_the_files_and_nodes(tmp_path):
    et_file(tmp_path / "job.0.et", [_all_reduce(4)])
    et_file(tmp_path / "job.1.et", [_all_reduce(9, comm_type=2)])  # ALL_GATHER
    with pytest.raises(TraceError, match=r"job.1.et: node 9 \('ar'\): field 'comm_type': this rank's collective 1 is "
                                         r"ALL_GATHER, but collective 1 of .*job.0.et \(node 4, 'ar'\) is ALL_REDUCE"):
        read_chakra(tmp_path)
    et_file(tmp_path / "job.1.et", [_all_reduce(9, size=2048)])
    with pytest.raises(TraceError, match=r"job.1.et: node 9 \('ar'\): field 'comm_size': this rank's collective 1 has "
                                         r"2048 bytes, but collective 1 of .*job.0.et \(node 4, 'ar'\) has 1024"):
        read_chakra(tmp_path)
    et_file(tmp_path / "job.0.et", [_all_reduce(4, comm_type=6)])  # ALL_TO_ALL
    et_file(tmp_path / "job.1.et", [_all_reduce(9, size=2048, comm_type=6)])
    with pytest.raises(TraceError, match=r"has 1024; every rank runs the same collectives, of the same sizes, in the "
                                         r"same order; an uneven all-to-all \(all-to-allv\) cannot be modelled from "
                                         r"Chakra nodes, which record no split sizes"):
        read_chakra(tmp_path)
    et_file(tmp_path / "job.0.et", [_all_reduce(4)])
    et_file(tmp_path / "job.1.et", [_all_reduce(9), node(10, "ar2", 7, deps=[9], attrs=[
        attribute("comm_type", int64=0), attribute("comm_size", int64=1024)])])
    with pytest.raises(TraceError, match=r"the ranks run different numbers of modelled collectives \(COMM_COLL_NODE "
                                         r"nodes\): job.0.et 1, job.1.et 2"):
        read_chakra(tmp_path)


def test_negative_shapes_and_huge_durations_name_the_node_and_field(tmp_path):
    et_file(tmp_path / "x.0.et", [node(2, "aten::mm", 4, shapes="[[64,-32],[-32,16]]")])
    with pytest.raises(TraceError, match=r"x.0.et: node 2 \('aten::mm'\): field 'inputs.shapes' must list sizes >= 0, "
                                         r"got \[\[64,-32\],\[-32,16\]\]$"):
        read_chakra(tmp_path / "x.0.et")
    et_file(tmp_path / "x.0.et", [node(2, "aten::relu", 4, duration=10**15)])
    with pytest.raises(TraceError, match=r"x.0.et: node 2 \('aten::relu'\): field 'duration_micros' must be at most "
                                         r"1e\+12 us, got 1000000000000000$"):
        read_chakra(tmp_path / "x.0.et", unsupported="delay")
    et_file(tmp_path / "x.0.et", [node(2, "aten::mm", 4, shapes="[[64,0],[0,16]]", duration=7)])
    with pytest.raises(TraceError, match=r"cannot be modelled: a matrix product of empty matrices"):
        read_chakra(tmp_path / "x.0.et")
    assert read_chakra(tmp_path / "x.0.et", unsupported="delay").frame["kind"].tolist() == ["delay"]


def test_an_unknown_unsupported_option_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^read_chakra\(\): unsupported must be 'error' or 'delay', got 'skip'$"):
        read_chakra(tmp_path / "any.et", unsupported="skip")


@pytest.mark.parametrize(("size", "dtype"), [(1024, "fp16"), (1001, "int8")])
def test_a_collective_of_an_odd_size_moves_bytes(tmp_path, size, dtype):
    """The file records no element type; a collective moves whole elements, so an odd size is one of
    bytes rather than an error."""
    for rank in (0, 1):
        et_file(tmp_path / f"job.{rank}.et", [_all_reduce(1, size=size)])
    frame = read_chakra(tmp_path).frame
    assert frame["dtype"].tolist() == [dtype, dtype] and frame["bytes"].tolist() == [size, size]
