"""`gpuscope compare` for the terminal: the parts of a step before and after, the verdict and knobs
that changed, and how BEFORE's predictions held."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from ..op_names import short
from ..vocab import PART_HEADS
from ._console import text_console, text_of
from .terminal import say

if TYPE_CHECKING:
    from ..analyze.compare import Comparison


#: the rates' names as a reader says them
RATE_NAMES = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "mfu_pct": "MFU",
              "resident_peak_bytes": "resident peak",
              "resident_growth_bytes_per_step": "resident growth per step"}


def _human(key: str, v) -> str:
    """A rate in the units a reader uses: 2.18k samples/s, 1.4 GiB, 12.5%."""
    if v is None:
        return "?"
    if key.endswith("_pct"):
        return f"{v:.1f}%"
    if "bytes" in key:
        for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(v) >= div:
                return f"{v / div:.1f} {unit}"
        return f"{v:.0f} B"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1f}%"


def render(c: Comparison, *, width: int | None = None, color: bool = False) -> str:
    console, buf = text_console(width, color)
    console.print(Text(f"BEFORE {c.before}\nAFTER  {c.after}", style="dim"))
    unit = "sample" if c.per_sample else "micro-step"
    word = "more" if c.slower_pct > 0 else "less"
    console.print(Text(f"AFTER takes {abs(c.slower_pct):.1f}% {word} time per {unit}",
                       style="bold red" if c.slower_pct > 0 else "bold green"))
    vb, va = c.verdict_before, c.verdict_after
    same = "unchanged" if vb[0] == va[0] else "changed"
    say(console, f"verdict {same}: {vb[0]} {vb[1]:.0%} -> {va[0]} {va[1]:.0%}")
    if c.stragglers_before or c.stragglers_after:
        say(console, f"stragglers: {c.stragglers_before or 'none'} -> "
            f"{c.stragglers_after or 'none'}")
    t = Table(title="ms per micro-step", title_justify="left")
    for col in ("part", "before", "after", "delta", "delta %"):
        t.add_column(col, justify="left" if col == "part" else "right", no_wrap=True)
    for p in c.parts:
        if p.before_ms == 0 and p.after_ms == 0:
            continue
        t.add_row(PART_HEADS.get(p.part, p.part), f"{p.before_ms:.2f}", f"{p.after_ms:.2f}",
                  f"{p.delta_ms:+.2f}", _pct(p.delta_pct))
    console.print(t)
    if c.rates:
        say(console, "rates: " + ", ".join(f"{RATE_NAMES.get(k, k)} {_human(k, a)} -> "
                                            f"{_human(k, b)}" for k, (a, b) in c.rates.items()))
    if c.knobs_changed:
        say(console, "knobs changed: " + ", ".join(f"{k} {a} -> {b}" if k != "layers" else
                                                     "layers per stage"
                                                     for k, (a, b) in c.knobs_changed.items()))
    else:
        say(console, "knobs changed: none")
    if c.predictions:
        p = Table(title="BEFORE's suggestions applied: predicted vs measured, ms per BEFORE step",
                  title_justify="left")
        for col in ("knob", "suggested", "applied", "predicted", "range", "measured", "error",
                    "noise"):
            p.add_column(col, justify="left" if col in ("knob", "suggested", "applied") else "right")
        for x in c.predictions:
            rng = ("" if x.predicted_range is None
                   else f"{x.predicted_range[0]:.1f}-{x.predicted_range[1]:.1f}"
                   + (" ok" if x.in_range else " miss"))
            p.add_row(x.knob, f"{x.current} -> {x.proposed}", str(x.applied),
                      f"{x.predicted_ms:.1f}", rng, f"{x.measured_ms:.1f}",
                      f"{x.error_pct:+.1f}%",
                      "?" if x.noise_pct is None else f"±{x.noise_pct:.0f}%")
        console.print(p)
    if c.ops:
        o = Table(title="ops, ranges and kernels that changed most, ms per micro-step (mean over "
                  "ranks)", title_justify="left")
        for col in ("kind", "name", "before", "after", "delta", ""):
            o.add_column(col, justify="left" if col in ("kind", "name", "") else "right")
        for x in c.ops:
            o.add_row(x["kind"], short(x["name"]), f"{x['before_ms']:.2f}", f"{x['after_ms']:.2f}",
                      f"{x['delta_ms']:+.2f}", "" if x["change"] == "changed" else x["change"])
        console.print(o)
    for w in c.warnings:
        say(console, f"warning: {w}", style="yellow")
    return text_of(buf)
