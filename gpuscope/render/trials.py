"""`gpuscope try`'s results for the terminal: one row per configuration tried."""

from __future__ import annotations

from rich.table import Table

from ._console import text_console, text_of
from .terminal import say


def _range(r: list | None, fmt: str = "{:.1f}") -> str:
    if not r:
        return "-"
    return f"{fmt.format(r[0])}-{fmt.format(r[1])}" if r[1] is not None else \
        f"{fmt.format(r[0])} or more"


def table(result: dict, *, width: int | None = None, color: bool = False) -> str:
    console, buf = text_console(width, color)
    t = Table(title="Trials", title_justify="left")
    for col in ("configuration", "step ms", "min-max", "gain %", "interval", "estimate ms",
                "in range"):
        t.add_column(col, justify="left" if col == "configuration" else "right", no_wrap=True)
    for r in result["trials"]:
        held = r.get("within_range")
        t.add_row(r["label"] + (" *" if r.get("best") else ""),
                  f"{r['step_ms']:.2f}" if r["step_ms"] is not None else "failed",
                  _range(r["step_ms_range"], "{:.2f}"),
                  f"{r['gain_pct']:+.1f}" if "gain_pct" in r else "-",
                  _range(r.get("gain_pct_range")),
                  (f"{r['estimated_step_ms']:.1f} ({_range(r.get('estimated_step_ms_range'))})"
                   if "estimated_step_ms" in r else "-"),
                  "-" if held is None else "yes" if held else "NO")
    console.print(t)
    why = f" ({result['steps_why']})" if result.get("steps_why") else ""
    say(console, f"* the fastest. step: the slowest rank's mean over {result['steps']} steps{why} "
        f"after {result['warmup']} left out, per the baseline's global batch; median and range "
        "over "
        f"{result['repeats']} interleaved round(s); gain: against the baseline of the same "
        "round; interval: where a repeat of as many rounds lands 95 times in 100 (the rounds' "
        "spread, pooled over the configurations tried, Student's t)", style="dim")
    for r in result["trials"]:
        for f in r["failures"]:
            say(console, f"{r['label']}: failed, {f}")
    for line in result["not_in_command"]:
        say(console, f"not tried: {line}")
    say(console, f"the trials' run dirs: {result['out']}", style="dim")
    if result.get("calibration"):
        say(console, f"kept in {result['calibration']}: the next estimates of these knobs on "
            "this host are calibrated by what was measured here (GPUSCOPE_CALIBRATION=off: "
            "not kept, not used)", style="dim")
    return text_of(buf)


def render(result: dict) -> None:
    print(table(result), end="")
