"""PNG plots of a load test (matplotlib, Agg backend — no display needed)."""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.results import PointResult

_PERCENTILES = (("p50", "p50_ms"), ("p90", "p90_ms"), ("p95", "p95_ms"), ("p99", "p99_ms"))


def write_plots(points: list[PointResult], directory: Path) -> list[Path]:
    """``latency_vs_throughput.png`` (one panel per model variant) and, for closed-loop sweeps,
    ``latency_vs_concurrency.png``. Points without successes are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = [p for p in points if p.aggregate.requests > 0]
    models = list(dict.fromkeys(p.model for p in usable))
    if not models:
        return []
    written = []

    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = sorted((p for p in usable if p.model == model), key=lambda p: (p.policy, p.load))
        x = [p.aggregate.infer_per_s for p in mine]
        for label, field in _PERCENTILES:
            ax.plot(x, [getattr(p.aggregate.latency, field) for p in mine], marker="o", label=label)
        for p, xi in zip(mine, x):
            ax.annotate(p.label, (xi, p.aggregate.latency.p99_ms), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.set(title=model, xlabel="throughput (infer/s)", ylabel="client latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Latency percentiles vs throughput")
    fig.tight_layout()
    path = directory / "latency_vs_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    closed = [p for p in usable if p.policy == "concurrency"]
    if closed:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for model in dict.fromkeys(p.model for p in closed):
            mine = sorted((p for p in closed if p.model == model), key=lambda p: p.load)
            loads = [p.load for p in mine]
            (line,) = ax.plot(loads, [p.aggregate.latency.p50_ms for p in mine], marker="o", label=f"{model} p50")
            ax.plot(loads, [p.aggregate.latency.p99_ms for p in mine], marker="^", linestyle="--",
                    color=line.get_color(), label=f"{model} p99")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set(title="Latency vs concurrency", xlabel="concurrency (per endpoint)", ylabel="client latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / "latency_vs_concurrency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
