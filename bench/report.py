"""Turn the list of runs into medians and ratios, and write latest.{json,md,png}.

A ratio is pypool's headline metric divided by PgBouncer's, computed per round: the two
runs of a round are adjacent in time, so slow drifts of the machine (other load, caches,
table bloat) affect both alike. The reported ratio is the median over rounds.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from scenarios import Scenario

AGGREGATED = [
    "tps",
    "latency_ms.avg",
    "latency_ms.p50",
    "latency_ms.p95",
    "latency_ms.p99",
    "queue_wait_ms.p50",
    "queue_wait_ms.p95",
    "queue_wait_ms.p99",
    "queue_wait_ms.max",
    "pooler_cpu_s_per_1k",
    "pg_cpu_s_per_1k",
    "rss_mib",
    "rss_before_mib",
    "kib_per_client",
    "connect_s",
]
METRIC_LABELS = {"tps": "TPS", "rss_mib": "RSS MiB", "queue_wait_ms.p99": "queue wait p99"}


def value(run: dict, key: str) -> float | None:
    """A possibly nested measurement, e.g. ``latency_ms.p99``."""
    node: object = run
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, int | float) else None


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _ratios(runs: list[dict], variant: str, key: str, base: str = "pgbouncer") -> list[float]:
    """Per-round ratios of ``key``, ``variant``'s (a pypool variant, or the pooling floor)
    over ``base``'s (PgBouncer, the no-op relay or the pooling floor)."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        measured = value(run, key)
        if run["ok"] and run["target"] in (variant, base) and measured is not None:
            by_round.setdefault(run["round"], {})[run["target"]] = measured
    return [
        pair[variant] / pair[base]
        for _, pair in sorted(by_round.items())
        if len(pair) == 2 and pair[base]
    ]


def summarize(runs: list[dict], scenarios: list[Scenario], targets: list[str]) -> dict:
    """Per scenario and target: medians/min/max; per pypool variant: ratio to PgBouncer."""
    summary = {}
    for scenario in scenarios:
        mine = [run for run in runs if run["scenario"] == scenario.name]
        if not mine:
            continue
        per_target = {}
        for target in targets:
            of_target = [run for run in mine if run["target"] == target]
            if not of_target:
                continue
            ok = [run for run in of_target if run["ok"]]
            stats = {
                key: _spread([v for run in ok if (v := value(run, key)) is not None])
                for key in AGGREGATED
            }
            per_target[target] = {
                "ok_runs": len(ok),
                "failed_runs": len(of_target) - len(ok),
                "stats": {key: spread for key, spread in stats.items() if spread},
            }
        ratios = {}
        for variant in (t for t in targets if t.startswith("pypool")):
            headline = _ratios(mine, variant, scenario.metric)
            if headline:
                ratios[variant] = {
                    "metric": scenario.metric,
                    "higher_is_better": scenario.higher_is_better,
                    "pairs": headline,
                    **(_spread(headline) or {}),
                    "pooler_cpu_pairs": _ratios(mine, variant, "pooler_cpu_s_per_1k"),
                }
            over_relay = _ratios(mine, variant, "pooler_cpu_s_per_1k", "relay")
            if over_relay and variant in ratios:
                # The floor: pypool's own work, beyond moving the bytes on uvloop.
                ratios[variant]["pooler_cpu_vs_relay_pairs"] = over_relay
                ratios[variant]["pooler_cpu_vs_relay"] = _spread(over_relay)
        floor: dict[str, dict[str, float] | None] = {}
        if floor_tps := _ratios(mine, "floor", scenario.metric):
            # The pooling floor (bench/pool_floor.py): what a pooler on uvloop that does
            # nothing else reaches, and how near each pypool comes to it.
            floor["pgbouncer"] = _spread(floor_tps)
            for variant in (t for t in targets if t.startswith("pypool")):
                if over := _ratios(mine, variant, scenario.metric, "floor"):
                    floor[variant] = _spread(over)
        summary[scenario.name] = {"targets": per_target, "ratios": ratios, "floor": floor}
    return summary


def write_json(
    path: Path, meta: dict, scenarios: list[Scenario], runs: list[dict], summary: dict
) -> None:
    described = [
        {
            "name": s.name,
            "description": s.description,
            "metric": s.metric,
            "higher_is_better": s.higher_is_better,
        }
        for s in scenarios
    ]
    document = {"meta": meta, "scenarios": described, "runs": runs, "summary": summary}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def fmt(number: float | None) -> str:
    if number is None:
        return "—"
    return f"{number:,.0f}" if abs(number) >= 100 else f"{number:.3g}"


def _median(entry: dict, key: str) -> str:
    spread = entry["stats"].get(key)
    return fmt(spread["median"]) if spread else "—"


def _with_range(entry: dict, key: str) -> str:
    spread = entry["stats"].get(key)
    if not spread:
        return "—"
    if spread["min"] == spread["max"]:
        return fmt(spread["median"])
    return f"{fmt(spread['median'])} ({fmt(spread['min'])}–{fmt(spread['max'])})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def _section(title: str, intro: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A `## title` section of the report: a sentence, then its table."""
    return ["", f"## {title}", "", intro, "", *_table(header, rows)]


def write_markdown(
    path: Path, meta: dict, scenarios: list[Scenario], runs: list[dict], summary: dict
) -> None:
    lines = [
        f"# pypool benchmark, {meta['date']}",
        "",
        f"- Machine: {meta['machine']}",
        "- Versions: " + ", ".join(f"{name} {ver}" for name, ver in meta["versions"].items()),
        f"- PgBouncer binary: {meta['pgbouncer']}",
        f"- Settings: {meta['settings']}",
        f"- Command: `{meta['command']}`",
    ]
    lines += [f"- **Skipped {name}**: {why}" for name, why in meta["skipped"].items()]
    lines += ["", "Medians over the runs, (min–max) where they differ. Latencies in ms.", ""]

    ratio_rows = []
    for name, entry in summary.items():
        for variant, ratio in entry["ratios"].items():
            better = "higher" if ratio["higher_is_better"] else "lower"
            cpu = _spread(ratio["pooler_cpu_pairs"])
            ratio_rows.append(
                [
                    name,
                    variant,
                    METRIC_LABELS.get(ratio["metric"], ratio["metric"]),
                    better,
                    f"**{ratio['median']:.2f}**",
                    f"{ratio['min']:.2f}–{ratio['max']:.2f}",
                    ", ".join(f"{pair:.2f}" for pair in ratio["pairs"]),
                    f"{cpu['median']:.2f}" if cpu else "—",
                ]
            )
    lines += ["## pypool / PgBouncer", ""]
    if ratio_rows:
        lines += [
            "Ratio of the headline metric per adjacent pair of runs; 1.00 = parity. "
            "Column *better* says which way is good for pypool.",
            "",
        ]
        lines += _table(
            [
                "Scenario",
                "pypool",
                "Metric",
                "better",
                "ratio",
                "min–max",
                "per pair, in run order",
                "pooler CPU/1k tx ratio",
            ],
            ratio_rows,
        )
    else:
        lines += ["No pypool/PgBouncer pairs in this run.", ""]

    floor_rows = [
        [name, variant, f"**{floor['median']:.2f}**", f"{floor['min']:.2f}–{floor['max']:.2f}"]
        for name, entry in summary.items()
        for variant, ratio in entry["ratios"].items()
        if (floor := ratio.get("pooler_cpu_vs_relay"))
    ]
    if floor_rows:
        lines += _section("pypool / the no-op relay (bench/relay.py)",
                          "Pooler CPU per transaction over the relay's, per adjacent pair: "
                          "what pypool's own work costs beyond moving the bytes on uvloop.",
                          ["Scenario", "pypool", "pooler CPU/1k tx ratio", "min–max"],
                          floor_rows)

    floor_tps_rows = [
        [name, f"**{over['median']:.2f}**", f"{over['min']:.2f}–{over['max']:.2f}",
         ", ".join(f"{variant} {spread['median']:.2f}"
                   for variant, spread in entry["floor"].items()
                   if variant != "pgbouncer" and spread)]
        for name, entry in summary.items()
        if (over := entry.get("floor", {}).get("pgbouncer"))
    ]
    if floor_tps_rows:
        lines += _section("The pooling floor (bench/pool_floor.py) / PgBouncer",
                          "TPS per adjacent pair: what a pooler on uvloop that pools and does "
                          "nothing else reaches beside PgBouncer, and each pypool's TPS over "
                          "the floor's.",
                          ["Scenario", "floor TPS / PgBouncer", "min–max", "pypool / floor"],
                          floor_tps_rows)

    groups = {
        "Throughput and latency": [s for s in scenarios if not s.idle_clients and not s.script],
        "Queueing: more clients than pool slots": [s for s in scenarios if s.script],
        "Idle connections": [s for s in scenarios if s.idle_clients],
    }
    for title, members in groups.items():
        rows = []
        for scenario in members:
            for target, entry in summary.get(scenario.name, {}).get("targets", {}).items():
                runs_text = str(entry["ok_runs"])
                if entry["failed_runs"]:
                    runs_text += f" (+{entry['failed_runs']} failed)"
                head = [scenario.name, target, runs_text]
                if scenario.idle_clients:
                    keys = [
                        "connect_s",
                        "rss_before_mib",
                        "rss_mib",
                        "kib_per_client",
                        "pooler_cpu_s_per_1k",
                    ]
                elif scenario.script:
                    keys = [
                        "tps",
                        "queue_wait_ms.p50",
                        "queue_wait_ms.p95",
                        "queue_wait_ms.p99",
                        "queue_wait_ms.max",
                    ]
                else:
                    keys = [
                        "latency_ms.avg",
                        "latency_ms.p50",
                        "latency_ms.p95",
                        "latency_ms.p99",
                        "pooler_cpu_s_per_1k",
                        "pg_cpu_s_per_1k",
                        "rss_mib",
                    ]
                    head.append(_with_range(entry, "tps"))
                rows.append(head + [_median(entry, key) for key in keys])
        if not rows:
            continue
        if members[0].idle_clients:
            header = [
                "Scenario",
                "Target",
                "runs",
                "connect s",
                "RSS before MiB",
                "RSS connected MiB",
                "KiB/client",
                "CPU s/1k logins",
            ]
        elif members[0].script:
            header = [
                "Scenario",
                "Target",
                "runs",
                "TPS",
                "wait p50",
                "wait p95",
                "wait p99",
                "wait max",
            ]
        else:
            header = [
                "Scenario",
                "Target",
                "runs",
                "TPS",
                "lat avg",
                "p50",
                "p95",
                "p99",
                "pooler CPU s/1k tx",
                "PG CPU s/1k tx",
                "pooler RSS MiB",
            ]
        lines += [f"## {title}", ""] + _table(header, rows)

    failures = [run for run in runs if not run["ok"]]
    if failures:
        lines += ["## Failed runs", ""]
        lines += [
            f"- {r['scenario']} / {r['target']} round {r['round']}: {r['error']}" for r in failures
        ]
        lines.append("")
    lines += ["## Scenarios", ""]
    lines += [f"- **{s.name}**: {s.description}" for s in scenarios]
    path.write_text("\n".join(lines) + "\n")


def write_chart(path: Path, scenarios: list[Scenario], summary: dict, targets: list[str]) -> None:
    """Ratio bars around a 1.0 line, TPS per target, and idle RSS per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {s.name: s for s in scenarios if s.name in summary}
    variants = [t for t in targets if t.startswith("pypool")]
    ratios = [
        (name, variant, entry["ratios"][variant])
        for name, entry in summary.items()
        for variant in variants
        if variant in entry["ratios"]
    ]
    throughput = [n for n, s in by_name.items() if s.metric == "tps" or s.script]
    idle = [n for n, s in by_name.items() if s.idle_clients]
    heights = [
        max(2.0, 0.3 * len(ratios) + 1),
        max(2.0, 0.2 * len(throughput) * len(targets) + 1),
        max(2.0, 0.25 * len(idle) * len(targets) + 1),
    ]
    fig, (ratio_ax, tps_ax, rss_ax) = plt.subplots(
        3, 1, figsize=(11, sum(heights)), gridspec_kw={"height_ratios": heights}
    )
    _ratio_bars(ratio_ax, ratios, several_variants=len(variants) > 1)
    _grouped_bars(tps_ax, throughput, summary, targets, "tps")
    tps_ax.set_xscale("log")
    tps_ax.set_title("Transactions per second (median of runs; log scale)")
    _grouped_bars(rss_ax, idle, summary, targets, "rss_mib")
    rss_ax.set_title("Pooler RSS with all idle clients connected, MiB (median of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _ratio_bars(ax, rows: list[tuple[str, str, dict]], several_variants: bool) -> None:
    """Bars from 1.0 to each median ratio on a log axis, so 0.5 and 2 look alike."""
    ax.set_title("pypool / PgBouncer: median ratio of adjacent runs (whiskers: min–max)")
    if not rows:
        _no_data(ax, "no pypool/PgBouncer pairs in this run")
        return
    labels, medians, whiskers, colors = [], [], ([], []), []
    for name, variant, ratio in rows:
        arrow = "↑" if ratio["higher_is_better"] else "↓"
        metric = METRIC_LABELS.get(ratio["metric"], ratio["metric"])
        labels.append(f"{name}{f' [{variant}]' if several_variants else ''}  {metric} {arrow}")
        medians.append(ratio["median"])
        whiskers[0].append(ratio["median"] - ratio["min"])
        whiskers[1].append(ratio["max"] - ratio["median"])
        good = (ratio["median"] >= 1) == ratio["higher_is_better"]
        colors.append("tab:green" if good else "tab:red")
    positions = list(range(len(rows)))
    widths = [median - 1 for median in medians]
    ax.barh(positions, widths, left=1, xerr=whiskers, color=colors, capsize=3)
    ax.set_xscale("log")
    low, high = min(r["min"] for *_, r in rows), max(r["max"] for *_, r in rows)
    ax.set_xlim(min(0.8, low) / 1.25, max(1.25, high) * 1.25)
    ticks = [t for t in (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 10) if low / 1.3 <= t <= high * 1.3]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_yticks(positions, labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel(
        "pypool / PgBouncer (↑: higher is better, ↓: lower is better; green: pypool better)"
    )
    for position, median in zip(positions, medians, strict=True):
        ax.annotate(
            f"{median:.2f}",
            (median, position),
            xytext=(4 if median >= 1 else -4, 4),
            textcoords="offset points",
            fontsize=8,
            ha="left" if median >= 1 else "right",
        )


def _grouped_bars(ax, names: list[str], summary: dict, targets: list[str], key: str) -> None:
    """One group of horizontal bars per scenario, one bar per target that has data."""
    present = [
        target
        for target in targets
        if any(key in summary[n]["targets"].get(target, {}).get("stats", {}) for n in names)
    ]
    if not present:
        _no_data(ax, "no data in this run")
        return
    height = 0.8 / len(present)
    for index, target in enumerate(present):
        positions, values = [], []
        for row, name in enumerate(names):
            spread = summary[name]["targets"].get(target, {}).get("stats", {}).get(key)
            if spread:
                positions.append(row + index * height)
                values.append(spread["median"])
        bars = ax.barh(positions, values, height=height, label=target)
        ax.bar_label(bars, [fmt(v) for v in values], fontsize=7, padding=2)
    ax.set_yticks([row + 0.4 - height / 2 for row in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.12)
    ax.legend(fontsize=8, loc="best")
