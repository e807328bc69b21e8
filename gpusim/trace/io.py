"""Reading and writing traces as CSV or Parquet files.

Both formats hold the columns of :mod:`gpusim.trace.schema`; lists are space-separated text.
Parquet files also keep the trace's metadata (model, parallelism...) as JSON; CSV files keep only
the table.  Reading validates the whole table before anything is returned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from gpusim.errors import TraceError

METADATA_KEY = b"gpusim.trace"
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")


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


def read_table(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """The raw table and metadata of a trace file (not yet validated)."""
    path = Path(path)
    kind = _format_of(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if kind == "csv":
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: not a readable CSV table: {exc}") from exc
        return frame, {}
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pyarrow.lib.ArrowException, OSError) as exc:
        raise TraceError(f"{path}: not a readable Parquet table: {exc}") from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    metadata = json.loads(raw) if raw else {}
    return table.to_pandas(), metadata


def write_table(frame: pd.DataFrame, metadata: dict, path: str | os.PathLike) -> Path:
    """Write a (validated) trace table to ``path`` (format by suffix); returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    kind = _format_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if kind == "csv":
        frame.to_csv(tmp, index=False, compression="gzip" if path.name.lower().endswith(".gz") else None)
    else:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: json.dumps(metadata)})
        pq.write_table(table, tmp)
    tmp.replace(path)
    return path
