"""A chart of a build's variants: accuracy against latency, and against file size (matplotlib, a PNG)."""

from __future__ import annotations

from pathlib import Path

from pipeline.reports.variants import VariantRow, latency_points

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

    batches = sorted({batch for _, batch in points})
    panels = len(batches) + 1
    fig, axes = plt.subplots(1, panels, figsize=(3.8 * panels + 1.3, 3.4), sharey=True, squeeze=False)
    targets = sorted({target for target, _ in points})
    for ax, batch in zip(axes[0], batches):
        xs = [row.latency[(t, batch)] for row, _ in scored for t in targets if (t, batch) in row.latency]
        for row, value in scored:
            for target in targets:
                if (target, batch) in row.latency:
                    _point(ax, row, row.latency[(target, batch)], value)
        _scale(ax, xs)
        ax.set_xlabel(f"{' / '.join(t.upper() for t in targets)} latency, batch {batch} (ms, median)")
    size_ax = axes[0][-1]
    sizes = [row.bytes / 1e3 for row, _ in scored if row.bytes]
    for row, value in scored:
        if row.bytes:
            _point(size_ax, row, row.bytes / 1e3, value)
    _scale(size_ax, sizes)
    size_ax.set_xlabel("model file size (KB)")
    axes[0][0].set_ylabel("accuracy (%)" if plain else "agreement with FP32 (%)")
    low = min(v for _, v in scored)
    for ax in axes[0]:
        ax.grid(alpha=0.3, which="both")
        ax.set_ylim(max(0.0, low - 2.0), min(100.5, max(v for _, v in scored) + 1.0))
    handles = [plt.Line2D([], [], color=_colour(r), marker=_marker(r), linestyle="", label=r.variant) for r, _ in scored]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 1.3 / (3.8 * panels + 1.3), 1))
    dst.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    return dst


def _scale(ax: object, xs: list[float]) -> None:
    """A log axis where the values span more than 20×, else a linear one from 0; room around the points."""
    if xs and min(xs) > 0 and max(xs) / min(xs) > 20:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")  # type: ignore[attr-defined]
        ax.set_xlim(min(xs) / 1.6, max(xs) * 1.6)  # type: ignore[attr-defined]
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # type: ignore[attr-defined]  # 0.1, 1, 10: not 10⁻¹
    elif xs:
        ax.set_xlim(0, max(xs) * 1.15)  # type: ignore[attr-defined]


def _colour(row: VariantRow) -> str:
    return COLOURS.get(row.precision, "#57606a")


def _marker(row: VariantRow) -> str:
    return "s" if row.kind == "plan" else "o"


def _point(ax: object, row: VariantRow, x: float, y: float) -> None:
    ax.scatter([x], [y], color=_colour(row), marker=_marker(row), s=60, alpha=0.85, edgecolors="white", zorder=3)  # type: ignore[attr-defined]
