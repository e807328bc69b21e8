"""The gpusim command."""

import re

import pandas as pd
import pytest

import gpusim
from gpusim import validation
from gpusim.cli import main, parse_op, split_stream
from gpusim.errors import ConfigError, GpusimError, OpError


def test_list(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["GPUs", "Nodes", "Models", "Data sets"]
    assert "t3-ring8" in lines[1] and "llama2-70b" in lines[2] and "gemm-h200" in lines[3]


def test_show_config(capsys):
    assert main(["show-config", "t3-table8.1", "--set", "gpu.num_cus=160"]) == 0
    out = capsys.readouterr().out
    assert "num_cus: 160" in out and "TFLOP/s" in out
    assert out.startswith("# t3-table8.1 with --set gpu.num_cus=160 (its name and description below are the preset's)")


def test_set_values_are_read_as_their_fields_are_typed(capsys):
    assert main(["show-config", "dgx-a100", "--set", "gpu.name=007", "--set", "gpu.nmc.enabled=false",
                 "--set", "network.node_bandwidth_bytes_per_s=null"]) == 0  # as the preset's comment suggests
    out = capsys.readouterr().out
    assert "name: '007'" in out and "node_bandwidth_bytes_per_s: null" in out
    assert main(["show-config", "dgx-a100", "--set", "gpu.num_cus=true"]) == 2
    assert "override 'gpu.num_cus'" in capsys.readouterr().err


def test_a_system_file_that_is_not_utf8_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"base: a100-sxm4\ndescription: caf\xe9\n")
    assert main(["show-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpusim: error: {path}: line 2: not UTF-8 text (byte 0xe9); save the file as UTF-8\n"
    assert captured.out == ""


def test_set_gives_a_list_field_as_yaml_writes_a_list(capsys):
    assert main(["show-config", "a100-4-nvlink", "--set", "topology.kind=custom", "--set",
                 "topology.edges=[[0, 1], [1, 2], [2, 3], [3, 0, 2]]"]) == 0
    assert "  edges:\n  - - 0\n    - 1\n" in capsys.readouterr().out


def test_a_field_set_twice_is_an_error(capsys):
    assert main(["show-config", "t3-ring8", "--set", "gpu.num_cus=40", "--set", "gpu.num_cus=80"]) == 2
    assert capsys.readouterr().err == "gpusim: error: --set 'gpu.num_cus' is given more than once; give each field one value\n"
    assert main(["show-config", "t3-ring8", "--set", "links.bandwidth=75GB/s", "--set", "links.bandwidth_bytes_per_s=1e11"]) == 2
    assert "field 'links.bandwidth_bytes_per_s' is set by override 'links.bandwidth' too" in capsys.readouterr().err


def test_run_writes_outputs(tmp_path, capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--quiet", "--out", str(tmp_path),
                 "--op", "gemm m=512 n=512 k=512 dtype=fp16", "--op", "allreduce nbytes=1MiB"])
    assert code == 0
    assert "allreduce" in capsys.readouterr().out
    for name in ("ops.csv", "summary.csv", "timeline.png", "timeline.perfetto.json"):
        assert (tmp_path / name).exists()


def test_run_takes_symmetric_mode_where_it_is_exact_unless_told_otherwise(capsys):
    """As sweep and simulate do: a GEMM and an all-reduce on every GPU of a ring run on rank 0 alone, a
    send between two GPUs in full mode, and --mode full still simulates every GPU."""
    for extra, mode in [([], "symmetric"), (["--mode", "full"], "full")]:
        assert main(["run", "--system", "t3-ring8", "--quiet", *extra, "--op", "gemm 512 512 512",
                     "--op", "allreduce 1MiB"]) == 0
        assert f"simulated ({mode} mode)" in capsys.readouterr().out
    assert main(["run", "--system", "t3-ring8", "--quiet", "--op", "sendrecv 1MiB src=0 dst=1"]) == 0
    assert "simulated (full mode)" in capsys.readouterr().out


def test_run_timeline_plot_shows_the_gpus_that_ran_ops():
    """An op on GPU 3 only: the plot used to show GPU 0 alone ("no ops", "no DRAM traffic")."""
    import matplotlib.pyplot as plt

    import gpusim
    from gpusim import ops
    from gpusim.cli import timeline_figure

    result = gpusim.run("a100-4-nvlink", [ops.Gemm(512, 512, 512, ranks=[3]), ops.Gemm(256, 256, 256, ranks=[2])])
    fig = timeline_figure(result, "title")
    timeline, dram = fig.axes
    assert [label.get_text() for label in timeline.get_yticklabels()] == ["GPU2 compute", "GPU3 compute"]
    assert dram.get_title() == "GPU 2 DRAM traffic" and dram.get_lines() and not dram.texts
    assert timeline.get_xlabel() == "time (ms)" and dram.get_ylabel() == "DRAM bandwidth (GB/s)"
    plt.close(fig)


def test_run_fused_gemm_reduce_scatter_with_t3_mca(capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--policy", "t3-mca", "--quiet",
                 "--op", "gemm_rs m=1024 n=1024 k=512 dtype=fp16"])
    assert code == 0
    assert "t3_ring_rs" in capsys.readouterr().out


def test_run_the_decomposed_software_overlap(capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--quiet",
                 "--op", "gemm_rs_decomposed m=2048 n=1024 k=512 channels=8 driver=cu"])
    assert code == 0
    assert "decomposed_ring_rs" in capsys.readouterr().out


def test_run_an_all_gather_overlapped_with_its_gemm(capsys):
    code = main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--quiet",
                 "--op", "ag_gemm_decomposed m=2048 n=1024 k=512 driver=dma"])
    assert code == 0
    assert "decomposed_dma_ag" in capsys.readouterr().out


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


def test_parse_op_takes_values_without_a_key_in_the_fields_order():
    assert parse_op("gemm 8192 4096 1024 bf16 trans_a=1") == parse_op("gemm m=8192 n=4096 k=1024 dtype=bf16 trans_a=1")
    assert parse_op("allreduce 64MiB bf16").nbytes == 64 * 2**20
    softmax = parse_op("softmax 4 8 fp32")  # a named row reduction's kind is its name: rows come first
    assert (softmax.kind, softmax.rows, softmax.cols, softmax.dtype) == ("softmax", 4, 8, "fp32")
    assert parse_op("rowreduce sum 4 8").kind == "sum"


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
    ("all_reduce nbytes=1MiB", r"must start with one of gemm, .*, optimizer \(did you mean 'allreduce'\?\)$"),
    ("attention batch=1 heads=8 q_len=128 kv_len=128 head_dims=64", r"unknown field 'head_dims' \(did you mean "
                                                                   r"'head_dim'\?\); attention takes name, ranks, batch"),
    ("allreduce nbytes=1 MiB", r"expected key=value after 'nbytes=1', got 'MiB' \(a value has no spaces: write "
                               r"nbytes=1MiB; values without a key come first\)"),
    ("gemm n=8 8 k=8", r"expected key=value after 'n=8', got '8'"),
    ("softmax 4 8 fp32 x y z w", r"softmax takes at most 6 values without a key \(rows, cols, dtype, input, out, "
                                 r"library\), got 'w' too"),
    ("gemm 8 8 8 n=8", "field 'n' is given more than once"),
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
    assert parse_op("elementwise kind=add elements=1048576 workgroups=4").workgroups == 4  # read as the op types it
    assert parse_op("elementwise kind=add elements=8 inflight_bytes_per_thread=4").inflight_bytes_per_thread == 4
    attention = parse_op("attention batch=1 heads=8 q_len=128 kv_len=128 head_dim=64 q=q k=keys v=vals")
    assert (attention.q, attention.k, attention.v) == ("q", "keys", "vals")  # an attention's k names a tensor


@pytest.mark.parametrize(("extra", "message"), [
    (["--op", "gemm m=128 n=128 k=128 ranks=0,9"],
     r"gemm 128x128x128 fp16: rank 9 does not exist; t3-ring8 has ranks 0\.\.7"),
    (["--op", "gemm m=128 n=128 k=128 kernel=MT999"], "unknown GEMM kernel 'MT999'"),
    (["--op", "alltoall nbytes=1MiB algorithm=ring"], "AllToAll: field 'algorithm' must be one of direct, auto"),
    (["--mode", "symmetric", "--op", "gemm m=128 n=128 k=128 ranks=3"], "symmetric mode simulates rank 0 only"),
    (["--mode", "symmetric", "--op", "sendrecv nbytes=1MiB src=0 dst=1"], "needs --mode full"),
    (["--set", "gpu.cu.max_threads=32", "--op", "gemm m=256 n=256 k=256"],
     "does not fit on a CU .*the library's heuristic found no kernel that fits"),
])
def test_run_reports_bad_ops_without_a_traceback(extra, message, capsys):
    assert main(["run", "--system", "t3-ring8", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: ") and "Traceback" not in err
    assert re.search(message, err)


def test_a_value_an_op_refuses_names_the_op_spec_that_gave_it(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--system", "t3-ring8", "--quiet", "--out", str(out), "--op", "gemm m=64 n=64 k=64",
                 "--op", "gemm m=0 n=64 k=64"]) == 2
    assert capsys.readouterr().err == ("gpusim: error: op 'gemm m=0 n=64 k=64': Gemm: field 'm' must be a positive "
                                       "integer, got 0\n")
    assert not out.exists()
    with pytest.raises(OpError, match=r"^op 'allreduce nbytes=1MiB dtype=fp99': AllReduce: field 'dtype' must be one of"):
        parse_op("allreduce nbytes=1MiB dtype=fp99")


@pytest.mark.parametrize(("op", "message"), [
    ("sendrecv nbytes=1MiB src=0 dst=3", "GPU 0 cannot reach GPU 3 in its custom topology (field 'topology.edges')"),
    ("allreduce nbytes=1MiB", "its custom topology of 4 GPUs has no ring through direct links, which a ring collective "
                              "needs (field 'topology.edges')"),
])
def test_ops_a_custom_topology_cannot_carry_are_one_error_line(tmp_path, capsys, op, message):
    islands = tmp_path / "islands.yaml"  # two pairs of GPUs, not linked to each other
    islands.write_text("base: a100-4-nvlink\ntopology: {kind: custom, edges: [[0, 1], [2, 3]]}\n")
    out = tmp_path / "out"
    assert main(["run", "--system", str(islands), "--mode", "full", "--quiet", "--op", op, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"gpusim: error: islands: {message}\n"
    assert not out.exists()


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


@pytest.mark.parametrize(("arguments", "message"), [
    (["--vidur", "EMPTY", "--system", "h100-sxm5"], "EMPTY: not a vidur MLP profile"),
    (["--vidur", "BINARY", "--system", "h100-sxm5"], "BINARY: not a vidur MLP profile"),
    (["--vidur", "EMPTY", "--system", "nosuch"], "unknown hardware preset 'nosuch'"),
    (["--dataset", "gemm-mi210", "--system", "h100-sxm5"], "only a --vidur profile takes a preset"),
])
def test_validate_reports_bad_profiles_and_presets_before_simulating(arguments, message, tmp_path, capsys):
    files = {"EMPTY": tmp_path / "empty.csv", "BINARY": tmp_path / "binary.csv"}
    files["EMPTY"].write_text("")
    files["BINARY"].write_bytes(bytes(range(128, 256)))
    arguments = [str(files[a]) if a in files else a for a in arguments]
    assert main(["validate", "--quiet", "--points", "2", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim: error: ") and "Traceback" not in err
    assert re.search(message.replace("EMPTY", ".*empty.csv").replace("BINARY", ".*binary.csv"), err)


def test_validate_writes_no_data_set_files_when_a_later_data_set_fails(tmp_path, capsys, monkeypatch):
    compare = validation.compare
    compared: list[str] = []

    def second_fails(dataset, *args, **kwargs):
        compared.append(dataset.name)
        if len(compared) == 2:
            raise ConfigError(f"{dataset.name}: cannot be compared")
        return compare(dataset, *args, **kwargs)

    monkeypatch.setattr(validation, "compare", second_fails)
    out = tmp_path / "out"
    assert main(["validate", "--dataset", "gelu-mi210", "--dataset", "softmax-mi210", "--points", "1", "--quiet",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == "gpusim: error: softmax-mi210: cannot be compared\n"
    assert not out.exists()  # not even gelu-mi210.csv, which was written before the failure


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


BAD_OUT_COMMANDS = {
    "run": ["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8", "--quiet"],
    "simulate": ["simulate", "--model", "bert-base", "--layers", "1", "--system", "t3-ring8", "--quiet"],
    "validate-trace": ["validate-trace", "workloads/traces/dp_backward_v100_2gpu.csv", "--system", "t3-ring8",
                       "--quiet"],
    "validate": ["validate", "--dataset", "gelu-mi210", "--points", "1", "--quiet"],
    "demo": ["demo", "--quick"],
}


@pytest.mark.parametrize("command", BAD_OUT_COMMANDS)
@pytest.mark.parametrize(("out", "message"), [
    ("afile", "--out afile: afile is a file, not a folder"),
    ("afile/sub", "--out afile/sub: afile is a file, not a folder"),
    ("", "--out: expected a folder, got an empty path"),
])
def test_a_bad_out_is_one_error_line_before_anything_is_simulated(command, out, message, tmp_path, capsys,
                                                                   monkeypatch):
    from tests.conftest import REPO

    argv = [str(REPO / word) if word.startswith("workloads/") else word for word in BAD_OUT_COMMANDS[command]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    assert main([*argv, "--out", out]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpusim: error: {message}\n"
    assert captured.out == ""  # refused before the simulation (which prints its results)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile"]


def test_an_out_folder_that_cannot_be_created_is_an_error(tmp_path, capsys, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.mkdir", refuse)
    out = tmp_path / "new"
    assert main(["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8", "--quiet", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpusim: error: --out {out}: cannot create the folder: Permission denied\n"
    assert captured.out == ""


def test_an_output_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path, capsys, monkeypatch):
    def full_disk(result, out, title):
        raise OSError(28, "No space left on device", str(out / "ops.csv"))

    monkeypatch.setattr("gpusim.cli.write_outputs", full_disk)
    assert main(["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8", "--quiet", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"gpusim: error: {tmp_path / 'ops.csv'}: cannot write it: No space left on device\n"
    assert not any(tmp_path.iterdir())  # nothing half-written, no staging folder left


def test_outputs_are_moved_into_out_all_together_or_not_at_all(tmp_path, capsys):
    run = ["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8", "--quiet", "--out"]
    (tmp_path / "timeline.perfetto.json").mkdir()  # in the way of the last file written
    assert main([*run, str(tmp_path)]) == 2
    assert "timeline.perfetto.json: cannot write it: a folder of that name is in the way" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["timeline.perfetto.json"]
    fresh = tmp_path / "fresh"
    assert main(["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8 ranks=0,9", "--quiet", "--out",
                 str(fresh)]) == 2
    assert not fresh.exists()  # the folder made for a run that failed is removed again
    assert main([*run, str(fresh)]) == 0
    assert sorted(path.name for path in fresh.iterdir()) == [".gpusim-written", "energy.csv", "ops.csv", "summary.csv",
                                                              "timeline.perfetto.json", "timeline.png"]


def test_a_rejected_sweep_leaves_no_cache_folder_it_made(tmp_path, capsys):
    sweep = ["sweep", "--system", "t3-ring8", "--op", "gemm m=64 n=64 k=64", "--vary", "gpu.num_cus=80,-1",
             "--quiet", "--cache"]
    assert main([*sweep, str(tmp_path / "made" / "cache")]) == 2
    assert "Input should be greater than 0" in capsys.readouterr().err
    assert not (tmp_path / "made").exists()
    (tmp_path / "mine").mkdir()
    assert main([*sweep, str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()  # a folder the user had stays


def test_a_failed_command_removes_the_parent_folders_it_made_for_out_but_no_others(tmp_path, capsys):
    failing = ["run", "--system", "t3-ring8", "--op", "gemm m=8 n=8 k=8 ranks=0,9", "--quiet", "--out"]
    assert main([*failing, str(tmp_path / "new" / "deeper" / "out")]) == 2
    assert "rank 9 does not exist" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    (tmp_path / "kept").mkdir()
    assert main([*failing, str(tmp_path / "kept" / "new" / "out")]) == 2
    assert [path.name for path in tmp_path.rglob("*")] == ["kept"]  # a folder that was there stays


def test_simulate_reports_the_kernels_it_replays_as_delays(capsys):
    from tests.conftest import shared_data

    trace = shared_data("traces/kineto/mi250_minitoy_train_kineto.json.gz")
    assert main(["simulate", "--trace", str(trace), "--system", "mi210", "--unsupported", "delay", "--quiet"]) == 0
    assert "kernels replayed as delays of their measured duration (not modelled):" in capsys.readouterr().out


@pytest.mark.parametrize("seed", ["-1", "99999999999", "1.5"])
def test_validate_needs_a_seed_numpy_accepts(seed, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--dataset", "gemm-mi210", "--points", "1", "--seed", seed])
    assert exit_info.value.code == 2
    assert f"argument --seed: expected a whole number from 0 to 4294967295, got '{seed}'" in capsys.readouterr().err


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_validate_needs_a_positive_number_of_workers(workers, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--dataset", "gemm-mi210", "--points", "1", "--workers", workers])
    assert exit_info.value.code == 2
    assert f"argument --workers: expected a positive integer, got '{workers}'" in capsys.readouterr().err


def test_validation_sample_takes_count_rows_spread_over_the_groups():
    frame = pd.DataFrame({"gpus": [2] * 5 + [4] * 5 + [8] * 5 + [16] * 5, "x": range(20)})
    two = validation.sample(frame, 2, seed=3, by="gpus")
    assert len(two) == 2 and two["gpus"].nunique() == 2
    six = validation.sample(frame, 6, seed=3, by="gpus")
    assert sorted(six["gpus"].value_counts()) == [1, 1, 2, 2]
    assert validation.sample(frame, 6, seed=3, by="gpus").equals(six)  # reproducible
    uneven = pd.DataFrame({"gpus": [2] + [4] * 10 + [8] * 10, "x": range(21)})
    assert validation.sample(uneven, 9, by="gpus")["gpus"].value_counts().to_dict() == {2: 1, 4: 4, 8: 4}
    assert len(validation.sample(uneven, 20, by="gpus")) == 20


def test_warnings_read_as_the_command_line_writes(capsys):
    assert main(["run", "--system", "t3-ring8", "--mode", "symmetric", "--quiet", "--op", "alltoall nbytes=1MiB"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("gpusim: warning: symmetric mode only approximates") and "use --mode full" in err
    assert ".py:" not in err  # no source file and line


def test_optimizer_ops_take_a_model_or_sizes():
    from gpusim.studies.nmc_optimizer import model_parameter_sizes

    op = parse_op("optimizer algorithm=lamb model=bert-base impl=nmc")
    assert (op.algorithm, op.impl) == ("lamb", "nmc") and op.sizes == tuple(model_parameter_sizes("bert-base"))
    assert parse_op("optimizer algorithm=adam sizes=1024,4096").sizes == (1024, 4096)  # elements, not bytes
    with pytest.raises(GpusimError, match="field 'model' expects one of bert-base-classifier, .*got 'gpt5'"):
        parse_op("optimizer algorithm=adam model=gpt5")
    with pytest.raises(GpusimError, match="field 'sizes' is given more than once"):
        parse_op("optimizer algorithm=adam model=bert-base sizes=1")


@pytest.mark.parametrize("cus", ["0-999999999999", "16384", "0-3,16384-16390"])
def test_cu_ranges_beyond_any_gpu_are_refused_before_they_are_listed(cus, capsys):
    assert main(["run", "--system", "a100-sxm4", "--quiet", "--op", f"gemm m=8 n=8 k=8 cus={cus}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpusim: error: op 'gemm m=8 n=8 k=8 cus={cus}': cus= names CU ")
    assert err.endswith(", but a GPU has at most 16384 CUs\n")


def test_ops_on_streams_of_their_own_run_side_by_side(tmp_path, capsys):
    assert split_stream("gemm m=64 n=64 k=64 stream=side") == ("gemm m=64 n=64 k=64", gpusim.Stream("side"))
    assert split_stream("gemm m=64 n=64 k=64")[1] == gpusim.Stream()  # the API's default stream
    assert split_stream("gemm m=64 n=64 k=64 stream=s cus=0-3,8-9")[1].cu_mask == (0, 1, 2, 3, 8, 9)
    for bad, message in (("gemm m=64 n=64 k=64 stream=a stream=b", "give one stream=NAME at most"),
                         ("gemm m=64 n=64 k=64 stream=", "give one stream=NAME at most"),
                         ("gemm m=64 n=64 k=64 cus=5-2", "cus= expects CU ranges such as 0-65"),
                         ("gemm m=64 n=64 k=64 cus=a", "cus= expects CU ranges such as 0-65")):
        with pytest.raises(GpusimError, match=message):
            split_stream(bad)
    gemm = "gemm m=1024 n=1024 k=1024"
    for streams, side_by_side in ((("a", "b"), True), (("a", "a"), False)):
        out = tmp_path / "".join(streams)
        arguments = ["run", "--system", "h200-sxm", "--quiet", "--out", str(out)]
        for stream in streams:
            arguments += ["--op", f"{gemm} stream={stream}"]
        assert main(arguments) == 0
        first, second = pd.read_csv(out / "ops.csv").sort_values("start_s").itertuples()
        assert (second.start_s < first.end_s) == side_by_side
    halves = ["--op", f"{gemm} stream=a cus=0-65", "--op", f"{gemm} stream=b cus=66-131"]
    assert main(["run", "--system", "h200-sxm", "--quiet", *halves]) == 0
    assert main(["run", "--system", "h200-sxm", "--quiet", "--op", f"{gemm} stream=a cus=0-65",
                 "--op", f"{gemm} stream=a"]) == 2
    assert "stream 'a' is given other CUs by another op" in capsys.readouterr().err


def test_python_dash_m_gpusim_is_the_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpusim", "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"gpusim {gpusim.__version__}"
