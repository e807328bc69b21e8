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


def test_a_bar_on_a_terminal_redraws_itself_until_closed(monkeypatch):
    """A sweep's point can take minutes: the bar's elapsed time must run on meanwhile."""
    import time

    from gpusim import progress

    class Bar:
        desc = "points"

        def __init__(self):
            self.redraws, self.closed = 0, False

        def refresh(self):
            self.redraws += 1

        def close(self):
            self.closed = True

    monkeypatch.setattr(progress, "TICK_S", 0.01)
    bar = Bar()
    progress._keep_ticking(bar)
    deadline = time.monotonic() + 5
    while bar.redraws < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.redraws >= 3
    bar.close()
    assert bar.closed
    time.sleep(0.05)
    after = bar.redraws
    time.sleep(0.05)
    assert bar.redraws == after  # closing stops the redraws
