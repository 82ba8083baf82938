"""The benchmark's results as Markdown tables (what docs/development.md#benchmarks shows)."""

from __future__ import annotations

from typing import Any

__all__ = ["render"]

_ORDER = (
    "direct",
    "nginx",
    "naive",
    "kube-rbac-proxy",
    "gatekeeper",
    "gatekeeper-unix",
    "gatekeeper-audit",
    "gatekeeper-cel",
)
# With --compare, gatekeeper@REF columns follow the others (a before/after in one run).


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "—"


def _throughput(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for workload, by_c in report["throughput"].items():
        first = next(iter(by_c.values()))
        targets = [t for t in _ORDER if t in first] + [t for t in first if t not in _ORDER]
        lines.append(
            f"\n#### {workload}: req/s (p50 / p99 ms; CPU µs per request of the serving process),"
            " median of runs\n"
        )
        lines.append(
            "| c | " + " | ".join(targets) + " | gk/direct | gk/nginx | gk/naive |"
            " gk p50 - direct p50 |"
        )
        lines.append("|---" * (len(targets) + 5) + "|")
        for c, row in by_c.items():
            cells = []
            for t in targets:
                cell = row[t]
                bad = f" ⚠{cell['errors']} errors {cell['statuses']}" if cell["errors"] else ""
                cpu = f"; {cell['cpu_us']:.0f} µs" if cell.get("cpu_us") else ""
                cells.append(
                    f"{cell['rps']:,.0f} ({cell['p50_ms']:.2f} / {cell['p99_ms']:.2f}{cpu})" + bad
                )
            gk = row.get("gatekeeper", {"rps": 0, "p50_ms": 0})
            direct = row.get("direct", {"rps": 0, "p50_ms": 0})
            nginx = row.get("nginx", {"rps": 0})
            naive = row.get("naive", {"rps": 0})
            added = gk["p50_ms"] - direct["p50_ms"]
            lines.append(
                f"| {c[2:]} | " + " | ".join(cells) + f" | {_ratio(gk['rps'], direct['rps'])}"
                f" | {_ratio(gk['rps'], nginx['rps'])} | {_ratio(gk['rps'], naive['rps'])}"
                f" | {added:+.2f} ms |"
            )
    return lines


_PROTOBUF_PAIRS = (("create", "create-pb"), ("update", "update-pb"))
"""JSON writes and their protobuf twins (client-go's default: one more upstream round trip,
the dry run that decodes the body)."""


def _encodings(report: dict[str, Any]) -> list[str]:
    """The gatekeeper's JSON and protobuf writes side by side, and what protobuf adds."""
    throughput = report["throughput"]
    pairs = [(j, p) for j, p in _PROTOBUF_PAIRS if j in throughput and p in throughput]
    if not pairs:
        return []
    lines = [
        "\n#### Writes through the gatekeeper, JSON vs protobuf (req/s; p50 ms; CPU µs per"
        " request)\n",
        "| write | c | JSON | protobuf | pb/JSON req/s | protobuf adds (p50, less direct's) |",
        "|---|---|---|---|---|---|",
    ]
    empty = {"rps": 0, "p50_ms": 0, "cpu_us": 0}
    for json_key, pb_key in pairs:
        for c, row in throughput[json_key].items():
            pb_row = throughput[pb_key].get(c, {})
            gk, gk_pb = row.get("gatekeeper", empty), pb_row.get("gatekeeper", empty)
            direct, direct_pb = row.get("direct", empty), pb_row.get("direct", empty)
            added = (gk_pb["p50_ms"] - gk["p50_ms"]) - (direct_pb["p50_ms"] - direct["p50_ms"])
            lines.append(
                f"| {json_key} | {c[2:]} | {gk['rps']:,.0f}; {gk['p50_ms']:.2f};"
                f" {gk['cpu_us']:.0f} µs | {gk_pb['rps']:,.0f}; {gk_pb['p50_ms']:.2f};"
                f" {gk_pb['cpu_us']:.0f} µs | {_ratio(gk_pb['rps'], gk['rps'])} |"
                f" {added:+.2f} ms |"
            )
    return lines


def _against_krp(report: dict[str, Any]) -> list[str]:
    """The issue's table: CPU µs per request of the serving process, gatekeeper ÷
    kube-rbac-proxy, from this run."""
    rows = [
        (workload, c, row)
        for workload, by_c in report["throughput"].items()
        for c, row in by_c.items()
        if "kube-rbac-proxy" in row and "gatekeeper" in row
    ]
    if not rows:
        return []
    lines = [
        "\n#### Against kube-rbac-proxy: CPU µs per request of the serving process (req/s)\n",
        "| workload | c | naive | kube-rbac-proxy | gatekeeper | gk ÷ krp |",
        "|---|---|---|---|---|---|",
    ]
    for workload, c, row in rows:
        cells = [
            f"{row[t]['cpu_us']:,.0f} ({row[t]['rps']:,.0f}/s)" if t in row else "—"
            for t in ("naive", "kube-rbac-proxy", "gatekeeper")
        ]
        ratio = _ratio(row["gatekeeper"]["cpu_us"], row["kube-rbac-proxy"]["cpu_us"])
        lines.append(f"| {workload} | {c[2:]} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def _cel(report: dict[str, Any]) -> list[str]:
    """What CEL validations on the kind add: p50 over direct's and CPU, without and with."""
    rows = [
        (workload, c, row)
        for workload, by_c in report["throughput"].items()
        for c, row in by_c.items()
        if {"gatekeeper", "gatekeeper-cel", "direct"} <= set(row)
    ]
    if not rows:
        return []
    lines = [
        "\n#### CEL: added p50 over direct (ms) and CPU µs per request, without and with the"
        " validations of bench/cel-policy.yaml\n",
        "| workload | c | without CEL | with CEL | CEL adds |",
        "|---|---|---|---|---|",
    ]
    for workload, c, row in rows:
        direct, plain, cel = row["direct"], row["gatekeeper"], row["gatekeeper-cel"]
        added = [cell["p50_ms"] - direct["p50_ms"] for cell in (plain, cel)]
        lines.append(
            f"| {workload} | {c[2:]} | {added[0]:+.2f} ms; {plain['cpu_us']:.0f} µs |"
            f" {added[1]:+.2f} ms; {cel['cpu_us']:.0f} µs | {added[1] - added[0]:+.2f} ms;"
            f" {cel['cpu_us'] - plain['cpu_us']:+.0f} µs |"
        )
    return lines


def _memory(report: dict[str, Any]) -> list[str]:
    memory = report.get("memory")
    if not memory:
        return []
    lines = [
        "\n#### Memory of every process: RSS idle (started, nothing asked yet), after the load,"
        " and its peak (MB)\n",
        "| process | targets | idle | after load | peak |",
        "|---|---|---|---|---|",
    ]
    for name, m in memory.items():
        lines.append(
            f"| {name} | {', '.join(m['targets'])} | {m['idle_mb']:.1f} |"
            f" {m['after_load_mb']:.1f} | {m['peak_mb']:.1f} |"
        )
    return lines


def _engine(report: dict[str, Any]) -> list[str]:
    lines = [
        "\n#### Decision engine alone (best of 3, µs per call)\n",
        "| request | decide | parse |",
        "|---|---|---|",
    ]
    for row in report["engine"]:
        lines.append(f"| {row['name']} | {row['decide_us']:.1f} | {row['parse_us']:.1f} |")
    return lines


def _resources(report: dict[str, Any]) -> list[str]:
    r = report["resources"]
    delays = r["delay_ms"]
    gk = delays.get("gatekeeper", (0, 0))
    direct = delays.get("direct", (0, 0))
    return [
        "\n#### Memory, watches, audit\n",
        "| measure | value |",
        "|---|---|",
        f"| RSS idle | {r['rss_idle_mb']:.1f} MB |",
        f"| {r['big_list_mb']:.0f} MB pinned list streamed through | {r['big_list_seconds']:.2f} s,"
        f" RSS growth {r['big_list_growth_mb']:.1f} MB |",
        f"| {r['watches']} watches asked, {r['watches_open']} open end to end | RSS "
        f"{r['rss_watches_mb']:.1f} MB ({r['kb_per_watch']:.0f} KB per watch) |",
        f"| idle CPU with the watches open, over {r['idle_seconds']:.1f} s |"
        f" {r['idle_cpu_percent']:.2f} % of a core |",
        f"| watch event delay, {r['watches_open']} watches (p50 / p99) | gatekeeper "
        f"{gk[0]:.2f} / {gk[1]:.2f} ms; direct {direct[0]:.2f} / {direct[1]:.2f} ms |",
        f"| audit writer alone | {report['audit_writer_events_per_s']:,.0f} events/s |",
    ]


def _wrk(report: dict[str, Any]) -> list[str]:
    wrk = report.get("wrk_direct", {})
    if "skipped" in wrk or not wrk:
        return [f"\nwrk check of the generator: {wrk.get('skipped', 'not run')}"]
    direct = report["throughput"]
    lines = [
        "\n#### Load generator check: wrk vs this generator, against the direct upstream\n",
        "| workload | wrk req/s (p50 ms) | generator req/s (p50 ms) |",
        "|---|---|---|",
    ]
    for key, values in wrk.items():
        workload, c = key.split(" ")
        ours = direct.get(workload, {}).get(c, {}).get("direct")
        mine = f"{ours['rps']:,.0f} ({ours['p50_ms']:.2f})" if ours else "—"
        lines.append(
            f"| {key} | {values.get('rps', 0):,.0f} ({values.get('p50_ms', 0):.2f}) | {mine} |"
        )
    return lines


def render(report: dict[str, Any]) -> str:
    before, after = report["machine_before"], report["machine_after"]
    lines = [
        f"### dra-gatekeeper benchmark, {before['time']}",
        f"machine: {before['nproc']} CPUs ({before['cpu']}), Linux {before['kernel']}, Python "
        f"{before['python']}, {before['versions']}; loadavg before {' '.join(before['loadavg'])},"
        f" after {' '.join(after['loadavg'])}",
        f"upstream: {report['upstream']}; skipped: {report['skipped'] or 'nothing'}",
        "targets: direct = the upstream itself; gatekeeper = `dra-gatekeeper serve` over mTLS "
        "(-unix: the driver's Unix socket; -audit: audit log to a file; -cel: a policy with CEL "
        "validations); kube-rbac-proxy = v0.19.1, mTLS in, static authorization, HTTPS out; "
        "nginx = plain mTLS reverse proxy (1 worker); naive = aiohttp pass-through without checks",
    ]
    lines += _throughput(report) + _against_krp(report) + _cel(report) + _encodings(report)
    lines += _memory(report) + _wrk(report)
    if "engine" in report:
        lines += _engine(report) + _resources(report)
    return "\n".join(lines)
