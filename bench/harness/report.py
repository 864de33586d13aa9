"""Reports a person reads: markdown summaries and matplotlib plots of load runs, the suite and the simulator.

Plots are written with matplotlib's Agg backend (no display needed). Every markdown report starts with
the machine line (cores, memory, load, versions, git revision), because a figure without it is not a
result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import machine_line
from bench.load.latency import Sample

__all__ = ["load_markdown", "plot_bars", "plot_latency_cdf", "plot_simulation", "plot_timeline", "suite_markdown"]


def _agg() -> None:
    """Draw with the Agg backend (no display); call before importing pyplot."""
    import matplotlib

    matplotlib.use("Agg")


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if v != 0 and abs(v) < 10 ** -digits:
            return f"{v:.3g}"
        return f"{v:.{digits}f}"
    return str(v)


def plot_latency_cdf(series: Mapping[str, Sequence[float]], path: Path, *, slo_ms: float | None = None,
                     title: str = "latency CDF") -> Path:
    _agg()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, xs in series.items():
        if not len(xs):
            continue
        x = np.sort(np.asarray(xs, dtype=float))
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=f"{label} (n={len(x)})")
    if slo_ms:
        ax.axvline(slo_ms, color="grey", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of responses")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_timeline(samples: Sequence[Sample], path: Path, *,
                  diurnal: tuple[float, float, float, float] | None = None,
                  bin_s: float | None = None, title: str = "latency and rate over time") -> Path:
    """Latency of every request against its due time (failures marked), and requests/s per bin."""
    from bench.load.trace import diurnal_rate, rate_series

    _agg()
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ok = [s for s in samples if s.ok and s.correct]
    bad = [s for s in samples if not (s.ok and s.correct)]
    a1.plot([s.due_s for s in ok], [s.latency_ms for s in ok], ".", ms=2, alpha=0.6, label="correct")
    if bad:
        a1.plot([s.due_s for s in bad], [s.latency_ms for s in bad], "x", color="red", ms=4,
                label=f"error / wrong ({len(bad)})")
    a1.set_ylabel("latency (ms)")
    a1.set_title(title)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    end = max((s.due_s + s.latency_ms / 1e3 for s in samples), default=1.0)
    b = bin_s or max(0.5, end / 60)
    xc, sent = rate_series([s.due_s for s in samples], end, b)
    _, done = rate_series([s.due_s + s.latency_ms / 1e3 for s in ok], end, b)
    a2.plot(xc, sent, label="offered (arrivals/s)")
    a2.plot(xc, done, label="completed correct/s")
    if diurnal is not None:
        low, high, period, duration = diurnal
        t = np.linspace(0, min(end, duration), 200)
        a2.plot(t, [diurnal_rate(x, low, high, period) for x in t], "--", color="grey", label="trace rate")
    a2.set_xlabel("time (s)")
    a2.set_ylabel("requests/s")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bars(rows: Sequence[tuple[str, float]], path: Path, *, title: str, xlabel: str = "ratio (> 1: candidate "
              "better)") -> Path:
    _agg()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.2))
    labels = [r[0] for r in rows]
    vals = [r[1] if r[1] is not None and math.isfinite(r[1]) else 0.0 for r in rows]
    ax.barh(labels, vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    ax.axvline(1.0, color="black", lw=1)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_simulation(runs: Mapping[str, Any], path: Path, *, title: str) -> Path:
    """The simulated runs (:class:`bench.sim.simulator.SimResult` by plan name): latency CDFs, and the median
    latency over time (open loops)."""
    _agg()
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 6))
    for name, r in runs.items():
        x = np.sort(r.latencies_ms)
        a1.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=name)
        if len(r.arrivals_ms):
            b = max(1.0, float(r.arrivals_ms.max()) / 1e3 / 60)
            edges = np.arange(0, r.arrivals_ms.max() / 1e3 + b, b)
            idx = np.digitize(r.arrivals_ms / 1e3, edges)
            p50 = [np.median(r.latencies_ms[idx == i]) if np.any(idx == i) else np.nan for i in range(1, len(edges))]
            a2.plot(edges[:-1], p50, label=f"{name} p50")
    a1.set_xlabel("latency (ms)")
    a1.set_ylabel("fraction")
    a1.set_title(title, fontsize=9)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.set_xlabel("time (s)")
    a2.set_ylabel("median latency (ms)")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_markdown(doc: Mapping[str, Any], files: Mapping[str, str] | None = None) -> str:
    """The markdown summary of one load run (:meth:`bench.load.run.LoadResult.to_json`)."""
    s, u, cfg = doc["summary"], doc["usage"], doc["config"]
    mode = cfg["mode"]
    if mode == "closed":
        what = f"closed loop, {cfg['clients']} clients x {cfg['requests']} requests"
    elif mode == "open":
        what = f"open loop, Poisson {cfg['rate_rps']:g}/s for {cfg['duration_s']:g} s"
    else:
        o = doc.get("offered", {})
        what = (f"diurnal trace {o.get('low_rps', 0):.2f} .. {o.get('high_rps', 0):.2f} requests/s over "
                f"{o.get('period_s', 0):g} s" + (f" (probe: {o['probe_rps']:.2f}/s saturated)" if "probe_rps" in o
                                                  else ""))
    lines = [
        f"# load: {doc['target']} — {what}",
        "",
        f"Machine: {machine_line(doc.get('machine'))}",
        "",
        f"Warm-up ({doc['warmup']['requests']} requests, {doc['warmup'].get('cold_starts', 0)} cold starts, "
        f"{doc['warmup']['errors']} errors) is excluded below; every response was checked against onnxruntime.",
        "",
        "| requests | correct | errors | wrong | p50 ms | p95 ms | p99 ms | throughput /s | SLO attainment |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {s['requests']} | {s['correct']} | {s['errors']} | {s['incorrect']} | {_fmt(s['p50_ms'], 1)} | "
        f"{_fmt(s['p95_ms'], 1)} | {_fmt(s['p99_ms'], 1)} | {_fmt(s['throughput_rps'])} | "
        f"{_fmt(s.get('slo_attainment'), 3) if 'slo_attainment' in s else '-'} |",
        "",
        "| cold starts | billed GB-s | USD / 1000 req | memory utilisation | MC GB-s / req | allocated MB | "
        "peak used MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {u['cold_starts']} | {_fmt(u['billed_gb_s'], 3)} | {_fmt(u['usd_per_1000'], 6)} | "
        f"{_fmt(u['memory_utilisation'], 3)} | {_fmt(u['mc_gb_s_per_request'], 4)} | {u['allocated_mb']} | "
        f"{_fmt(u['used_mb'], 0)} |",
        "",
        "| function | memory MB | invocations | cold starts | errors | billed GB-s | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in sorted(u["functions"].items()):
        lines.append(f"| {name} | {r['memory_mb']} | {r['invocations']} | {r['cold_starts']} | {r['errors']} | "
                     f"{_fmt(r['billed_gb_s'], 4)} | {_fmt(r['max_rss_mb'], 0)} |")
    if s.get("first_error"):
        lines += ["", f"First error: `{s['first_error']}`"]
    if files:
        lines += [""] + [f"![{k}]({v})" for k, v in files.items() if v.endswith(".png")]
    return "\n".join(lines) + "\n"


def suite_markdown(doc: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    """The suite's report: one table of every comparison, then each comparison's details."""
    lines = [
        "# flatpack evaluation suite" + (" (quick)" if doc.get("quick") else ""),
        "",
        f"Machine: {machine_line(doc.get('machine'))}",
        "",
        "Parallel speedup the machine had to spare when the suite started (2 CPU-bound processes in sessions of "
        f"their own vs 1; 2.0 on an idle 2-core machine): **{_fmt(doc.get('machine', {}).get('parallel_speedup_now'))}"
        "** — a split plan cannot beat one function by more than that allows.",
        "",
        f"All responses correct: **{_fmt(doc.get('all_correct'))}**. Ratios > 1 mean the candidate is better "
        "(faster or cheaper); each is measured in one run (baseline and candidate interleaved) unless its "
        "`measured` column says `predicted`.",
        "",
        "| comparison | model | baseline | candidate | metric | baseline value | candidate value | ratio | measured |",
        "|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for c in doc["comparisons"]:
        lines.append(
            f"| {c['name']} | {c.get('model', '-')} | {c.get('baseline', '-')} | {c.get('candidate', '-')} | "
            f"{c.get('metric', '-')} | {_fmt(c.get('baseline_value'), 3)} | {_fmt(c.get('candidate_value'), 3)} | "
            f"**{_fmt(c.get('ratio'))}** | {c.get('source', 'measured')} |")
    seen: set[tuple[str, str]] = set()
    for c in doc["comparisons"]:
        text = "; ".join(str(n) for n in c.get("notes") or [])
        if c.get("first_error"):
            text += ("; " if text else "") + f"first error: `{c['first_error']}`"
        key = (str(c.get("model", "")), text)
        if text and key not in seen:
            seen.add(key)
            lines += ["", f"- **{c['name']} / {c.get('model', '')}**: {text}"]
    skipped = doc.get("skipped") or []
    if skipped:
        lines += ["", "## Left out", ""] + [f"- {s}" for s in skipped]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"
