"""GEMM workloads of the concurrency study, generated from model definitions (``workloads/concurrency``).

Every linear layer ``Y[tokens, out] = X[tokens, in] W[out, in]^T`` of a model contributes three
GEMMs per training step (PyTorch's layout; ``C[m, n] = A[m, k] B[k, n]``):

========================  ==============  ==============  ==============  =======  =======
GEMM                      m               n               k               trans_a  trans_b
========================  ==============  ==============  ==============  =======  =======
forward                   tokens          out             in              no       yes
input gradient            tokens          in              out             no       no
weight gradient           out             in              tokens          yes      no
========================  ==============  ==============  ==============  =======  =======

A Transformer block's linear layers are the Q, K, V and output projections (hidden -> hidden) and
the feed-forward pair (hidden -> ffn x hidden -> hidden); an LSTM (GRU) time step multiplies the
batch's input and recurrent state by the 4 (3) gate matrices, so ``tokens`` is the batch and
``out`` is 4 (3) x hidden.  An app's optional ``passes`` field keeps some of the three GEMMs
(default: all; ``[forward]`` for inference).  Attention's strided batched GEMMs (scores ``Q K^T`` and context
``P V``, one batch entry per sequence and head) come from :func:`attention_gemms`.

A GEMM's *shape* (m, n, k, transposes, batch, dtype) is what the simulation sees; GEMMs of
different apps with the same shape share their simulations.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gpusim.checks import as_int, is_flag, is_positive_int, names, one_of, positive_int, positive_ints
from gpusim.config.gpu import DTYPE_BYTES
from gpusim.data_paths import data_root
from gpusim.errors import ConfigError

WORKLOADS = data_root() / "workloads" / "concurrency"
"""The repository's concurrency workload definitions."""

GATES = {"lstm": 4, "gru": 3}
FFN_MULTIPLIER = 4
PASSES = ("forward", "input-grad", "weight-grad")
"""The GEMMs of a training step, as :func:`linear_gemms` names them; an app's ``passes`` field keeps some."""
GEMM_COLUMNS = ["app", "layer", "hidden", "inputs", "linear", "pass", "m", "n", "k", "trans_a", "trans_b", "batch", "dtype"]
SHAPE_COLUMNS = ["m", "n", "k", "trans_a", "trans_b", "batch", "dtype"]


def linear_gemms(tokens: int, fan_in: int, fan_out: int) -> list[dict[str, Any]]:
    """The forward, input-gradient and weight-gradient GEMMs of one linear layer.

    Parameters
    ----------
    tokens
        Rows of the layer's input (tokens, or the batch of a recurrent step).
    fan_in, fan_out
        Input and output features.

    Raises
    ------
    ConfigError
        A size that is not a positive integer.
    """
    for name, value in (("tokens", tokens), ("fan_in", fan_in), ("fan_out", fan_out)):
        positive_int(name, value, "linear_gemms")
    forward, input_grad, weight_grad = PASSES
    return [
        {"pass": forward, "m": tokens, "n": fan_out, "k": fan_in, "trans_a": False, "trans_b": True},
        {"pass": input_grad, "m": tokens, "n": fan_in, "k": fan_out, "trans_a": False, "trans_b": False},
        {"pass": weight_grad, "m": fan_out, "n": fan_in, "k": tokens, "trans_a": True, "trans_b": False},
    ]


def _layers(app: dict[str, Any], hidden: int) -> list[tuple[str, int, int]]:
    """``(name, in, out)`` of the distinct linear layers of one block of ``app`` at ``hidden``."""
    kind = app["layer"]
    if kind == "transformer":
        ffn = app.get("ffn_multiplier", FFN_MULTIPLIER) * hidden
        return [("qkvo", hidden, hidden), ("ffn1", hidden, ffn), ("ffn2", ffn, hidden)]
    gates = GATES[kind] * hidden
    widths = sorted(set(app.get("input_widths", [1])) | {1})
    return [(f"gates_in{width}" if width != 1 else "gates", width * hidden, gates) for width in widths]


APP_FIELDS = {"transformer": {"name", "source", "layer", "hidden", "tokens", "ffn_multiplier", "passes"},
              **{kind: {"name", "source", "layer", "hidden", "batch", "input_widths", "passes"} for kind in GATES}}
ATTENTION_FIELDS = {"name", "source", "hidden", "heads", "sequences", "sequence_lengths"}


def _check_fields(mapping: dict[str, Any], known: set[str], where: str) -> None:
    """Reject keys that are not ``known`` (a misspelled key would otherwise be ignored)."""
    for key in mapping:
        if key not in known:
            raise ConfigError(f"{where}: unknown field {key!r} (misspelled?); known: {', '.join(sorted(known))}")


def _check_app(app: Any, where: str) -> None:
    if not isinstance(app, dict) or "name" not in app:
        raise ConfigError(f"{where}: every app needs a 'name' (a mapping with name, layer, hidden and tokens or batch)")
    name = app["name"]
    kind = app.get("layer")
    if kind not in APP_FIELDS:
        raise ConfigError(f"{where}: app {name!r}: field 'layer' must be transformer, lstm or gru, got {kind!r}")
    here = f"{where}: app {name!r}"
    _check_fields(app, APP_FIELDS[kind], f"{here} ({kind})")
    for field in ("hidden", "tokens" if kind == "transformer" else "batch"):
        positive_ints(f"field '{field}'", app.get(field), where=here)
    if "input_widths" in app:
        positive_ints("field 'input_widths'", app["input_widths"], where=here)
    if "ffn_multiplier" in app:
        positive_int("field 'ffn_multiplier'", app["ffn_multiplier"], here)
    if "passes" in app:
        passes = names("field 'passes'", app["passes"], PASSES, where=here)
        if len(set(passes)) != len(passes):
            raise ConfigError(f"{here}: field 'passes' names a pass twice: {app['passes']!r}")


def _check_attention_model(model: Any, where: str) -> None:
    if not isinstance(model, dict) or "name" not in model:
        raise ConfigError(f"{where}: every model needs a 'name' (a mapping with {', '.join(sorted(ATTENTION_FIELDS))})")
    here = f"{where}: model {model['name']!r}"
    _check_fields(model, ATTENTION_FIELDS, here)
    for field in ("hidden", "heads", "sequences"):
        positive_int(f"field '{field}'", model.get(field), here)
    positive_ints("field 'sequence_lengths'", model.get("sequence_lengths"), where=here)
    if model["hidden"] % model["heads"]:
        raise ConfigError(f"{here}: hidden ({model['hidden']}) must be a multiple of heads ({model['heads']})")


def _read(path: str | os.PathLike, entries: str) -> tuple[dict[str, Any], str]:
    """A workload file's fields, checked at the top level (``entries``: its list's field name)."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"expected a workload file or the name of one in {WORKLOADS}, got {path!r}")
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        path = WORKLOADS / f"{path.name}.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        known = ", ".join(sorted(p.stem for p in WORKLOADS.glob("*.yaml")))
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); workload definitions in {WORKLOADS}: {known}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    _check_fields(data, {"dtype", "role", entries}, str(path))
    entries_value = data.get(entries)
    if not isinstance(entries_value, list) or not entries_value:
        raise ConfigError(f"{path}: field {entries!r} must be a non-empty list of definitions")
    one_of("field 'dtype'", data.get("dtype", "fp32"), DTYPE_BYTES, str(path))
    return data, str(path)


def model_gemms(path: str | os.PathLike = "table7.3", dtype: str | None = None,
                apps: Sequence[str] | None = None) -> pd.DataFrame:
    """The GEMMs of the apps defined in a workload file, one row per distinct GEMM of each app.

    Parameters
    ----------
    path
        A YAML file, or the name of one in ``workloads/concurrency`` (``table7.3``, ``quick``,
        ``extension``).
    dtype
        Overrides the file's dtype.
    apps
        Names of the apps to keep (default: all of the file's).

    Returns
    -------
    pandas.DataFrame
        Columns ``app, layer, hidden, inputs, linear, pass, m, n, k, trans_a, trans_b, batch,
        dtype, role``; a GEMM that recurs within an app (e.g. the four hidden x hidden projections)
        appears once per app, and only the passes of the app's ``passes`` field (default: all three).

    Raises
    ------
    ConfigError
        An unreadable or invalid file, an unknown ``dtype``, or a name in ``apps`` that the file
        does not define (the message lists those it does).
    """
    data, where = _read(path, "apps")
    if dtype is not None:
        one_of("dtype", dtype, DTYPE_BYTES, "model_gemms")
    dtype = dtype or data.get("dtype", "fp32")
    for app in data["apps"]:
        _check_app(app, where)
    if apps is not None:
        wanted = [apps] if isinstance(apps, str) else list(apps) if isinstance(apps, Sequence) else None
        known = [app["name"] for app in data["apps"]]
        if not wanted or any(name not in known for name in wanted):
            raise ConfigError(f"model_gemms: apps must name apps of {where}, got {apps!r}; known: {', '.join(known)}")
    rows = []
    for app in data["apps"]:
        if apps is not None and app["name"] not in wanted:
            continue
        inputs_field = "tokens" if app["layer"] == "transformer" else "batch"
        passes = set(app.get("passes", PASSES))
        for hidden in app["hidden"]:
            for inputs in app[inputs_field]:
                for linear, fan_in, fan_out in _layers(app, hidden):
                    for gemm in linear_gemms(inputs, fan_in, fan_out):
                        if gemm["pass"] not in passes:
                            continue
                        rows.append({"app": app["name"], "layer": app["layer"], "hidden": hidden, "inputs": inputs,
                                     "linear": linear, **gemm, "batch": 1, "dtype": dtype})
    frame = pd.DataFrame(rows, columns=GEMM_COLUMNS)
    frame = frame.drop_duplicates(subset=["app", "m", "n", "k", "trans_a", "trans_b", "batch", "dtype"]).reset_index(drop=True)
    frame["role"] = data.get("role", "evaluate")
    return frame


def attention_gemms(path: str | os.PathLike = "attention", dtype: str | None = None) -> pd.DataFrame:
    """The strided batched GEMMs of attention for every model and sequence length in ``path``.

    Returns
    -------
    pandas.DataFrame
        Columns as :func:`model_gemms`, with ``linear`` ``scores`` (``Q K^T``: m = n = sequence
        length, k = head size) or ``context`` (``P V``: m = sequence length, n = head size,
        k = sequence length), ``inputs`` the sequence length and ``batch`` sequences x heads.

    Raises
    ------
    ConfigError
        An unreadable or invalid file, or an unknown ``dtype``.
    """
    data, where = _read(path, "models")
    if dtype is not None:
        one_of("dtype", dtype, DTYPE_BYTES, "attention_gemms")
    dtype = dtype or data.get("dtype", "fp32")
    rows = []
    for model in data["models"]:
        _check_attention_model(model, where)
        head = model["hidden"] // model["heads"]
        batch = model["sequences"] * model["heads"]
        for length in model["sequence_lengths"]:
            common = {"app": model["name"], "layer": "attention", "hidden": model["hidden"], "inputs": length,
                      "pass": "forward", "batch": batch, "dtype": dtype}
            rows.append({**common, "linear": "scores", "m": length, "n": length, "k": head, "trans_a": False, "trans_b": True})
            rows.append({**common, "linear": "context", "m": length, "n": head, "k": length, "trans_a": False, "trans_b": False})
    frame = pd.DataFrame(rows, columns=GEMM_COLUMNS)
    frame["role"] = data.get("role", "batched")
    return frame


def shape_key(row: Any) -> str:
    """The simulation identity of a GEMM, e.g. ``2048x768x768x1_01_fp32`` (m x n x k x batch, transposes, dtype)."""
    return f"{row['m']}x{row['n']}x{row['k']}x{row['batch']}_{int(row['trans_a'])}{int(row['trans_b'])}_{row['dtype']}"


def gemm_label(row: Any) -> str:
    """The dissertation's GEMM naming, ``M_N_K_T1T2`` (e.g. ``4096_128_1024_01``)."""
    return f"{row['m']}_{row['n']}_{row['k']}_{int(row['trans_a'])}{int(row['trans_b'])}"


def check_gemms(frame: Any, where: str, empty: bool = False) -> None:
    """Check a table of GEMMs: a DataFrame with the :data:`SHAPE_COLUMNS`, positive integer sizes
    and known dtypes.

    Parameters
    ----------
    frame
        The table (e.g. from :func:`model_gemms`).
    where
        Who asks, and for which argument (``"ConcurrencyStudy.run: gemms"``), for the message.
    empty
        Whether a table without rows passes.

    Raises
    ------
    ConfigError
        Naming ``where``, the first bad column or row and what was expected.
    """
    if not isinstance(frame, pd.DataFrame):
        raise ConfigError(f"{where}: expected a DataFrame of GEMMs (e.g. model_gemms()), got {type(frame).__name__}")
    missing = [column for column in SHAPE_COLUMNS if column not in frame]
    if missing:
        raise ConfigError(f"{where}: the GEMM table lacks the column(s) {', '.join(missing)}; a GEMM needs "
                          f"{', '.join(SHAPE_COLUMNS)}")
    if frame.empty and not empty:
        raise ConfigError(f"{where}: no GEMM given (an empty table: did a selection by app, size or pass match nothing?)")
    for column in ("m", "n", "k", "batch"):
        bad = [value for value in frame[column] if not is_positive_int(value)]
        if bad:
            raise ConfigError(f"{where}: column {column!r} must hold positive integers, got {bad[0]!r}")
    for column in ("trans_a", "trans_b"):
        bad = [value for value in frame[column] if not (is_flag(value) or as_int(value) in (0, 1))]
        if bad:
            raise ConfigError(f"{where}: column {column!r} must hold True or False (whether the operand is "
                              f"transposed), got {bad[0]!r}")
    unknown = sorted({str(value) for value in frame["dtype"] if not isinstance(value, str) or value not in DTYPE_BYTES})
    if unknown:
        raise ConfigError(f"{where}: column 'dtype' must hold {', '.join(DTYPE_BYTES)}, got {', '.join(unknown)}")


def with_shapes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``shape`` (:func:`shape_key`), ``label`` (:func:`gemm_label`) and ``flops`` columns.

    Raises
    ------
    ConfigError
        ``frame`` is not a table of GEMMs (:func:`check_gemms`; an empty one passes).
    """
    check_gemms(frame, "with_shapes", empty=True)
    frame = frame.copy()
    frame["shape"] = [shape_key(row) for _, row in frame.iterrows()]
    frame["label"] = [gemm_label(row) for _, row in frame.iterrows()]
    frame["flops"] = 2.0 * frame["m"] * frame["n"] * frame["k"] * frame["batch"]
    return frame


def systematic_sample(gemms: pd.DataFrame, every: int, minimum: int = 3) -> pd.DataFrame:
    """The GEMMs of about every ``every``-th shape of each app, spread evenly over its sizes.

    Each app's distinct shapes are ordered by FLOPs and ``max(minimum, round(count / every))`` of
    them are taken at evenly spaced positions (all of them when the app has no more); a GEMM is
    kept when its shape was taken for its app.  ``every=1`` keeps everything.

    Raises
    ------
    ConfigError
        ``every`` or ``minimum`` is not a positive integer, or ``gemms`` is not a table of GEMMs
        with an ``app`` column.
    """
    positive_int("every", every, "systematic_sample")
    positive_int("minimum", minimum, "systematic_sample")
    check_gemms(gemms, "systematic_sample: gemms", empty=True)
    if "app" not in gemms:
        raise ConfigError("systematic_sample: gemms needs an 'app' column (the sample spreads over each app's sizes)")
    frame = with_shapes(gemms) if "shape" not in gemms else gemms
    kept = []
    for _, app in frame.groupby("app", sort=False):
        shapes = app.drop_duplicates("shape").sort_values(["flops", "shape"])["shape"].tolist()
        count = min(len(shapes), max(minimum, round(len(shapes) / every)))
        positions = [int((i + 0.5) * len(shapes) / count) for i in range(count)]
        chosen = {shapes[p] for p in positions}
        kept.append(app[app["shape"].isin(chosen)])
    return pd.concat(kept).reset_index(drop=True) if kept else frame
