import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusim.units import QuantityError, format_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("1 TB/s", "bandwidth", 1e12),
        ("300 GB/s", "bandwidth", 300e9),
        ("200 Gb/s", "bandwidth", 25e9),
        ("16 MiB", "bytes", 16 * 2**20),
        ("4KiB", "bytes", 4096),
        ("500 ns", "time", 500.0),
        ("2 us", "time", 2000.0),
        ("1.4 GHz", "frequency", 1.4e9),
        (1024, "bytes", 1024.0),
    ],
)
def test_parse_quantity(text, kind, expected):
    assert parse_quantity(text, kind) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["fast", "3 parsecs", "GB/s", ""])
def test_parse_quantity_rejects_garbage(bad):
    with pytest.raises(QuantityError, match="bandwidth"):
        parse_quantity(bad, "bandwidth")


def test_unitless_rejected_when_unit_required():
    with pytest.raises(QuantityError, match="with a unit"):
        parse_quantity("300", "bandwidth", require_unit=True)
    with pytest.raises(QuantityError, match="bare number"):
        parse_quantity(300, "bandwidth", require_unit=True)


@given(st.floats(min_value=1e-3, max_value=1e6))
def test_units_scale_consistently(value):
    assert parse_quantity(f"{value} GB/s", "bandwidth") == pytest.approx(parse_quantity(f"{value * 1000} MB/s", "bandwidth"))
    assert parse_quantity(f"{value} us", "time") == pytest.approx(parse_quantity(f"{value * 1000} ns", "time"))


def test_format_bytes():
    assert format_bytes(64 * 2**20) == "64.0 MiB"
    assert format_bytes(12) == "12 B"


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan"), "1e400 GB/s", "1e400"])
def test_parse_quantity_rejects_non_finite_values(value):
    with pytest.raises(QuantityError, match="expected a finite bandwidth"):
        parse_quantity(value, "bandwidth")
