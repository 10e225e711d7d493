"""A bench result as a PNG bar chart, drawn with Pillow (the `runtime` extra has it; matplotlib
is not a dependency): one panel per figure (decode ms/token, prefill ms), one labelled bar per
peer."""

from __future__ import annotations

from pathlib import Path

from mobius_lite.bench.rounds import BenchResult
from mobius_lite.optional import require

PURPOSE = "drawing the bench chart"
PANELS = (("decode_ms_per_token", "decode ms/token"), ("prefill_ms", "prefill ms"))
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")
PANEL_W, PANEL_H, MARGIN, BAR_H = 520, 60, 16, 22


def check_pillow() -> None:
    """MissingPackageError unless Pillow is installed (checked before anything runs)."""
    require("PIL", PURPOSE)


def write_chart(result: BenchResult, path: Path) -> Path:
    """Horizontal bars, each with its peer's name and median value; lower is faster."""
    image_module = require("PIL.Image", PURPOSE)
    draw_module = require("PIL.ImageDraw", PURPOSE)
    names = [peer.name for peer in result.peers]
    medians = {name: result.medians(name) for name in names}
    panel = PANEL_H + BAR_H * len(names)
    image = image_module.new("RGB", (PANEL_W, MARGIN + panel * len(PANELS)), "white")
    draw = draw_module.Draw(image)
    label_w = 10 + 7 * max(len(n) for n in names)
    for p, (key, title) in enumerate(PANELS):
        top = MARGIN + p * panel
        draw.text((MARGIN, top), f"{title} (median, lower is faster)", fill="black")
        largest = max(medians[n][key] for n in names) or 1.0
        span = PANEL_W - label_w - 2 * MARGIN - 70
        for i, name in enumerate(names):
            y = top + 24 + i * BAR_H
            value = medians[name][key]
            width = max(1, int(span * value / largest))
            draw.text((MARGIN, y + 4), name, fill="black")
            x0 = MARGIN + label_w
            draw.rectangle((x0, y, x0 + width, y + BAR_H - 6), fill=COLOURS[i % len(COLOURS)])
            draw.text((x0 + width + 6, y + 4), f"{value:.2f}", fill="black")
    image.save(path, format="PNG")
    return path
