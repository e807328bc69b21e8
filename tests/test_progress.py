"""Progress bars: live on a terminal, sparse in a log."""

import gpusim
from gpusim import ops
from gpusim.progress import LOG_INTERVAL_S, in_notebook, progress_bar


def test_a_bar_written_to_a_log_updates_sparsely():
    import ipykernel.kernelapp  # noqa: F401  (imported, as a process that runs notebooks has it: not a kernel)

    assert not in_notebook()
    bar = progress_bar(10, "points", "pt")  # pytest's stderr is not a terminal
    assert bar.mininterval == LOG_INTERVAL_S
    bar.close()


def test_a_run_in_a_log_shows_its_start_and_its_end_only(capsys):
    gpusim.run("t3-ring8", [ops.Gemm(1024, 1024, 1024)] * 4, progress=True)
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.strip()]
    assert len(lines) == 2 and "0/32" in lines[0] and "32/32" in lines[1] and "simulated" in lines[1]
