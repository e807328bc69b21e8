"""Where gpusim's data lives: hardware presets, model and workload definitions, measured data.

The data sits in the repository's top-level folders (``hwconfigs/``, ``workloads/``,
``validation/measured/``), beside the ``gpusim`` package.  Run from a source checkout (or an
editable install of one), the package reads them there; a regular install (``pip install .`` or a
wheel) copies them, through ``[options.data_files]`` in ``setup.cfg``, to
``<sys.prefix>/share/gpusim/`` under the same relative paths, and the package reads that copy.
"""

from __future__ import annotations

import site
import sys
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parents[1]
"""The folder that holds the ``gpusim`` package: a source checkout's root, or ``site-packages``."""

CHECKOUT_MARKER = "hwconfigs"
"""A folder that only a source checkout has beside the package."""

INSTALLED_DATA = Path("share") / "gpusim"
"""Where an install puts the data, relative to its prefix (the ``setup.cfg`` data_files' destinations)."""


def data_root() -> Path:
    """The folder that holds gpusim's data folders (``hwconfigs/``, ``workloads/``, ``validation/``).

    Returns
    -------
    Path
        The source checkout's root when the package runs from one (:data:`CHECKOUT_ROOT` has a
        ``hwconfigs/`` folder), else the installed copy: ``sys.prefix/share/gpusim``, or, where
        only a user install (``pip install --user``) made one, ``site.getuserbase()/share/gpusim``.
        ``sys.prefix/share/gpusim`` is returned when neither exists; readers then find no presets
        or models there.
    """
    if (CHECKOUT_ROOT / CHECKOUT_MARKER).is_dir():
        return CHECKOUT_ROOT
    installed = Path(sys.prefix) / INSTALLED_DATA
    user = Path(site.getuserbase()) / INSTALLED_DATA
    return user if not installed.is_dir() and user.is_dir() else installed
