"""The report's structured sections are typed (gpuscope/sections.py): built as structs by the
analysis, read by field in the renderers, written as the JSON they always were, and checked
when a saved report is read back."""

import json
import os

import pytest

import gpuscope
from gpuscope.errors import InputError
from gpuscope.sections import CommGroup, DataParallel, Memory, MemorySeries, Ops, Routing

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden", "reports")


def _saved(case: str) -> dict:
    with open(os.path.join(GOLDEN, case, "expected.json")) as fh:
        return {**json.load(fh), "path": case}


@pytest.mark.parametrize("case", ["comm", "stalled", "jitter_kineto", "cuda_modules"])
def test_a_saved_report_s_sections_read_back_typed_and_write_the_same(case):
    d = _saved(case)
    rep = gpuscope.Report.from_dict(d)
    assert all(isinstance(g, CommGroup) for g in rep.comm_by_group)
    assert rep.memory is None or isinstance(rep.memory, Memory)
    assert rep.ops is None or isinstance(rep.ops, Ops)
    assert json.loads(json.dumps(rep.to_dict())) == d


def test_the_cases_hold_the_sections():
    """The golden cases above do hold what the round trip checks (not a vacuous pass)."""
    assert _saved("comm")["comm_by_group"] and _saved("jitter_kineto")["ops"]["ranks"]
    assert _saved("cuda_modules")["memory"]["series"]


@pytest.mark.parametrize("key, bad, says", [
    ("comm_by_group", [{"group": "ddp", "dim": None, "ranks": [0, 1], "kinds": []}],
     "missing required field `comm_ms`"),
    ("comm_by_group", {"group": "ddp"}, "not a list"),
    ("routing", {"instance": 0, "instances": 1, "steps": 4, "rows_by_rank": {"0": 1.0},
                 "busiest_rank": "one", "busiest_share": 0.5, "max_over_mean": 1.0,
                 "uneven": False}, "busiest_rank"),
    ("dataparallel", {"forward_ms": {"0": 1.0}}, "devices"),
    ("memory", {"series": [{"rank": 0}], "findings": []}, "$.series[0]"),
    ("ops", {"basis": "x", "ranks": "all", "run": {}}, "ranks"),
    ("energy", {"source": "power samples", "per_rank": [{"rank": 0, "steps": 3}]},
     "$.per_rank[0]"),
    ("straggler_floor", {"up_to_ms": 1.0, "pct": 2.0}, "steps"),
    ("died", [{"rank": 1, "step": 4, "last_step": 3, "cause": "eaten", "first": True,
               "unix_ns": None, "text": "rank 1 ..."}], "cause"),
    ("throughput", {"per_rank": [], "steps_per_s": "fast", "samples_per_s": None,
                    "assumes": []}, "steps_per_s"),
    ("stopped_ranks", [{"rank": 1, "last_step": "26", "others_reached": 43, "reason": "x"}],
     "last_step"),
    ("layout", {"groups": [{"name": "dp"}], "mesh": {"by_dim": {}, "holds_back": None}},
     "$.groups[0]"),
    ("layout", {"groups": [], "mesh": {"by_dim": {"tp": {"comm_ms": 1.0, "kinds": []}},
                                       "holds_back": "tp"}}, "exposed_ms"),
])
def test_a_malformed_section_is_one_clear_error_on_load(key, bad, says):
    d = {**_saved("comm"), key: bad}
    with pytest.raises(InputError, match=f"{key}") as err:
        gpuscope.Report.from_dict(d)
    assert says in str(err.value)


def test_each_section_writes_its_optional_fields_only_when_known():
    g = CommGroup(group="1", dim=None, ranks=[0, 2], comm_ms=2.0, exposed_ms=1.0,
                  kinds=["all_reduce"])
    assert g.to_dict() == {"group": "1", "dim": None, "ranks": [0, 2], "comm_ms": 2.0,
                           "exposed_ms": 1.0, "kinds": ["all_reduce"]}  # not split: no wait
    assert DataParallel(devices=["cpu"]).to_dict() == {"devices": ["cpu"]}
    s = MemorySeries(rank=0, memory="host", points=1, first_bytes=1, last_bytes=1, peak_bytes=1,
                     rate_bytes_per_step=None, growing=None)
    assert s.to_dict()["growing"] is None  # unknown growth is said, not left out
    r = Routing(instance=0, instances=2, steps=4, rows_by_rank={"0": 3.0, "1": 1.0},
                busiest_rank=0, busiest_share=0.75, max_over_mean=1.5, uneven=True)
    rep = gpuscope.Report.from_dict({**_saved("comm"), "routing": r.to_dict()})
    assert rep.routing == r


def _keys_a_report_writes() -> set:
    """Every top-level key ReportData.to_dict can write: its declared columns (json_form)."""
    from gpuscope.json_form import keys
    from gpuscope.results import ReportData

    return set(keys(ReportData))


def test_every_key_a_report_writes_has_its_entry_in_the_front_ends_table():
    """Issue 72: render/shown.py says, key by key, where the terminal, the HTML and the tab
    show it, or why one does not; a key added to the report without an entry fails here, as
    an entry for a key the report no longer writes."""
    from gpuscope.render.shown import SHOWN

    written = _keys_a_report_writes()
    assert len(written) > 30
    assert sorted(written - set(SHOWN)) == [], "keys without an entry in render/shown.py"
    assert sorted(set(SHOWN) - written) == [], "entries for keys the report does not write"
    for key, shown in SHOWN.items():
        assert all(shown[:3]) or len(shown.why) > 20, f"{key}: a front end without why"


@pytest.mark.parametrize("case", sorted(os.listdir(GOLDEN)))
def test_each_front_end_shows_what_its_entry_says(case):
    """For each key a golden case's report holds (analysed from its input, as the CLI does),
    each place its entry names is in that front end's output: the terminal's text, the HTML,
    the tab's index.js (and its backend's words)."""
    import json as json_module
    import sys

    from gpuscope.render import html, json as render_json, terminal
    from gpuscope.render.shown import SHOWN

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import golden_cases

    rep, _ = golden_cases.analysed_case(os.path.join(GOLDEN, case))
    d = json_module.loads(render_json.render(rep))
    text = " ".join(terminal.render(rep, width=400).split())
    page = html.render(rep, plotlyjs="cdn")
    tab_dir = os.path.join(os.path.dirname(gpuscope.__file__), "integrations", "tensorboard")
    with open(os.path.join(tab_dir, "static", "index.js")) as fh:
        tab = fh.read()
    with open(os.path.join(tab_dir, "plugin.py")) as fh:
        backend = fh.read()
    scalars = {k: v for k, v in d.items() if isinstance(v, (str, int, float))}
    for key, shown in SHOWN.items():
        if d.get(key) in (None, [], {}, "") or (shown.holds and not shown.holds(d)):
            continue
        if shown.terminal:
            assert shown.terminal.format(**scalars) in text, (key, shown.terminal)
        if shown.html:
            assert shown.html.format(**scalars) in page, (key, shown.html)
        if shown.tab and shown.tab.startswith("panel-"):
            assert f'id="{shown.tab}"' in page, (key, shown.tab)  # the tab draws figures()
        elif shown.tab:
            assert shown.tab in tab, (key, shown.tab)
            if shown.tab.startswith("words."):
                assert f'"{shown.tab[6:]}":' in backend, (key, shown.tab)


def test_throughput_keeps_unknown_apart_from_absent_when_read_back():
    """samples/s without a batch size is written as null, a token rate without a token count
    not at all (analyze/throughput.py): the typed section keeps both when read back."""
    from msgspec import UNSET

    d = {**_saved("comm"), "throughput": {
        "per_rank": [{"rank": 0, "steps_per_s": 2.0, "samples_per_s": None}],
        "steps_per_s": 2.0, "samples_per_s": None, "flops_per_step": 1e9, "flops_source": "given",
        "flop_per_s": 2e9, "peak_flops": None, "peak_source": "x", "mfu_pct": None,
        "assumes": ["a"]}}
    rep = gpuscope.Report.from_dict(d)
    t = rep.throughput
    assert t.samples_per_s is None and t.mfu_pct is None and t.tokens_per_s is UNSET
    assert rep.to_dict()["throughput"] == d["throughput"]
    assert list(rep.to_dict()["throughput"]) == list(d["throughput"])  # in its key order
