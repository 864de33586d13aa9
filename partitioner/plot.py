"""Drawing a plan like Gillis's Fig. 14: each stage's output, cut into the tiles its functions compute."""

from __future__ import annotations

from pathlib import Path

from partitioner.graph import LayerGraph
from partitioner.parts import CutStage
from partitioner.solvers.common import SolverResult

__all__ = ["plot_plan"]


def plot_plan(lg: LayerGraph, result: SolverResult, path: Path) -> Path:
    """One panel per stage showing its output's parts (spatial tiles on H x W, channel bands, or stacked
    partial sums for reduction/heads), coloured by the function that computes each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    stages = result.choices
    cols = min(4, len(stages))
    rows = -(-len(stages) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    palette = plt.get_cmap("tab20")
    for ax in axes.flat[len(stages):]:
        ax.axis("off")
    for i, (ax, ch) in enumerate(zip(axes.flat, stages, strict=False)):
        cs = CutStage(lg, ch.first, ch.last)
        out = lg.tensors[cs.outputs[0]].shape
        where = ("master" if ch.split.degree == 1 else "master+workers") if ch.master_part else "workers"
        ax.set_title(f"stage {i}: units {ch.first}-{ch.last}\n{ch.split} ({where})", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        n = ch.split.degree
        who = [("master" if (k == 0 and ch.master_part) else f"w{k}") for k in range(n)]
        colour = [palette(0) if w == "master" else palette(1 + k % 19) for k, w in enumerate(who)]
        if ch.split.family in ("spatial", "channel") and n > 1:
            channel, spatial = cs.axes()
            boxes = cs.boxes(ch.split)
            if ch.split.family == "spatial":
                ya, xa = spatial[0], spatial[1] if len(spatial) > 1 else None
            else:
                assert channel is not None  # cs.boxes raised NotSplittable for a channel split without one
                ya, xa = channel, None
            height = out[ya]
            width = out[xa] if xa is not None else 1
            for k, box in enumerate(boxes):
                y0, y1 = box[ya]
                x0, x1 = box[xa] if xa is not None else (0, 1)
                ax.add_patch(Rectangle((x0, height - y1), x1 - x0, y1 - y0, facecolor=colour[k], edgecolor="white"))
                ax.text((x0 + x1) / 2, height - (y0 + y1) / 2, who[k], ha="center", va="center", fontsize=7)
            ax.set_xlim(0, width)
            ax.set_ylim(0, height)
        else:
            for k in range(n):
                ax.add_patch(Rectangle((0, k), 1, 1, facecolor=colour[k], edgecolor="white"))
                label = who[k] if n == 1 else f"{who[k]} (partial sum)"
                ax.text(0.5, k + 0.5, label, ha="center", va="center", fontsize=7)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, n)
        ax.set_xlabel("x".join(map(str, out)), fontsize=7)
    est = result.estimate
    fig.suptitle(f"{lg.name}: {result.solver}, {est.latency_ms:.1f} ms, {est.cost_usd * 1000:.5f} USD/1000 req",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
