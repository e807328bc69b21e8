"""Progress bars that suit where they are shown: live on a terminal or in a notebook, sparse in a log."""

from __future__ import annotations

import sys
from typing import Any

LOG_INTERVAL_S = 30.0
"""Least wall time between two updates of a bar written to a file or a pipe (a CI log, ``> run.log``),
s: each update is another line there."""


def progress_bar(total: int, description: str, unit: str, initial: int = 0) -> Any:
    """A tqdm bar of ``total`` items of ``unit`` (``initial`` already done), updated as often as tqdm
    likes on a terminal or in a notebook, and at most every :data:`LOG_INTERVAL_S` seconds when
    standard error goes to a file or a pipe."""
    from tqdm.auto import tqdm

    live = sys.stderr.isatty() or in_notebook()
    return tqdm(total=total, initial=initial, desc=description, unit=unit,
                **({} if live else {"mininterval": LOG_INTERVAL_S}))


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (whose bars tqdm draws as widgets), not merely a
    process that imported IPython or ipykernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config
