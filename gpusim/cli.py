"""The ``gpusim`` command: list presets, show a configuration, run ops, the demo.

Each subcommand is a function ``cmd_NAME(args)`` plus an entry in :data:`COMMANDS` that adds its
arguments; ``gpusim --help`` lists them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import string
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from gpusim import __version__
from gpusim import ops as gops
from gpusim.arguments import SEED_MAX, output_folder, positive_int, random_seed
from gpusim.config.gpu import MAX_CUS
from gpusim.errors import GpusimError, OpError
from gpusim.output_files import remove_empty_created_folders, staged_outputs
from gpusim.sched.executor import Stream
from gpusim.trace.commands import add_simulate_arguments, add_validate_trace_arguments, cmd_simulate, cmd_validate_trace
from gpusim.units import QuantityError, parse_quantity

OP_NAMES = {
    "gemm": gops.Gemm,
    "grouped_gemm": gops.GroupedGemm,
    "gemm_rs": gops.GemmReduceScatter,
    "gemm_ag": gops.GemmAllGather,
    "gemm_a2a": gops.GemmAllToAll,
    "gemm_rs_decomposed": gops.DecomposedGemmReduceScatter,
    "ag_gemm_decomposed": gops.DecomposedAllGatherGemm,
    "ag_gemm": gops.AllGatherGemm,
    "elementwise": gops.Elementwise,
    "softmax": gops.RowReduce,
    "layernorm": gops.RowReduce,
    "rmsnorm": gops.RowReduce,
    "rowreduce": gops.RowReduce,
    "attention": gops.Attention,
    "allreduce": gops.AllReduce,
    "reducescatter": gops.ReduceScatter,
    "allgather": gops.AllGather,
    "alltoall": gops.AllToAll,
    "sendrecv": gops.SendRecv,
    "optimizer": gops.Optimizer,
}
SIZE_FIELDS = {"nbytes"}
TRUE_WORDS = ("1", "true", "yes", "t")
FALSE_WORDS = ("0", "false", "no", "f")


def _parse_int(text: str, field: str, spec: str) -> int:
    """A whole number; for a size field (``nbytes``) optionally with a unit (``1.5MiB``)."""
    what = "a whole number of bytes, e.g. 4096 or 1.5MiB" if field in SIZE_FIELDS else "a whole number"
    try:
        value = parse_quantity(text, "bytes") if field in SIZE_FIELDS else float(text)
    except (ValueError, QuantityError) as exc:
        raise GpusimError(f"op {spec!r}: field {field!r} expects {what}, got {text!r}") from exc
    if not math.isfinite(value) or value != int(value):
        raise GpusimError(f"op {spec!r}: field {field!r} expects {what}, got {text!r}")
    return int(value)


def parse_op(spec: str) -> gops.Op:
    """Parse ``"gemm m=8192 n=8192 k=8192 dtype=fp16"`` (or ``allreduce nbytes=64MiB``...) into an op.

    The first word names the op (:data:`OP_NAMES`; ``softmax``, ``layernorm`` and ``rmsnorm`` are
    row reductions of that kind, ``rowreduce`` takes ``kind=``).  Values without a key come first
    and give the op's fields in order (``gemm 8192 8192 8192 fp16``: m, n, k, dtype; ``allreduce
    64MiB``: nbytes; ``softmax 4096 8192``: rows, cols); each field may be given once and
    is read as the op's field is typed (an attention's ``k=`` names a tensor, a GEMM's is a
    number).  ``ranks``, ``inputs`` and an optimizer's ``sizes`` are comma-separated lists; an
    optimizer's ``model=`` gives the sizes of a model's parameter tensors
    (:data:`gpusim.studies.nmc_optimizer.MODELS`); a grouped GEMM's ``shapes`` are its problems'
    ``MxNxK``, comma-separated.
    """
    words = spec.split()
    if not words or words[0].lower() not in OP_NAMES:
        likely = difflib.get_close_matches(words[0].lower(), OP_NAMES, n=1) if words else []
        meant = f" (did you mean {likely[0]!r}?)" if likely else ""
        raise GpusimError(f"op {spec!r}: must start with one of {', '.join(OP_NAMES)}{meant}")
    name = words[0].lower()
    cls = OP_NAMES[name]
    types = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.init}
    in_order = [field for field in types if field not in ("name", "ranks")
                and not (cls is gops.RowReduce and name != "rowreduce" and field == "kind")]
    fields: dict[str, object] = {}
    for index, (previous, word) in enumerate(zip(words, words[1:])):
        if "=" not in word:
            if "=" in previous:
                raise GpusimError(f"op {spec!r}: expected key=value after {previous!r}, got {word!r} "
                                  f"(a value has no spaces: write {previous}{word}; values without a key "
                                  f"come first)")
            if index >= len(in_order):
                raise GpusimError(f"op {spec!r}: {name} takes at most {len(in_order)} values without a key "
                                  f"({', '.join(in_order)}), got {word!r} too")
            word = f"{in_order[index]}={word}"
        key, value = word.split("=", 1)
        key = {"size": "nbytes", "bytes": "nbytes"}.get(key, key)
        if cls is gops.Optimizer and key == "model":  # the parameter tensors of a model definition
            from gpusim.studies.nmc_optimizer import MODELS, model_parameter_sizes

            key = "sizes"
            if value not in MODELS:
                raise GpusimError(f"op {spec!r}: field 'model' expects one of {', '.join(MODELS)}, got {value!r}")
            value = ",".join(map(str, model_parameter_sizes(value)))
        if key in fields:
            raise GpusimError(f"op {spec!r}: field {key!r} is given more than once")
        typed = types.get(key, "str")
        if cls is gops.Optimizer and key == "sizes":
            fields[key] = tuple(_parse_int(item, key, spec) for item in value.split(","))
        elif cls is gops.GroupedGemm and key == "shapes":  # 512x4096x1024,64x4096x1024
            fields[key] = tuple(tuple(_parse_int(dim, key, spec) for dim in item.lower().split("x"))
                                for item in value.split(","))
        elif key in SIZE_FIELDS or typed.startswith("int"):
            fields[key] = _parse_int(value, key, spec)
        elif typed == "bool":
            if value.lower() not in TRUE_WORDS + FALSE_WORDS:
                raise GpusimError(f"op {spec!r}: field {key!r} expects true or false, got {value!r}")
            fields[key] = value.lower() in TRUE_WORDS
        elif key == "ranks":
            try:
                fields[key] = [int(r) for r in value.split(",")]
            except ValueError:
                raise GpusimError(f"op {spec!r}: field 'ranks' expects GPU indices such as 0,1,2, got {value!r}") from None
        elif typed.startswith("tuple[str"):
            fields[key] = tuple(value.split(","))
        else:
            fields[key] = value
    if cls is gops.RowReduce and name != "rowreduce" and fields.setdefault("kind", name) != name:
        raise GpusimError(f"op {spec!r}: {name} is the row reduction of kind {name!r}, but kind={fields['kind']!r} "
                          f"is given; use 'rowreduce kind=...' or drop kind=")
    known = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in known]
    takes = ", ".join(names)
    unknown = [key for key in fields if key not in names]
    if unknown:
        likely = difflib.get_close_matches(unknown[0], names, n=1)
        meant = f" (did you mean {likely[0]!r}?)" if likely else ""
        raise GpusimError(f"op {spec!r}: unknown field {unknown[0]!r}{meant}; {name} takes {takes}")
    missing = [f.name for f in known if f.name not in fields
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise GpusimError(f"op {spec!r}: missing field {missing[0]!r}; {name} takes {takes}")
    try:
        return cls(**fields)
    except OpError as exc:  # a value the op refuses (m=0, dtype=fp99): say which --op gave it
        raise OpError(f"op {spec!r}: {exc}") from None


def _cu_ranges(text: str, spec: str) -> tuple[int, ...]:
    """``"0-65"`` or ``"0-31,64-95"`` as the CU indices they name."""
    cus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
            raise GpusimError(f"op {spec!r}: cus= expects CU ranges such as 0-65 or 0-31,64-95, got {text!r}")
        if int(last or first) >= MAX_CUS:  # before listing a range that could fill the memory
            raise GpusimError(f"op {spec!r}: cus= names CU {int(last or first)}, but a GPU has at most {MAX_CUS} CUs")
        cus.extend(range(int(first), int(last or first) + 1))
    return tuple(dict.fromkeys(cus))


def split_stream(spec: str) -> tuple[str, Stream]:
    """An op spec without its ``stream=NAME`` and ``cus=RANGES`` words, and the stream they name (the
    API's default stream when neither is given; ``cus=`` masks the stream to those CUs).

    Raises
    ------
    GpusimError
        ``stream=`` or ``cus=`` given twice or without a value, or CU ranges that do not read.
    """
    words = spec.split()
    given: dict[str, str] = {}
    for key in ("stream", "cus"):
        named = [word.removeprefix(f"{key}=") for word in words if word.startswith(f"{key}=")]
        if len(named) > 1 or (named and not named[0]):
            raise GpusimError(f"op {spec!r}: give one {key}={'NAME' if key == 'stream' else 'RANGES'} at most")
        if named:
            given[key] = named[0]
    rest = " ".join(word for word in words if not word.startswith(("stream=", "cus=")))
    mask = _cu_ranges(given["cus"], spec) if "cus" in given else None
    return rest, Stream(given.get("stream", Stream().name), cu_mask=mask)


def _streams_of(specs: list[str]) -> tuple[list[str], list[Stream]]:
    """The op specs without their stream words, and each op's stream.

    Raises
    ------
    GpusimError
        Two ops naming one stream with different CUs.
    """
    specs_only, streams = zip(*(split_stream(spec) for spec in specs), strict=True)
    masks: dict[str, Stream] = {}
    for spec, stream in zip(specs, streams, strict=True):
        if masks.setdefault(stream.name, stream) != stream:
            raise GpusimError(f"op {spec!r}: stream {stream.name!r} is given other CUs by another op; one stream, one mask")
    return list(specs_only), list(streams)


def parse_overrides(pairs: list[str] | None) -> dict[str, object]:
    """Turn ``--set PATH=VALUE`` arguments into overrides: the value as typed, which the loader reads as
    its field's type (``gpu.name=007`` stays text, ``gpu.num_cus=160`` is a number), and ``null`` for
    no value (a field that may be left out)."""
    result: dict[str, object] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise GpusimError(f"--set expects PATH=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        if key in result:
            raise GpusimError(f"--set {key!r} is given more than once; give each field one value")
        result[key] = None if value.strip().lower() == "null" else value
    return result


def parse_vary(specs: list[str]) -> dict[str, list[object]]:
    """Turn ``--vary PATH=V1,V2,...`` arguments into a grid (values as typed, ``null`` for no value)."""
    grid: dict[str, list[object]] = {}
    for spec in specs:
        key, _, text = spec.partition("=")
        values = [value.strip() for value in text.split(",")]
        if not key.strip() or not text.strip() or not all(values):
            raise GpusimError(f"--vary expects PATH=VALUE,VALUE,... (e.g. gpu.num_cus=80,160), got {spec!r}")
        if key in grid:
            raise GpusimError(f"--vary {key!r} is given more than once; list all its values in one --vary")
        grid[key] = [None if value.lower() == "null" else value for value in values]
    return grid


def _as_number(text: object) -> object:
    """``text`` as an int or a float where it reads as one (``"1024"``, ``"0.5"``), a size with a
    byte unit as its bytes (``"1MiB"``: 1048576, an int where whole), else as it is."""
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            continue
    try:
        nbytes = parse_quantity(text, "bytes", require_unit=True)
    except QuantityError:
        return text
    return int(nbytes) if nbytes.is_integer() else nbytes


def template_names(specs: list[str]) -> list[str]:
    """The ``{name}`` placeholders of op specs (``"allreduce nbytes={size}"``), in order.

    Raises
    ------
    GpusimError
        A placeholder that is not a plain name (a conversion such as ``!r`` or a format such as
        ``:>8`` included), or a brace without its partner.
    """
    names: list[str] = []
    for spec in specs:
        try:
            parts = list(string.Formatter().parse(spec))
        except ValueError as exc:  # "{size" or "size}"
            raise GpusimError(f"op {spec!r}: {exc}; a placeholder is a name in braces, such as {{size}}") from None
        for _, name, format_spec, conversion in parts:
            if name is not None and (not name.isidentifier() or format_spec or conversion):
                written = name + (f"!{conversion}" if conversion else "") + (f":{format_spec}" if format_spec else "")
                raise GpusimError(f"op {spec!r}: a placeholder must be a name such as {{size}}, got {{{written}}}")
            if name and name not in names:
                names.append(name)
    return names


def cmd_list(args: argparse.Namespace) -> int:
    """Print the known presets, the transformer models ``simulate --model`` generates and the data
    sets ``validate --dataset`` compares."""
    from gpusim.config.loader import list_presets
    from gpusim.trace import list_models
    from gpusim.validation import DATASETS

    presets = list_presets()
    print("GPUs:      " + ", ".join(presets["gpus"]))
    print("Nodes:     " + ", ".join(presets["nodes"]))
    print("Models:    " + ", ".join(list_models()) + "  (gpusim simulate --model)")
    print("Data sets: " + ", ".join(DATASETS) + "  (gpusim validate --dataset)")
    return 0


def cmd_show_config(args: argparse.Namespace) -> int:
    """Print a preset's resolved configuration as YAML."""
    from gpusim.system import load_system

    system = load_system(args.name, parse_overrides(args.set))
    if args.set:
        print(f"# {args.name} with --set {' '.join(args.set)} (its name and description below are the preset's)")
    print(system.to_yaml(), end="")
    gpu = system.gpu
    print(
        f"# derived: {gpu.matrix_flops_per_s('fp16') / 1e12:.1f} TFLOP/s fp16 matrix peak, "
        f"{gpu.hbm.bandwidth_bytes_per_s / 1e12:.3f} TB/s HBM, {gpu.l2.bandwidth_bytes_per_s / 1e12:.2f} TB/s L2"
    )
    return 0


def timeline_figure(result, title: str):
    """The figure of ``gpusim run --out``'s timeline.png: the ops of every GPU and stream that ran
    one, over time (ms), and the DRAM traffic (GB/s) of the lowest-numbered GPU that ran an op
    (not for a trace replayed with layer caching, :attr:`gpusim.results.Result.traffic_on_timeline`)."""
    import matplotlib.pyplot as plt

    from gpusim import plot

    lanes = result.ops[["gpu", "stream"]].drop_duplicates()
    gpu = int(lanes["gpu"].min()) if not lanes.empty else 0
    if not result.traffic_on_timeline:  # layer caching: the traffic is not on the ops' time axis
        fig, ax = plt.subplots(figsize=(9, 2.5 + 0.25 * len(lanes)))
        plot.timeline(result.ops, ax=ax)
        ax.set_title(f"{title}\n(layer caching: no DRAM traffic over time; --no-cache simulates every row)")
        return fig
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.5 + 0.25 * len(lanes)))
    plot.timeline(result.ops, ax=axes[0])
    axes[0].set_title(title)
    plot.dram_bandwidth(result.dram_bandwidth(gpu), ax=axes[1], title=f"GPU {gpu} DRAM traffic")
    return fig


def write_outputs(result, out: Path, title: str) -> None:
    """Write a result's tables, a timeline plot and a Perfetto trace into the existing folder ``out``."""
    from gpusim import plot
    from gpusim.energy import has_energy

    result.ops.to_csv(out / "ops.csv", index=False)
    result.summary().to_csv(out / "summary.csv", index=False)
    if has_energy(result):
        result.energy().to_csv(out / "energy.csv", index=False)
    plot.save_figure(timeline_figure(result, title), out / "timeline.png")
    result.to_perfetto(out / "timeline.perfetto.json")


def cmd_run(args: argparse.Namespace) -> int:
    """Simulate ops given on the command line."""
    import pandas as pd

    from gpusim.energy import describe, has_energy
    from gpusim.simulate import run
    from gpusim.system import load_system

    system = load_system(args.system, parse_overrides(args.set))
    specs, streams = _streams_of(args.op)
    op_list = [parse_op(spec) for spec in specs]
    out = output_folder(args.out)
    with staged_outputs(out) as stage:
        if args.within_power_limit:
            from gpusim.power_limit import describe_clock, run_within_power_limit

            result = run_within_power_limit(system, op_list, streams=streams, mode=args.mode, memory_policy=args.policy,
                                            progress=not args.quiet)
            print(describe_clock(result))
        else:
            result = run(system, op_list, streams, mode=args.mode, memory_policy=args.policy, progress=not args.quiet)
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(result.summary()[["name", "kind", "impl", "gpus", "duration_s", "tflop_per_s",
                                    "gb_per_s"]].to_string(index=False))
        print(f"total {result.time_s * 1e3:.3f} ms simulated ({result.stats['mode']} mode); "
              f"{result.stats['events']} events in {result.stats['wall_s']:.2f} s")
        energy_line = describe(result)
        if energy_line is not None:
            print(energy_line)
        if stage is not None:
            write_outputs(result, stage, f"{system.name}")
    if out is not None:
        print(f"wrote {out}/ (ops.csv, summary.csv{', energy.csv' if has_energy(result) else ''}, timeline.png, "
              "timeline.perfetto.json)")
    return 0


def report_sweep(table, stage: Path | None, title: str) -> None:
    """Print a :func:`~gpusim.parameter_sweep.sweep_parameters` table's points (times in ms) and
    elasticities, and write sweep.csv, points.csv, elasticities.csv and sweep.png into ``stage``
    (nothing when it is None)."""
    import pandas as pd

    from gpusim import plot
    from gpusim.parameter_sweep import elasticities, elasticity_lines, point_totals, points_in_ms, varied_fields

    points = point_totals(table)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(points_in_ms(points).to_string(index=False))
    print("\n".join([f"{len(points)} points", *elasticity_lines(table)]))
    over = int(points["over_tdp"].sum()) if "over_tdp" in points.columns else 0
    if over:
        print(f"{over} of {len(points)} points average more than the GPUs' power limit (over_tdp); "
              f"--within-power-limit runs each at the clock the limit allows")
    if stage is not None:
        table.to_csv(stage / "sweep.csv", index=False)
        points.to_csv(stage / "points.csv", index=False)
        elasticities(table).to_csv(stage / "elasticities.csv", index=False)
        plot.save_figure(plot.sweep_totals(points, varied_fields(table), title=title).figure, stage / "sweep.png")


SWEEP_OUTPUTS = "sweep.csv, points.csv, elasticities.csv, sweep.png"
"""What :func:`report_sweep` writes."""


def _check_varied_keys(grid: dict[str, list[object]], names: list[str]) -> None:
    """Refuse a key of ``gpusim sweep``'s grid that is neither a field nor one of the ops' placeholder
    ``names`` (nor ``system``).

    Raises
    ------
    GpusimError
        Naming the key, and the field it names under ``gpu.`` where it is a GPU's (``clock``).
    """
    from gpusim.config.gpu import GpuConfig
    from gpusim.config.node import SystemConfig
    from gpusim.config.quantities import UNIT_SUFFIXES
    from gpusim.parameter_sweep import SYSTEM_KEY

    unused = [key for key in grid if "." not in key and key not in (SYSTEM_KEY, *names, *SystemConfig.model_fields)]
    if unused:
        key = unused[0]
        spellings = [key, *(key + suffix for suffix in UNIT_SUFFIXES)]  # clock for clock_hz
        hint = f"; the GPU's field is gpu.{key}" if any(name in GpuConfig.model_fields for name in spellings) else ""
        raise GpusimError(f"sweep: --vary {key} is neither a field (such as gpu.num_cus) nor a placeholder {{{key}}} "
                          f"of the ops{hint}")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Simulate ops over a grid of hardware values."""
    from gpusim.parameter_sweep import SYSTEM_KEY, WorkloadFunction, sweep_parameters
    from gpusim.sweep import check_scheduler
    from gpusim.system import load_system

    grid = parse_vary(args.vary)
    system = load_system(args.system, parse_overrides(args.set)) if args.system else None
    if (system is None) == (SYSTEM_KEY not in grid):
        raise GpusimError(f"sweep: give --system, or the systems to compare as --vary {SYSTEM_KEY}=NAME,NAME "
                          f"(one of the two, not both)")
    specs, streams = _streams_of(args.op)
    names = template_names(specs)
    unset = [name for name in names if name not in grid]
    if unset:
        raise GpusimError(f"sweep: the ops use {{{unset[0]}}}; give its values with --vary {unset[0]}=VALUE,VALUE")
    _check_varied_keys(grid, names)
    grid.update((name, [_as_number(value) for value in grid[name]]) for name in names)  # columns of numbers
    op_list = WorkloadFunction(lambda **values: [parse_op(spec.format(**values)) for spec in specs], names) \
        if names else [parse_op(spec) for spec in specs]
    if args.scheduler:
        check_scheduler(args.scheduler)
    cache = output_folder(args.cache, "--cache")
    out = output_folder(args.out)
    with staged_outputs(out) as stage:
        table = sweep_parameters(system, op_list, grid, overrides=None if system else parse_overrides(args.set),
                                 streams=streams, mode=args.mode, memory_policy=args.policy,
                                 within_power_limit=args.within_power_limit,
                                 workers=args.workers, scheduler=args.scheduler, cache=cache,
                                 progress=not args.quiet)
        report_sweep(table, stage, f"{system.name if system else 'systems'}: {len(args.op)} op(s)")
    if out is not None:
        print(f"wrote {out}/ ({SWEEP_OUTPUTS})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main demo (see :mod:`gpusim.demo`)."""
    from gpusim.demo import main as demo_main

    return demo_main(output_folder(args.out), quick=args.quick)


def cmd_validate(args: argparse.Namespace) -> int:
    """Compare the simulator with measured data; exit 1 when an error leaves its tolerance."""
    import pandas as pd

    from gpusim import validation
    from gpusim.system import load_system

    if args.vidur and not args.system:
        raise GpusimError("validate --vidur: give the preset to simulate it on with --system")
    if args.system and not args.vidur:
        raise GpusimError("validate --system: only a --vidur profile takes a preset (each --dataset has its own)")
    overrides = parse_overrides(args.set)
    if args.system:
        load_system(args.system, overrides)  # an unknown preset or override fails here, before any simulation
    extra = [validation.vidur_dataset(path, args.system) for path in args.vidur or []]
    names = [] if extra and not args.dataset else list(dict.fromkeys(args.dataset or validation.DATASETS))
    given = " ".join(f"{key}={value}" for key, value in overrides.items())
    if overrides:
        for system in dict.fromkeys(validation.get(name).system for name in names):
            load_system(system, overrides)
        print(f"with the overrides {given} at every point (not the presets' calibration)")
    out = output_folder(args.out)
    tables = []
    broken: list[str] = []
    subsets: list[str] = []
    with staged_outputs(out) as stage:  # a data set that fails leaves none of the others' files behind
        for dataset in [validation.get(name) for name in names] + extra:
            name = dataset.name
            frame, table, violations = validation.report(
                dataset, stage, points=args.points, seed=args.seed, mode=args.mode, workers=args.workers,
                progress=not args.quiet, overrides=overrides,
            )
            limits = ", ".join(f"{stat} <= {limit:.0%}" for stat, limit in dataset.tolerances.items())
            table["tolerance"] = [limits if subset == "all" else "" for subset in table["subset"]]
            # the tolerances judge the whole data set: its groups' rows carry no verdict of their own
            table["verdict"] = [("FAIL" if violations else "ok") if subset == "all" else "" for subset in table["subset"]]
            if overrides:
                table["overrides"] = given
            tables.append(table)
            broken += violations
            subsets.append(f"{name} {len(frame)} of {len(dataset.load())}")
        table = pd.concat(tables, ignore_index=True)
        shown = table.copy()
        for column in ("median", "p90", "max"):
            shown[column] = shown[column].map(lambda value: f"{value:.1%}")
        shown["bias"] = shown["bias"].map(lambda value: f"{value:+.1%}")
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(shown.to_string(index=False))
        if stage is not None:
            table.to_csv(stage / "summary.csv", index=False)
    if out is not None:
        print(f"wrote {out}/ (summary.csv, one CSV and one PNG per data set)")
    if broken:
        print("validation FAILED:\n  " + "\n  ".join(broken), file=sys.stderr)
        return 1
    print("validation passed" + (f" (on random subsets of the points: {', '.join(subsets)})" if args.points else ""))
    return 0


def _add_validate(parser: argparse.ArgumentParser) -> None:
    from gpusim.validation import DATASETS

    parser.add_argument("--dataset", action="append", choices=list(DATASETS),
                        help="data set to compare (repeatable, each compared once; default: all)")
    parser.add_argument("--vidur", action="append", metavar="PATH",
                        help="also (or, without --dataset, only) compare a vidur MLP profile as vidur writes it "
                             "(data/profiling/compute/<gpu>/<model>/mlp.csv), simulated on --system (repeatable)")
    parser.add_argument("--system", help="preset a --vidur profile is simulated on")
    parser.add_argument("--out", default="out/validate",
                        help="folder for the CSVs, plots and summary.csv (default: out/validate in the current folder)")
    parser.add_argument("--points", type=positive_int, default=None,
                        help="simulate a random subset of at most this many points per data set, spread evenly "
                             "over its groups (default: all)")
    parser.add_argument("--seed", type=random_seed, default=0, help=f"seed of the random subset (0 to {SEED_MAX})")
    parser.add_argument("--mode", default="full", choices=["full", "symmetric"],
                        help="simulation mode of single-node collectives (default: full; multi-node ones run in "
                             "full mode)")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes (default: all CPUs)")
    parser.add_argument("--set", action="append", metavar="PATH=VALUE",
                        help="override at every point of every data set, over its preset and its own settings, to "
                             "try a calibration value, e.g. gpu.l2.hit_latency_ns=250ns (repeatable; summary.csv "
                             "records them)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_run(parser: argparse.ArgumentParser) -> None:
    from gpusim.hw.memctrl import PICK_POLICIES

    parser.add_argument("--system", required=True, help="preset name or YAML file")
    parser.add_argument("--op", action="append", required=True,
                        help='e.g. "gemm m=8192 n=8192 k=8192 dtype=fp16" (or "gemm 8192 8192 8192 fp16": values without a key, '
                             'first, give the op\'s fields in order) or "allreduce nbytes=64MiB algorithm=auto" '
                             "(auto: direct for alltoall, ring for the other collectives); stream=NAME puts it on a "
                             "stream of its own, beside the others (default: all on one stream, in order), and "
                             "cus=0-65 masks that stream to those CUs; ops: "
                             f"{', '.join(OP_NAMES)} (gemm_rs, gemm_ag, gemm_a2a: T3's fused GEMM and collective; "
                             "gemm_rs_decomposed: the software overlap it competes with; ag_gemm_decomposed: an "
                             "all-gather overlapped with the GEMM that consumes it)")
    parser.add_argument("--mode", default="auto", choices=["full", "symmetric", "auto"],
                        help="auto (the default, as in sweep and simulate) takes symmetric where it is exact for "
                             "the ops, else full; full simulates every GPU; symmetric simulates rank 0 only (every "
                             "op must run on rank 0)")
    parser.add_argument("--policy", default=None, choices=list(PICK_POLICIES),
                        help="memory-controller policy (default: each GPU's configured one)")
    parser.add_argument("--set", action="append", help="override, e.g. gpu.num_cus=160 (repeatable)")
    parser.add_argument("--within-power-limit", action="store_true",
                        help="simulate at the highest SM clock at which every GPU's average power is within its "
                             "limit (gpu.power.tdp_watts; several runs, a progress bar over them; docs/energy.md)")
    parser.add_argument("--out", help="folder for ops.csv, summary.csv, energy.csv (where the GPU has a power "
                        "model), timeline.png and timeline.perfetto.json (Perfetto)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    from gpusim.hw.memctrl import PICK_POLICIES

    parser.add_argument("--system", help="preset name or YAML file (or the systems to compare: --vary system=A,B)")
    parser.add_argument("--op", action="append", required=True,
                        help='an op as gpusim run takes it, e.g. "gemm_rs m=8192 n=4256 k=2128" (repeatable; stream=NAME '
                             "and cus=RANGES as in gpusim run); "
                             '{name} in it takes the values of --vary name=... (e.g. "allreduce nbytes={size}" '
                             "--vary size=1MiB,64MiB)")
    parser.add_argument("--vary", action="append", required=True, metavar="PATH=V1,V2,...",
                        help="a field and its values, e.g. links.bandwidth=75GB/s,150GB/s, or system=h100-sxm5,h200-sxm "
                             "(repeatable: every combination runs, the last --vary fastest)")
    parser.add_argument("--set", action="append",
                        help="override at every point, e.g. gpu.l2.capacity=32MiB (repeatable)")
    parser.add_argument("--mode", default="auto", choices=["full", "symmetric", "auto"],
                        help="auto (default) takes symmetric where it is exact for the ops, else full")
    parser.add_argument("--policy", default=None, choices=list(PICK_POLICIES),
                        help="memory-controller policy (default: each GPU's configured one)")
    parser.add_argument("--within-power-limit", action="store_true",
                        help="run every point at the highest SM clock within its power limit and report it as "
                             "clock_hz (e.g. --vary gpu.power.tdp_watts=400,550,700; docs/energy.md)")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes (default: all CPUs)")
    parser.add_argument("--scheduler", help="address of a Dask scheduler to run the points on (the dist extra)")
    parser.add_argument("--cache", help="folder of finished points: a rerun simulates only what changed")
    parser.add_argument("--out", help="folder for sweep.csv (per point and op), points.csv, elasticities.csv and sweep.png")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="preset name or YAML file")
    parser.add_argument("--set", action="append", help="override, e.g. gpu.num_cus=160 (repeatable)")


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="out/demo", help="output folder")
    parser.add_argument("--quick", action="store_true", help="a smaller case")


COMMANDS: dict[str, tuple[Callable, Callable[[argparse.ArgumentParser], None] | None, str]] = {
    "list": (cmd_list, None, "list hardware presets, transformer models and validation data sets"),
    "show-config": (cmd_show_config, _add_show, "print a preset's resolved configuration"),
    "run": (cmd_run, _add_run, "simulate ops on a system"),
    "sweep": (cmd_sweep, _add_sweep, "simulate ops over a grid of hardware values (what-if)"),
    "demo": (cmd_demo, _add_demo, "run the main demo"),
    "simulate": (cmd_simulate, add_simulate_arguments, "replay a trace or a generated transformer iteration"),
    "validate-trace": (cmd_validate_trace, add_validate_trace_arguments,
                       "replay a measured trace and compare simulated with measured times"),
    "validate": (cmd_validate, _add_validate, "compare the simulator with measured hardware data (fails loudly)"),
}


def _in_cli_words(text: str) -> str:
    """The library's advice in the command line's spelling (``mode='full'`` is ``--mode full``)."""
    return text.replace("mode='full'", "--mode full").replace("mode='symmetric'", "--mode symmetric")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print a warning as ``gpusim: warning: MESSAGE`` on standard error."""
    print(f"gpusim: warning: {_in_cli_words(str(message))}", file=file or sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The ``gpusim`` command's argument parser, a subcommand per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="gpusim", description="Cycle-approximate multi-GPU simulator")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (handler, add_arguments, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if add_arguments is not None:
            add_arguments(command)
        command.set_defaults(handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpusim`` command."""
    args = build_parser().parse_args(argv)
    if "MPLBACKEND" not in os.environ:  # figures go to files, never to windows (and the environment that
        import matplotlib  # child processes inherit stays as it was)

        matplotlib.use("Agg")
    try:
        try:
            with warnings.catch_warnings():  # the library's warnings in the command line's words, not its source lines
                warnings.showwarning = _show_warning
                status = args.handler(args)
        except BaseException:
            remove_empty_created_folders()
            raise
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return status
    except GpusimError as exc:
        print(f"gpusim: error: {_in_cli_words(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: outputs are written whole or not at all
        print("gpusim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``gpusim show-config x | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # an output that cannot be written (a full disk, a folder removed meanwhile)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"gpusim: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
