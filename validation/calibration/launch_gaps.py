"""The command processor's dispatch latencies in the public Kineto traces of ../shared/data.

Prints, per trace, the queued gap (a kernel already waiting behind its stream predecessor) and the
idle latency (launch return to start on an idle stream), the evidence behind every preset's
``dependent_launch_ns`` (docs/validation.md, "Calibrated parameters").
"""

import argparse
from pathlib import Path

from gpusim.trace.launch_gaps import stream_gaps, summarize

TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "kineto"

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("traces", nargs="*", type=Path, default=sorted(TRACES.glob("*.json.gz")))
    for trace in parser.parse_args().traces:
        gaps = stream_gaps(trace)
        print(f"{trace.name}\n{summarize(gaps).round(2).to_string()}")
        split_k = gaps[(gaps["kind"] == "queued") & gaps["name"].str.contains("splitK", case=False)]
        if len(split_k):
            print(f"  split-K reductions queued behind their GEMM: {split_k['wait_us'].round(2).tolist()} us")
