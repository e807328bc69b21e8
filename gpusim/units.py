"""Units: time is float nanoseconds everywhere; sizes are bytes; rates are bytes per second.

Quantities in configuration files and on the command line may be written with units
(``"1 TB/s"``, ``"500 ns"``, ``"16 MiB"``, ``"1.4 GHz"``).  :func:`parse_quantity` turns such a
string into a float in the base unit of its kind:

========== ============== =======================================
kind        base unit      accepted suffixes
========== ============== =======================================
bytes       byte           B, KB, MB, GB, TB, KiB, MiB, GiB, TiB
bandwidth   byte/second    B/s, KB/s, GB/s, TB/s, KiB/s, ... (bytes); Gb/s, Gbit/s (bits)
time        nanosecond     ps, ns, us, µs, ms, s
frequency   hertz          Hz, kHz, MHz, GHz
========== ============== =======================================

SI prefixes are decimal (1 GB = 1e9 B); the ``i`` prefixes are binary (1 GiB = 2**30 B).  A
quantity must be finite: ``inf``, ``nan`` and numbers that overflow (``"1e400 GB/s"``) are errors.
"""

from __future__ import annotations

import math
import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3

NS_PER_S = 1e9

_BYTE_UNITS = {
    "b": 1.0,
    "byte": 1.0,
    "bytes": 1.0,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2.0**10,
    "mib": 2.0**20,
    "gib": 2.0**30,
    "tib": 2.0**40,
}
_BIT_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}
_TIME_UNITS_NS = {"ps": 1e-3, "ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_FREQ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}


def _bandwidth_units() -> dict[str, float]:
    units: dict[str, float] = {}
    for name, factor in _BYTE_UNITS.items():
        if name in ("byte", "bytes"):
            continue
        units[f"{name}/s"] = factor
    for name, factor in _BIT_UNITS.items():
        units[f"{name}/s"] = factor
    return units


_BANDWIDTH_UNITS = _bandwidth_units()

KINDS = {
    "bytes": _BYTE_UNITS,
    "bandwidth": _BANDWIDTH_UNITS,
    "time": _TIME_UNITS_NS,
    "frequency": _FREQ_UNITS,
}

EXAMPLES = {
    "bytes": "'16 MiB'",
    "bandwidth": "'300 GB/s'",
    "time": "'500 ns'",
    "frequency": "'1.4 GHz'",
}

_BITS_PER_S = re.compile(r"^([kKmMgGtT])b/s$")
_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ/]+)?\s*$")


class QuantityError(ValueError):
    """A quantity string that cannot be read as the expected kind."""


def parse_quantity(value: str | float | int, kind: str, *, require_unit: bool = False) -> float:
    """Convert ``value`` to the base unit of ``kind``.

    Parameters
    ----------
    value
        A number (already in the base unit) or a string such as ``"300 GB/s"``.
    kind
        One of ``"bytes"``, ``"bandwidth"``, ``"time"`` (result in ns) or ``"frequency"``.
    require_unit
        When true, a bare number (or a string without a unit) is an error.

    Returns
    -------
    float
        The value in bytes, bytes/s, ns or Hz.

    Raises
    ------
    QuantityError
        For text that is not a quantity of ``kind``, a missing unit where one is required, and a
        value that is not finite.
    """
    result = _parse(value, kind, require_unit)
    if not math.isfinite(result):
        raise QuantityError(f"expected a finite {kind} such as {EXAMPLES[kind]}, got {value!r}")
    return result


def _parse(value: str | float | int, kind: str, require_unit: bool) -> float:
    """:func:`parse_quantity` before its check that the value is finite."""
    if kind not in KINDS:
        raise ValueError(f"unknown quantity kind {kind!r}")
    if isinstance(value, bool):
        raise QuantityError(f"expected a {kind} such as {EXAMPLES[kind]}, got {value!r}")
    if isinstance(value, (int, float)):
        if require_unit:
            raise QuantityError(
                f"expected a {kind} with a unit such as {EXAMPLES[kind]}, got the bare number {value!r}"
            )
        return float(value)
    if not isinstance(value, str):
        raise QuantityError(f"expected a {kind} such as {EXAMPLES[kind]}, got {value!r}")
    match = _QUANTITY.match(value)
    if not match:
        raise QuantityError(f"expected a {kind} such as {EXAMPLES[kind]}, got {value!r}")
    number = float(match.group(1))
    unit = match.group(2)
    if unit is None:
        if require_unit:
            raise QuantityError(f"expected a {kind} with a unit such as {EXAMPLES[kind]}, got {value!r}")
        return number
    table = KINDS[kind]
    bits = _BITS_PER_S.match(unit) if kind == "bandwidth" else None
    if bits:
        # Network convention: a lower-case b ("200 Gb/s") means bits.
        return number * _BIT_UNITS[f"{bits.group(1).lower()}bit"]
    key = unit if unit in table else unit.lower()
    if key not in table:
        known = ", ".join(sorted(table))
        raise QuantityError(f"unknown {kind} unit {unit!r} in {value!r}; known units: {known}")
    return number * table[key]


def cycles_to_ns(cycles: float, clock_hz: float) -> float:
    """Duration of ``cycles`` clock cycles at ``clock_hz``, in ns."""
    return cycles * NS_PER_S / clock_hz


def transfer_ns(nbytes: float, bandwidth_bytes_per_s: float) -> float:
    """Time to move ``nbytes`` at ``bandwidth_bytes_per_s``, in ns."""
    return nbytes * NS_PER_S / bandwidth_bytes_per_s


def format_bytes(nbytes: float) -> str:
    """Human-readable binary size, e.g. ``'64.0 MiB'``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes:.0f} B"


def format_ns(t_ns: float) -> str:
    """Human-readable duration from ns, e.g. ``'1.25 ms'``."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(t_ns) >= size:
            return f"{t_ns / size:.3g} {unit}"
    return f"{t_ns:.3g} ns"
