"""The :class:`Trace` object: a validated operator table that ``gpusim.run`` replays as a DAG."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpusim.config.gpu import DTYPE_BYTES
from gpusim.errors import TraceError
from gpusim.trace import io
from gpusim.trace.schema import parse_ints, validate


class Trace:
    """An operator trace: one row per op per GPU, validated on construction.

    Parameters
    ----------
    frame
        The table (see :mod:`gpusim.trace.schema` for its columns).
    source
        Where it came from (named in error messages).
    metadata
        Free-form facts about the trace (model, parallelism, importer), kept in Parquet files.

    Attributes
    ----------
    frame
        The normalised table.
    metadata
        See above.

    Raises
    ------
    gpusim.errors.TraceError
        A malformed table (naming the row and the field), or metadata that is not a mapping.
    """

    def __init__(self, frame: pd.DataFrame, source: str = "trace", metadata: dict[str, Any] | None = None):
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TraceError(f"{source}: metadata must be a mapping of facts about the trace (e.g. {{'model': 'gpt3'}}) "
                             f"or None, got {type(metadata).__name__}")
        self.source = source
        self.frame = validate(frame, source)
        self.metadata = dict(metadata or {})
        self._key: str | None = None

    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        ops = self.frame["op_id"].nunique()
        return f"<Trace {self.source}: {ops} ops, {len(self.frame)} rows on GPUs {self.gpus}>"

    @property
    def gpus(self) -> list[int]:
        """GPUs that have rows."""
        return sorted(int(g) for g in self.frame["gpu"].unique())

    def sweep_key(self) -> str:
        """A digest of the table's columns and values and of the metadata: two traces with the same
        key replay alike (the key of a :func:`gpusim.sweep.sweep` point that holds the trace)."""
        if self._key is None:
            digest = hashlib.sha256("\x1f".join(map(str, self.frame.columns)).encode())
            digest.update(pd.util.hash_pandas_object(self.frame, index=False).to_numpy().tobytes())
            digest.update(json.dumps(self.metadata, sort_keys=True, default=str).encode())
            self._key = digest.hexdigest()
        return self._key

    def write(self, path: str | os.PathLike) -> Path:
        """Write as CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``); returns the path."""
        return io.write_table(self.frame, self.metadata, path)

    def replay(
        self,
        system,
        mode: str = "full",
        memory_policy: str | None = None,
        dispatch_policy: str | None = None,
        progress: bool = False,
        bin_s: float = 5e-6,
        cache_layers: bool = True,
        warmup_layers: int | None = None,
    ):
        """Simulate the trace on ``system`` as a DAG (see :func:`gpusim.trace.replay.replay`)."""
        from gpusim.trace.replay import replay

        return replay(self, system, mode=mode, memory_policy=memory_policy, dispatch_policy=dispatch_policy,
                      progress=progress, bin_s=bin_s, cache_layers=cache_layers,
                      warmup_layers=warmup_layers)

    def with_modelled_host(self) -> Trace:
        """This trace without its measured launch times (``issue_s`` blank): replayed, its kernels
        are issued by the model's host thread, one per ``kernel_launch_ns`` (e.g. to ask what the
        GPU alone would take, or a faster host)."""
        return Trace(self.frame.assign(issue_s=float("nan")), f"{self.source} (modelled host)", self.metadata)

    def communication_bytes(self) -> pd.DataFrame:
        """Bytes of every collective and send/receive, per op (rows of one op counted once); a
        ``gemm_collective`` (a GEMM overlapped with a collective of its output) counts that output,
        each rank's ``m * n * batch`` elements, as a collective's ``bytes`` (for an all-gather, every
        rank's shard: the gathered size; with a blank group the trace does not know the ranks, and
        one shard is counted); a ``collective_gemm`` (an all-gather overlapped with the GEMM that
        consumes it) counts the gathered A, ``m * k`` elements."""
        frame = self.frame[self.frame["kind"].isin(["collective", "sendrecv", "gemm_collective", "collective_gemm"])]
        frame = frame.drop_duplicates("op_id").copy()
        overlapped = frame["kind"] == "gemm_collective"
        if overlapped.any():
            rows = frame[overlapped]
            output = rows["m"] * rows["n"] * rows["batch"] * rows["dtype"].map(DTYPE_BYTES)
            ranks = [len(parse_ints(group)) or 1 for group in rows["group"]]
            frame.loc[overlapped, "bytes"] = output.where(rows["collective"] != "allgather", output * ranks)
        gathered = frame["kind"] == "collective_gemm"
        if gathered.any():
            rows = frame[gathered]
            frame.loc[gathered, "bytes"] = rows["m"] * rows["k"] * rows["dtype"].map(DTYPE_BYTES)
        return frame[["op_id", "name", "kind", "collective", "bytes", "group", "phase", "layer", "step"]].reset_index(
            drop=True
        )


def read(path: str | os.PathLike) -> Trace:
    """Read a trace written by :meth:`Trace.write` (CSV or Parquet), validating every row.

    Raises
    ------
    gpusim.errors.TraceError
        Unreadable file or malformed trace; nothing partial is returned.
    """
    frame, metadata = io.read_table(path)
    return Trace(frame, source=str(path), metadata=metadata)
