"""Progress bars that suit where they are shown: live on a terminal or in a notebook, sparse in a log."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

LOG_INTERVAL_S = 30.0
"""Least wall time between two updates of a bar written to a file or a pipe (a CI log, ``> run.log``),
s: each update is another line there."""
TICK_S = 1.0
"""Interval at which a bar on a terminal redraws itself between updates, s, so that its elapsed
time runs on while one long item (a sweep's point) is being worked on."""


def progress_bar(total: int, description: str, unit: str, initial: int = 0) -> Any:
    """A tqdm bar of ``total`` items of ``unit`` (``initial`` already done), updated as often as tqdm
    likes on a terminal or in a notebook, and at most every :data:`LOG_INTERVAL_S` seconds when
    standard error goes to a file or a pipe.  On a terminal the bar also redraws itself every
    :data:`TICK_S` seconds until it is closed: without that, its elapsed time would stand still
    while an item takes minutes, and the run would look hung."""
    from tqdm.auto import tqdm

    terminal = sys.stderr.isatty()
    bar = tqdm(total=total, initial=initial, desc=description, unit=unit,
               **({} if terminal or in_notebook() else {"mininterval": LOG_INTERVAL_S}))
    if terminal:
        _keep_ticking(bar)
    return bar


def _keep_ticking(bar: Any) -> None:
    """Redraw ``bar`` every :data:`TICK_S` seconds from a daemon thread until ``bar.close()``."""
    closed = threading.Event()
    close = bar.close
    alive = weakref.ref(bar)  # a bar dropped unclosed (an error on its way) stops the thread too

    def tick() -> None:
        while not closed.wait(TICK_S):
            shown = alive()
            if shown is None:
                return
            shown.refresh()
            del shown

    def close_and_stop() -> None:
        closed.set()
        close()

    bar.close = close_and_stop
    threading.Thread(target=tick, name=f"progress: {bar.desc}", daemon=True).start()


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (whose bars tqdm draws as widgets), not merely a
    process that imported IPython or ipykernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config
