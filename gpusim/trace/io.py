"""Reading and writing traces as CSV or Parquet files.

Both formats hold the columns of :mod:`gpusim.trace.schema`; lists are space-separated text.
Parquet files also keep the trace's metadata (model, parallelism...) as JSON, mappings keyed by ints
included and numpy scalars as numbers; metadata JSON cannot hold (a set, a tuple key...) is a
:class:`TraceError` naming its key, before anything is written.  CSV files keep only the table.
Reading validates the whole table before anything is returned.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from gpusim.errors import TraceError
from gpusim.output_files import write_whole
from gpusim.trace.schema import check_column_names

METADATA_KEY = b"gpusim.trace"
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
INT_KEYS = "gpusim.int_keys"
"""Marks a metadata mapping whose keys were ints (JSON object keys are always text)."""


def _format_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(CSV_SUFFIXES):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise TraceError(
        f"{path}: unknown trace format; use one of {', '.join(CSV_SUFFIXES + PARQUET_SUFFIXES)} "
        "(Kineto JSON: gpusim.trace.read_kineto; Chakra .et: gpusim.trace.read_chakra)"
    )


def _encode_metadata(value: object, where: str) -> object:
    """``value`` as plain JSON data: numpy scalars as Python numbers, tuples as lists and every dict
    keyed by ints wrapped as ``{INT_KEYS: ...}`` (JSON keys are text).

    Raises
    ------
    TraceError
        A value or key JSON cannot hold (a set, an object, a tuple key...); the message names
        ``where`` it is (e.g. ``metadata['parallel'][2]``).
    """
    if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float, str)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        keys = [key.item() if isinstance(key, np.integer) else key for key in value]
        for key in keys:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TraceError(f"{where}[{key!r}]: a metadata key must be text or an integer, "
                                 f"got {type(key).__name__}")
        encoded = {key: _encode_metadata(item, f"{where}[{key!r}]") for key, item in zip(keys, value.values())}
        integer = bool(keys) and all(isinstance(key, int) for key in keys)
        if not integer and any(isinstance(key, int) for key in keys):
            raise TraceError(f"{where}: a metadata mapping's keys must be all text or all integers, got {keys!r}")
        return {INT_KEYS: encoded} if integer else encoded
    if isinstance(value, (list, tuple)):
        return [_encode_metadata(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise TraceError(f"{where}: metadata of type {type(value).__name__} cannot be written as JSON; use numbers, "
                     "text, lists and mappings")


def _decode_int_keys(obj: dict) -> dict:
    """The JSON object hook undoing :func:`_encode_metadata`'s wrapping of int-keyed mappings."""
    if len(obj) == 1 and isinstance(obj.get(INT_KEYS), dict):
        return {int(key): item for key, item in obj[INT_KEYS].items()}
    return obj


def read_table(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """The raw table and metadata of a trace file (not yet validated, but with a name for each column
    and no name twice).

    Raises
    ------
    TraceError
        No such file, a file that is not a table of its format, a column without a name or a name
        given twice (:func:`~gpusim.trace.schema.check_column_names`), or unreadable metadata.
    """
    path = Path(path)
    kind = _format_of(path)
    if path.is_dir():
        raise TraceError(f"{path}: is a folder, not a trace file")
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if kind == "csv":
        try:
            header = pd.read_csv(path, dtype=str, keep_default_na=False, header=None, nrows=1)
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, EOFError,
                zlib.error) as exc:  # OSError and EOFError: a .csv.gz that is not (or no longer) gzip
            raise TraceError(f"{path}: not a readable CSV table: {exc}") from exc
        check_column_names(header.iloc[0].tolist(), str(path))  # pandas would rename a repeated 'm' 'm.1'
        if not isinstance(frame.index, pd.RangeIndex):  # pandas took the extra leading fields for an index
            raise TraceError(f"{path}: the first data line has more fields than the header's {len(frame.columns)} "
                             "column names")
        return frame, {}
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        check_column_names(pq.read_schema(path).names, str(path))  # pyarrow cannot read a repeated column
        table = pq.read_table(path)
    except (pyarrow.lib.ArrowException, OSError) as exc:
        raise TraceError(f"{path}: not a readable Parquet table: {exc}") from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        metadata = json.loads(raw, object_hook=_decode_int_keys) if raw else {}
    except ValueError as exc:  # not JSON, not UTF-8, or a mangled int-keyed mapping
        raise TraceError(f"{path}: the '{METADATA_KEY.decode()}' metadata is not valid JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise TraceError(f"{path}: the '{METADATA_KEY.decode()}' metadata must be a JSON object, "
                         f"got {type(metadata).__name__}")
    frame = table.to_pandas()
    if any(name is not None for name in frame.index.names):  # a column saved as the index (set_index("op_id"))
        frame = frame.reset_index()
    elif not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1:
        frame = frame.reset_index(drop=True)  # an unnamed index is no column
    return frame, metadata


def write_table(frame: pd.DataFrame, metadata: dict, path: str | os.PathLike) -> Path:
    """Write a (validated) trace table to ``path`` (format by suffix); returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    kind = _format_of(path)
    if kind == "parquet":  # checked before anything is written
        encoded = json.dumps(_encode_metadata(metadata, f"{path}: metadata"))

    def write(tmp: Path) -> None:
        if kind == "csv":
            frame.to_csv(tmp, index=False, compression="gzip" if path.name.lower().endswith(".gz") else None)
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: encoded})
            pq.write_table(table, tmp)

    return write_whole(path, write, "the trace file", TraceError)
