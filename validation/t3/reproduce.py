"""Reproduce the dissertation's T3 results (seeds/002 chapter 8) with gpusim, beside its numbers.

Usage::

    python validation/t3/reproduce.py --out out/t3            # everything (<= 10 min on 2 cores)
    python validation/t3/reproduce.py --out out/t3 --check    # exit 1 when a figure leaves its tolerance
    python validation/t3/reproduce.py --out out/t3 --subset ci    # the two cases the text names, all configurations

Writes into ``--out``: ``speedups.csv`` (model, tp, sublayer, config, time_s, speedup and the GEMM /
RS / AG split of Figs. 8.13-8.14), ``dram.csv`` (Fig. 8.16), ``dram_timeline.csv`` (Fig. 8.15),
``cu_sharing.csv`` (Fig. 8.4), ``future_2x_cus.csv`` (Fig. 8.18), ``end_to_end.csv`` (Fig. 8.17),
``large_models.csv`` (section 8.5.4), ``software_overlap.csv`` (the GEMM decomposed in software
beside T3), ``end_to_end_replayed.csv`` (the iterations again, with the overlapped sub-layers replayed
inside the generated layer instead of substituted), ``energy.csv`` (one GPU's energy and average power in
Sequential, T3 and T3-MCA; not in the dissertation), ``summary.csv`` (every reference number beside ours) and a
PNG per figure.  All simulations run as one :func:`gpusim.sweep.sweep` (parallel processes, a
progress bar, and a cache under ``--out`` so that a rerun only redoes what changed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from gpusim import plot
from gpusim.arguments import output_folder_or_exit, positive_int, run_script
from gpusim.output_files import staged_outputs
from gpusim.studies import t3
from gpusim.sweep import sweep

plt = plot.plt

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference.csv"
CI_CASES = (("T-NLG", 16, "FC-1"), ("Mega-GPT-2", 16, "OP"))
"""The two sub-layers the text gives an ideal-overlap speedup for (section 8.5.1.1)."""


def points(subset: str) -> list[dict]:
    """Every simulation of the reproduction (or of the ``ci`` subset)."""
    if subset == "ci":
        cases = [p for p in t3.case_points(t3.MAIN_MODELS) if (p["model"], p["tp"], p["sublayer"]) in CI_CASES]
        return t3.tagged("case", cases) + t3.tagged("decomposed", t3.decomposed_points(cases=CI_CASES))
    result = t3.tagged("case", t3.case_points(t3.MAIN_MODELS))
    result += t3.tagged("decomposed", t3.decomposed_points(t3.MAIN_MODELS, splits=t3.DECOMPOSED_SPLITS))
    result += t3.tagged("decomposed", t3.decomposed_points(t3.LARGE_MODELS))
    result += t3.tagged("case", t3.case_points(t3.LARGE_MODELS))
    result += t3.tagged("case", t3.case_points(t3.MAIN_MODELS, tps=(8,), overrides={"gpu.num_cus": 160}), variant="2x-cus")
    result += t3.tagged("cu_split", t3.cu_sharing_points())
    result += t3.tagged("layer", t3.layer_points())
    result += t3.tagged("replayed", t3.replayed_points())
    result += t3.tagged("timeline", [{"model": "T-NLG", "tp": 8, "sublayer": "FC-2"}])
    return result


def _rows(raw: pd.DataFrame, study: str, variant: str = "base") -> pd.DataFrame:
    frame = raw[(raw["study"] == study) & (raw["variant"] == variant)]
    return frame.dropna(axis=1, how="all").drop(columns=["study", "variant", "overrides"], errors="ignore")


def metrics(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Our value of every metric that ``reference.csv`` can name (those we could compute)."""
    ours: dict[str, float] = {}
    table = tables["speedups"]
    for config in ("t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc"):
        values = table.loc[table["config"] == config, "speedup"]
        if len(values):
            ours[f"speedup_geomean.{config}"] = t3.geomean(values)
            ours[f"speedup_max.{config}"] = float(values.max())
    for row in table.itertuples(index=False):
        ours[f"speedup.{row.config}.{row.model}.{row.tp}.{row.sublayer}"] = row.speedup
    wide = table.pivot_table(index=t3.CASE, columns="config", values="time_s")
    ours["ideal_rs_nmc_extra_max"] = float((wide["ideal-overlap"] / wide["ideal-rs-nmc"]).max())
    for row in tables["nmc_rs"].itertuples(index=False):
        ours[f"nmc_rs_speedup.tp{row.tp}"] = row.speedup
    reductions = tables["dram_reductions"]
    ours["dram_reduction_geomean.t3-mca"] = 1 - t3.geomean(1 - reductions["reduction"])
    ours["dram_reduction_max.t3-mca"] = float(reductions["reduction"].max())
    for name in ("rs_read_ratio", "write_ratio", "gemm_read_ratio"):
        ours[f"{name}_geomean"] = t3.geomean(reductions[name])
    for tp, frame in reductions.groupby("tp"):
        ours[f"rs_read_ratio_geomean.tp{tp}"] = t3.geomean(frame["rs_read_ratio"])
    sharing = tables.get("cu_sharing")
    if sharing is not None and len(sharing):
        splits = {split: frame for split, frame in sharing.groupby("split")}
        ours["cu_sharing.ar_slowdown.8cus"] = t3.geomean(splits["72-8"]["ar_norm"])
        ours["cu_sharing.ar_slowdown.16cus"] = t3.geomean(splits["64-16"]["ar_norm"])
        ours["cu_sharing.gemm_slowdown.64cus"] = t3.geomean(splits["64-16"]["gemm_norm"])
        for split, frame in splits.items():
            ours[f"cu_sharing.speedup_geomean.{split}"] = t3.geomean(frame["speedup"])
    e2e = tables.get("end_to_end")
    if e2e is not None and len(e2e):
        for large, prefix in ((False, ""), (True, "large_models.")):
            frame = e2e[e2e["model"].isin(t3.LARGE_MODELS) == large]
            for (setting, config), group in frame.groupby(["setting", "config"]):
                ours[f"{prefix}end_to_end_geomean.{setting}.{config}"] = t3.geomean(group["speedup"])
                ours[f"{prefix}end_to_end_max.{setting}.{config}"] = float(group["speedup"].max())
    large = tables.get("large_models")
    if large is not None and len(large):
        for config, frame in large.groupby("config"):
            ours[f"large_models.speedup_geomean.{config}"] = t3.geomean(frame["speedup"])
            ours[f"large_models.speedup_max.{config}"] = float(frame["speedup"].max())
    return ours


def summary(ours: dict[str, float]) -> pd.DataFrame:
    """``reference.csv`` with our value, the difference and a status for every metric we computed."""
    reference = pd.read_csv(REFERENCE)
    reference["ours"] = reference["metric"].map(ours)
    reference = reference.dropna(subset=["ours"]).reset_index(drop=True)
    reference["difference"] = reference["ours"] - reference["reference"]
    has_tolerance = reference["tolerance"].notna()
    within = reference["difference"].abs() <= reference["tolerance"] + 1e-12
    reference["status"] = "info"
    reference.loc[has_tolerance & within, "status"] = "ok"
    reference.loc[has_tolerance & ~within, "status"] = "MISS"
    return reference[["metric", "ours", "reference", "difference", "tolerance", "status", "source", "note"]]


def tables_from(raw: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """All result tables from the sweep's rows."""
    cases = _rows(raw, "case")
    main = cases[cases["model"].isin(t3.MAIN_MODELS)]
    tables = {"raw_cases": cases, "speedups": t3.speedups(main)}
    tables["dram"] = t3.dram_table(main)
    tables["energy"] = t3.energy_table(main)
    tables["dram_reductions"] = t3.dram_reductions(tables["dram"])
    tables["nmc_rs"] = t3.nmc_reduce_scatter(main)
    large = cases[cases["model"].isin(t3.LARGE_MODELS)]
    if len(large):
        tables["large_models"] = t3.speedups(large)
    future = _rows(raw, "case", "2x-cus")
    if len(future):
        future_table = t3.speedups(future)
        base = tables["speedups"].set_index(t3.CASE + ["config"])["speedup"]
        future_table["speedup_1x"] = [base.get(tuple(key)) for key in future_table[t3.CASE + ["config"]].values]
        tables["future_2x_cus"] = future_table
    every_case = pd.concat([tables["speedups"], tables.get("large_models", pd.DataFrame())], ignore_index=True)
    decomposed = _rows(raw, "decomposed")
    if len(decomposed):
        tables["software_overlap"] = t3.software_overlap(decomposed, every_case)
    split_rows = _rows(raw, "cu_split")
    if len(split_rows):
        tables["cu_sharing"] = t3.cu_sharing(split_rows)
    layer_rows = _rows(raw, "layer")
    if len(layer_rows):
        decomposed_rows = [t3.best_decomposed(tables["software_overlap"])] if "software_overlap" in tables else []
        all_speedups = pd.concat([every_case, *decomposed_rows], ignore_index=True)
        tables["end_to_end"] = t3.end_to_end(layer_rows, all_speedups)
    replayed = _rows(raw, "replayed")
    if len(replayed):
        tables["end_to_end_replayed"] = t3.end_to_end_replayed(replayed, tables.get("end_to_end"))
    timeline = _rows(raw, "timeline")
    if len(timeline):
        tables["dram_timeline"] = timeline
    return tables


def _case_label(frame: pd.DataFrame) -> pd.Series:
    return frame["model"] + " TP" + frame["tp"].astype(str) + " " + frame["sublayer"]


def write_plots(tables: dict[str, pd.DataFrame], out: Path) -> None:
    """One PNG per figure."""
    table = tables["speedups"].copy()
    table["case"] = _case_label(table)
    fig, ax = plt.subplots(figsize=(12, 4))
    plot.bars(table, "case", "speedup", hue="config", ax=ax, ylabel="speedup over Sequential (x)")
    ax.axhline(1.0, color="k", linewidth=0.6)
    ax.set_title("Fig. 8.14: sub-layer speedups (gpusim)")
    plot.save_figure(fig, out / "fig8_14_speedups.png")

    seq = table[table["config"] == "sequential"].melt(id_vars=["case", "time_s"], value_vars=["gemm_s", "rs_s", "ag_s"],
                                                       var_name="kernel", value_name="seconds")
    seq["share"] = seq["seconds"] / seq["time_s"] * 100
    fig, ax = plt.subplots(figsize=(10, 4))
    plot.stacked_bars(seq, "case", "share", "kernel", ax=ax, ylabel="share of Sequential time (%)")
    ax.set_title("Fig. 8.13: GEMM / RS / AG time split (gpusim)")
    plot.save_figure(fig, out / "fig8_13_breakdown.png")

    dram = tables["dram"].copy()
    dram["case"] = _case_label(dram) + " " + dram["config"]
    dram = dram[dram["config"] != "t3"]
    dram["GB"] = dram["bytes"] / 1e9
    fig, ax = plt.subplots(figsize=(12, 4.5))
    plot.stacked_bars(dram, "case", "GB", "category", ax=ax, ylabel="DRAM traffic of one GPU (GB)")
    ax.set_title("Fig. 8.16: DRAM accesses, Sequential vs T3-MCA (gpusim)")
    plot.save_figure(fig, out / "fig8_16_dram.png")

    if "dram_timeline" in tables:
        timeline = tables["dram_timeline"]
        configs = list(dict.fromkeys(timeline["config"]))
        fig, axes = plt.subplots(len(configs), 1, figsize=(10, 2.6 * len(configs)), sharex=True, sharey=True)
        for ax, config in zip(axes, configs):
            wide = timeline[timeline["config"] == config].pivot_table(index="t_s", columns="category", values="gb_per_s",
                                                                       aggfunc="sum").fillna(0.0).reset_index()
            plot.dram_bandwidth(wide, ax=ax, title=f"T-NLG FC-2 TP8: {config}")
        plot.save_figure(fig, out / "fig8_15_dram_timeline.png")

    if "software_overlap" in tables:
        software = tables["software_overlap"].copy()
        software["case"] = _case_label(software)
        best = software[software["best"]]
        dma = software[(software["driver"] == "dma") & (software["splits"] == 1)].rename(columns={"speedup": "dma_speedup"})
        wide = best.merge(dma[["case", "dma_speedup"]], on="case")
        names = {"speedup": "decomposed, CUs (best split)", "dma_speedup": "decomposed, DMA + NMC",
                 "t3_mca_speedup": "t3-mca", "ideal_overlap_speedup": "ideal-overlap"}
        long = wide.melt(id_vars=["case"], value_vars=list(names), var_name="config",
                         value_name="speedup over Sequential (x)")
        long["config"] = long["config"].map(names)
        fig, ax = plt.subplots(figsize=(12, 4))
        plot.bars(long, "case", "speedup over Sequential (x)", hue="config", ax=ax, ylabel="speedup over Sequential (x)")
        ax.axhline(1.0, color="k", linewidth=0.6)
        ax.set_title("Software overlap by decomposition against T3-MCA (gpusim)")
        plot.save_figure(fig, out / "software_overlap.png")

    if "cu_sharing" in tables:
        sharing = tables["cu_sharing"].copy()
        sharing["case"] = sharing["model"] + " " + sharing["sublayer"]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        plot.bars(sharing, "case", "speedup", hue="split", ax=ax, ylabel="speedup over GEMM then AR (x)")
        ax.set_title("Fig. 8.4: potential-overlap speedup, CUs shared by GEMM and AR (gpusim)")
        plot.save_figure(fig, out / "fig8_4_cu_sharing.png")

    if "end_to_end" in tables:
        e2e = tables["end_to_end"].copy()
        e2e = e2e[e2e["config"].isin(["decomposed", "t3", "t3-mca"])]
        e2e["case"] = e2e["model"] + " TP" + e2e["tp"].astype(str) + " " + e2e["setting"]
        fig, ax = plt.subplots(figsize=(11, 3.8))
        plot.bars(e2e, "case", "speedup", hue="config", ax=ax, ylabel="speedup over Sequential (x)")
        ax.set_ylim(0.95, None)
        ax.set_title("Fig. 8.17: end-to-end speedups (gpusim)")
        plot.save_figure(fig, out / "fig8_17_end_to_end.png")

    if "future_2x_cus" in tables:
        future = tables["future_2x_cus"]
        future = future[future["config"] == "t3-mca"].copy()
        future["case"] = _case_label(future)
        long = future.melt(id_vars=["case"], value_vars=["speedup_1x", "speedup"], var_name="gpu", value_name="T3-MCA speedup")
        long["gpu"] = long["gpu"].map({"speedup_1x": "80 CUs", "speedup": "160 CUs"})
        fig, ax = plt.subplots(figsize=(9, 3.5))
        plot.bars(long, "case", "T3-MCA speedup", hue="gpu", ax=ax, ylabel="speedup over Sequential (x)")
        ax.set_title("Fig. 8.18: T3-MCA with 2x CUs, same network (gpusim)")
        plot.save_figure(fig, out / "fig8_18_2x_cus.png")


def main(argv: list[str] | None = None) -> int:
    """Run the reproduction; return 1 with ``--check`` when a metric leaves its tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (CSVs, PNGs, sweep cache)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure leaves its tolerance")
    parser.add_argument("--subset", choices=["all", "ci"], default="all", help="'ci': two sub-layers, all configurations")
    parser.add_argument("--workers", type=positive_int, default=None, help="processes (default: the CPUs available)")
    parser.add_argument("--no-cache", action="store_true", help="do not reuse results cached under --out")
    args = parser.parse_args(argv)
    final = output_folder_or_exit(parser, args.out, "--out")
    with staged_outputs(final) as out:  # all of this run's files, or none (an interrupted run leaves the last set)
        raw = sweep(t3.run_point, points(args.subset), workers=args.workers,
                    cache=None if args.no_cache else final / "cache", description="T3 study")
        tables = tables_from(raw)
        names = {"speedups": "speedups.csv", "dram": "dram.csv", "dram_reductions": "dram_reductions.csv",
                 "nmc_rs": "nmc_reduce_scatter.csv", "large_models": "large_models.csv", "future_2x_cus": "future_2x_cus.csv",
                 "cu_sharing": "cu_sharing.csv", "end_to_end": "end_to_end.csv", "dram_timeline": "dram_timeline.csv",
                 "software_overlap": "software_overlap.csv", "end_to_end_replayed": "end_to_end_replayed.csv",
                 "raw_cases": "simulations.csv", "energy": "energy.csv"}
        for key, name in names.items():
            if key in tables:
                tables[key].to_csv(out / name, index=False)
        table = summary(metrics(tables))
        if args.subset == "ci":  # aggregates over two cases say nothing about the 16-case references
            table = table[table["metric"].str.startswith("speedup.")].reset_index(drop=True)
        table.to_csv(out / "summary.csv", index=False)
        write_plots(tables, out)
        with pd.option_context("display.width", 200, "display.max_colwidth", 40, "display.max_rows", 200):
            print(table[["metric", "ours", "reference", "difference", "tolerance", "status"]].to_string(index=False,
                                                                                                  float_format="{:.3f}".format))
        if "software_overlap" in tables:
            software = tables["software_overlap"]
            for large, models in ((False, "main models"), (True, "TP32 models")):
                frame = software[software["model"].isin(t3.LARGE_MODELS) == large]
                if len(frame):
                    best, dma = frame[frame["best"]], frame[(frame["driver"] == "dma") & (frame["splits"] == 1)]
                    print(f"decomposed overlap, {models}, geomean speedup over Sequential: software (best CU variant) "
                          f"{t3.geomean(best['speedup']):.3f}, on DMA + NMC {t3.geomean(dma['speedup']):.3f}; "
                          f"T3-MCA {t3.geomean(best['t3_mca_speedup']):.3f} (software_overlap.csv)")
                    variants = frame.groupby(["driver", "channels", "splits"])["speedup"].apply(t3.geomean)
                    print("  by variant (driver, CUs, kernels per chunk): " + ", ".join(
                        f"{driver}-{channels} x{splits} {value:.3f}" for (driver, channels, splits), value in variants.items()))
        energy = tables["energy"][tables["energy"]["config"] != "sequential"]
        print("energy per GPU over Sequential, geomean (energy.csv; not in the dissertation, docs/energy.md): " + ", ".join(
            f"{config} {t3.geomean(frame['energy_ratio']):.3f} of the energy at {t3.geomean(frame['power_ratio']):.3f} "
            "of the average power" for config, frame in energy.groupby("config")))
        if "end_to_end_replayed" in tables:
            replayed = tables["end_to_end_replayed"]
            for setting, frame in replayed.groupby("setting"):
                geomeans = ", ".join(f"{config} {t3.geomean(group['speedup']):.3f}"
                                     for config, group in frame.groupby("config", sort=False) if config != "sequential")
                print(f"end to end with the overlaps replayed in the layer, {setting}, geomean speedup: {geomeans} "
                      "(end_to_end_replayed.csv)")
        misses = table[table["status"] == "MISS"]
        print(f"{len(table)} reference numbers: {(table['status'] == 'ok').sum()} within tolerance, {len(misses)} outside, "
              f"{(table['status'] == 'info').sum()} without a tolerance; wrote {final}/")
        return 1 if args.check and len(misses) else 0


if __name__ == "__main__":
    sys.exit(run_script(main, Path(__file__).parent.name + "/reproduce.py"))
