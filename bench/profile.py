"""Profile ``dra-gatekeeper serve`` under one workload with py-spy (when installed).

    python bench/profile.py [--workload get] [--concurrency 16] [--seconds 8] [--target gatekeeper]
        [--top 30] [--out FILE.txt]

Starts the fixed upstream and the gatekeeper as ``bench/run.py`` does, drives the workload
while ``py-spy record --format raw`` samples the gatekeeper, then prints the functions with the
most samples, inclusive and self (% of all samples). ``--out`` keeps the collapsed stacks
(for flamegraph tools).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # python bench/profile.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import generator_pool, run_load
from bench.run import WORKLOADS
from bench.stack import Stack

__all__ = ["main", "summarize"]


def summarize(collapsed: str, top: int) -> str:
    """Inclusive and self sample shares per function from py-spy's raw (collapsed) output."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    lines = [f"{total} samples", "", "inclusive:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
    lines += ["", "self:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="get", choices=sorted(WORKLOADS))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--target", default="gatekeeper")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 1
    with Stack.create(500) as stack:
        stack.start_all(audit=False, cel=args.target == "gatekeeper-cel", kube_rbac_proxy=False)
        pid = stack.procs[stack.serving[args.target]].pid
        raw = stack.workdir / "profile.txt"
        record = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(args.seconds)),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--nonblocking",
                "--rate",
                "500",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pool = generator_pool(2)
        result = {}

        def drive() -> None:
            result["load"] = run_load(
                pool,
                stack.targets[args.target],
                WORKLOADS[args.workload],
                concurrency=args.concurrency,
                duration=args.seconds,
            )

        thread = threading.Thread(target=drive)
        thread.start()
        thread.join()
        record.wait(timeout=args.seconds + 60)
        pool.shutdown()
        load = result["load"]
        print(
            f"{args.workload} c={args.concurrency} via {args.target}: {load.rps:,.0f} req/s, "
            f"p50 {load.percentile(0.5):.2f} ms, statuses {dict(load.statuses)}"
        )
        text = raw.read_text() if raw.exists() else ""
        if args.out:
            Path(args.out).write_text(text)
        print(summarize(text, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
