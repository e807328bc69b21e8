"""Model descriptions (workloads/models/*.yaml): validation of their fields."""

import pytest
import yaml

from gpusim.errors import ConfigError
from gpusim.trace.models import load_model

BERT = {"hidden": 768, "layers": 12, "heads": 12, "vocab": 30522, "seq_len": 128}
COUNTS = ["hidden", "layers", "heads", "kv_heads", "d_head", "ffn_hidden", "vocab", "seq_len", "batch"]


def _model_file(tmp_path, **fields):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**BERT, **fields}))
    return path


@pytest.mark.parametrize("field", COUNTS)
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_count(tmp_path, field, value):
    with pytest.raises(ConfigError, match=rf"m.yaml: field '{field}': .*must be a whole number, got {str(value).lower()}"):
        load_model(_model_file(tmp_path, **{field: value}))
    with pytest.raises(ConfigError, match=rf"m.yaml: field '{field}': .*must be a whole number"):
        load_model(_model_file(tmp_path), **{field: value})


def test_whole_numbers_still_load(tmp_path):
    model = load_model(_model_file(tmp_path), layers=2, kv_heads=4)
    assert (model.layers, model.key_value_heads, model.hidden, model.batch) == (2, 4, 768, 1)


def test_errors_name_the_field_a_misspelling_meant_and_the_value_received(tmp_path):
    """As a hardware file's: a did-you-mean for an unknown field, the value a field could not take,
    and a check across fields in its own words (not pydantic's 'Value error' on a field 'model')."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**{k: v for k, v in BERT.items() if k != "heads"}, "haeds": 12}))
    with pytest.raises(ConfigError, match=r"m.yaml: field 'heads': Field required; field 'haeds': unknown field "
                                          r"\(did you mean 'heads'\?\)$"):
        load_model(path)
    with pytest.raises(ConfigError, match=r"m.yaml: field 'seq_len': .*integer.* \(got '4k'\)$"):
        load_model(_model_file(tmp_path, seq_len="4k"))
    with pytest.raises(ConfigError, match=r"m.yaml: hidden \(767\) must be a multiple of heads \(12\)"):
        load_model(_model_file(tmp_path, hidden=767))
