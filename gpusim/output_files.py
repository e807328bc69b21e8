"""Output files written whole or not at all.

A file is written under a temporary name beside its target and renamed onto it, so a reader never
sees half a file and a failed write leaves neither the temporary file nor a damaged target.  A
command's set of files is staged in a hidden folder and moved into its output folder only once
every file is written (:func:`staged_outputs`), which also says when the folder still holds files
that an earlier command wrote there and this one did not (a hidden list, :data:`WRITTEN_LIST`,
remembers the last command's files).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpusim.arguments import CREATED_FOLDERS, blocking_file
from gpusim.errors import GpusimError

WRITTEN_LIST = ".gpusim-written"
"""The hidden file, in an output folder, naming the files the last command wrote there (one a line)."""


def write_whole(path: Path, write: Callable[[Path], None], what: str, error: type[GpusimError] = GpusimError) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then rename; return ``path``.

    Parameters
    ----------
    path
        The target file; its folder is created if missing.
    write
        Writes the whole content to the path it is given (a new name beside ``path`` that ends in
        ``.tmp``, hidden, and unique, so no file of the user's is overwritten on the way).
    what
        What the file is, for the error message (``"the trace file"``).
    error
        The error class raised when the file cannot be written.

    Raises
    ------
    GpusimError
        (``error``) naming the path and the reason (a file where a folder of the path should be
        names that file); nothing is left behind, not even the folders it created.
    """
    created = _missing_folders(path.parent)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(handle)
        tmp = Path(name)
        write(tmp)
        tmp.replace(path)
    except OSError as exc:
        blocking = blocking_file(path.parent)
        reason = f"{blocking} is a file, not a folder" if blocking is not None else exc.strerror or exc
        raise error(f"{path}: cannot write {what}: {reason}") from exc
    finally:
        if tmp is not None and tmp.is_file():
            tmp.unlink()
        if not path.exists():
            for folder in created:
                _remove_if_empty(folder)
    return path


def _missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty, or not there: leave it


@contextmanager
def staged_outputs(out: Path | None) -> Iterator[Path | None]:
    """A folder to write a command's outputs into, moved into ``out`` only if the block succeeds.

    The files are written into a hidden folder inside ``out``; when the ``with`` block ends without
    an error they replace their namesakes in ``out``, and otherwise they are removed, so ``out``
    holds either the whole new set or what it held before (and the folders that
    :func:`gpusim.arguments.output_folder` created for the command are removed again while empty).
    Files that the previous command wrote into ``out`` and this one did not are left, and named in a
    note on standard error, so that they are not taken for this command's.

    Parameters
    ----------
    out
        The output folder (existing), or None when nothing is to be written (the block gets None).

    Raises
    ------
    GpusimError
        A file cannot be written (the message names it as it would be in ``out``), or a staged
        file cannot take its place there (a folder of its name is in the way); nothing is moved.
    """
    if out is None:
        yield None
        return
    stage = Path(tempfile.mkdtemp(prefix=".gpusim-staging-", dir=out))
    moved = False
    try:
        try:
            yield stage
        except OSError as exc:  # a file could not be written: name it where it was to go
            where = out / Path(exc.filename).name if exc.filename else out
            raise GpusimError(f"{where}: cannot write it: {exc.strerror or exc}") from exc
        staged = sorted(stage.iterdir())
        blocked = next((out / item.name for item in staged if (out / item.name).is_dir()), None)
        if blocked is not None:
            raise GpusimError(f"{blocked}: cannot write it: a folder of that name is in the way")
        for item in staged:
            item.replace(out / item.name)
        moved = True
        _note_earlier_files(out, [item.name for item in staged])
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not moved:
            remove_empty_created_folders()


def _note_earlier_files(out: Path, written: list[str]) -> None:
    """Name, on standard error, the files of ``out`` that the previous command wrote and this one
    (which wrote ``written``) did not; then remember ``written`` as the last command's."""
    listing = out / WRITTEN_LIST
    try:
        earlier = listing.read_text(encoding="utf-8").splitlines() if listing.is_file() else []
        listing.write_text("".join(f"{name}\n" for name in written), encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # the list is a courtesy: the outputs are in place
        return
    left = sorted(name for name in set(earlier) - set(written) if (out / name).is_file())
    if left:
        print(f"note: {out} also holds {', '.join(left)} from an earlier command, which this one did not write",
              file=sys.stderr)


def remove_empty_created_folders() -> None:
    """Remove every folder that :func:`gpusim.arguments.output_folder` created for the command and
    that is still empty, the innermost first (a command that failed leaves no empty output or
    cache folder behind)."""
    for folder in sorted(CREATED_FOLDERS, key=lambda path: len(path.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        CREATED_FOLDERS.discard(folder)
