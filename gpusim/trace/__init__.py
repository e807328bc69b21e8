"""Operator traces: the schema, generators, importers and DAG replay.

Quick use::

    import gpusim

    trace = gpusim.trace.transformer("gpt3", phase="train", tp=8, batch=2, seq_len=1024)
    result = gpusim.run(gpusim.load_system("t3-ring8"), trace, mode="symmetric")
    print(gpusim.trace.breakdown(result.ops, result.kernels))

    fused = gpusim.trace.overlap_gemm_collectives(trace, "t3")   # T3: every TP GEMM fused with its reduce-scatter
    result = gpusim.run(gpusim.load_system("t3-ring8"), fused, mode="symmetric", memory_policy="t3-mca")

    measured = gpusim.trace.read_kineto("../shared/data/traces/kineto/a100_2rank_cnn_nccl_kineto.json.gz",
                                        unsupported="delay", iteration=5)   # one rank's profile
    result = gpusim.run(gpusim.load_system("dgx-a100"), measured, mode="symmetric")
    print(gpusim.trace.compare(result.ops, kernels=result.kernels))

    print(gpusim.trace.memory_footprint(trace, gpusim.load_system("t3-ring8")))   # does it fit?
"""

from gpusim.trace.breakdown import breakdown
from gpusim.trace.chakra import read_chakra
from gpusim.trace.compare import compare
from gpusim.trace.fusion import overlap_gather_gemms, overlap_gemm_collectives, overlap_report
from gpusim.trace.generator import Parallelism, transformer
from gpusim.trace.kineto import read_kineto
from gpusim.trace.memory import memory_footprint
from gpusim.trace.models import ModelConfig, list_models, load_model
from gpusim.trace.schema import COLUMNS, KINDS, validate
from gpusim.trace.trace import Trace, read

__all__ = [
    "COLUMNS",
    "KINDS",
    "ModelConfig",
    "Parallelism",
    "Trace",
    "breakdown",
    "compare",
    "list_models",
    "load_model",
    "memory_footprint",
    "overlap_gather_gemms",
    "overlap_gemm_collectives",
    "overlap_report",
    "read",
    "read_chakra",
    "read_kineto",
    "transformer",
    "validate",
]
