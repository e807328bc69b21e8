"""Pydantic field types for quantities with units.

A field whose name ends in a unit (``_bytes``, ``_bytes_per_s``, ``_ns``, ``_hz``) accepts either a
bare number in that unit or a string with any unit of the same kind (``"1 TB/s"``).  Values must be
positive unless the type says otherwise.  The number types here take ints and numeric text but
not booleans (pydantic would read ``true`` as 1).  Every number of a description, with a unit or without,
must be finite: ``inf`` (YAML's ``.inf``, or ``1e400``, which overflows) and ``nan`` are errors.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpusim.units import parse_quantity


def _parser(kind: str):
    def parse(value: object) -> float:
        return parse_quantity(value, kind)  # type: ignore[arg-type]

    return BeforeValidator(parse)


def _not_bool(value: object) -> object:
    """``value``, unless it is ``True`` or ``False``, which pydantic would take for 1 and 0."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value!r}")
    return value


_NOT_BOOL = BeforeValidator(_not_bool)


def _not_blank(text: str) -> str:
    """``text``, unless it is empty or only spaces."""
    if not text.strip():
        raise ValueError(f"expected a name, got {text!r}")
    return text


Name = Annotated[str, AfterValidator(_not_blank)]
"""A name: text that is not empty or only spaces."""

Int = Annotated[int, _NOT_BOOL]
"""A whole number (a float with no fraction, or numeric text, is taken; a boolean is not)."""
Float = Annotated[float, _NOT_BOOL]
"""A number (an int, or numeric text, is taken; a boolean is not)."""
PositiveFloat = Annotated[float, _NOT_BOOL, Field(gt=0)]
"""A positive number."""
Bytes = Annotated[float, _parser("bytes"), Field(gt=0)]
"""A positive size in bytes."""
Bandwidth = Annotated[float, _parser("bandwidth"), Field(gt=0)]
"""A positive rate in bytes per second."""
Nanoseconds = Annotated[float, _parser("time"), Field(ge=0)]
"""A non-negative duration in ns."""
Hertz = Annotated[float, _parser("frequency"), Field(gt=0)]
"""A positive frequency in Hz."""
PositiveInt = Annotated[int, _NOT_BOOL, Field(gt=0)]
"""A positive whole number."""
Fraction = Annotated[float, _NOT_BOOL, Field(gt=0, le=1)]
"""A number in (0, 1]."""

UNIT_SUFFIXES = {
    "_bytes_per_s": "bandwidth",
    "_bytes": "bytes",
    "_ns": "time",
    "_hz": "frequency",
}
"""Field-name suffixes that carry a unit, longest first, and the quantity kind each implies."""


class Model(BaseModel):
    """Base of every hardware description: frozen; unknown keys and non-finite numbers are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
