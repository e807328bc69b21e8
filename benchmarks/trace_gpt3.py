"""Speed of trace replay: one GPT-3 175B training iteration with TP=8 on t3-ring8 (issue 6).

Generates the trace (seeds/002 Table 8.2 inputs: SL=1K, B=2), replays it in symmetric mode with
layer caching, and prints a Markdown table row: wall and CPU time, simulated iteration time, events
and events/s, rows simulated out of all.  Run it on one core:

    taskset -c 0 python benchmarks/trace_gpt3.py
"""

from __future__ import annotations

import argparse
import resource
import time

import gpusim
from gpusim.arguments import positive_int
from gpusim.trace import breakdown, transformer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt3", help="model preset of workloads/models (default gpt3)")
    parser.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel degree (default 8)")
    parser.add_argument("--system", default="t3-ring8", help="hardware preset or YAML file (default t3-ring8)")
    parser.add_argument("--no-cache", action="store_true", help="simulate every layer (slow)")
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    trace = transformer(args.model, tp=args.tp, batch=2, seq_len=1024)
    generate_wall = time.perf_counter() - wall
    system = gpusim.load_system(args.system)
    wall, cpu = time.perf_counter(), time.process_time()
    result = gpusim.run(system, trace, mode="symmetric") if not args.no_cache else trace.replay(
        system, mode="symmetric", cache_layers=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = result.stats
    parts = breakdown(result.ops).iloc[0]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| case | generate (s) | replay wall (s) | replay CPU (s) | simulated iteration | rows simulated / all | "
          "events | events/s (CPU) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.model} train TP={args.tp} on {args.system}, symmetric, layer caching "
          f"{'off' if args.no_cache else 'on'} | {generate_wall:.1f} | {wall:.1f} | {cpu:.1f} | "
          f"{result.time_s * 1e3:.1f} ms | {stats['simulated_rows']} / {stats['trace_rows']} | {stats['events']} | "
          f"{stats['events'] / cpu:.0f} | {rss:.0f} |")
    print(f"\nbreakdown of GPU 0: compute {parts['compute_s'] * 1e3:.1f} ms, exposed communication "
          f"{parts['exposed_comm_s'] * 1e3:.1f} ms, overlapped {parts['overlapped_comm_s'] * 1e3:.1f} ms, "
          f"idle {parts['idle_s'] * 1e3:.1f} ms")
    by_kind = result.ops.groupby("kind")["duration_s"].agg(["count", "sum"])
    print("by kind: " + ", ".join(f"{kind} {row['sum'] * 1e3:.1f} ms ({int(row['count'])} ops)"
                                  for kind, row in by_kind.iterrows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
