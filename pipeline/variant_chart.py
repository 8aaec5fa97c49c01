"""A chart of a build's variants: accuracy against latency, and against file size (matplotlib, a PNG)."""

from __future__ import annotations

from pathlib import Path

from pipeline.build_variants import VariantRow, latency_points

COLOURS = {"fp32": "#0969da", "fp16": "#1a7f37", "int8": "#cf222e", "int8cpu": "#8250df", "u8": "#9a6700"}


def variant_chart_png(rows: list[VariantRow], dst: Path, title: str) -> Path | None:
    """Write ``dst``: accuracy (or agreement with FP32, without labels) against median latency at batch 1 and at
    the largest batch, per target, and against file size; None (nothing written) when no variant has both figures."""
    plain = any(r.accuracy is not None for r in rows)
    scored = [(r, 100.0 * v) for r in rows if (v := r.accuracy if plain else r.agreement) is not None]
    points = latency_points([r for r, _ in scored])
    if not scored or not (points or any(r.bytes for r, _ in scored)):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(points) + 1
    fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels + 1.3, 3.4), sharey=True, squeeze=False)
    ylabel = "accuracy (%)" if plain else "agreement with FP32 (%)"
    for ax, (target, batch) in zip(axes[0], points):
        for row, value in scored:
            if (target, batch) in row.latency:
                _point(ax, row, row.latency[(target, batch)], value)
        ax.set_xlabel(f"{target.upper()} latency, batch {batch} (ms, median)")
    size_ax = axes[0][-1]
    for row, value in scored:
        if row.bytes:
            _point(size_ax, row, row.bytes / 1e3, value)
    size_ax.set_xlabel("model file size (KB)")
    axes[0][0].set_ylabel(ylabel)
    low = min(v for _, v in scored)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        ax.margins(x=0.25, y=0.3)
        ax.set_ylim(max(0.0, low - 2.0), min(100.5, max(v for _, v in scored) + 1.0))
    handles = [plt.Line2D([], [], color=_colour(r), marker=_marker(r), linestyle="", label=r.variant) for r, _ in scored]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 1.3 / (3.6 * panels + 1.3), 1))
    dst.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    return dst


def _colour(row: VariantRow) -> str:
    return COLOURS.get(row.precision, "#57606a")


def _marker(row: VariantRow) -> str:
    return "s" if row.kind == "plan" else "o"


def _point(ax: object, row: VariantRow, x: float, y: float) -> None:
    ax.scatter([x], [y], color=_colour(row), marker=_marker(row), s=60, alpha=0.85, edgecolors="white", zorder=3)  # type: ignore[attr-defined]
