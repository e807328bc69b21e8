import re

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


@pytest.mark.parametrize(("text", "expected"), [
    ("150 Gb/s", 150e9 / 8), ("150 Gbit/s", 150e9 / 8), ("150 gbit/s", 150e9 / 8), ("8 Kb/s", 1e3),
    ("150 GB/s", 150e9), ("1 kB/s", 1e3), ("1 KB/s", 1e3), ("1 GiB/s", 2**30), ("8 bit/s", 1.0),
])
def test_a_capital_b_is_a_byte_and_a_lower_case_b_a_bit(text, expected):
    assert parse_quantity(text, "bandwidth") == pytest.approx(expected)


@pytest.mark.parametrize(("text", "advice"), [
    ("150 gb/s", "'GB/s' (bytes) or 'Gbit/s' (bits)"),
    ("1 kb/s", "'kB/s' (bytes) or 'kbit/s' (bits)"),
    ("1 tb/s", "'TB/s' (bytes) or 'Tbit/s' (bits)"),
    ("8 b/s", "'B/s' (bytes) or 'bit/s' (bits)"),
    ("1 gib/s", "'GiB/s' (bytes)"),
    ("1 Gib/s", "'GiB/s' (bytes)"),
])
def test_an_all_lower_case_bandwidth_unit_is_ambiguous(text, advice):
    with pytest.raises(QuantityError, match=rf"unit '{text.split()[1]}' in '{text}' is ambiguous: write {re.escape(advice)}"):
        parse_quantity(text, "bandwidth")


@pytest.mark.parametrize(("text", "message", "fixed"), [
    ("16 Mb", r"'Mb' in '16 Mb' is bits, but a size is in bytes: write 'MB'", "16 MB"),
    ("16 Gbit", r"'Gbit' in '16 Gbit' is bits, but a size is in bytes: write 'GB'", "16 GB"),
    ("16 mb", r"'mb' in '16 mb' is ambiguous: write 'MB' \(bytes\)$", "16 MB"),
    ("16 mib", r"'mib' in '16 mib' is ambiguous: write 'MiB' \(bytes\)$", "16 MiB"),
])
def test_a_size_takes_byte_units_written_with_a_capital_b(text, message, fixed):
    with pytest.raises(QuantityError, match=message):
        parse_quantity(text, "bytes")
    assert parse_quantity(fixed, "bytes") == {"16 MB": 16e6, "16 GB": 16e9, "16 MiB": 16 * 2**20}[fixed]


def test_the_known_units_listed_for_an_unknown_one_are_spelled_with_their_case():
    with pytest.raises(QuantityError) as info:
        parse_quantity("10 GBps", "bandwidth")
    message = str(info.value)
    assert "GB/s" in message and "Gbit/s" in message and "Gb/s" in message
    assert not re.search(r"\b(gb|mb|tb|kb)/s", message)
