"""Reproduce the near-memory optimizer study (dissertation chapter 6) and check the GPU baseline
against V100 measurements (seed 000, Tables 4.3-4.5).

    python validation/nmc_optimizer/reproduce.py --out out/nmc_optimizer [--quick] [--workers N]

Writes into ``--out``:

* ``lamb.csv``: LAMB on BERT-Large, near-memory ALUs of ``t3-table8.1`` against the ideal GPU at
  100, 90 and 80% of peak bandwidth, with 1x and 4x temporary storage, for both placements of the
  gradient norm; the dissertation's values beside ours and the relative error;
* ``adan_v100.csv``: one Adan step of BERT-base (IMDb fine-tuning, 201 tensors) on ``v100-sxm2`` in
  the four implementations: measured and simulated time and kernel counts;
* ``adam_h200.csv``: one Adam step of BERT-base (201 tensors, fp32) on ``h200-sxm`` in the four
  implementations: the H200 measurements of ``validation/measured/h200/optimizer.csv`` (the step's
  host-timed time, its kernels and their summed durations, from the PyTorch profiler) beside the
  simulated ones;
* ``end_to_end.csv``: simulated BERT-Large training iterations (chapter 4's configurations) with
  LAMB on the GPU and on NMC: LAMB's share of the iteration and the iteration's speedup, beside
  the dissertation's 9-20%;
* ``breakdown.csv``: where LAMB's time on NMC goes (column commands, row switches, GPU);
* ``energy.csv``: the energy of a LAMB step on the GPU's multi-tensor kernels and on NMC with 1x
  and 4x temporary storage, by component (``gpusim.energy``; docs/energy.md);
* ``sweep_*.csv``: temporary storage, banks per ALU, model size, HBM generation, divide and square
  root cost, the other optimizers (their columns mean what ``lamb.csv``'s of the same name mean;
  docs/nmc.md);
* ``*.png``: plots of all of these; ``lamb_nmc.perfetto.json``: a timeline of LAMB on NMC.

``--quick`` uses BERT-base for LAMB, fewer sweep points and only the multi-tensor Adan and Adam
cases (a minute); the full run takes several minutes, most of it the single-tensor cases.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

import gpusim
from gpusim import ops, plot
from gpusim.arguments import output_folder_or_exit, positive_int, run_script
from gpusim.output_files import staged_outputs
from gpusim.studies import nmc_optimizer as study

HERE = Path(__file__).resolve().parent
H200_OPTIMIZER = HERE.parents[0] / "measured" / "h200" / "optimizer.csv"
LAMB_TOLERANCE = 0.15
DATA_REDUCTION_TOLERANCE = 0.20
ADAN_TOLERANCE = 0.25  # the multi-tensor fused case


def reference_lamb() -> pd.DataFrame:
    """The dissertation's LAMB numbers (reference_lamb.csv)."""
    return pd.read_csv(HERE / "reference_lamb.csv")


def reference_adan() -> pd.DataFrame:
    """The measured Adan steps (reference_adan_v100.csv)."""
    return pd.read_csv(HERE / "reference_adan_v100.csv")


def lamb_table(model: str) -> pd.DataFrame:
    """Our LAMB speedups beside the dissertation's, both gradient-norm placements."""
    frame = pd.concat([study.lamb_speedups(model=model, grad_norm=g) for g in ("banks", "gpu")], ignore_index=True)
    reference = reference_lamb()
    speedups = reference[reference.quantity == "speedup"][["baseline", "temp_storage", "value"]]
    frame = frame.merge(speedups.rename(columns={"value": "reference_speedup"}), on=["baseline", "temp_storage"], how="left")
    frame["error"] = frame["speedup"] / frame["reference_speedup"] - 1
    data_reduction = reference.loc[reference.quantity == "data_reduction", "value"].iloc[0]
    frame["reference_data_reduction"] = data_reduction
    frame["data_reduction_error"] = frame["data_reduction"] / data_reduction - 1
    return frame


def end_to_end_table(quick: bool, workers: int | None) -> pd.DataFrame:
    """Simulated BERT iterations with LAMB on the GPU and on NMC, beside the dissertation's range."""
    if quick:
        frame = study.bert_iterations(model="bert-base", configs=("Ph1-B32-FP16",), workers=workers)
    else:
        frame = study.bert_iterations(workers=workers)
    reference = reference_lamb().set_index("quantity")["value"]
    low, high = 1 + reference["bert_iteration_speedup_low"], 1 + reference["bert_iteration_speedup_high"]
    frame["reference_low"], frame["reference_high"] = low, high
    frame["within_reference"] = frame["iteration_speedup"].between(low, high)
    return frame


def adan_table(quick: bool, workers: int | None) -> pd.DataFrame:
    """Simulated Adan steps beside the V100 measurements."""
    reference = reference_adan()
    if quick:
        reference = reference[reference.impl.str.startswith("multi")]
    simulated = study.gpu_steps("v100-sxm2", "bert-base-classifier", "adan", cases=list(reference.impl), workers=workers)
    frame = reference.merge(simulated[["system", "model", "impl", "simulated_ms", "kernels", "wall_s"]], on="impl")
    frame = frame.rename(columns={"kernels": "kernels_simulated"})
    frame["error"] = frame["simulated_ms"] / frame["measured_ms"] - 1
    frame["error_vs_active"] = frame["simulated_ms"] / frame["measured_active_ms"] - 1
    columns = ["system", "model", "case", "impl", "measured_ms", "measured_active_ms", "simulated_ms", "error",
               "error_vs_active", "kernels_measured", "kernels_simulated", "wall_s", "source"]
    return frame[columns]


def adam_h200_table(quick: bool, workers: int | None) -> pd.DataFrame:
    """Simulated Adam steps of BERT-base on the H200 beside the measured ones."""
    measured = pd.read_csv(H200_OPTIMIZER).query("model == 'bert-base-classifier' and algorithm == 'adam'")
    if quick:
        measured = measured[measured.impl.str.startswith("multi")]
    simulated = study.gpu_steps("h200-sxm", "bert-base-classifier", "adam", cases=list(measured.impl), workers=workers)
    frame = measured.merge(simulated[["system", "impl", "simulated_ms", "simulated_busy_ms", "kernels", "wall_s"]],
                           on="impl")
    frame = frame.rename(columns={"step_ms": "measured_ms", "kernel_busy_ms": "measured_busy_ms",
                                  "kernels_per_step": "kernels_measured", "kernels": "kernels_simulated"})
    frame["error"] = frame["simulated_ms"] / frame["measured_ms"] - 1
    frame["busy_error"] = frame["simulated_busy_ms"] / frame["measured_busy_ms"] - 1
    columns = ["system", "model", "impl", "measured_ms", "simulated_ms", "error", "measured_busy_ms", "simulated_busy_ms",
               "busy_error", "kernels_measured", "kernels_simulated", "wall_s"]
    return frame[columns].reset_index(drop=True)


def plot_lamb(frame: pd.DataFrame, out: Path) -> None:
    """``lamb.png``: LAMB's speedups (:func:`lamb_table`) beside the dissertation's, per gradient-norm placement."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, grad_norm in zip(axes, ("banks", "gpu")):
        part = frame[frame.grad_norm == grad_norm]
        plot.bars(part, x="baseline", y="speedup", hue="temp_storage", ax=ax,
                  ylabel="LAMB speedup over ideal GPU (x)")
        known = part.dropna(subset=["reference_speedup"]).drop_duplicates(["baseline", "temp_storage"])
        order = list(dict.fromkeys(part["baseline"]))
        offsets = {"1x": -0.125, "4x": 0.125}
        ax.plot([order.index(b) + offsets[t] for b, t in zip(known.baseline, known.temp_storage)],
                known.reference_speedup, "k*", markersize=10, label="dissertation")
        ax.set_title(f"LAMB on {_models(part)}, gradient norm: {grad_norm}")
        ax.legend(fontsize="small", loc="upper left")
    plot.save_figure(fig, out / "lamb.png")


def plot_end_to_end(frame: pd.DataFrame, out: Path) -> None:
    """``end_to_end.png``: the iterations' speedups (:func:`end_to_end_table`) and the dissertation's range."""
    fig, ax = plt.subplots(figsize=(7, 4))
    plot.bars(frame, x="config", y="iteration_speedup", hue="temp_storage", ax=ax,
              ylabel="speedup over LAMB on GPU (x)")
    ax.axhspan(frame["reference_low"].iloc[0], frame["reference_high"].iloc[0], color="0.85", zorder=0,
               label="dissertation: 9-20%")
    ax.set_ylim(1.0, max(1.25, frame["iteration_speedup"].max() * 1.05))
    ax.legend(fontsize="small", loc="upper left")
    ax.set_title(f"Simulated {_models(frame)} iterations, LAMB on NMC vs on the GPU")
    plot.save_figure(fig, out / "end_to_end.png")


def plot_adan(frame: pd.DataFrame, out: Path) -> None:
    """``adan_v100.png``: the Adan steps (:func:`adan_table`), measured and simulated, ms."""
    fig, ax = plt.subplots(figsize=(7, 4))
    long = frame.melt(id_vars="case", value_vars=["measured_ms", "measured_active_ms", "simulated_ms"],
                      var_name="kind", value_name="ms")
    plot.bars(long, x="case", y="ms", hue="kind", ax=ax, ylabel="Adan step, computation (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Adan on {_models(frame)}, V100: measured (seed 000) vs simulated")
    plot.save_figure(fig, out / "adan_v100.png")


def plot_adam_h200(frame: pd.DataFrame, out: Path) -> None:
    """``adam_h200.png``: the Adam steps (:func:`adam_h200_table`), measured and simulated, ms."""
    fig, ax = plt.subplots(figsize=(7, 4))
    long = frame.melt(id_vars="impl", value_vars=["measured_ms", "simulated_ms", "measured_busy_ms", "simulated_busy_ms"],
                      var_name="kind", value_name="ms")
    plot.bars(long, x="impl", y="ms", hue="kind", ax=ax, ylabel="Adam step (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Adam on {_models(frame)}, H200: measured vs simulated")
    plot.save_figure(fig, out / "adam_h200.png")


def _models(frame: pd.DataFrame) -> str:
    """The models of ``frame``'s rows, for a title."""
    return ", ".join(dict.fromkeys(frame["model"]))


def _value_ticks(ax, values: pd.Series) -> None:
    """Tick a log axis at the swept ``values`` themselves."""
    ticks = sorted(values.unique())
    ax.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    ax.minorticks_off()


def plot_sweeps(sweeps: dict[str, pd.DataFrame], out: Path) -> None:
    """``sweeps.png``: LAMB's speedup over the ideal GPU at peak bandwidth in every sweep (:func:`run_sweeps`)."""
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    axes = axes.ravel()
    speedup = "LAMB speedup over ideal GPU (x)"
    plot.lines(sweeps["temp_storage"], "temp_storage_bytes", "speedup", by="grad_norm", ax=axes[0], logx=True,
               xlabel="temporary storage per ALU (B)", ylabel=speedup)
    _value_ticks(axes[0], sweeps["temp_storage"]["temp_storage_bytes"])
    plot.lines(sweeps["banks_per_alu"], "banks_per_alu", "speedup", by="temp_storage", ax=axes[1], logx=True,
               xlabel="ALU sharing (banks per ALU)", ylabel=speedup)
    _value_ticks(axes[1], sweeps["banks_per_alu"]["banks_per_alu"])
    plot.lines(sweeps["models"], "parameters", "speedup", by="temp_storage", ax=axes[2], logx=True,
               xlabel="model size (parameters)", ylabel=speedup)
    plot.bars(sweeps["hbm"], x="hbm", y="speedup", hue="temp_storage", ax=axes[3], ylabel=speedup)
    plot.lines(sweeps["divide_cost"], "divide_cycles", "speedup", by="temp_storage", ax=axes[4], logx=True,
               xlabel="divide / square-root issue (ALU cycles per SIMD word)", ylabel=speedup)
    _value_ticks(axes[4], sweeps["divide_cost"]["divide_cycles"])
    plot.bars(sweeps["optimizers"], x="algorithm", y="speedup", ax=axes[5],
              ylabel="optimizer speedup over ideal GPU (x)")
    titles = {"temp_storage": "temporary storage", "banks_per_alu": "ALU sharing", "models": "model size",
              "hbm": "HBM generation", "divide_cost": "divide/sqrt cost", "optimizers": "optimizers"}
    for ax, (name, title) in zip(axes, titles.items()):
        ax.set_title(title if name == "models" else f"{title}: {_models(sweeps[name])}")
    plot.save_figure(fig, out / "sweeps.png")


def run_sweeps(quick: bool, workers: int | None, model: str) -> dict[str, pd.DataFrame]:
    common = {"workers": workers}
    storage = (256, 1024, 4096) if quick else (256, 512, 1024, 2048, 4096, 8192)
    models = ("bert-base", "bert-large") if quick else ("bert-base", "bert-large", "megatron-gpt2", "t-nlg", "gpt3")
    return {
        "temp_storage": study.sweep_temp_storage(storage, model=model, **common),
        "banks_per_alu": study.sweep_banks_per_alu((1, 4, 16) if quick else (1, 2, 4, 8, 16), model=model, **common),
        "models": study.sweep_models(models, **common),
        "hbm": study.sweep_hbm(model=model, **common),
        "divide_cost": study.sweep_divide_cost((1, 8) if quick else (1, 2, 4, 8, 16), model=model, **common),
        "optimizers": study.optimizers_on_nmc(model=model, **common),
    }


def checks_table(lamb: pd.DataFrame, adan: pd.DataFrame, end_to_end: pd.DataFrame) -> pd.DataFrame:
    """The issue's reference numbers beside ours: LAMB's speedups over the ideal GPU (gradient norm
    in the banks), the data moved (gradient norm on the GPU) and the fused multi-tensor Adan step
    gate ``--check`` with their tolerances; the BERT iterations' 9-20% is shown, not gated.  Each
    row names the model it simulated (``--quick`` compares smaller models with the references)."""
    rows = []
    for row in lamb[(lamb["grad_norm"] == "banks") & lamb["reference_speedup"].notna()].itertuples(index=False):
        rows.append({"check": f"lamb speedup {row.baseline} {row.temp_storage}", "model": row.model,
                     "simulated": row.speedup, "reference": row.reference_speedup, "tolerance": LAMB_TOLERANCE,
                     "error": row.error})
    reduction = lamb[lamb["grad_norm"] == "gpu"].iloc[0]
    rows.append({"check": "data moved between DRAM and the GPU, less by", "model": reduction["model"],
                 "simulated": reduction["data_reduction"], "reference": reduction["reference_data_reduction"],
                 "tolerance": DATA_REDUCTION_TOLERANCE, "error": reduction["data_reduction_error"]})
    fused = adan[adan["impl"] == "multi_fused"].iloc[0]
    rows.append({"check": "adan multi-tensor fused step on v100-sxm2 (ms)", "model": fused["model"],
                 "simulated": fused["simulated_ms"], "reference": fused["measured_ms"], "tolerance": ADAN_TOLERANCE,
                 "error": fused["error"]})
    frame = pd.DataFrame(rows)
    frame["status"] = ["ok" if abs(error) <= tolerance else "miss"
                       for error, tolerance in zip(frame["error"], frame["tolerance"])]
    iterations = pd.DataFrame({
        "check": [f"bert iteration speedup {row.config} {row.temp_storage}" for row in end_to_end.itertuples()],
        "model": end_to_end["model"],
        "simulated": end_to_end["iteration_speedup"], "reference": end_to_end["reference_low"],
        "status": ["info: within 9-20%" if inside else "info: outside 9-20%" for inside in end_to_end["within_reference"]],
    })
    return pd.concat([frame, iterations], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (CSV, PNG, timeline)")
    parser.add_argument("--quick", action="store_true", help="smaller models and fewer points")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes for the sweeps (default: all CPUs)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a reference number leaves its tolerance (checks.csv)")
    args = parser.parse_args(argv)
    final = output_folder_or_exit(parser, args.out, "--out")
    with staged_outputs(final) as out:  # all of this run's files, or none (an interrupted run leaves the last set)
        model = "bert-base" if args.quick else "bert-large"
        start = time.perf_counter()

        lamb = lamb_table(model)
        lamb.to_csv(out / "lamb.csv", index=False)
        plot_lamb(lamb, out)
        end_to_end = end_to_end_table(args.quick, args.workers)
        end_to_end.to_csv(out / "end_to_end.csv", index=False)
        plot_end_to_end(end_to_end, out)
        storage = gpusim.load_system("t3-table8.1").gpu.nmc.temp_storage_bytes
        breakdown = pd.concat(
            [study.nmc_breakdown(model=model, overrides={"gpu.nmc.temp_storage_bytes": storage * scale}).assign(
                temp_storage=f"{scale}x") for scale in (1, 4)]
        )
        breakdown.to_csv(out / "breakdown.csv", index=False)
        lamb_energy = study.lamb_energy(model=model)
        lamb_energy.to_csv(out / "energy.csv", index=False)

        adan = adan_table(args.quick, args.workers)
        adan.to_csv(out / "adan_v100.csv", index=False)
        plot_adan(adan, out)
        adam = adam_h200_table(args.quick, args.workers)
        adam.to_csv(out / "adam_h200.csv", index=False)
        plot_adam_h200(adam, out)

        sweeps = run_sweeps(args.quick, args.workers, model)
        for name, frame in sweeps.items():
            frame.drop(columns=["overrides"], errors="ignore").to_csv(out / f"sweep_{name}.csv", index=False)
        plot_sweeps(sweeps, out)

        timeline = gpusim.run(gpusim.load_system("t3-table8.1"),
                              ops.Optimizer("lamb", study.model_parameter_sizes("bert-base"), impl="nmc"))
        timeline.to_perfetto(out / "lamb_nmc.perfetto.json")

        with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
            print("LAMB on near-memory ALUs vs the ideal GPU (dissertation Figure 6.4)")
            print(lamb[["grad_norm", "baseline", "temp_storage", "temp_storage_bytes", "nmc_time_s", "speedup",
                        "reference_speedup", "error", "data_reduction", "data_reduction_error"]].to_string(index=False))
            print("\nWhere LAMB's time on NMC goes")
            print(breakdown.to_string(index=False))
            print("\nEnergy of a LAMB step (J; not evaluated in the dissertation, section 9.2)")
            print(lamb_energy.drop(columns=["system", "model"]).to_string(index=False))
            print("\nBERT iterations with LAMB on the GPU and on NMC (dissertation: 9-20% faster)")
            print(end_to_end.to_string(index=False))
            print("\nAdan step on V100 (seed 000 Tables 4.3-4.5)")
            print(adan.drop(columns=["source"]).to_string(index=False))
            print("\nAdam step on H200 (validation/measured/h200/optimizer.csv; busy: the kernels' summed durations)")
            print(adam.to_string(index=False))
        checks = checks_table(lamb, adan, end_to_end)
        checks.to_csv(out / "checks.csv", index=False)
        with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
            print(f"\nReference numbers{' (--quick compares BERT-base with BERT-Large references)' if args.quick else ''}")
            print(checks.to_string(index=False))
        print(f"\nwrote {final}/ in {time.perf_counter() - start:.0f} s")
        missed = checks[checks["status"] == "miss"]
        if args.check and not missed.empty:
            print(f"--check: {len(missed)} reference numbers outside their tolerance: {', '.join(missed['check'])}")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(run_script(main, Path(__file__).parent.name + "/reproduce.py"))
