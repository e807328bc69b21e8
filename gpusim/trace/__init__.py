"""Operator traces: the schema, generators, importers and DAG replay.

Quick use::

    import gpusim
    from gpusim import trace

    t = trace.transformer("gpt3", phase="train", tp=8, batch=2, seq_len=1024)
    result = gpusim.run(gpusim.load_system("t3-ring8"), t, mode="symmetric")
    print(trace.breakdown(result.ops))
"""

from gpusim.trace.generator import transformer
from gpusim.trace.models import ModelConfig, list_models, load_model
from gpusim.trace.schema import COLUMNS, KINDS, validate
from gpusim.trace.trace import Trace, read

__all__ = [
    "COLUMNS",
    "KINDS",
    "ModelConfig",
    "Trace",
    "list_models",
    "load_model",
    "read",
    "transformer",
    "validate",
]
