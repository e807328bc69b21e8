"""Output files written whole or not at all.

A file is written under a temporary name beside its target and renamed onto it, so a reader never
sees half a file and a failed write leaves neither the temporary file nor a damaged target.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpusim.errors import GpusimError


def write_whole(path: Path, write: Callable[[Path], None], what: str, error: type[GpusimError] = GpusimError) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then rename; return ``path``.

    Parameters
    ----------
    path
        The target file; its folder is created if missing.
    write
        Writes the whole content to the path it is given.
    what
        What the file is, for the error message (``"the trace file"``).
    error
        The error class raised when the file cannot be written.

    Raises
    ------
    GpusimError
        (``error``) naming the path and the reason; nothing is left behind.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        tmp.replace(path)
    except OSError as exc:
        raise error(f"{path}: cannot write {what}: {exc.strerror or exc}") from exc
    finally:
        if tmp.is_file():
            tmp.unlink()
    return path
