"""The ``gpusim simulate`` and ``gpusim validate-trace`` subcommands (registered in :mod:`gpusim.cli`)."""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

from gpusim.arguments import non_negative_float, output_folder, positive_int
from gpusim.errors import GpusimError, TraceError, UnsupportedTraceError
from gpusim.hw.memctrl import PICK_POLICIES
from gpusim.output_files import staged_outputs
from gpusim.trace.fusion import GATHER_FUNCTIONS, overlap_gather_gemms, overlap_gemm_collectives, overlap_report
from gpusim.trace.io import CSV_SUFFIXES, PARQUET_SUFFIXES
from gpusim.trace.schema import OVERLAP_FUNCTIONS

PATTERN_CHARACTERS = "*?["
"""Characters that make a trace path that does not exist a glob pattern (of Chakra ``.et`` files)."""

MODEL_OPTIONS = ("phase", "tp", "dp", "pp", "batch", "seq_len", "microbatches", "schedule", "recompute", "layers",
                 "decode_tokens", "attention", "dtype", "sequence_parallel", "vocab_divisible_by",
                 "async_tp_backward", "distributed_optimizer", "overlap_param_gather", "virtual_stages", "ep",
                 "expert_capacity_factor", "expert_load", "expert_gemm", "expert_overlap_chunks", "shared_expert_overlap",
                 "prefill_tokens", "prefill_context")
"""The ``simulate`` options that describe a generated model (``--model``), by argparse name."""


def expert_shares(text: str) -> tuple[float, ...] | tuple[tuple[tuple[float, ...]], ...]:
    """``--expert-load``'s shares, separated by commas or colons (``4,1,1,1`` or ``4:1:1:1``; a
    ``--vary expert_load=`` value takes colons), as floats; with slashes between layers
    (``4,1,1,1/1,4,1,1``), one set per layer, each routed alike from every place (the generator
    checks their counts and signs).

    Raises
    ------
    argparse.ArgumentTypeError
        A part that is not a number.
    """
    try:
        layers = [tuple(float(part) for part in layer.replace(":", ",").split(",")) for layer in str(text).split("/")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected the experts' shares as numbers separated by commas or "
                                         f"colons (4,1,1,1), and layers by slashes (4,1,1,1/1,4,1,1), "
                                         f"got {text!r}") from None
    return layers[0] if len(layers) == 1 else tuple((shares,) for shares in layers)


def _option(name: str) -> str:
    """The command-line spelling of an argparse name (``seq_len`` -> ``--seq-len``)."""
    return "--" + name.replace("_", "-")


KINETO_SUFFIXES = (".json", ".json.gz")


def _kind_of_files(files: list[str], where: str, what: str) -> str:
    """``"chakra"`` or ``"kineto"``: the one kind of trace ``files`` (a pattern's matches or a
    folder's files, described as ``what`` of ``where``) are; a :class:`TraceError` otherwise."""
    chakra = [name for name in files if name.lower().endswith(".et")]
    kineto = [name for name in files if name.lower().endswith(KINETO_SUFFIXES)]
    if chakra and kineto:
        raise TraceError(f"{where}: {what} Chakra traces ({Path(chakra[0]).name}) and Kineto traces "
                         f"({Path(kineto[0]).name}); give the files of one job, of one kind")
    if chakra or kineto:
        return "chakra" if chakra else "kineto"
    raise TraceError(f"{where}: {what} no trace files; give Chakra .et files or Kineto .json/.json.gz files, one a rank")


def _kineto_files(path: str) -> list[str]:
    """The Kineto traces (``.json``/``.json.gz``) of the folder or pattern ``path``, in name order."""
    files = glob.glob(path) if not Path(path).exists() else [str(item) for item in Path(path).iterdir()]
    return sorted(name for name in files if name.lower().endswith(KINETO_SUFFIXES) and Path(name).is_file())


def trace_format(path: str) -> str:
    """How :func:`load_any` reads ``path``: ``"kineto"``, ``"chakra"`` or ``"table"`` (gpusim CSV/Parquet).

    A folder, or a pattern, of one job's traces (one file a rank) is read as Chakra traces when
    they are ``.et`` files and as Kineto traces when they are ``.json``/``.json.gz`` ones.

    Raises
    ------
    gpusim.errors.TraceError
        Nothing at ``path``, a pattern that matches nothing or matches other files than traces of one
        kind, a folder without trace files or with both kinds, or a file of none of these formats
        (by suffix).
    """
    name = path.lower()
    if not Path(path).exists():
        if not any(character in path for character in PATTERN_CHARACTERS):
            raise TraceError(f"{path}: no such file or folder")
        matches = sorted(glob.glob(path))
        if not matches:
            raise TraceError(f"{path}: no file matches the pattern")
        others = [match for match in matches if not match.lower().endswith((".et", *KINETO_SUFFIXES))]
        if others:
            raise TraceError(f"{path}: a pattern must select Chakra .et files or Kineto .json/.json.gz files, "
                             f"but it matches {others[0]}")
        return _kind_of_files(matches, path, "the pattern matches")
    if Path(path).is_dir():
        return _kind_of_files(sorted(item.name for item in Path(path).iterdir() if item.is_file()), path, "the folder holds")
    if name.endswith(KINETO_SUFFIXES):
        return "kineto"
    if name.endswith(".et"):
        return "chakra"
    if name.endswith(CSV_SUFFIXES + PARQUET_SUFFIXES):
        return "table"
    raise TraceError(f"{path}: unknown trace format; give a gpusim table ({', '.join(CSV_SUFFIXES + PARQUET_SUFFIXES)}), "
                     "a Kineto trace (.json, .json.gz) or Chakra traces (.et files), or a folder or pattern of a "
                     "job's Kineto or Chakra traces, one a rank")


def load_any(path: str, unsupported: str = "error", iteration: int | None = None, dataflow: bool = True):
    """A trace from a file by its kind (:func:`trace_format`): ``.csv``/``.parquet`` (gpusim),
    ``.json``/``.json.gz`` (Kineto), ``.et`` (Chakra), or a folder or pattern of a job's Kineto or
    Chakra traces, one a rank.

    Errors that point to the readers' ``unsupported='delay'`` name ``--unsupported delay`` instead.
    ``iteration`` and ``dataflow`` apply to Kineto traces (:func:`gpusim.trace.read_kineto`).
    """
    from gpusim.trace.chakra import read_chakra
    from gpusim.trace.kineto import read_kineto
    from gpusim.trace.trace import read

    kind = trace_format(path)
    try:
        if kind == "kineto":
            ranks = path if Path(path).is_file() else _kineto_files(path)
            return read_kineto(ranks, unsupported=unsupported, iteration=iteration, dataflow=dataflow)
        if kind == "chakra":
            return read_chakra(path, unsupported=unsupported)
        return read(path)
    except UnsupportedTraceError as exc:
        raise exc.naming("--unsupported delay") from None


def _check_iteration(command: str, iteration: int | None, trace: str | None) -> None:
    """Raise :class:`GpusimError` when ``--iteration`` is given for other than Kineto traces."""
    if iteration is None:
        return
    if trace is None:
        raise GpusimError(f"{command}: --iteration selects a ProfilerStep of Kineto traces (--trace), not of --model")
    if trace_format(trace) != "kineto":
        raise GpusimError(f"{command}: --iteration selects a ProfilerStep of a Kineto trace (.json/.json.gz), "
                          f"but the trace {trace} is not one")


def _system(args: argparse.Namespace):
    from gpusim.cli import parse_overrides
    from gpusim.system import load_system

    return load_system(args.system, parse_overrides(args.set))


def _mode(args: argparse.Namespace, trace, system) -> str:
    from gpusim.trace.replay import choose_mode

    return choose_mode(trace, system) if args.mode == "auto" else args.mode


def _model_options(args: argparse.Namespace) -> dict[str, object]:
    """The model options given to ``simulate`` (the others keep :func:`~gpusim.trace.transformer`'s defaults).

    Raises
    ------
    GpusimError
        Model options with ``--trace``, or an option that the phase ignores (the generator checks
        the values themselves).
    """
    given = {name: getattr(args, name) for name in MODEL_OPTIONS if getattr(args, name) is not None}
    if args.trace is not None:
        if given:
            raise GpusimError(f"simulate: {_option(next(iter(given)))} describes a generated model (--model) "
                              f"and does not apply to --trace")
        return given
    return _checked_model_options(given)


def _checked_model_options(given: dict[str, object]) -> dict[str, object]:
    """``given`` model options, checked against the phase they describe.

    Raises
    ------
    GpusimError
        An option that the phase ignores (the generator checks the values themselves).
    """
    phase = given.get("phase", "train")
    for name in ("schedule", "recompute", "async_tp_backward", "distributed_optimizer", "overlap_param_gather"):
        if name in given and phase != "train":
            raise GpusimError(f"simulate: {_option(name)} applies to --phase train only, not to --phase {phase}")
    for name in ("decode_tokens", "prefill_tokens", "prefill_context"):
        if name in given and phase != "decode":
            raise GpusimError(f"simulate: {_option(name)} applies to --phase decode only, not to --phase {phase}")
    if "sequence_parallel" in given and phase == "decode":
        raise GpusimError("simulate: --sequence-parallel applies to --phase train and prompt, not to --phase decode")
    return given


def _check_flags_take_effect(options: dict[str, object]) -> None:
    """Refuse a flag that a model run's fixed degrees make do nothing (a sweep that varies the
    degree may well include 1: it is not checked).

    Raises
    ------
    GpusimError
        ``--sequence-parallel`` or ``--async-tp-backward`` with ``--tp 1``, or
        ``--distributed-optimizer`` with ``--dp 1``.
    """
    for name, degree, what in (("sequence_parallel", "tp", "splits the tensor-parallel ranks' sequence"),
                               ("async_tp_backward", "tp", "overlaps the tensor-parallel communication"),
                               ("distributed_optimizer", "dp", "shards the optimizer over the data-parallel ranks")):
        if options.get(name) is True and options.get(degree, 1) == 1:
            raise GpusimError(f"simulate: {_option(name)} {what}; with --{degree} 1 it changes nothing (give "
                              f"--{degree} 2 or more)")


INT_MODEL_OPTIONS = ("tp", "dp", "pp", "batch", "seq_len", "microbatches", "layers", "decode_tokens",
                     "vocab_divisible_by", "virtual_stages", "ep", "expert_overlap_chunks", "prefill_tokens",
                     "prefill_context")
FLOAT_MODEL_OPTIONS = ("expert_capacity_factor",)
NO_NUMBER_WORDS = ("none", "dropless")
"""Words a ``--vary`` value of a numeric model option takes for ``None`` (no capacity: dropless)."""
FLAG_MODEL_OPTIONS = ("sequence_parallel", "async_tp_backward", "distributed_optimizer", "overlap_param_gather",
                      "shared_expert_overlap")


def _model_option_value(name: str, text: object) -> object:
    """A ``--vary`` value of model option ``name`` as the option takes it (a number, a flag or a word).

    Raises
    ------
    GpusimError
        Not a whole number for a whole-number option, not a number for a numeric one, nor true or
        false for a flag.
    """
    from gpusim.cli import FALSE_WORDS, TRUE_WORDS

    word = str(text).strip().lower()
    if name in INT_MODEL_OPTIONS:
        if not word.lstrip("-").isdigit():
            raise GpusimError(f"--vary {name}: expected whole numbers, got {text!r}")
        return int(word)
    if name in FLOAT_MODEL_OPTIONS:
        if word in NO_NUMBER_WORDS:
            return None
        try:
            return float(word)
        except ValueError:
            raise GpusimError(f"--vary {name}: expected numbers or none, got {text!r}") from None
    if name == "expert_load":  # kept as its text in the table; the generator gets the shares (_prepared_trace)
        try:
            expert_shares(word)
        except argparse.ArgumentTypeError as exc:
            raise GpusimError(f"--vary expert_load: {exc}") from None
        return word
    if name in FLAG_MODEL_OPTIONS:
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise GpusimError(f"--vary {name}: expected true or false, got {text!r}")
        return word in TRUE_WORDS
    return text


def _report_not_modelled(trace) -> None:
    """Print how many imported kernels replay as delays of their measured duration, by reason, and
    how many uneven all-to-alls replay as even ones (one rank's Kineto file)."""
    import pandas as pd

    not_modelled = pd.DataFrame(trace.metadata.get("not_modelled") or [], columns=["reason"])
    if not not_modelled.empty:
        print(f"{len(not_modelled)} kernels replayed as delays of their measured duration (not modelled):")
        for reason, count in not_modelled["reason"].value_counts().items():
            print(f"  {count:6d}  {reason}")
    even = trace.metadata.get("even_all_to_alls") or []
    if even:
        print(f"{len(even)} uneven all-to-alls replayed as even exchanges of this rank's total (read every rank's "
              "file to replay their split sizes)")


def _report_overlap(trace, flag: str, function: str, gathers: bool) -> None:
    """Print how many collectives ``--overlap`` (reduce-scatters and all-reduces) or ``--overlap-gathers``
    (all-gathers) overlapped with their GEMMs, and why it left the others."""
    report = overlap_report(trace)
    report = report[(report["collective"] == "allgather") == gathers]
    overlapped = int((report["status"] == "overlapped").sum())
    what = ("all-gathers overlapped with the GEMM that consumes their output" if gathers else
            "reduce-scatters and all-reduces overlapped with the GEMM that produces their input")
    print(f"{flag} {function}: {overlapped} of {report['collective_op_id'].nunique()} {what}")
    for reason, count in report.loc[report["status"] == "skipped", "reason"].value_counts().items():
        print(f"  {count} left as they were: {reason}")


def _prepared_trace(args: argparse.Namespace, options: dict[str, object], report: bool):
    """The trace ``simulate`` replays: generated from ``--model`` with ``options`` or read from
    ``--trace``, with the overlaps of ``--overlap-gathers`` and ``--overlap`` (printing what they
    overlapped when ``report``)."""
    from gpusim.trace.generator import transformer

    if args.model:
        load = options.get("expert_load")
        shares = {"expert_load": expert_shares(load)} if isinstance(load, str) else {}  # a --vary value
        trace = transformer(args.model, **{**options, **shares})
    else:
        trace = load_any(args.trace, unsupported=args.unsupported or "error", iteration=args.iteration)
    if args.overlap_gathers:  # first: a GEMM that gathers its A and feeds a reduction keeps the gather's overlap
        channels = args.overlap_channels if args.overlap_gathers == "decomposed" else None
        trace = overlap_gather_gemms(trace, args.overlap_gathers, channels)
        if report:
            _report_overlap(trace, "--overlap-gathers", args.overlap_gathers, gathers=True)
    if args.overlap:
        channels = args.overlap_channels if args.overlap == "decomposed" else None
        trace = overlap_gemm_collectives(trace, args.overlap, channels, args.overlap_splits or 1)
        if report:
            _report_overlap(trace, "--overlap", args.overlap, gathers=False)
    return trace


def cmd_simulate(args: argparse.Namespace) -> int:
    """Generate or read a trace, replay it, and write ops.parquet, summary.json, a timeline, a breakdown plot and the energy."""
    import matplotlib.pyplot as plt

    from gpusim import plot
    from gpusim.cli import parse_vary
    from gpusim.energy import describe, has_energy
    from gpusim.parameter_sweep import SYSTEM_KEY
    from gpusim.trace.breakdown import breakdown

    if (args.trace is None) == (args.model is None):
        raise GpusimError("simulate: give exactly one of --trace FILE or --model NAME")
    options = _model_options(args)
    grid = parse_vary(args.vary) if args.vary else None
    if grid:  # a model option as its flag spells it (seq-len) or as the generator does (seq_len)
        grid = {key.replace("-", "_") if key.replace("-", "_") in MODEL_OPTIONS else key: values
                for key, values in grid.items()}
    if args.system is None and SYSTEM_KEY not in (grid or {}):
        raise GpusimError(f"simulate: give --system (or, with --vary, the systems to compare as --vary {SYSTEM_KEY}=A,B)")
    system = _system(args) if args.system else None
    if args.model and args.unsupported is not None:
        raise GpusimError("simulate: --unsupported applies to imported traces (--trace), not to --model")
    _check_iteration("simulate", args.iteration, args.trace)
    if args.overlap_channels is not None and "decomposed" not in (args.overlap, args.overlap_gathers):
        raise GpusimError("simulate: --overlap-channels applies to --overlap decomposed and --overlap-gathers decomposed")
    if args.overlap_splits is not None and args.overlap not in ("decomposed", "decomposed_dma"):
        raise GpusimError("simulate: --overlap-splits applies to --overlap decomposed and decomposed_dma")
    varied = [key for key in grid or {} if key in MODEL_OPTIONS]
    if varied and not args.model:
        raise GpusimError(f"simulate: --vary {varied[0]} varies an option of a generated model; it needs --model")
    both = [key for key in varied if key in options]
    if both:
        raise GpusimError(f"simulate: {_option(both[0])} and --vary {both[0]} both give it; keep one")
    if varied:
        from gpusim.parameter_sweep import WorkloadFunction

        grid.update((key, [_model_option_value(key, value) for value in grid[key]]) for key in varied)

        def make(**values: object):
            return _prepared_trace(args, _checked_model_options({**options, **values}), report=False)

        return _simulate_sweep(args, WorkloadFunction(make, varied), system, grid)
    if args.model:
        _check_flags_take_effect(options)
    trace = _prepared_trace(args, options, report=True)
    if grid:
        return _simulate_sweep(args, trace, system, grid)
    mode = _mode(args, trace, system)
    if args.workers or args.scheduler or args.sweep_cache is not None:
        raise GpusimError("simulate: --workers, --scheduler and --sweep-cache apply to a sweep (--vary)")
    out = output_folder(args.out)
    with staged_outputs(out) as stage:
        if args.within_power_limit:
            from gpusim.power_limit import describe_clock, run_within_power_limit

            result = run_within_power_limit(system, trace, mode=mode, memory_policy=args.policy, progress=not args.quiet)
            print(describe_clock(result))
        else:
            result = trace.replay(system, mode=mode, memory_policy=args.policy, progress=not args.quiet,
                                  cache_layers=not args.no_cache)
        parts = breakdown(result.ops, result.kernels)
        print(f"{trace.source} on {system.name} ({mode} mode): {result.time_s * 1e3:.3f} ms per iteration")
        print((parts.set_index("gpu") * 1e3).round(3).rename(columns=lambda c: c.replace("_s", "_ms")).to_string())
        stats = result.stats
        print(f"{stats['simulated_rows']} of {stats['trace_rows']} rows simulated; {stats['events']} events in "
              f"{stats['wall_s']:.1f} s ({stats['events_per_s']:.0f} events/s)")
        energy_line = describe(result)
        if energy_line is not None:
            print(energy_line)
        _report_not_modelled(trace)
        memory = _report_memory(trace, system) if args.model else None
        if stage is not None:
            result.ops.to_parquet(stage / "ops.parquet", index=False)
            if memory is not None:
                memory.to_csv(stage / "memory.csv", index=False)
            if has_energy(result):
                result.energy().to_csv(stage / "energy.csv", index=False)
            summary = {
                "trace": trace.source, "system": system.name, "mode": mode, "time_s": result.time_s,
                "breakdown": parts.to_dict("records"), "stats": {k: v for k, v in stats.items() if k != "layer_runs"},
                "layer_runs": stats["layer_runs"], "trace_metadata": trace.metadata,
            }  # fmt: skip
            (stage / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            result.to_perfetto(stage / "timeline.perfetto.json")
            fig, ax = plt.subplots(figsize=(8, 2.5 + 0.35 * len(parts)))
            plot.breakdown(parts, ax=ax, title=f"{trace.source} on {system.name}")
            plot.save_figure(fig, stage / "breakdown.png")
    if out is not None:
        extra = (", memory.csv" if memory is not None else "") + (", energy.csv" if has_energy(result) else "")
        print(f"wrote {out}/ (ops.parquet{extra}, summary.json, timeline.perfetto.json, breakdown.png)")
    return 0


def _report_memory(trace, system):
    """Print what one GPU of the busiest pipeline stage holds at the iteration's peak, and which
    stages do not fit in a GPU's memory; return :func:`~gpusim.trace.memory.memory_footprint`'s table."""
    from gpusim.trace.memory import memory_footprint

    table = memory_footprint(trace, system)
    peak = table.loc[table["total_bytes"].idxmax()]
    parts = {"weights": "weights_bytes", "gradients": "gradients_bytes", "optimizer": "optimizer_bytes",
             "activations": "activations_bytes", "KV cache": "kv_cache_bytes"}
    shown = ", ".join(f"{name} {peak[column] / 2**30:.1f}" for name, column in parts.items() if peak[column])
    print(f"memory per GPU at the peak: {peak['total_bytes'] / 2**30:.1f} GiB of {peak['capacity_bytes'] / 2**30:.0f} "
          f"GiB (stage {peak['stage']}: {shown})")
    over = table.loc[~table["fits"], "stage"].tolist()
    if over:
        print(f"  does not fit: stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} need more than "
              f"gpu.hbm.capacity_bytes; the simulated times assume the memory is there")
    if trace.metadata.get("memory_whole_model"):
        whole = memory_footprint(trace, system, whole_model=True)
        layers = trace.metadata["model"]["layers"]
        print(f"  the whole model, in this layout: {whole['total_bytes'].max() / 2**30:.1f} GiB per GPU at the peak "
              f"({'fits' if whole['fits'].all() else 'does not fit'}; {layers} "
              f"layer{'s' if layers != 1 else ''} simulated)")
    return table


def _simulate_sweep(args: argparse.Namespace, trace, system, grid: dict[str, list[object]]) -> int:
    """``gpusim simulate --vary``: replay the trace (or the trace a workload function makes of each
    point's model options) at every combination of the values; print a row per point and the
    elasticities, and write sweep.csv (per point and GPU), points.csv, elasticities.csv and sweep.png."""
    from gpusim.cli import SWEEP_OUTPUTS, parse_overrides, report_sweep
    from gpusim.parameter_sweep import SYSTEM_KEY, sweep_parameters
    from gpusim.sweep import check_scheduler
    from gpusim.trace.trace import Trace

    if args.scheduler:
        check_scheduler(args.scheduler)
    cache = output_folder(args.sweep_cache, "--sweep-cache")
    out = output_folder(args.out)
    with staged_outputs(out) as stage:
        table = sweep_parameters(system, trace, grid, overrides=None if system else parse_overrides(args.set),
                                 mode=args.mode, memory_policy=args.policy, cache_layers=not args.no_cache,
                                 within_power_limit=args.within_power_limit,
                                 workers=args.workers, scheduler=args.scheduler, cache=cache,
                                 progress=not args.quiet)
        where = system.name if system else ", ".join(map(str, grid[SYSTEM_KEY]))
        label = trace.source if isinstance(trace, Trace) else args.model
        print(f"{label} on {where}, per iteration (the breakdown's mean over the simulated GPUs):")
        report_sweep(table, stage, f"{label} on {where}")
        if isinstance(trace, Trace):
            _report_not_modelled(trace)
    if out is not None:
        print(f"wrote {out}/ ({SWEEP_OUTPUTS})")
    return 0


def cmd_validate_trace(args: argparse.Namespace) -> int:
    """Replay an imported trace and report simulated versus measured time per kernel class and overall."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from gpusim import plot
    from gpusim.trace.compare import compare, kernel_comparison

    _check_iteration("validate-trace", args.iteration, args.trace)
    if args.dataflow is not None and trace_format(args.trace) != "kineto":
        flag = "--dataflow" if args.dataflow else "--no-dataflow"
        raise GpusimError(f"validate-trace: {flag} chooses how the tensors of a Kineto trace (.json/.json.gz) are "
                          f"inferred, but the trace {args.trace} is not one")
    system = _system(args)
    trace = load_any(args.trace, unsupported=args.unsupported or "error", iteration=args.iteration,
                     dataflow=args.dataflow is not False)
    if args.model_host:
        trace = trace.with_modelled_host()
    if not trace.frame["measured_s"].notna().any():
        raise GpusimError(f"validate-trace: {trace.source} has no measured durations to compare with")
    mode = _mode(args, trace, system)
    out = output_folder(args.out)
    with staged_outputs(out) as stage:
        result = trace.replay(system, mode=mode, progress=not args.quiet)
        spans = trace.metadata.get("measured_span_s") or {}
        span = spans.get(0, spans.get("0")) if mode == "symmetric" else (max(spans.values()) if spans else None)
        table = compare(result.ops, span, result.kernels)
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            shown = table.copy()
            for column in ("measured_s", "simulated_s", "not_simulated_s"):
                shown[column] = (shown[column] * 1e3).round(4)
            shown = shown.rename(columns={"measured_s": "measured_ms", "simulated_s": "simulated_ms",
                                          "not_simulated_s": "not_simulated_ms"})
            print(f"{trace.source} on {system.name} ({mode} mode)")
            print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        _report_not_modelled(trace)
        if stage is not None:
            table.to_csv(stage / "validate_trace.csv", index=False)
            kernels = kernel_comparison(result.ops, result.kernels)
            kernels.to_csv(stage / "kernels.csv", index=False)
            fig, axes = plt.subplots(1, 2, figsize=(11, 4))
            modelled = kernels[kernels["modelled"]]
            for klass, group in modelled.groupby("kernel_class"):
                plot.measured_vs_simulated(group, ax=axes[0], label=klass)
            if not modelled.empty:
                axes[0].legend(fontsize="small")
            axes[0].set_title("per kernel")
            classes = table[table["kernels"] > 0].rename(columns={"measured_s": "measured",
                                                                  "simulated_s": "simulated"})
            classes = classes.melt(id_vars="kernel_class", value_vars=["measured", "simulated"], var_name="source",
                                   value_name="time_s")
            classes["time_ms"] = classes["time_s"] * 1e3
            plot.bars(classes, "kernel_class", "time_ms", hue="source", ax=axes[1], ylabel="time (ms)")
            axes[1].set_title("per kernel class")
            plot.save_figure(fig, stage / "validate_trace.png")
    if out is not None:
        print(f"wrote {out}/ (validate_trace.csv, kernels.csv, validate_trace.png)")
    if args.tolerance is not None:
        everything = table[table["kernel_class"] == "all kernels"].iloc[0]
        if everything["kernels"] == 0:
            print(f"validate-trace: nothing to check against the tolerance: all {everything['not_simulated']} kernels "
                  "were replayed as their measured durations")
            return 1
        whole = everything["error"]
        if not abs(whole) <= args.tolerance:
            print(f"validate-trace: all-kernel error {whole:+.1%} exceeds the tolerance {args.tolerance:.1%}")
            return 1
    return 0


def _common(parser: argparse.ArgumentParser, system_required: bool = True) -> None:
    parser.add_argument("--system", required=system_required,
                        help="preset name or YAML file" + ("" if system_required else
                                                           " (with --vary, or the systems to compare: --vary system=A,B)"))
    parser.add_argument("--set", action="append", help="override, e.g. links.bandwidth=300GB/s (repeatable)")
    parser.add_argument("--mode", default="auto", choices=["auto", "full", "symmetric"],
                        help="simulation mode (auto: symmetric when every GPU does the same work)")
    parser.add_argument("--unsupported", choices=["error", "delay"],
                        help="imported kernels gpusim cannot model: fail (default), or replay as measured-duration "
                             "delays")
    parser.add_argument("--out", help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gpusim simulate``."""
    from gpusim.trace.generator import DTYPES

    parser.add_argument("--trace", help="trace file: .csv/.parquet, Kineto .json(.gz), Chakra .et; or a folder or "
                                           "pattern of a job's Kineto or Chakra traces, one a rank")
    parser.add_argument("--model", help="generate a transformer trace (see gpusim.trace.list_models())")
    parser.add_argument("--phase", choices=["train", "prompt", "decode"], help="--model: the phase to generate (default: train)")
    parser.add_argument("--tp", type=int, help="--model: tensor-parallel degree (default: 1)")
    parser.add_argument("--dp", type=int, help="--model: data-parallel degree (default: 1)")
    parser.add_argument("--pp", type=int, help="--model: pipeline-parallel degree (default: 1)")
    parser.add_argument("--ep", type=int, help="--model with experts: expert-parallel degree, a divisor of --dp "
                        "(default: 1)")
    parser.add_argument("--expert-capacity-factor", type=float,
                        help="--model with experts: tokens each expert processes and the all-to-all moves, as a "
                             "multiple of the balanced share; with --expert-load, each rank's tokens beyond it "
                             "are dropped, 1 included (default: none: the balanced share, dropless with "
                             "--expert-load; --vary expert_capacity_factor=none,1,1.25)")
    parser.add_argument("--expert-load", type=expert_shares,
                        help="--model with experts: uneven, dropless routing, each expert's share of the routed "
                             "tokens, e.g. 4,1,1,1,1,1,1,1, or one set per layer, 4,1,1,1/1,4,1,1 "
                             "(--vary expert_load=1:1:1:1,4:1:1:1; default: balanced)")
    parser.add_argument("--expert-overlap-chunks", type=int,
                        help="--model with experts and --ep above 1: overlap the all-to-alls with the experts' GEMMs "
                             "in this many chunks of the tokens (default: 1, in turn)")
    parser.add_argument("--shared-expert-overlap", action="store_true", default=None,
                        help="--model with a shared expert and --ep above 1: run the shared expert beside the "
                             "all-to-alls, as Megatron-LM's --moe-shared-expert-overlap does")
    parser.add_argument("--expert-gemm", choices=["grouped", "sequential"],
                        help="--model with experts: each rank's experts' GEMMs in one kernel (batched, or grouped "
                             "under --expert-load; default) or one kernel per expert")
    parser.add_argument("--batch", type=int, help="--model: global batch in sequences (default: the model's)")
    parser.add_argument("--seq-len", type=int, help="--model: sequence length (default: the model's)")
    parser.add_argument("--microbatches", type=int, help="--model: microbatches (default: pp)")
    parser.add_argument("--schedule", choices=["1f1b", "gpipe"], help="--model, --phase train: pipeline schedule "
                        "(default: 1f1b)")
    parser.add_argument("--virtual-stages", type=positive_int,
                        help="--model: model chunks per pipeline stage, above 1 the interleaved 1F1B schedule "
                             "(Megatron-LM's virtual pipeline stages; needs --pp > 1, microbatches a multiple of it)")
    parser.add_argument("--recompute", nargs="?", const="full", choices=["full", "selective"],
                        help="--model, --phase train: activation recomputation, of every layer's forward pass "
                             "(full, the default when given alone) or of the core attention only (selective, "
                             "Megatron-LM's)")
    parser.add_argument("--layers", type=int, help="--model: use only this many of the model's layers")
    parser.add_argument("--decode-tokens", type=int,
                        help="--model, --phase decode: tokens generated (default: 1)")
    parser.add_argument("--prefill-tokens", type=int,
                        help="--model, --phase decode: a new prompt's chunk that every decoding step also processes "
                             "(chunked prefill, as Sarathi-Serve; default: 0)")
    parser.add_argument("--prefill-context", type=int,
                        help="--model, --phase decode, with --prefill-tokens: tokens of that prompt processed before "
                             "the first chunk (default: 0)")
    parser.add_argument("--attention", choices=["unfused", "flash"],
                        help="--model: attention as batched GEMMs and a softmax, or fused (FlashAttention-2) "
                             "(default: unfused)")
    parser.add_argument("--dtype", choices=DTYPES, help="--model: data type of the activations and weights (default: fp16)")
    parser.add_argument("--sequence-parallel", action="store_true", default=None,
                        help="--model, --phase train or prompt: Megatron-LM's sequence parallelism (norms and "
                             "dropouts on 1/tp of the tokens; reduce-scatters and all-gathers instead of all-reduces)")
    parser.add_argument("--async-tp-backward", action="store_true", default=None,
                        help="--model, --phase train: overlap the column-parallel layers' backward tensor-parallel "
                             "communication with their GEMMs on a tp_comm stream, as Megatron-LM does")
    parser.add_argument("--distributed-optimizer", action="store_true", default=None,
                        help="--model, --phase train: Megatron-LM's distributed optimizer (ZeRO-1): reduce-scatter "
                             "the gradients, update 1/dp of the parameters on each rank, all-gather them")
    parser.add_argument("--overlap-param-gather", action="store_true", default=None,
                        help="--model, --phase train, with --distributed-optimizer: all-gather the parameters at the "
                             "start of the iteration, each layer's forward pass waiting for its own, as Megatron-LM's "
                             "--overlap-param-gather")
    parser.add_argument("--vocab-divisible-by", type=positive_int,
                        help="--model: pad the vocabulary to a multiple of N x tp, as Megatron-LM's "
                             "--make-vocab-size-divisible-by (128 there) (default: 1, no padding)")
    parser.add_argument("--no-cache", action="store_true", help="simulate every layer (no layer caching)")
    parser.add_argument("--within-power-limit", action="store_true",
                        help="replay at the highest SM clock at which every GPU's average power is within its limit "
                             "(gpu.power.tdp_watts; several replays, every layer simulated; with --vary, at every "
                             "point, reported as clock_hz; docs/energy.md)")
    parser.add_argument("--overlap", choices=list(OVERLAP_FUNCTIONS),
                        help="overlap every GEMM with the reduce-scatter or all-reduce of its output: t3 (T3's fused "
                             "GEMM and reduce-scatter), decomposed (the GEMM cut into a kernel per rank beside a "
                             "CU-driven ring) or decomposed_dma (beside a DMA ring); an all-reduce becomes the "
                             "overlapped reduce-scatter and an all-gather")
    parser.add_argument("--overlap-gathers", choices=list(GATHER_FUNCTIONS),
                        help="overlap every all-gather with the GEMM right after it that consumes the gathered "
                             "tensor (sequence parallelism): decomposed_dma (a GEMM kernel per chunk as the DMA "
                             "engines deliver it, as Transformer Engine's overlap), decomposed (beside a CU-driven "
                             "ring on --overlap-channels CUs) or t3 (one GEMM kernel whose workgroups T3's tracker "
                             "triggers as their rows arrive)")
    parser.add_argument("--overlap-channels", type=positive_int,
                        help="--overlap decomposed, --overlap-gathers decomposed: CUs of their rings (default: "
                             "the node's collectives.cus)")
    parser.add_argument("--overlap-splits", type=positive_int,
                        help="--overlap decomposed or decomposed_dma: kernels per rank's chunk (default: 1)")
    parser.add_argument("--policy", choices=list(PICK_POLICIES),
                        help="memory-controller policy (default: each GPU's configured one; t3-mca for T3-MCA)")
    parser.add_argument("--vary", action="append", metavar="PATH=V1,V2,...",
                        help="replay at every combination of these values instead (a what-if sweep; repeatable), "
                             "e.g. links.bandwidth=75GB/s,300GB/s, a --model option such as tp=2,4,8 or seq-len=1024,4096, "
                             "or system=a100-sxm4,h100-sxm5: writes sweep.csv, points.csv, elasticities.csv and sweep.png")
    parser.add_argument("--workers", type=positive_int, help="--vary: processes (default: all CPUs)")
    parser.add_argument("--scheduler", help="--vary: address of a Dask scheduler to run the points on")
    parser.add_argument("--sweep-cache", help="--vary: folder of finished points; a rerun simulates only what changed")
    parser.add_argument("--iteration", type=int, help="--trace of Kineto traces: only the kernels of ProfilerStep#N")
    _common(parser, system_required=False)


def add_validate_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gpusim validate-trace``."""
    parser.add_argument("trace", help="measured trace: Kineto .json(.gz), Chakra .et/folder, or .csv/.parquet")
    parser.add_argument("--iteration", type=int, help="Kineto: only the kernels of ProfilerStep#N")
    parser.add_argument("--dataflow", action=argparse.BooleanOptionalAction,
                        help="Kineto: a kernel reads its stream predecessor's output where the sizes match "
                             "(warm in the L2) instead of a private input (default: on for Kineto traces)")
    parser.add_argument("--tolerance", type=non_negative_float,
                        help="exit with status 1 when the all-kernel error exceeds this fraction (e.g. 0.25)")
    parser.add_argument("--model-host", action="store_true",
                        help="issue kernels by the model's host thread (kernel_launch_ns per call) instead of at "
                             "the trace's measured launch times")
    _common(parser)
