"""Simulator-speed benchmarks: a bare simpy loop against gpusim on the cases the issues name.

Each case runs in its own process (so its peak memory can be read) on one core, ``--repeat`` times
(3 by default); the table reports the fastest run, as ``timeit`` does, since other load on a shared
machine only ever slows a run down, and beside it the slowest.  With ``--out`` the table replaces
the part of that Markdown file between the core-benchmarks markers (a new file is made of them and
the table); without it the table is printed.

    python benchmarks/run_benchmarks.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import simpy

from gpusim.arguments import positive_int

CASES = {
    "gemm-8192-mi210": {
        "what": "8192^3 fp16 GEMM on mi210",
        "system": "mi210",
        "ops": ["gemm m=8192 n=8192 k=8192 dtype=fp16"],
        "mode": "full",
        "target_s": 5.0,
    },
    "allreduce-256MiB-t3-ring8-full": {
        "what": "256 MiB ring all-reduce on t3-ring8, full mode (8 GPUs)",
        "system": "t3-ring8",
        "ops": ["allreduce nbytes=256MiB"],
        "mode": "full",
        "target_s": 5.0,
    },
    "tnlg-fc2-gemm-rs-symmetric": {
        "what": "T-NLG FC-2 (TP=8) GEMM + ring reduce-scatter on t3-ring8, symmetric mode",
        "system": "t3-ring8",
        "ops": ["gemm m=8192 n=4256 k=2128 dtype=fp16 out=c", "reducescatter nbytes=69730304 input=c"],
        "mode": "symmetric",
        "target_s": None,
    },
    "tnlg-fc2-t3-mca-symmetric": {
        "what": "T-NLG FC-2 (TP=8) T3-MCA fused GEMM + reduce-scatter on t3-ring8, symmetric mode",
        "system": "t3-ring8",
        "ops": ["gemm_rs m=8192 n=4256 k=2128 dtype=fp16"],
        "mode": "symmetric",
        "memory_policy": "t3-mca",
        "target_s": None,
    },
    "tnlg-fc2-gemm-rs-full": {
        "what": "T-NLG FC-2 (TP=8) GEMM + ring reduce-scatter on t3-ring8, full mode (8 GPUs)",
        "system": "t3-ring8",
        "ops": ["gemm m=8192 n=4256 k=2128 dtype=fp16 out=c", "reducescatter nbytes=69730304 input=c"],
        "mode": "full",
        "target_s": 30.0,
    },
}


START = "<!-- core-benchmarks:start -->"
END = "<!-- core-benchmarks:end -->"


def bare_simpy_rate(events: int = 1_000_000) -> float:
    """Bare timeouts per second of simpy in this process."""
    env = simpy.Environment()

    def ticker():
        for _ in range(events):
            yield env.timeout(1.0)

    env.process(ticker())
    start = time.perf_counter()
    env.run()
    return events / (time.perf_counter() - start)


def run_case(name: str) -> dict:
    """Run one case in this process and return its measurements."""
    import gpusim
    from gpusim.cli import parse_op

    case = CASES[name]
    ops = [parse_op(spec) for spec in case["ops"]]
    system = gpusim.load_system(case["system"])
    start = time.perf_counter()
    result = gpusim.run(system, ops, mode=case["mode"], memory_policy=case.get("memory_policy"))
    wall = time.perf_counter() - start
    requests = sum(v for k, v in result.counters.items() if k.endswith(".dram_requests"))
    return {
        "case": name,
        "wall_s": wall,
        "simulated_s": result.time_s,
        "events": result.stats["events"],
        "events_per_s": result.stats["events"] / wall,
        "dram_requests": requests,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bare_simpy_events_per_s": bare_simpy_rate(300_000),
    }


def page_around_table(out: str) -> tuple[str, str]:
    """The text of Markdown file ``out`` up to the table (its start marker) and from the end marker
    on; for a file that does not exist yet, the two markers.

    Raises
    ------
    ValueError
        When the file cannot be read and written (or made), or an existing file lacks the markers.
    """
    path = Path(out)
    try:
        if not path.exists():
            path.touch(exist_ok=False)  # can it be made?  (removed again: nothing is written before the runs)
            path.unlink()
            return f"{START}\n", f"{END}\n"
        with path.open("r+") as handle:  # readable and writable
            page = handle.read()
    except OSError as error:
        raise ValueError(f"cannot write it ({error.strerror})") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"not a text file ({error.reason})") from error
    before, start, rest = page.partition(START)
    _, end, after = rest.partition(END)
    if not (start and end):
        raise ValueError(f"an existing file needs the markers {START} and {END} (in this order) around the table")
    return before + START + "\n", END + after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="Markdown file to write the table into, between its core-benchmarks markers "
                                      "(a new file gets them); default: print")
    parser.add_argument("--case", action="append", choices=list(CASES), help="run only these cases")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs per case; the fastest is reported (default 3)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one)))
        return 0
    if args.out:
        try:
            before, after = page_around_table(args.out)
        except ValueError as error:
            parser.error(f"--out {args.out}: {error}")
    rows = []
    for name in args.case or list(CASES):
        runs = []
        for _ in range(args.repeat):
            output = subprocess.run(
                ["taskset", "-c", "0", sys.executable, __file__, "--one", name],
                check=True, capture_output=True, text=True,
            ).stdout.strip().splitlines()[-1]
            runs.append(json.loads(output))
        row = min(runs, key=lambda run: run["wall_s"])
        row["slowest_wall_s"] = max(run["wall_s"] for run in runs)
        rows.append(row)
        print(f"{name}: {row['wall_s']:.2f} s (slowest of {len(runs)}: {row['slowest_wall_s']:.2f} s)", file=sys.stderr)
    lines = [
        "| case | wall (s) | slowest run (s) | target (s) | simulated time | simpy events | events/s | ratio to bare simpy | DRAM requests | requests/s | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        case = CASES[row["case"]]
        target = f"{case['target_s']:.0f}" if case["target_s"] else "-"
        lines.append(
            f"| {case['what']} | {row['wall_s']:.2f} | {row['slowest_wall_s']:.2f} | {target} | {row['simulated_s'] * 1e3:.3f} ms | {row['events']:,} | "
            f"{row['events_per_s']:,.0f} | {row['events_per_s'] / row['bare_simpy_events_per_s']:.0%} | "
            f"{row['dram_requests']:,.0f} | {row['dram_requests'] / row['wall_s']:,.0f} | {row['peak_rss_mib']:.0f} |"
        )
    header = (
        f"Measured {date.today()} on {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"one core per case (taskset), fastest of {args.repeat} runs, "
        f"bare simpy: {rows[0]['bare_simpy_events_per_s']:,.0f} timeouts/s.\n\n"
    )
    text = header + "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(before + text + after)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
