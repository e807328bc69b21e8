"""The scripts under benchmarks/ and validation/ refuse bad arguments the argparse way, before any
simulation runs: exit status 2, one ``<prog>: error: ...`` line on stderr, no traceback, nothing
written (no output folder, a Markdown target left as it was)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = "benchmarks/run_benchmarks.py"
T3 = "validation/t3/reproduce.py"
T3_MODES = "validation/t3/full_vs_symmetric.py"
T3_LAYOUTS = "validation/t3/megatron_layouts.py"
T3_GENERATION = "validation/t3/generation.py"
NMC = "validation/nmc_optimizer/reproduce.py"
CONCURRENCY = "validation/concurrency/reproduce.py"
FIT = "validation/calibration/fit.py"
FIT_GEMM = ["--dataset", "gemm-v100-deepbench", "--out", "out"]

BAD = {  # name: (script, arguments, a part of the error line)
    "benchmark --out without an end marker": (BENCHMARKS, ["--case", "gemm-8192-mi210", "--repeat", "1", "--out", "bench.md"],
                                             "needs the markers"),
    "benchmark --out a folder": (BENCHMARKS, ["--case", "gemm-8192-mi210", "--out", "folder"], "cannot write it"),
    "benchmark --repeat 0": (BENCHMARKS, ["--repeat", "0"], "argument --repeat: expected a positive integer, got '0'"),
    "benchmark --repeat -5": (BENCHMARKS, ["--repeat", "-5"], "argument --repeat: expected a positive integer"),
    "t3 --out an existing file": (T3, ["--out", "file", "--subset", "ci"], "--out file: file is a file, not a folder"),
    "t3 modes --out under a file": (T3_MODES, ["--out", "file/out"], "--out file/out: file is a file, not a folder"),
    "t3 layouts --out an existing file": (T3_LAYOUTS, ["--out", "file"], "--out file: file is a file, not a folder"),
    "t3 layouts --models unknown": (T3_LAYOUTS, ["--out", "out", "--models", "GPT-5"], "argument --models: invalid choice"),
    "t3 generation --workers 0": (T3_GENERATION, ["--out", "out", "--workers", "0"],
                                  "argument --workers: expected a positive integer"),
    "nmc --out unwritable": (NMC, ["--out", "/proc/gpusim-out", "--quick"], "--out /proc/gpusim-out: cannot create the folder"),
    "concurrency --set unknown field": (CONCURRENCY, ["--out", "out", "--quick", "--set", "gpu.nonexistent=3"],
                                        "gpu has no field 'nonexistent'"),
    "concurrency --set without =": (CONCURRENCY, ["--out", "out", "--quick", "--set", "gpu.num_cus"],
                                    "--set expects PATH=VALUE"),
    "concurrency --max-gflop leaves nothing": (CONCURRENCY, ["--out", "out", "--max-gflop", "0.000001"],
                                               "--max-gflop 1e-06 leaves none of the"),
    "fit --query selects no row": (FIT, [*FIT_GEMM, "--param", "gpu.gemm_efficiency.fp16=0.84", "--query", "m > 1e12"],
                                   "leave 0 of its rows"),
    "fit --query not an expression": (FIT, [*FIT_GEMM, "--param", "gpu.gemm_efficiency.fp16=0.84", "--query", "m >"],
                                      "--query 'm >' on gemm-v100-deepbench: SyntaxError"),
    "fit --query for another data set": (FIT, [*FIT_GEMM, "--param", "gpu.gemm_efficiency.fp16=0.84", "--query",
                                            "gemm-mi210: m > 1"], "is for gemm-mi210, which is not among"),
    "fit --param unknown field": (FIT, [*FIT_GEMM, "--param", "gpu.nonexistent=1,2"], "gpu has no field 'nonexistent'"),
    "fit --points 0": (FIT, [*FIT_GEMM, "--param", "gpu.num_cus=80", "--points", "0"],
                       "argument --points: expected a positive integer"),
}
PREPARED = {"file": "", "bench.md": "x\n<!-- core-benchmarks:start -->\n"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every bad call (and the t3 modes script's --help), two at a time, each in a folder of its own
    with a file, a folder and a Markdown page: name -> (completed process, folder)."""
    calls = {**{name: (script, arguments) for name, (script, arguments, _) in BAD.items()}, "help": (T3_MODES, ["--help"])}

    def call(item):
        name, (script, arguments) = item
        folder = tmp_path_factory.mktemp("call")
        for file, text in PREPARED.items():
            (folder / file).write_text(text)
        (folder / "folder").mkdir()
        process = subprocess.run([sys.executable, str(REPO / script), *arguments], cwd=folder, capture_output=True,
                                 text=True, timeout=60)
        return name, (process, folder)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(call, calls.items()))


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_argument_is_a_usage_error_before_anything_runs(runs, name):
    script, _, message = BAD[name]
    process, folder = runs[name]
    assert process.returncode == 2, process.stderr
    assert "Traceback" not in process.stderr and process.stdout == ""
    errors = [line for line in process.stderr.splitlines() if ": error: " in line]
    assert errors == [process.stderr.splitlines()[-1]]
    assert errors[0].startswith(f"{Path(script).name}: error: ") and message in errors[0]
    assert sorted(path.name for path in folder.iterdir()) == sorted([*PREPARED, "folder"])  # no output folder
    assert all((folder / file).read_text() == text for file, text in PREPARED.items())
    assert not any((folder / "folder").iterdir())


def test_full_vs_symmetric_help_describes_every_option(runs):
    process, _ = runs["help"]
    assert process.returncode == 0
    for option, text in (("--out", "output folder"), ("--check", "exit 1 when"), ("--models", "sub-layers"),
                         ("--parts", "software overlaps"), ("--workers", "processes")):
        described = process.stdout.split(f"  {option} ", 1)[1].split("\n  --", 1)[0]
        assert text in " ".join(described.split()), option


def test_a_study_script_interrupted_ends_with_one_line(capsys):
    from gpusim.arguments import run_script

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_script(interrupted, "t3/reproduce.py") == 130
    assert capsys.readouterr().err == "t3/reproduce.py: interrupted\n"
    assert run_script(lambda: 0, "t3/reproduce.py") == 0


def test_a_config_error_while_a_study_script_runs_ends_with_one_line(capsys):
    from gpusim.arguments import run_script
    from gpusim.errors import ConfigError

    def lost_its_scheduler() -> int:
        raise ConfigError("cannot reach the Dask scheduler at tcp://host:8786 (timed out)")

    assert run_script(lost_its_scheduler, "concurrency/reproduce.py") == 2
    assert capsys.readouterr().err == ("concurrency/reproduce.py: error: cannot reach the Dask scheduler at "
                                       "tcp://host:8786 (timed out)\n")


def test_an_unreachable_scheduler_is_a_usage_error_before_anything_runs(tmp_path):
    pytest.importorskip("dask.distributed")
    environment = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"}  # Dask's default waits 30 s
    process = subprocess.run([sys.executable, str(REPO / CONCURRENCY), "--out", "out", "--quick", "--scheduler",
                              "tcp://127.0.0.1:1"], cwd=tmp_path, env=environment, capture_output=True, text=True,
                             timeout=60)
    assert process.returncode == 2, process.stderr
    assert "Traceback" not in process.stderr and process.stdout == ""
    assert process.stderr.splitlines()[-1].startswith(
        "reproduce.py: error: cannot reach the Dask scheduler at tcp://127.0.0.1:1 (")
    assert "check that a scheduler runs there" in process.stderr
    assert not any(tmp_path.iterdir())  # no output folder, no cache
