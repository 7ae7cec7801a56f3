"""Where each key of the report's JSON is shown: the terminal, the HTML dashboard and the
TensorBoard tab, one entry per key. A key the report writes without an entry here, or an entry
whose front end no longer shows it, fails tests/test_sections.py: a front end cannot fall
behind unnoticed, and where one does not show a key, its entry says why.

Each place is a marker: a text the terminal's report holds (formatted with the report's scalar
fields: "{source}"); a text the HTML holds (an element's id, mostly); what the tab's
static/index.js reads ("report.KEY", or "words.KEY": the words the tab's backend makes with the
terminal's functions, plugin.py), or "panel-NAME": one of the dashboard's figures, which the
tab draws from the same figures().
"""

from __future__ import annotations

from typing import Callable, NamedTuple


class Shown(NamedTuple):
    terminal: str | None
    html: str | None
    tab: str | None
    why: str = ""      # where a front end does not show the key
    #: whether the key's value (the report's JSON) holds what the front ends show; None: any
    #: value but an empty one
    holds: Callable[[dict], bool] | None = None


SHOWN: dict[str, Shown] = {
    "schema": Shown(None, None, None, "the format's name, for programs that read the JSON"),
    "source": Shown("gpuscope {source}", "<small>{source}: ", "report.source"),
    "path": Shown("{path}", "{path}", None, "the tab names the run in its own run menu"),
    "basis": Shown(None, None, None, "what the figures are (a mean per analysed step), which "
                   "every view's headings say in their own words"),
    "stall": Shown("THE RUN STALLED: ", 'id="stall"', "report.stall"),
    "died": Shown("THE RUN DIED: ", 'id="died"', "report.died"),
    "world_size": Shown(" of {world_size} ranks", " of {world_size} ranks", "report.world_size"),
    "ranks_analysed": Shown("{ranks_analysed} of ", "{ranks_analysed} of ",
                            "report.ranks_analysed"),
    "steps_analysed": Shown(None, None, "report.steps_analysed",
                            "the terminal and the HTML count the steps their table holds "
                            "(optimizer steps with accumulation), the same figure in words"),
    "verdict": Shown("Verdict", 'class="verdict"', "report.verdict"),
    "verdict_share": Shown("% of step time", "% of step time", "report.verdict_share"),
    "confidence": Shown("confidence {confidence}", "confidence {confidence}",
                        "report.confidence"),
    "confidence_why": Shown("confidence {confidence}: ", 'id="confidence-why"',
                            "report.confidence_why"),
    "time_by_label": Shown("(also: ", "(also: ", "words.also", "the verdict's own share is "
                           "verdict_share's; the front ends show the labels beside it",
                           holds=lambda d: len(d["time_by_label"]) > 1),
    "stragglers": Shown("Straggler", 'id="stragglers"', "report.straggler_details"),
    "probable_stragglers": Shown("Straggler", 'id="stragglers"', "report.straggler_details"),
    "straggler_details": Shown("Straggler", 'id="stragglers"', "report.straggler_details"),
    "minor_stragglers": Shown("Minor straggler:", 'id="minor-stragglers"', "words.minor"),
    "straggler_not_ruled_out": Shown("is not ruled out as a straggler", 'id="not-ruled-out"',
                                     "words.not_ruled_out"),
    "straggler_floor": Shown("cannot tell a rank late by up to", 'id="straggler-floor"',
                             "words.straggler_floor"),
    "early_ranks": Shown("Stragglers: none named: rank(s)", 'id="stragglers"', None,
                         "where a straggler is named, it is what the front ends say; the tab's "
                         "straggler list names late ranks only",
                         holds=lambda d: not d["stragglers"] and not d["probable_stragglers"]),
    "jitter": Shown("of step time is spent waiting by the rank that waits longest",
                    'id="jitter"', "words.jitter", "under 1% of the step it is not said",
                    holds=lambda d: d["jitter"]["wait_pct"] >= 1),
    "steps": Shown(None, "panel-steps", "panel-steps",
                   "the terminal's table is per rank; the steps are the dashboard's figure"),
    "ranks": Shown("Per rank: mean ms per step", "panel-ranks", "panel-ranks"),
    "suggestions": Shown("Suggestions", 'id="suggestions"', "report.suggestions"),
    "knobs": Shown(None, None, None, "the settings the suggestions start from: each "
                   "suggestion says the value it changes"),
    "thresholds": Shown("thresholds: data >=", None, None,
                        "the dashboard and the tab show the verdict, not the rule's numbers"),
    "warnings": Shown("warning:", 'id="warnings"', "report.warnings"),
    "layout": Shown("Layout: ", 'id="layout"', None,
                    "the tab shows the mesh's figure where there is one (panel-mesh)"),
    "pipeline": Shown("Pipeline: ", "panel-stages", "panel-stages"),
    "dataparallel": Shown("DataParallel over ", "DataParallel", None,
                          "its per-device figures are the dashboard's"),
    "stopped_ranks": Shown("warning:", 'id="warnings"', "report.warnings",
                           "said in the warnings: which ranks stopped early and at which step"),
    "missing_ranks": Shown("warning:", 'id="warnings"', "report.warnings",
                           "said in the warnings: which ranks have no record"),
    "memory": Shown("Memory ", 'id="panel-memory"', "panel-memory"),
    "throughput": Shown("Throughput: ", 'id="throughput"', "words.throughput"),
    "energy": Shown("Energy: ", 'id="energy"', "words.energy"),
    "comm_by_group": Shown("Communication by mesh dimension / group", None, None,
                           "one group of no mesh dimension is what the collectives line says; "
                           "the dashboard and the tab draw the groups of a device mesh as its "
                           "figure (panel-mesh, from layout.mesh)",
                           holds=lambda d: len(d["comm_by_group"]) > 1
                           or any(g.get("dim") for g in d["comm_by_group"])),
    "routing": Shown("All-to-all rows per step", 'id="routing"', None,
                     "an expert layer's routing is the terminal's and the dashboard's"),
    "ops": Shown("ms per step (mean over", 'id="ops-run-', "report.ops"),
}
