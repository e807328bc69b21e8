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
