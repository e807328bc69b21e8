"""The gpusim command."""

import pytest

from gpusim.cli import main, parse_op
from gpusim.errors import GpusimError


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
    with pytest.raises(GpusimError, match="field 'm' expects a number"):
        parse_op("gemm m=big n=1 k=1")


@pytest.mark.parametrize(("spec", "message"), [
    ("gemm m=8 n=8", "missing field 'k'; gemm takes .*m, n, k"),
    ("gemm m=8 n=8 k=8 colour=red", "unknown field 'colour'; gemm takes"),
    ("gemm m=8 n=8 k=8 trans_a=maybe", "field 'trans_a' expects true or false, got 'maybe'"),
    ("allreduce nbytes=1MiB ranks=a,b", "field 'ranks' expects GPU indices"),
])
def test_parse_op_names_the_bad_field(spec, message):
    with pytest.raises(GpusimError, match=message):
        parse_op(spec)
