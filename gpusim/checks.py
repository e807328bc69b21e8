"""Argument checks of gpusim's Python API: one implementation per check, shared by the ops and the studies.

A failed check raises ``error`` (:class:`gpusim.errors.ConfigError` unless the caller passes
another class, such as :class:`gpusim.errors.OpError`) with a message that names the argument,
the value and what was expected, after ``where`` (the function or class that asks) and a colon
when ``where`` is given.  The ``as_*`` readers return ``None`` instead of raising, for checks whose
messages are their own.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Iterable
from typing import Any

import numpy as np

from gpusim.errors import ConfigError


def as_int(value: object) -> int | None:
    """``value`` as a Python ``int`` if it is an integer (Python or NumPy, not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def as_real(value: object) -> float | None:
    """``value`` as a Python ``float`` if it is a finite real number (Python or NumPy, not a bool),
    else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


def as_sequence(value: object) -> list | None:
    """The items of a list, tuple, range or one-dimensional NumPy array, else ``None``."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim == 1 else None
    if isinstance(value, (list, tuple, range)):
        return list(value)
    return None


def is_positive_int(value: object) -> bool:
    """Whether ``value`` is an integer of at least 1 (Python or NumPy, not a bool)."""
    number = as_int(value)
    return number is not None and number >= 1


def is_flag(value: object) -> bool:
    """Whether ``value`` is True or False (Python or NumPy); a word such as ``"no"``, which ``if``
    would take as true, is not."""
    return isinstance(value, bool | np.bool_)


def is_one_of(value: object, options: Collection[str]) -> bool:
    """Whether ``value`` is a string among ``options`` (an unhashable value is not)."""
    return isinstance(value, str) and value in options


def _fail(error: type[Exception], where: str, message: str) -> Exception:
    return error(f"{where}: {message}" if where else message)


def one_of(name: str, value: object, options: Iterable[str], where: str = "",
           error: type[Exception] = ConfigError) -> str:
    """``value`` if it is one of the strings ``options``.

    Parameters
    ----------
    name
        The argument, as the message names it (``"dtype"``, ``"field 'dtype'"``).
    value
        What was given.
    options
        The allowed strings (a sequence, or a mapping's keys).
    where
        Who asks (``"gnmt_groups"``), or ``""`` for a message without a prefix.
    error
        The exception class to raise.

    Raises
    ------
    error
        "``where``: ``name`` must be one of A, B, got ``value``".
    """
    options = list(options)
    if not is_one_of(value, options):
        raise _fail(error, where, f"{name} must be one of {', '.join(options)}, got {value!r}")
    return value


def known_name(what: str, value: object, options: Iterable[str], where: str = "",
               error: type[Exception] = ConfigError) -> str:
    """``value`` if it is one of the names ``options``.

    The same check as :func:`one_of` for a name that selects something (a model, a policy).

    Raises
    ------
    error
        "``where``: unknown ``what`` ``value``; known: A, B".
    """
    options = list(options)
    if not is_one_of(value, options):
        raise _fail(error, where, f"unknown {what} {value!r}; known: {', '.join(options)}")
    return value


def positive_int(name: str, value: object, where: str = "", error: type[Exception] = ConfigError) -> int:
    """``value`` as a Python ``int`` if it is an integer of at least 1 (Python or NumPy, not a bool).

    Raises
    ------
    error
        "``where``: ``name`` must be a positive integer, got ``value``".
    """
    if not is_positive_int(value):
        raise _fail(error, where, f"{name} must be a positive integer, got {value!r}")
    return int(value)


def items(name: str, values: object, fits: Callable[[Any], bool], expected: str, where: str = "",
          error: type[Exception] = ConfigError) -> list[Any]:
    """The items of ``values``, a non-empty list, tuple, range or 1-D array whose items all ``fits``.

    Parameters
    ----------
    name, where, error
        As for :func:`one_of`.
    values
        What was given.
    fits
        Whether one item is allowed.
    expected
        What the items must be, for the message (``"positive integers"``).

    Raises
    ------
    error
        "``where``: ``name`` must be a non-empty list of ``expected``, got ``values``".
    """
    listed = as_sequence(values)
    if not listed or not all(fits(item) for item in listed):
        raise _fail(error, where, f"{name} must be a non-empty list of {expected}, got {values!r}")
    return listed


def names(name: str, values: object, options: Iterable[str], where: str = "",
          error: type[Exception] = ConfigError) -> list[str]:
    """The items of ``values``, a non-empty list of strings among ``options`` (see :func:`items`)."""
    options = list(options)
    return items(name, values, lambda item: is_one_of(item, options), f"names among {', '.join(options)}", where, error)


def positive_ints(name: str, values: object, unit: str = "", where: str = "",
                  error: type[Exception] = ConfigError) -> list[int]:
    """The items of ``values``, a non-empty list of positive integers (see :func:`items`); ``unit``
    (``" (bytes)"``) follows "positive integers" in the message."""
    return items(name, values, is_positive_int, f"positive integers{unit}", where, error)


def table_with(name: str, frame: object, columns: Iterable[str], where: str = "", source: str = "",
               error: type[Exception] = ConfigError) -> None:
    """Check that ``frame`` is a DataFrame with ``columns`` (``source``: what makes such a table,
    for the message), so that a table builder given the wrong table says so instead of failing on
    a missing key."""
    import pandas as pd

    columns = list(columns)
    made_by = f" ({source})" if source else ""
    if not isinstance(frame, pd.DataFrame):
        raise _fail(error, where, f"{name} must be a DataFrame with the columns {', '.join(columns)}{made_by}, "
                                  f"got {type(frame).__name__}")
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise _fail(error, where, f"{name} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                                  f"it needs {', '.join(columns)}{made_by}")
