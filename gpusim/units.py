"""Units: time is float nanoseconds everywhere; sizes are bytes; rates are bytes per second.

Quantities in configuration files and on the command line may be written with units
(``"1 TB/s"``, ``"500 ns"``, ``"16 MiB"``, ``"1.4 GHz"``).  :func:`parse_quantity` turns such a
string into a float in the base unit of its kind:

========== ============== =======================================
kind        base unit      accepted suffixes
========== ============== =======================================
bytes       byte           B, kB (KB), MB, GB, TB, KiB, MiB, GiB, TiB
bandwidth   byte/second    B/s, kB/s, GB/s, TB/s, KiB/s, ... (bytes); Gb/s, Gbit/s, ... (bits)
time        nanosecond     ps, ns, us, µs, ms, s
frequency   hertz          Hz, kHz, MHz, GHz
========== ============== =======================================

SI prefixes are decimal (1 GB = 1e9 B); the ``i`` prefixes are binary (1 GiB = 2**30 B).  A
capital ``B`` is a byte and a lower-case ``b`` a bit, as networks write it (``200 Gb/s`` is 25 GB/s):
a bit needs a capital prefix (``Gb/s``) or its name (``Gbit/s``, ``gbit/s``), and an all-lower-case
unit such as ``gb/s``, ``mb`` or ``b/s`` is ambiguous and an error.  A size takes no bits.  A
quantity must be finite: ``inf``, ``nan`` and numbers that overflow (``"1e400 GB/s"``) are errors.
"""

from __future__ import annotations

import math
import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3

NS_PER_S = 1e9

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_PREFIX_SPELLING = {"": "", "k": "k", "m": "M", "g": "G", "t": "T", "ki": "Ki", "mi": "Mi", "gi": "Gi", "ti": "Ti"}
_TIME_UNITS_NS = {"ps": 1e-3, "ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_FREQ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_TABLES = {"time": _TIME_UNITS_NS, "frequency": _FREQ_UNITS}

KINDS = ("bytes", "bandwidth", "time", "frequency")

EXAMPLES = {
    "bytes": "'16 MiB'",
    "bandwidth": "'300 GB/s'",
    "time": "'500 ns'",
    "frequency": "'1.4 GHz'",
}

KNOWN_UNITS = {
    "bytes": "B, kB (or KB), MB, GB, TB, KiB, MiB, GiB, TiB, bytes",
    "bandwidth": "B/s, kB/s (or KB/s), MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s (bytes); "
                 "bit/s, kbit/s, Mbit/s, Gbit/s, Tbit/s, Kb/s, Mb/s, Gb/s, Tb/s (bits)",
    "time": ", ".join(_TIME_UNITS_NS),
    "frequency": "Hz, kHz, MHz, GHz",
}
"""The units of each kind, as an error lists them."""

_SIZE_UNIT = re.compile(r"(?P<prefix>[kmgt]i?)?(?P<symbol>bytes?|bits?|b)", re.IGNORECASE)
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
    if kind in _TABLES:
        table = _TABLES[kind]
        key = unit if unit in table else unit.lower()
        if key not in table:
            raise QuantityError(f"unknown {kind} unit {unit!r} in {value!r}; known units: {KNOWN_UNITS[kind]}")
        return number * table[key]
    if kind == "bandwidth":
        if unit[-2:].lower() != "/s":
            raise QuantityError(f"unknown bandwidth unit {unit!r} in {value!r}; known units: {KNOWN_UNITS[kind]}")
        return number * _size_factor(unit[:-2], kind, unit, value)
    return number * _size_factor(unit, kind, unit, value)


def _size_factor(size: str, kind: str, unit: str, value: str) -> float:
    """Bytes in one ``size`` (``"GB"``, ``"Gbit"``), the size part of ``unit`` in ``value``.

    ``B`` is a byte and ``b`` a bit (with a capital prefix, ``Gb``, as networks write it); an
    all-lower-case ``gb`` or ``b``, or a ``Gib``, could be either and is an error, as are bits where
    ``kind`` is ``bytes``.  Prefixes of ``B``, and ``bit`` spelled out, may be in any case; bits
    take no binary prefixes.
    """
    match = _SIZE_UNIT.fullmatch(size)
    prefix = match.group("prefix") or "" if match else ""
    key = prefix.lower()
    name = match.group("symbol").lower() if match else ""
    if match is None or (name.startswith("byte") and prefix) or (name.startswith("bit") and "i" in key):
        raise QuantityError(f"unknown {kind} unit {unit!r} in {value!r}; known units: {KNOWN_UNITS[kind]}")
    if match.group("symbol") == "B" or name.startswith("byte"):
        return {**_DECIMAL, **_BINARY}[key]
    per_s = "/s" if kind == "bandwidth" else ""
    as_bytes = f"'{_PREFIX_SPELLING[key]}B{per_s}' (bytes)"
    if name == "b" and (not prefix[:1].isupper() or "i" in key):
        as_bits = f" or '{_PREFIX_SPELLING[key.removesuffix('i')]}bit/s' (bits)" if kind == "bandwidth" else ""
        raise QuantityError(f"{kind} unit {unit!r} in {value!r} is ambiguous: write {as_bytes}{as_bits}")
    if kind == "bytes":
        raise QuantityError(f"unit {unit!r} in {value!r} is bits, but a size is in bytes: write {as_bytes}")
    return _DECIMAL[key] / 8


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
