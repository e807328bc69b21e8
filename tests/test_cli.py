"""The gpusim command."""

import re

import pandas as pd
import pytest

from gpusim import validation
from gpusim.cli import main, parse_op
from gpusim.errors import ConfigError, GpusimError


def test_list(capsys):
    assert main(["list"]) == 0
    assert "t3-ring8" in capsys.readouterr().out


def test_show_config(capsys):
    assert main(["show-config", "t3-table8.1", "--set", "gpu.num_cus=160"]) == 0
    out = capsys.readouterr().out
    assert "num_cus: 160" in out and "TFLOP/s" in out


def test_run_writes_outputs(tmp_path, capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--quiet", "--out", str(tmp_path),
                 "--op", "gemm m=512 n=512 k=512 dtype=fp16", "--op", "allreduce nbytes=1MiB"])
    assert code == 0
    assert "allreduce" in capsys.readouterr().out
    for name in ("ops.csv", "summary.csv", "timeline.png", "timeline.perfetto.json"):
        assert (tmp_path / name).exists()


def test_run_fused_gemm_reduce_scatter_with_t3_mca(capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--policy", "t3-mca", "--quiet",
                 "--op", "gemm_rs m=1024 n=1024 k=512 dtype=fp16"])
    assert code == 0
    assert "t3_ring_rs" in capsys.readouterr().out


def test_unknown_preset_is_reported(capsys):
    assert main(["show-config", "nope"]) == 2
    assert "known presets" in capsys.readouterr().err


def test_parse_op():
    op = parse_op("gemm m=8192 n=4096 k=1024 dtype=bf16 trans_a=1")
    assert (op.m, op.n, op.k, op.dtype, op.trans_a) == (8192, 4096, 1024, "bf16", True)
    assert parse_op("allreduce nbytes=64MiB").nbytes == 64 * 2**20
    assert parse_op("softmax rows=4 cols=8").kind == "softmax"
    with pytest.raises(GpusimError, match="must start with"):
        parse_op("conv2d x=1")
    with pytest.raises(GpusimError, match="field 'm' expects a whole number"):
        parse_op("gemm m=big n=1 k=1")


@pytest.mark.parametrize(("spec", "message"), [
    ("gemm m=8 n=8", "missing field 'k'; gemm takes .*m, n, k"),
    ("gemm m=8 n=8 k=8 colour=red", "unknown field 'colour'; gemm takes"),
    ("gemm m=8 n=8 k=8 trans_a=maybe", "field 'trans_a' expects true or false, got 'maybe'"),
    ("allreduce nbytes=1MiB ranks=a,b", "field 'ranks' expects GPU indices"),
    ("allreduce nbytes=1.5", r"field 'nbytes' expects a whole number of bytes, e.g. 4096 or 1.5MiB, got '1.5'"),
    ("allreduce nbytes=nan", "field 'nbytes' expects a whole number of bytes"),
    ("gemm m=nan n=8 k=8", "field 'm' expects a whole number, got 'nan'"),
    ("gemm m=inf n=8 k=8", "field 'm' expects a whole number, got 'inf'"),
    ("gemm m=8 n=8 k=128 k=256", "field 'k' is given more than once"),
    ("allreduce size=1KiB nbytes=2KiB", "field 'nbytes' is given more than once"),
    ("layernorm rows=4 cols=4 kind=softmax", "layernorm is the row reduction of kind 'layernorm', but kind='softmax'"),
    ("gemm m=8 n=8 k=8 kernel=MT999", "Gemm: field 'kernel': unknown GEMM kernel 'MT999'"),
    ("gemm_rs m=8 n=8 k=8 stagger=sometimes", "field 'stagger' expects true or false"),
    ("elementwise kind=relu elements=8 inputs=x,y", "field 'inputs' names 2 tensors, but 'relu' reads 1"),
])
def test_parse_op_names_the_bad_field(spec, message):
    with pytest.raises(GpusimError, match=message):
        parse_op(spec)


def test_parse_op_sizes_lists_and_row_reductions():
    assert parse_op("allreduce nbytes=1.5MiB").nbytes == 3 * 2**19
    assert parse_op("allreduce nbytes=1e3").nbytes == 1000
    assert parse_op("layernorm rows=4 cols=4 kind=layernorm").kind == "layernorm"
    assert parse_op("rowreduce kind=sum rows=4 cols=4").kind == "sum"
    assert parse_op("gemm_rs m=8 n=8 k=8 stagger=false").stagger is False
    assert parse_op("elementwise kind=add elements=8 inputs=x,y").inputs == ("x", "y")


@pytest.mark.parametrize(("extra", "message"), [
    (["--op", "gemm m=128 n=128 k=128 ranks=0,9"],
     r"gemm 128x128x128 fp16: rank 9 does not exist; t3-ring8 has ranks 0\.\.7"),
    (["--op", "gemm m=128 n=128 k=128 kernel=MT999"], "unknown GEMM kernel 'MT999'"),
    (["--op", "alltoall nbytes=1MiB algorithm=ring"], "AllToAll: field 'algorithm' must be one of direct, auto"),
    (["--mode", "symmetric", "--op", "gemm m=128 n=128 k=128 ranks=3"], "symmetric mode simulates rank 0 only"),
])
def test_run_reports_bad_ops_without_a_traceback(extra, message, capsys):
    assert main(["run", "--system", "t3-ring8", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: ") and "Traceback" not in err
    assert re.search(message, err)


def test_run_rejects_an_unknown_policy(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--system", "t3-ring8", "--policy", "bogus", "--op", "gemm m=8 n=8 k=8"])
    assert exit_info.value.code == 2
    assert "argument --policy: invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("points", ["0", "-2", "many"])
def test_validate_needs_a_positive_number_of_points(points, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--points", points])
    assert exit_info.value.code == 2
    assert f"argument --points: expected a positive integer, got '{points}'" in capsys.readouterr().err


@pytest.mark.parametrize("count", [0, -2, 1.5, True])
def test_validation_sample_needs_a_positive_count(count):
    with pytest.raises(ConfigError, match="points: expected a positive number of rows"):
        validation.sample(pd.DataFrame({"x": range(5)}), count)


def test_a_reader_that_stops_early_gets_no_traceback():
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # like ``| head`` that has already exited
    writer = subprocess.run([sys.executable, "-m", "gpusim.cli", "show-config", "dgx-a100"], stdout=write_end,
                            stderr=subprocess.PIPE, text=True, check=False)
    os.close(write_end)
    assert writer.returncode == 1 and "Traceback" not in writer.stderr and "BrokenPipe" not in writer.stderr
