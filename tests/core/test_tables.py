"""Result tables on a narrow terminal: nothing cut, the row names whole."""

from __future__ import annotations

from rich.console import Console

from pipeline.core.tables import TableData, to_rich


def test_an_80_column_terminal_wraps_cells_and_keeps_row_names_whole() -> None:
    table = TableData("accuracy", ["variant", "acc", "FP32 acc", "drop (bounds) / max", "top-1 agree", "max abs", "min cos", "gate"])
    names = ["fp16-onnx", "int8-onnx", "int8-trt"]  # the issue saw "fp16-on…" at 80 columns
    for name in names:
        table.add([name, "97.55%", "97.55%", "0.00 [-0.60, 0.60] / 1", "100.00%", "1.1e-03", "1.0000", "undecided"])
    console = Console(width=80, record=True, color_system=None)
    console.print(to_rich(table))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for name in names:
        assert any(line.startswith(f"│ {name} ") for line in text.splitlines())  # whole, on one line
    cells = "".join(text.replace("│", " ").split())
    assert cells.count("undecided") == 0 or cells.count("undecided") == 3  # folded or whole, never cut
    shown = [*table.columns, *(c for row in table.rows for c in row)]
    assert sum(ch.isdigit() for ch in cells) == sum(ch.isdigit() for c in shown for ch in c)  # every digit shown
