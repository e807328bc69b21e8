"""The trace schema: validation errors name the row and field; CSV/Parquet round trips; DAG semantics."""

import re

import networkx as nx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusim
from gpusim.cli import main
from gpusim.errors import TraceError
from gpusim.trace import Trace, read

ONE = gpusim.load_system("t3-table8.1")


def rows(*extra):
    base = [
        {"op_id": 1, "gpu": 0, "stream": "compute", "kind": "gemm", "m": 256, "n": 256, "k": 256, "name": "g"},
        {"op_id": 2, "gpu": 0, "stream": "compute", "kind": "elementwise", "function": "gelu", "elements": 65536},
        {"op_id": 3, "gpu": 0, "stream": "side", "kind": "delay", "delay_s": 1e-6, "deps": "1"},
    ]
    return pd.DataFrame(base + list(extra))


def test_a_valid_trace_is_normalised():
    trace = Trace(rows())
    frame = trace.frame
    assert list(frame.columns) == list(gpusim.trace.COLUMNS)
    assert frame["batch"].tolist() == [1, 1, 1] and frame["dtype"].tolist() == ["fp16"] * 3
    assert frame["layer"].tolist() == [-1, -1, -1]
    assert trace.gpus == [0]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_round_trip(tmp_path, suffix):
    trace = Trace(rows(), metadata={"model": "x"})
    path = trace.write(tmp_path / f"t{suffix}")
    again = read(path)
    pd.testing.assert_frame_equal(again.frame, trace.frame)
    if suffix == ".parquet":
        assert again.metadata == {"model": "x"}


def test_a_csv_separated_by_semicolons_says_so(tmp_path):
    path = tmp_path / "semicolons.csv"
    path.write_text("op_id;gpu;stream;kind\n1;0;compute;delay\n")
    with pytest.raises(TraceError, match=r"semicolons.csv: missing column 'op_id' \(every trace needs the columns "
                                         r"op_id, gpu, stream, kind\); the header is one column holding ';': separate "
                                         r"the columns with commas$"):
        read(path)


def test_a_number_column_of_deps_as_pandas_writes_it_is_read():
    """A deps column of whole numbers and blanks is float in pandas (1.0): read as op_id 1."""
    frame = rows().assign(deps=[None, None, 1.0])
    assert Trace(frame).frame["deps"].tolist() == Trace(rows()).frame["deps"].tolist()


def test_a_parquet_table_saved_with_op_id_as_its_index_is_read(tmp_path):
    path = tmp_path / "indexed.parquet"
    rows().set_index("op_id").to_parquet(path)
    assert read(path).frame.equals(Trace(rows()).frame)
    rows().set_index(pd.Index([7, 8, 9])).to_parquet(path)  # an unnamed index is no column
    assert read(path).frame.equals(Trace(rows()).frame)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda f: f.drop(columns="gpu"), r"missing column 'gpu'"),
        (lambda f: f.assign(frobs=1), r"unknown column 'frobs'"),
        (lambda f: f.assign(kind=["gemm", "conv", "delay"]), r"row 1 \(op_id 2, gpu 0\): field 'kind' must be one of"),
        (lambda f: f.assign(m=["abc", None, None]), r"row 0 \(op_id 1, gpu 0\): field 'm' must be a whole number, got 'abc'"),
        (lambda f: f.assign(m=[256.5, None, None]), r"row 0 .*field 'm' must be a whole number"),
        (lambda f: f.assign(m=[0, None, None]), r"row 0 .*field 'm' must be a positive whole number"),
        (lambda f: f.assign(deps=["", "", "7"]), r"row 2 \(op_id 3, gpu 0\): field 'deps' names op_id 7, which has no row"),
        (lambda f: f.assign(deps=["2", "", ""]), r"row 0 .*field 'deps' is part of a dependency cycle"),
        (lambda f: f.assign(op_id=[1, 1, 3]), r"row 1 .*field 'op_id' repeats"),
        (lambda f: f.assign(function=["", "frobnicate", ""]), r"row 1 .*field 'function' must be one of"),
        (lambda f: f.assign(dtype=["fp13", "fp16", "fp16"]), r"row 0 .*field 'dtype'"),
        (lambda f: f.assign(delay_s=[None, None, -1.0]), r"row 2 .*field 'delay_s'"),
        (lambda f: f.assign(delay_s=[None, None, float("inf")]), r"row 2 .*field 'delay_s' must be a finite number"),
        (lambda f: f.assign(measured_s=[float("inf"), None, None]), r"row 0 .*field 'measured_s' must be a finite"),
        (lambda f: f.assign(trans_a=["maybe", "", ""]), r"row 0 .*field 'trans_a' must be true or false"),
        (lambda f: f.assign(index_dims=[None, -1, None]), r"row 1 .*field 'index_dims' must be a whole number from 0 to 25"),
        (lambda f: f.assign(index_dims=[None, 26, None]), r"row 1 .*field 'index_dims' must be a whole number from 0 to 25"),
        (lambda f: f.assign(stream=["compute", "", "side"]), r"row 1 \(op_id 2, gpu 0\): field 'stream' must not be blank"),
        (lambda f: f.assign(stream=["compute", None, "side"]), r"row 1 .*field 'stream' must not be blank"),
        (lambda f: f.assign(deps=[None, None, 1.5]), r"row 2 .*field 'deps' must list op_ids, got '1.5'"),
        (lambda f: f.assign(kind=["gemm", "collective", "delay"], collective=["", "allreduce", ""],
                            bytes=[None, 1001, None], dtype=["fp16", "fp32", "fp16"]),
         r"row 1 \(op_id 2, gpu 0\): field 'bytes' must be a whole number of the row's fp32 elements \(4 bytes each\) "
         r"for a collective row, got 1001"),
    ],
)
def test_malformed_traces_name_row_and_field(change, pattern):
    with pytest.raises(TraceError, match=pattern):
        Trace(change(rows()))


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda f: f.assign(m=[-64, None, None]), r"row 0 \(op_id 1, gpu 0\): field 'm' .*, got -64$"),
        (lambda f: f.assign(m=[None, None, None]), r"row 0 \(op_id 1, gpu 0\): field 'm' .*, got blank$"),
        (lambda f: f.assign(delay_s=[None, None, -1.0]), r"row 2 \(op_id 3, gpu 0\): field 'delay_s' .*, got -1.0$"),
        (lambda f: f.assign(measured_s=[np.float64(-1.0), None, None]), r"field 'measured_s' .*, got -1.0$"),
        (lambda f: f.assign(m=pd.Series([np.float64(1.5), None, None], dtype=object)),
         r"field 'm' must be a whole number, got 1.5$"),
        (lambda f: f.assign(op_id=pd.Series([pd.NA, 2, 3], dtype="Int64")),
         r"row 0 \(op_id blank, gpu 0\): field 'op_id' must not be blank$"),
        (lambda f: f.assign(trans_a=pd.Series([np.int64(7), False, False], dtype=object)),
         r"field 'trans_a' must be true or false, got 7$"),
    ],
)
def test_messages_show_values_plainly_not_as_numpy_reprs(change, pattern):
    with pytest.raises(TraceError, match=pattern) as caught:
        Trace(change(rows()))
    assert not re.search(r"np\.|<NA>|nan", str(caught.value))


@pytest.mark.parametrize("column", ["delay_s", "measured_s", "issue_s"])
@pytest.mark.parametrize("value", ["1e300", "2e6"])
def test_times_beyond_max_seconds_are_rejected(tmp_path, column, value):
    row = {"op_id": "1", "gpu": "0", "stream": "s", "kind": "delay", "delay_s": "0", column: value}
    pd.DataFrame([row]).to_csv(tmp_path / "t.csv", index=False)
    message = f"t.csv: row 0 (op_id 1, gpu 0): field '{column}' must be a time of at most 1e+06 s, got {float(value)!r}"
    with pytest.raises(TraceError, match=re.escape(message)):
        read(tmp_path / "t.csv")


def test_a_delay_of_max_seconds_replays_to_finite_times():
    trace = Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "delay", "delay_s": 1e6}]))
    result = gpusim.run(ONE, trace)
    assert result.time_s == pytest.approx(1e6) and np.isfinite(result.ops[["start_s", "end_s"]].to_numpy()).all()


def test_collective_rows_must_agree_and_contain_their_gpu():
    collective = {"kind": "collective", "collective": "allreduce", "bytes": 1024, "group": "0 1", "stream": "comm"}
    good = [{"op_id": 9, "gpu": 0, **collective}, {"op_id": 9, "gpu": 1, **collective}]
    Trace(pd.DataFrame(good))
    with pytest.raises(TraceError, match=r"row 1 .*field 'bytes' differs from the other rows"):
        Trace(pd.DataFrame([good[0], {**good[1], "bytes": 2048}]))
    with pytest.raises(TraceError, match=r"field 'group' does not contain the row's own gpu 2"):
        Trace(pd.DataFrame([good[0], {**good[1], "gpu": 2}]))
    with pytest.raises(TraceError, match=r"field 'group' must be 'src dst'"):
        Trace(pd.DataFrame([{"op_id": 1, "gpu": 0, "stream": "s", "kind": "sendrecv", "bytes": 8, "group": "0 1 2"}]))


def test_a_cycle_through_stream_order_and_a_collective_is_found():
    # GPU 0 runs A then the all-reduce; GPU 1 runs the all-reduce after B, and B depends on... nothing
    # on GPU 0, but GPU 1's stream puts B after the all-reduce while the all-reduce depends on B.
    ar = {"kind": "collective", "collective": "allreduce", "bytes": 1024, "group": "0 1", "stream": "s"}
    frame = pd.DataFrame([
        {"op_id": 5, "gpu": 1, **ar, "deps": "6"},
        {"op_id": 6, "gpu": 1, "stream": "s", "kind": "delay", "delay_s": 0.0},
        {"op_id": 5, "gpu": 0, **ar},
    ])  # fmt: skip
    with pytest.raises(TraceError, match="dependency cycle"):
        Trace(frame)


def test_reading_a_malformed_file_names_the_file_and_row(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("op_id,gpu,stream,kind,m,n,k\n1,0,s,gemm,8,8,8\n2,0,s,gemm,8,eight,8\n")
    with pytest.raises(TraceError, match=r"bad.csv: row 1 \(op_id 2, gpu 0\): field 'n'"):
        read(path)
    with pytest.raises(TraceError, match="unknown trace format"):
        read(tmp_path / "bad.txt")
    with pytest.raises(TraceError, match="no such trace file"):
        read(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("op_id,gpu,stream,kind,delay_s\n99999999999999999999,0,s,delay,0\n",
         r"row 0 .*field 'op_id' must be a whole number below 2\*\*63 in magnitude, got '99999999999999999999'"),
        ("op_id,gpu,stream,kind,m,n,k\n1,0,s,gemm,inf,8,8\n",
         r"row 0 \(op_id 1, gpu 0\): field 'm' must be a whole number, got 'inf'"),
        ("op_id,gpu,stream,kind,delay_s,deps\n1,0,s,delay,0,,extra\n",
         r"the first data line has more fields than the header's 6 column names"),
    ],
)
def test_csv_values_that_do_not_fit_name_the_file_and_field(tmp_path, text, pattern):
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(TraceError, match=rf"t.csv: {pattern}"):
        read(tmp_path / "t.csv")


@pytest.mark.parametrize("damage", [
    lambda raw: b"garbage",  # not gzip at all
    lambda raw: raw[: len(raw) // 2],  # cut short
    lambda raw: raw[:12] + bytes(len(raw) - 12),  # the header is intact, the compressed data is not
])
def test_a_corrupt_gzipped_csv_names_the_file(tmp_path, damage):
    path = Trace(rows()).write(tmp_path / "t.csv.gz")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(TraceError, match=r"t.csv.gz: not a readable CSV table: "):
        read(path)


@pytest.mark.parametrize(("raw", "pattern"), [(b"{bad json", "is not valid JSON"),
                                              (b"[1,2]", "must be a JSON object, got list")])
def test_corrupt_parquet_metadata_names_the_file(tmp_path, raw, pattern):
    table = pa.Table.from_pandas(Trace(rows()).frame, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({b"gpusim.trace": raw}), tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=rf"t.parquet: the 'gpusim.trace' metadata {pattern}"):
        read(tmp_path / "t.parquet")


def test_a_failed_write_names_the_path_and_leaves_nothing_behind(tmp_path):
    trace = Trace(rows())
    (tmp_path / "folder.parquet").mkdir()
    (tmp_path / "file").write_text("x")
    for target in (tmp_path / "folder.parquet", tmp_path / "file" / "t.csv"):
        with pytest.raises(TraceError, match=rf"{re.escape(str(target))}: cannot write the trace file"):
            trace.write(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "folder.parquet"]


def test_parquet_keeps_int_metadata_keys(tmp_path):
    metadata = {"measured_span_s": {0: 1.5, 3: 2.0}, "text_keys": {"0": 1}, "nested": [{1: "a"}]}
    assert read(Trace(rows(), metadata=metadata).write(tmp_path / "t.parquet")).metadata == metadata


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_text_none_and_nan_are_kept(tmp_path, suffix):
    trace = Trace(rows().assign(stream=["None", "nan", "side"], name=["None", None, "nan"]))
    assert trace.frame["stream"].tolist() == ["None", "nan", "side"]
    assert trace.frame["name"].tolist() == ["None", "", "nan"]
    pd.testing.assert_frame_equal(read(trace.write(tmp_path / f"t{suffix}")).frame, trace.frame)


def test_replay_keeps_trace_ids_names_and_measured_durations():
    frame = rows()
    frame["measured_s"] = [2e-5, None, None]
    result = gpusim.run(ONE, Trace(frame))
    ops = result.ops.set_index("op_id")
    assert ops.loc[1, "name"] == "g" and ops.loc[1, "kind"] == "gemm"
    assert ops.loc[1, "measured_s"] == 2e-5 and pd.isna(ops.loc[2, "measured_s"])
    assert ops.loc[3, "start_s"] == pytest.approx(ops.loc[1, "end_s"])  # waits for its dependency only
    assert ops.loc[2, "start_s"] == pytest.approx(ops.loc[1, "end_s"])  # stream order
    assert ops.loc[3, "start_s"] < ops.loc[2, "end_s"]  # the side stream overlaps the compute stream


@st.composite
def delay_dags(draw):
    """Random traces of delays on a few streams with random backward dependencies."""
    count = draw(st.integers(1, 14))
    streams = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=count, max_size=count))
    durations = draw(st.lists(st.integers(0, 50), min_size=count, max_size=count))
    table = []
    for index in range(count):
        deps = draw(st.lists(st.integers(0, index - 1), max_size=2, unique=True)) if index else []
        table.append({"op_id": index + 1, "gpu": 0, "stream": streams[index], "kind": "delay",
                      "delay_s": durations[index] * 1e-6, "deps": " ".join(str(d + 1) for d in deps)})
    return pd.DataFrame(table)


@settings(max_examples=15, deadline=None)
@given(delay_dags())
def test_replayed_delays_take_the_critical_path(frame):
    """Invariant: a DAG of fixed delays ends after its longest path (dependencies plus stream order)."""
    graph = nx.DiGraph()
    last: dict[str, int] = {}
    for row in frame.itertuples():
        graph.add_node(row.op_id, weight=row.delay_s)
        if row.stream in last:
            graph.add_edge(last[row.stream], row.op_id)
        last[row.stream] = row.op_id
        for dep in filter(None, row.deps.split()):
            graph.add_edge(int(dep), row.op_id)
    finish: dict[int, float] = {}
    for node in nx.topological_sort(graph):
        start = max((finish[p] for p in graph.predecessors(node)), default=0.0)
        finish[node] = start + graph.nodes[node]["weight"]
    result = gpusim.run(ONE, Trace(frame))
    ends = result.ops.set_index("op_id")["end_s"]
    for node, end in finish.items():
        assert ends[node] == pytest.approx(end, abs=1e-12)


def test_parquet_writes_numpy_scalars_in_metadata_as_numbers(tmp_path):
    metadata = {"n": np.int64(3), "span": np.float32(0.5), "flag": np.bool_(True), "by_gpu": {np.int64(1): 2.0}}
    again = read(Trace(rows(), metadata=metadata).write(tmp_path / "t.parquet")).metadata
    assert again == {"n": 3, "span": 0.5, "flag": True, "by_gpu": {1: 2.0}}
    assert type(again["n"]) is int and type(again["flag"]) is bool


@pytest.mark.parametrize(("metadata", "where"), [
    ({"gpus": {0, 1}}, r"metadata\['gpus'\]: metadata of type set"),
    ({("a", "b"): 1}, r"metadata\[\('a', 'b'\)\]: a metadata key must be text or an integer, got tuple"),
    ({"model": {"layers": [1, object()]}}, r"metadata\['model'\]\['layers'\]\[1\]: metadata of type object"),
    ({"mixed": {1: "a", "b": 2}}, r"metadata\['mixed'\]: a metadata mapping's keys must be all text or all integers"),
])  # fmt: skip
def test_metadata_json_cannot_hold_names_its_key_and_writes_nothing(tmp_path, metadata, where):
    trace = Trace(rows(), metadata=metadata)
    (tmp_path / "old.parquet").write_text("kept")
    for target in (tmp_path / "new" / "t.parquet", tmp_path / "old.parquet"):
        with pytest.raises(TraceError, match=rf"{re.escape(str(target))}: {where}"):
            trace.write(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["old.parquet"]
    assert (tmp_path / "old.parquet").read_text() == "kept"


@pytest.mark.parametrize(
    ("header", "values", "message"),
    [
        ("op_id,gpu,stream,kind,m,n,k,m", "1,0,s,gemm,8,8,8,8", "column 'm' appears 2 times; give each column once"),
        ("op_id,gpu,stream,kind,delay_s,", "1,0,s,delay,0,",
         "column 6 has no name; give it a trace column's name or remove it"),
    ],
)
def test_a_repeated_or_unnamed_column_is_named_in_every_format(tmp_path, header, values, message):
    """pandas renamed a CSV's repeated 'm' to 'm.1' and a blank name to 'Unnamed: 5' (reported as unknown
    columns), pyarrow refused a repeated Parquet column with its schema dump, and a DataFrame's crashed."""
    (tmp_path / "t.csv").write_text(f"{header}\n{values}\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(tmp_path / 't.csv'))}: {re.escape(message)}$"):
        read(tmp_path / "t.csv")
    names = header.split(",")
    frame = pd.DataFrame([values.split(",")], columns=names)
    with pytest.raises(TraceError, match=rf"^trace: {re.escape(message)}$"):
        Trace(frame)
    pq.write_table(pa.Table.from_arrays([pa.array([value]) for value in values.split(",")], names=names),
                   tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(tmp_path / 't.parquet'))}: {re.escape(message)}$"):
        read(tmp_path / "t.parquet")


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda f: f.assign(m=[True, None, None]), r"row 0 \(op_id 1, gpu 0\): field 'm' must be a whole number, got True$"),
        (lambda f: f.assign(op_id=[1, np.bool_(True), 3]), r"row 1 .*field 'op_id' must be a whole number, got True$"),
        (lambda f: f.assign(delay_s=pd.Series([None, None, True], dtype="boolean")),
         r"row 2 .*field 'delay_s' must be a finite number, got True$"),
        (lambda f: f.assign(delay_s=[None, None, pd.Timedelta(1, "ms")]),
         r"row 2 .*field 'delay_s' must be a finite number, got Timedelta\('0 days 00:00:00.001000'\)$"),
        (lambda f: f.assign(measured_s=[pd.Timestamp(0), None, None]),
         r"row 0 .*field 'measured_s' must be a finite number, got Timestamp\('1970-01-01 00:00:00'\)$"),
    ],
)
def test_booleans_dates_and_durations_are_not_numbers(change, pattern):
    """pandas reads True as 1 and a date or a duration as nanoseconds: a Parquet file's boolean 'm' made a
    GEMM of one row, and its timestamp 'delay_s' a delay of 1e9 s as nanoseconds since 1970."""
    with pytest.raises(TraceError, match=pattern):
        Trace(change(rows()))


def test_a_parquet_files_boolean_size_is_refused_by_the_command(tmp_path, capsys):
    table = pa.table({"op_id": [1], "gpu": [0], "stream": ["s"], "kind": ["gemm"], "m": [True], "n": [64], "k": [64]})
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "out"
    status = main(["simulate", "--trace", str(tmp_path / "t.parquet"), "--system", "t3-ring8", "--quiet",
                   "--out", str(out)])
    assert status == 2 and not out.exists()
    assert capsys.readouterr().err == (f"gpusim: error: {tmp_path / 't.parquet'}: row 0 (op_id 1, gpu 0): "
                                       "field 'm' must be a whole number, got True\n")


@pytest.mark.parametrize("metadata", [5, "gpt3", [("model", "gpt3")]])
def test_metadata_that_is_not_a_mapping_is_a_trace_error(metadata):
    """It was a TypeError ('int' object is not iterable) or, for a list of pairs, taken as a dict."""
    with pytest.raises(TraceError, match=rf"^trace: metadata must be a mapping of facts about the trace "
                                         rf"\(e\.g\. \{{'model': 'gpt3'\}}\) or None, got {type(metadata).__name__}$"):
        Trace(rows(), metadata=metadata)


def test_a_folder_named_like_a_trace_file_is_called_a_folder(tmp_path):
    """It was 'no such trace file', though the path exists (a Parquet dataset folder, say)."""
    folder = tmp_path / "t.parquet"
    folder.mkdir()
    with pytest.raises(TraceError, match=rf"^{re.escape(str(folder))}: is a folder, not a trace file$"):
        read(folder)
