"""Flight Recorder dumps of real jobs (issue 67): recognised by content whatever their name,
read by process group (never by the description every group of a kind shares), pg_status read
so that a rank whose ring is empty or wrapped is still placed, and the ranks that stopped the job
told first.

Dumps come two ways: generated in the shape torch writes them for a Megatron-style job of any
size that hangs in a known way (benchmarks/fr_dumps.py simulates the job: who issued what, what
completed), and written by torch itself in real 8-rank gloo runs with tensor-, data-, pipeline-
and expert-parallel groups (tests/workloads/fr_mesh.py)."""

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

import gpuscope
from gpuscope.analyze.hang_report import tell
from gpuscope.readers.flight_recorder import find, load

HERE = os.path.dirname(__file__)
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from fr_dumps import Layout, make_job  # noqa: E402

SMALL = Layout(tp=2, cp=2, ep=4, pp=2, world=64)  # dp = 8: EP groups of 4 across DP


def _told(folder):
    dumps, bad = find(str(folder))
    return tell(dumps, bad)


@pytest.mark.parametrize("fault,fmt", [("behind", "pickle"), ("empty", "json"),
                                       ("missing", "pickle"), ("mismatch", "pickle")])
def test_the_rank_that_stopped_the_job_is_named_with_the_group_and_collective_it_holds(
        tmp_path, fault, fmt):
    """64 ranks in five kinds of group; rank 45 stops before its expert-parallel all-to-all
    (stuck in Python; the same with its ring empty; with no dump; or calling another
    collective): it alone is blamed, first at its own EP group's collective, where the other
    three members wait."""
    truth = make_job(str(tmp_path), SMALL, fault=fault, rank=45, at=2, step=40, fmt=fmt)
    got = _told(tmp_path)
    assert got["blamed"] == [45], got["text"]
    first = got["stopped_by"][0]
    hold = first["holds"][0]
    assert (hold["group"], hold["seq"]) == (truth["group"], truth["seq"]), got["text"]
    assert hold["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    others = [r for r in truth["members"] if r != 45]
    assert hold["waiting"] == (truth["members"] if fault == "mismatch" else others)
    assert first["reason"] == {"behind": "never_entered", "empty": "never_entered",
                               "missing": "no_dump", "mismatch": "mismatch"}[fault]
    assert got["text"].startswith("rank 45 stopped it"), got["text"]
    if fault == "mismatch":
        assert "rank 45 called all_reduce of [[1]]" in got["text"]
        assert "(rank 45 the odd one out)" in got["text"]


def test_two_ranks_whose_rings_are_empty_are_placed_from_their_pg_status(tmp_path):
    """Ranks 13 and 14 stop and their dumps hold no entries: their pg_status (keyed by their
    own ids of their groups) is tied to their groups through their peers, and each is named with
    the expert-parallel group that waits for it."""
    truth = make_job(str(tmp_path), SMALL, fault="empty", rank=[13, 14], at=2, step=40)
    got = _told(tmp_path)
    assert got["blamed"] == [13, 14], got["text"]
    assert got["text"].startswith("ranks 13, 14 stopped it")
    for s in got["stopped_by"]:
        assert s["holds"][0]["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
        assert s["holds"][0]["seq"] == truth["seq"]
        assert s["last"]["text"].startswith("its ring holds no collective; its pg_status")
    assert "tied to the group by its peers' id" in got["text"]
    assert not got["unplaced"]


def _entry(name, desc, uid, seq, done, kind="all_reduce", sizes=((8,),)):
    return {"process_group": (name, desc), "pg_id": uid, "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "profiling_name": f"nccl:{kind}",
            "input_sizes": [list(s) for s in sizes], "state": "completed" if done else "scheduled",
            "retired": done, "time_created_ns": 1_796_000_000_000_000_000 + seq,
            "frames": [{"filename": "/job/train.py", "line": seq, "name": "step"}]}


def _dump(folder, rank, groups, entries, status):
    """A hand-made dump: groups {name: (desc, ranks)}, status {uid: (enq, done)}."""
    d = {"version": "2.10", "pg_config": {n: {"name": n, "desc": desc, "ranks": str(ranks)}
                                          for n, (desc, ranks) in groups.items()},
         "pg_status": {str(u): {"last_enqueued_collective": e, "last_started_collective": -1,
                                "last_completed_collective": c} for u, (e, c) in status.items()},
         "entries": entries}
    with open(os.path.join(folder, f"nccl_trace_rank_{rank}"), "wb") as fh:
        pickle.dump(d, fh)


def test_sequence_numbers_are_compared_within_a_group_never_across_groups_of_one_kind(tmp_path):
    """Two tensor-parallel groups share one description, at very different collective numbers
    (one does far more work): ranks 0, 1 are idle at #39416 of theirs, ranks 2, 3 wait in #30837
    of theirs, which rank 3 never entered. Only rank 3 is blamed; nothing compares #39416 with
    #30837."""
    tp, world = "TENSOR_MODEL_PARALLEL_GROUP", {"0": ("default_pg", [0, 1, 2, 3])}
    for r in (0, 1):
        g = {**world, "1": (tp, [0, 1])}
        _dump(tmp_path, r, g, [_entry("1", tp, 1, s, True) for s in (39415, 39416)],
              {1: (39416, 39416)})
    _dump(tmp_path, 2, {**world, "2": (tp, [2, 3])},
          [_entry("2", tp, 1, 30836, True), _entry("2", tp, 1, 30837, False)], {1: (30837, 30836)})
    _dump(tmp_path, 3, {**world, "2": (tp, [2, 3])}, [_entry("2", tp, 1, 30836, True)],
          {1: (30836, 30836)})
    got = _told(tmp_path)
    assert got["blamed"] == [3], got["text"]
    stuck = got["stuck_groups"]
    assert [(s["group"], s["seq"], s["waiting"], s["never_entered"]) for s in stuck] == \
        [("2", 30837, [2], [3])]
    assert "39416" not in got["text"] and "ranks 0, 1: every collective" in got["text"]
    assert got["by_kind"][tp] == {"groups": 2, "stuck": 1, "waiting_on_it": 0, "complete": 1}
    # {2, 3} & {0, 1, 2, 3} leaves two ranks: the number torch ends the file name with says which
    assert [s["rank_from"] for s in got["stopped_by"]] == ["its file name"]


def test_a_collective_every_member_waits_in_blames_no_rank(tmp_path):
    """Every member of one EP group issued the all-to-all and it never completed (a link down):
    no rank stopped the job; the collective itself hangs, and the rest of the job waits on it."""
    make_job(str(tmp_path), SMALL, fault="transfer", rank=45, at=2, step=40)
    got = _told(tmp_path)
    assert got["blamed"] == [] and got["hung"], got["text"]
    assert got["text"].startswith("no rank stopped it")
    assert "the collective itself hangs" in got["text"]
    assert "Waiting on it:" in got["text"]


def test_a_circle_of_waits_is_told_as_collectives_called_in_another_order(tmp_path):
    """Rank 0 calls group A's collective first, rank 1 group B's: each waits for the other."""
    groups = {"0": ("default_pg", [0, 1]), "1": ("A", [0, 1]), "2": ("B", [0, 1])}
    _dump(tmp_path, 0, groups, [_entry("1", "A", 1, 4, True), _entry("2", "B", 2, 4, True),
                                _entry("1", "A", 1, 5, False)], {1: (5, 4), 2: (4, 4)})
    _dump(tmp_path, 1, groups, [_entry("1", "A", 1, 4, True), _entry("2", "B", 2, 4, True),
                                _entry("2", "B", 2, 5, False)], {1: (4, 4), 2: (5, 4)})
    got = _told(tmp_path)
    assert got["circle"] and got["blamed"] == [0, 1], got["text"]
    assert "another order" in got["text"]


def test_dumps_under_any_name_take_their_rank_from_their_groups(tmp_path):
    """Dumps renamed to names with no rank in them: each rank comes from the one rank its
    groups share; the story is the same."""
    src = tmp_path / "src"
    make_job(str(src), SMALL, fault="behind", rank=45, at=2, step=40)
    named = tmp_path / "named"
    named.mkdir()
    for i, name in enumerate(sorted(os.listdir(src))):
        shutil.copy(src / name, named / f"dump-{chr(97 + i % 26)}{chr(97 + i // 26)}.bin")
    dumps, bad = find(str(named))
    assert sorted(dumps) == list(range(64)) and not bad
    assert {d.rank_from for d in dumps.values()} == {"the dump"}
    assert tell(dumps, bad)["blamed"] == [45]


def test_json_and_pickle_dumps_tell_the_same(tmp_path):
    for fmt in ("pickle", "json"):
        make_job(str(tmp_path / fmt), SMALL, fault="behind", rank=45, at=2, step=40, fmt=fmt)
    a, b = _told(tmp_path / "pickle"), _told(tmp_path / "json")
    assert a == b


def test_files_that_are_not_dumps_say_why_and_lose_nothing(tmp_path):
    """Beside the dumps: a log, an empty file, a truncated pickle, JSON of something else, a
    pickle of a list: each is listed with why; the dumps are read as before. A folder of such
    files alone is refused in one line that says what a dump holds and why the first is not."""
    make_job(str(tmp_path), SMALL, fault="behind", rank=45, at=2, step=40)
    blob = (tmp_path / "_dump_3").read_bytes()
    (tmp_path / "_dump_3").write_bytes(blob[: len(blob) // 2])  # cut as a full disk cuts
    (tmp_path / "notes").write_text("rank 3 looked slow\n")
    (tmp_path / "empty_1").write_bytes(b"")
    (tmp_path / "config_7").write_text(json.dumps({"lr": 0.1}))
    (tmp_path / "list_9").write_bytes(pickle.dumps([1, 2]))
    dumps, bad = find(str(tmp_path))
    why = dict(bad)
    assert "truncated or corrupt pickle" in why["_dump_3"]
    assert why["empty_1"] == "empty" and "neither a pickle nor JSON" in why["notes"]
    assert "it holds lr" in why["config_7"] and "not a Flight Recorder dump" in why["list_9"]
    got = tell(dumps, bad)
    assert got["blamed"] == [45] and got["missing"] == [3]
    assert any(n.startswith("_dump_3: a truncated") for n in got["notes"])
    only = tmp_path / "only"
    only.mkdir()
    shutil.move(str(tmp_path / "notes"), only / "notes")
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(only)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "Flight Recorder dumps" in out.stderr, out.stderr
    assert "notes: not a Flight Recorder dump (neither a pickle nor JSON)" in out.stderr


def test_dumps_beside_a_run_dir_that_never_saw_the_stall_tell_it(tmp_path):
    """A recorded run killed before its stall watcher's bound (no stall records) with torch's
    dumps written into its run dir: the report opens with what the dumps say."""
    src = os.path.join(HERE, "fixtures", "stalled")
    for name in os.listdir(src):
        if name.endswith(".gpuscope.jsonl"):
            with open(os.path.join(src, name)) as fh:
                kept = [line for line in fh if not line.startswith('{"stall"')]
            (tmp_path / name).write_text("".join(kept))
        elif name.endswith(".fr.json"):
            shutil.copy(os.path.join(src, name), tmp_path / f"nccl_trace_rank_{int(name[5:10])}")
    rep = gpuscope.analyze(str(tmp_path))
    s = rep.to_dict()["stall"]
    assert s["blamed"] == [2] and s["flight_recorder"]["blamed"] == [2], s
    assert s["text"].startswith("stalled (Flight Recorder) rank 2 stopped it"), s["text"]
    assert s["state"] == rep.stall.state == "from_dumps"  # no stall record: the dumps tell it
    assert "rank 2 was already" in s["late_before"]["2"], s["late_before"]  # the straggler
    from gpuscope.render.terminal import render

    assert render(rep, width=100).splitlines()[1].startswith(
        "THE RUN STALLED: (Flight Recorder) rank 2 stopped it")


@pytest.mark.slow
def test_1024_ranks_in_five_kinds_of_group_are_told_as_shortly_as_64(tmp_path):
    """1,024 ranks (TP 8, CP 2, EP 8 across DP 16, PP 4): rank 517 stops before its EP
    all-to-all; it is blamed with its EP group's collective, and the report has as many lines as
    the 64-rank one's."""
    truth = make_job(str(tmp_path / "big"), fault="behind", rank=517, at=2, step=300, ring=200)
    big = _told(tmp_path / "big")
    assert big["blamed"] == [517] and big["dumps"] == 1024, big["text"]
    hold = big["stopped_by"][0]["holds"][0]
    assert (hold["group"], hold["seq"]) == (truth["group"], truth["seq"])
    make_job(str(tmp_path / "small"), SMALL, fault="behind", rank=45, at=2, step=40)
    small = _told(tmp_path / "small")
    assert len(big["text"].splitlines()) == len(small["text"].splitlines())
    assert len(big["text"]) < 2 * len(small["text"]), big["text"]
    assert set(big["by_kind"]) == {"TENSOR_MODEL_PARALLEL_GROUP", "CONTEXT_PARALLEL_GROUP",
                                   "EXPERT_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP",
                                   "PIPELINE_MODEL_PARALLEL_GROUP", "default_pg"}


def _mesh(tmp_path, *args):
    out = tmp_path / "dumps"
    out.mkdir()
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "8", os.path.join(HERE, "workloads", "fr_mesh.py"),
                          "--out", str(out), "--dump-after", "4", *args],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.slow
def test_real_gloo_dumps_a_rank_stuck_in_python_with_an_empty_ring(tmp_path):
    """torch's own dumps of an 8-rank gloo job under the prefix `_dump_` (gloo's pg_config lists
    no members): rank 5 stops in Python before its EP all-to-all, its dump without entries.
    Rank 5 is blamed, placed in its EP group from its pg_status, where ranks 4, 6, 7 wait."""
    out = _mesh(tmp_path, "--how", "python", "--dump", "empty", "--prefix", "_dump_")
    assert sorted(os.listdir(out)) == sorted(f"_dump_{r}" for r in range(8))
    got = _told(out)
    assert got["blamed"] == [5], got["text"]
    hold = got["stopped_by"][0]["holds"][0]
    assert hold["desc"] == "EXPERT_MODEL_PARALLEL_GROUP" and hold["waiting"] == [4, 6, 7]
    assert hold["group_ranks"] == [4, 5, 6, 7] and hold["call"] == "all_to_all of [[16]]"
    assert "short of a member" in got["text"]
    assert got["by_kind"]["TENSOR_MODEL_PARALLEL_GROUP"]["groups"] == 4


@pytest.mark.slow
def test_real_gloo_dumps_a_mismatched_collective_with_a_wrapped_ring(tmp_path):
    """Rank 5 calls an all-reduce of [1] on its EP group where the others call the all-to-all;
    its ring holds 2 entries (TORCH_FR_BUFFER_SIZE=2); dumps named fr_trace_rank_N. Rank 5 is
    the odd one out, named by its own call."""
    out = _mesh(tmp_path, "--how", "mismatch", "--buffer", "2", "--prefix", "fr_trace_rank_")
    got = _told(out)
    assert got["blamed"] == [5], got["text"]
    stuck = [s for s in got["stuck_groups"] if s["odd_ones"]]
    assert stuck and stuck[0]["odd_ones"] == [5] and stuck[0]["calls"] == {
        "all_to_all of [[16]]": [4, 6, 7], "all_reduce of [[1]]": [5]}, got["text"]


@pytest.mark.slow
def test_real_gloo_dumps_with_the_stuck_rank_s_dump_lost(tmp_path):
    """Rank 5's dump never written (its node went down), the others' as JSON: rank 5 is named
    from the EP group that is one member short of the others of its kind."""
    out = _mesh(tmp_path, "--how", "lost", "--dump", "json")
    assert len(os.listdir(out)) == 7
    assert isinstance(load(str(out / "_dump_4")), object)
    got = _told(out)
    assert got["blamed"] == [5] and got["missing"] == [5], got["text"]
    assert got["stopped_by"][0]["reason"] == "no_dump"


def test_the_dumps_page_opens_in_a_browser_with_the_hang_first(tmp_path):
    """`gpuscope analyze DUMPS --html F`: one page, read in headless Chromium: the hang's line
    first, naming the rank, no error in the console."""
    from browser import Page, launch

    make_job(str(tmp_path / "d"), SMALL, fault="behind", rank=45, at=2, step=40)
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(tmp_path / "d"),
                          "--html", str(tmp_path / "fr.html")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "HTML page:" in out.stdout, out.stderr
    pw, browser = launch()
    try:
        page = Page(browser)
        page.page.goto((tmp_path / "fr.html").as_uri())
        first = page.page.inner_text("#hang")
        assert first.startswith("THE JOB HUNG: rank 45 stopped it"), first
        assert "EXPERT_MODEL_PARALLEL_GROUP" in page.page.inner_text("pre")
        assert not page.errors, page.errors
    finally:
        browser.close()
        pw.stop()
