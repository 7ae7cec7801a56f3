"""`gpuscope compare`: hand-built reports with known deltas, the CLI's exit codes and inputs, and
real pairs of 2-rank runs (a suggestion applied, the run repeated) with their prediction errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpuscope
from gpuscope.analyze.compare import compare
from gpuscope.analyze.run import analyze_table
from gpuscope.cli import main
from gpuscope.thresholds import Thresholds
from helpers import balanced, table_from_rows, unconfirmed_stragglers

TH0 = Thresholds(warmup_steps=0)


def rep(rows, **kw):
    return analyze_table(table_from_rows(rows, **kw), TH0)


def comm_bound(exposed, batch=4):
    return rep(balanced(8, 2, forward=10, backward=20, compute=30, comm=exposed + 5,
                        comm_exposed=exposed, other=2),
               knobs={"batch_size": batch, "world_size": 2, "device": "cpu"})


def test_parts_verdict_and_knobs_compare():
    before, after = comm_bound(30), comm_bound(3, batch=8)
    c = compare(before, after)
    parts = {p.part: p for p in c.parts}
    assert parts["step"].before_ms == pytest.approx(62) and parts["step"].after_ms == pytest.approx(35)
    assert parts["comm_exposed"].delta_ms == pytest.approx(-27)
    assert parts["forward"].delta_ms == pytest.approx(0) and parts["compute"].delta_pct == 0
    assert c.verdict_before[0] == "comm-bound" and c.verdict_after[0] == "compute-bound"
    assert c.knobs_changed == {"batch_size": (4, 8)}
    # per sample: 62 / 4 against 35 / 8
    assert c.per_sample and c.slower_pct == pytest.approx(100 * ((35 / 8) / (62 / 4) - 1))
    pred = next(p for p in c.predictions if p.knob == "batch_size")
    # on the suggestions' basis, the time of BEFORE's global batch: 35 ms for 2x the samples
    assert pred.applied == 8 and pred.measured_ms == pytest.approx(35 / 2)
    assert pred.error_pct == pytest.approx(100 * (pred.predicted_ms - 17.5) / 17.5)
    d = c.to_dict()
    assert d["schema"] == "gpuscope.compare/1" and d["unit"] == "sample"
    assert json.loads(json.dumps(d)) == d
    # samples/s before and after: 2 ranks x 4 samples per 62 ms, then x 8 per 35 ms
    b_rate, a_rate = d["rates"]["samples_per_s"]
    assert b_rate == pytest.approx(2 * 4 / 0.062, rel=1e-3)
    assert a_rate == pytest.approx(2 * 8 / 0.035, rel=1e-3)
    assert "mfu_pct" not in d["rates"]  # neither side knows it


def test_micro_steps_compare_across_accumulation():
    """4 micro-steps per optimizer step against 1: times compare per micro-step."""
    rows = []
    for r in range(2):
        for s in range(16):
            last = s % 4 == 3
            rows.append({"rank": r, "step": s, "compute": 10 + (2 if last else 0),
                         "optimizer": 2 if last else 0, "comm": 20 if last else 0,
                         "comm_exposed": 20 if last else 0})
    accum = rep(rows, knobs={"batch_size": 4})
    every = comm_bound(20)
    c = compare(every, accum)
    step = next(p for p in c.parts if p.part == "step")
    assert step.after_ms == pytest.approx((3 * 10 + 32) / 4)
    assert "sync_interval" in c.knobs_changed
    # the other way round, predictions are per BEFORE step: 4 of AFTER's micro-steps
    back = compare(accum, every)
    pred = next(p for p in back.predictions if p.knob == "sync_frequency")
    assert pred.measured_ms == pytest.approx(4 * 52)  # comm_bound(20): a 52 ms step


def test_cli_gate_exit_codes_and_saved_reports(tmp_path, capsys):
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    comm_bound(30).write_json(slow)
    comm_bound(3).write_json(fast)
    assert main(["compare", str(fast), str(slow), "--fail-if-slower", "5", "-q"]) == 3
    assert "regression" in capsys.readouterr().err
    assert main(["compare", str(slow), str(fast), "--fail-if-slower", "5", "-q"]) == 0
    assert main(["compare", str(fast), str(fast), "--fail-if-slower", "0", "-q"]) == 0
    out = tmp_path / "cmp.json"
    assert main(["compare", str(slow), str(fast), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "less time per sample" in text and "comm-bound" in text
    assert json.load(open(out))["slower_pct"] < -40
    assert main(["compare", str(slow), str(tmp_path / "nope")]) == 2
    assert main(["compare", str(slow), str(fast), "--fail-if-slower", "-1"]) == 2
    (tmp_path / "bad.json").write_text('{"schema": "gpuscope.report/1", "source": "record"}')
    assert main(["compare", str(slow), str(tmp_path / "bad.json")]) == 2


# ------------------------------------------------------------------------------ real runs
def _train(out, *args, profile=False):
    run_dir = os.path.join(out, "record")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "gpuscope.demo.train", "--run-dir", run_dir,
           "--timings", os.path.join(out, "timings.jsonl"), *args]
    if profile:
        cmd += ["--profile", os.path.join(out, "kineto")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _perf_counter_ms(out, skip=1, cycle=1):
    """The loop's own mean micro-step, warm-up left out: per optimizer step of `cycle`
    micro-steps the slowest rank's time (the ranks meet once per cycle: a max per micro-step
    would add up every rank's noise), divided by `cycle`."""
    lines = [json.loads(x) for x in open(os.path.join(out, "timings.jsonl"))]
    per_rank = np.array([np.array(x["step_s"])[skip:] for x in lines])
    n = per_rank.shape[1] // cycle * cycle
    cycles = per_rank[:, :n].reshape(len(lines), -1, cycle).sum(axis=2)
    return float(cycles.max(axis=0).mean()) * 1e3 / cycle


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gpuscope", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.alone
def test_real_pair_sync_frequency_applied(tmp_path):
    """The comm scenario, then its own sync_frequency suggestion applied (DDP no_sync and one
    optimizer step every K micro-steps): compare finds the knob, and the measured side agrees
    with the loop's perf_counter."""
    # two separately timed runs on a shared 2-core VM: its speed drifts between them (in CI the
    # estimate once came out 51.8% over the re-run, in a busy-core clone 52%, 24.8 ms predicted
    # against 16.3 ms). The estimate's accuracy is bench_whatif.py's figure; here only what holds
    # with margin under load, without a rerun: a gain predicted and got, and the point within a
    # factor of two of the measured step (a model that drops the saved transfer lands ~3x off)
    b, a = str(tmp_path / "b"), str(tmp_path / "a")
    before = _train(b, "--scenario", "comm", "--steps", "16")
    sug = next(s for s in gpuscope.analyze(before).suggestions if s.knob == "sync_frequency")
    k = int(sug.proposed.split()[1])
    after = _train(a, "--scenario", "comm", "--sync-every", str(k), "--steps", str(4 * k))
    proc = _cli("compare", before, after, "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr
    c = json.load(open(tmp_path / "c.json"))
    pred = next(p for p in c["predictions"] if p["knob"] == "sync_frequency")
    assert c["knobs_changed"]["sync_interval"] == [1, k]
    assert c["unit"] == "sample" and c["slower_pct"] < -20  # syncing less often pays here
    assert pred["as_suggested"] and pred["predicted_ms"] == pytest.approx(sug.estimated_step_ms,
                                                                         abs=1e-3)
    # the measured side: AFTER's mean micro-step, against the loop's own timing (cycles whole)
    ours = pred["measured_ms"]
    theirs = _perf_counter_ms(str(a), skip=k, cycle=k)
    assert abs(ours - theirs) <= 0.1 * theirs, (ours, theirs)
    assert pred["error_pct"] == pytest.approx(100 * (pred["predicted_ms"] - ours) / ours, abs=0.2)
    step_before = _perf_counter_ms(b)
    assert pred["predicted_ms"] < step_before and ours < step_before, (pred, step_before)
    assert 0.5 < pred["predicted_ms"] / ours < 2.0, pred
    assert "sync_frequency" in proc.stdout and "predicted" in proc.stdout


@pytest.mark.slow
@pytest.mark.alone
def test_real_pair_straggler_removed_and_the_gate(tmp_path):
    """The imbalanced scenario and the same run without the slow rank, recorded and profiled:
    the straggler prediction is checked, and the gate fires the other way round."""
    # 24 steps: on a busy core rank 0 stalls now and then too, and rank 1's 40 ms shrink to ~23
    # of difference; over 13 analysed steps that was once too noisy to call a straggler at a
    # family-wise 1% (t 2.5: rank 1 last in 9 of 13, 87% of the waiting, read as a low-confidence
    # lean), over 23 the same spread gives t ~3.4 against ~2.8
    before = _train(str(tmp_path / "b"), "--scenario", "imbalanced", "--steps", "24", profile=True)
    after = _train(str(tmp_path / "a"), "--scenario", "imbalanced", "--steps", "14",
                   "--extra-ms", "0", profile=True)
    proc = _cli("compare", before, after, "--json", str(tmp_path / "c.json"),
                "--fail-if-slower", "5")
    assert proc.returncode == 0, proc.stderr
    c = json.load(open(tmp_path / "c.json"))
    assert c["verdict"]["before"] == "imbalanced"
    # rank 1 named; or, where a busy core stalled rank 0 in enough of the steps that chance is
    # not ruled out, rank 1 probably a straggler and no other (once in a clean-clone CI run)
    assert c["stragglers"]["before"] == [1] or (
        c["stragglers"]["before"] == []
        and gpuscope.analyze(before).probable_straggler_ranks == [1]), c["stragglers"]
    # rank 1's forward computes 40 ms more of wall time (the loop's own perf_counter around each
    # forward, this run's, is the yardstick). The straggler's excess is how much longer rank 1 is
    # busy than rank 0; on a shared 2-core host rank 0's backward competes for a core with rank
    # 1's extra work and computes slower meanwhile (27 ms to rank 1's 13 in a busy-core clone), so
    # the excess is less than the forward gap: 22.2 ms for a 39.6 ms gap there, 36.7-44.7 for
    # 43-46 in others, 12.5 once. Pinned: at least a quarter of the gap, never much more than it
    slow = next(s for s in gpuscope.analyze(before).stragglers if s.rank == 1)
    own = {r["rank"]: r["forward_s"] for r in map(json.loads, open(tmp_path / "b" / "timings.jsonl"))}
    gaps = np.subtract(own[1], own[0])[1:]  # after the warm-up step
    gap_ms = 1e3 * float(np.median(gaps))
    assert gap_ms > 20, own  # the loop itself sees rank 1 slower by a material amount
    # the excess is a mean per step: where a busy core stalled rank 1's extra work in a few
    # steps (a clean-clone CI run: 84 ms late in 8 of 21 steps, said as its bursts; the median
    # gap 40.9 ms, the excess 54.3), the loop's mean gap is its yardstick from above
    top_ms = max(gap_ms, 1e3 * float(np.mean(gaps)))
    assert 0.25 * gap_ms <= slow.excess_ns / 1e6 <= 1.25 * top_ms + 3, (slow, gap_ms, top_ms)
    # the 40 ms straggler is gone from AFTER; two ranks sharing 2 cores with the test runner can
    # still make a real straggler of a few ms (rank 1 named again, with 8 ms, once in eight suite
    # runs), which the tool is right to name when the loop's own clock shows that rank computing
    # longer: pinned, that, and nothing near the 40 ms left
    # The loop's clock covers forward and the optimizer step (backward holds DDP's all-reduce):
    # a straggler named for those must show there; one named for backward is beyond that
    # yardstick (rank 1 named with 5.2 ms once in CI, its forward + optimizer 12.0 against
    # 11.7 ms: the excess lay elsewhere), and only held to be far from the 40 ms removed
    # A probable straggler is no claim: the report says too few steps rule out chance (rank 0
    # "last in 10 of 12 steps", 2.6 ms, its forward + optimizer 5.46 against 5.12 ms, once in a
    # quiet fresh-clone run); it too is held to be far from the 40 ms removed
    a = gpuscope.analyze(after).to_dict()
    checkable = dict(a, straggler_details=[s for s in a["straggler_details"]
                                           if s.get("cause_detail") != "backward"
                                           and not s.get("probable")])
    assert unconfirmed_stragglers(after, checkable) == [], a["straggler_details"]
    assert all(s["excess_ms"] < gap_ms / 2 for s in a["straggler_details"])
    wait = next(p for p in c["parts"] if p["part"] == "wait")
    # the straggler's excess is what rank 0 waited for; parts are means over the 2 ranks (rank 1
    # waited ~0), so up to half of it goes; AFTER's ranks wait for each other too on a busy core
    # (busy-core clone runs: -11.3 ms for a 23.9 ms excess, -8.3 ms for 28.8 ms)
    assert wait["delta_ms"] < -0.15 * slow.excess_ns / 1e6
    pred = next(p for p in c["predictions"] if p["knob"] == "straggler")
    # the measured side is AFTER's mean step; no bound on the error here: the profiler writing
    # its traces lengthens a few of these 14 steps (bench_whatif.py measures the error)
    # AFTER's step is the report's one figure (the slowest rank's mean step), as analyze says
    assert pred["measured_ms"] == pytest.approx(gpuscope.analyze(after).step_ns / 1e6, rel=1e-3)
    assert pred["error_pct"] == pytest.approx(
        100 * (pred["predicted_ms"] - pred["measured_ms"]) / pred["measured_ms"], abs=0.2)
    # the regression gate: the slow run as AFTER
    gate = _cli("compare", after, before, "--fail-if-slower", "10", "-q")
    assert gate.returncode == 3 and "regression" in gate.stderr
    # torch.profiler traces of the same pair compare too
    kin = _cli("compare", str(tmp_path / "b" / "kineto"), str(tmp_path / "a" / "kineto"),
               "--json", str(tmp_path / "k.json"))
    assert kin.returncode == 0, kin.stderr
    k = json.load(open(tmp_path / "k.json"))
    # the profiler's own trace writing lengthens a few of the profiled steps of both runs: the
    # 40 ms removed showed as only 18.7% faster in one suite run of five: the direction is pinned
    # over its 8 profiled steps on a busy core, a step where the other rank was later still can
    # leave the straggler short of significance: then the verdict is jitter, never confidently,
    # with rank 1 named: a probable straggler (last in most steps: low), or one its steps cannot
    # rule out (once in CI: rank 0 stalled past it in 3 of 8 steps, and the traces said jitter
    # 81% "high" before that cap: low)
    kb = gpuscope.analyze(str(tmp_path / "b" / "kineto")).verdict
    assert k["verdict"]["before"] == "imbalanced" or (
        kb.label == "jitter-bound" and kb.confidence != "high"
        and any("rank 1 arrived" in e for e in kb.evidence)), kb
    assert k["slower_pct"] < -5


def test_the_gate_refuses_two_different_trainings_unless_forced(tmp_path, capsys):
    """50,826 against 6,258,010 parameters is not one training before and after a change: the
    comparison says so, and the regression gate refuses it (exit 2, one line) unless --force
    (it printed '208708.8% more time per sample' and exited 3)."""
    small = rep(balanced(8, 2, compute=10, other=1),
                knobs={"batch_size": 4, "params": 50_826, "model": "DistributedDataParallel"})
    big = rep(balanced(8, 2, compute=900, other=1),
              knobs={"batch_size": 4, "params": 6_258_010, "model": "DistributedDataParallel"})
    c = compare(small, big)
    assert c.different == "50,826 against 6,258,010 parameters"
    assert any("different trainings" in w for w in c.warnings)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    small.write_json(a)
    big.write_json(b)
    assert main(["compare", str(a), str(b), "--fail-if-slower", "5", "-q"]) == 2
    assert "different trainings" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--fail-if-slower", "5", "-q", "--force"]) == 3
    same = rep(balanced(8, 2, compute=11, other=1),
               knobs={"batch_size": 4, "params": 50_826, "model": "DistributedDataParallel"})
    assert compare(small, same).different == ""


def test_a_knob_that_follows_from_another_is_not_another_change():
    """Giving a DataLoader workers sets its prefetch_factor (None with none, 2 with some): one
    change, not 'more than one knob changed'."""
    from gpuscope.analyze.compare import changed_knobs

    got = changed_knobs({"num_workers": 0, "prefetch_factor": None,
                         "persistent_workers": False, "hidden_comm_ns": 130_686},
                        {"num_workers": 6, "prefetch_factor": 2, "persistent_workers": True,
                         "hidden_comm_ns": 200_735})
    assert got == {"num_workers": (0, 6)}  # measured values (DDP's logging) are no knob either
    both = changed_knobs({"num_workers": 2, "prefetch_factor": 2},
                         {"num_workers": 6, "prefetch_factor": 4})
    assert set(both) == {"num_workers", "prefetch_factor"}  # both chosen: both said


def test_measurements_are_no_knobs_and_a_batch_s_bytes_go_with_its_size():
    """Issue 71, 3.: every compare of one changed knob listed DDP's measured hidden share too
    ("hidden_comm_share 0.0647 -> 0.22925, num_workers 0 -> 1") and warned of more than one
    knob; a batch's bytes and FLOPs follow its size. Bytes changed alone (another dataset)
    are still said."""
    from gpuscope.analyze.compare import changed_knobs

    got = changed_knobs({"num_workers": 0, "hidden_comm_share": 0.0647,
                         "hidden_comm": "unmeasured", "flops_counted_step": 3},
                        {"num_workers": 1, "hidden_comm_share": 0.22925,
                         "hidden_comm": "in_flight", "flops_counted_step": 5})
    assert got == {"num_workers": (0, 1)}
    got = changed_knobs({"batch_size": 16, "batch_bytes": 4224, "flops_per_step": 1e9},
                        {"batch_size": 32, "batch_bytes": 8448, "flops_per_step": 2e9})
    assert got == {"batch_size": (16, 32)}
    assert changed_knobs({"batch_size": 16, "batch_bytes": 4224},
                         {"batch_size": 16, "batch_bytes": 9000}) == {"batch_bytes": (4224, 9000)}


def test_rates_print_in_human_units():
    from gpuscope.render.compare import _human

    assert _human("samples_per_s", 2180.0) == "2.18k"
    assert _human("resident_peak_bytes", 1.5 * 2**30) == "1.5 GiB"
    assert _human("mfu_pct", 41.23) == "41.2%" and _human("tokens_per_s", None) == "?"


def test_the_noise_figure_is_one_figure_in_the_table_and_the_json():
    """AFTER's step-to-step spread is said once: the table's '±N%' is the JSON's noise_pct (half
    the interquartile range of AFTER's step times, in % of their median)."""
    from gpuscope.render.compare import render

    before = comm_bound(30)
    jumpy = balanced(8, 2, forward=10, backward=20, compute=30, comm=8, comm_exposed=3, other=2)
    for r in jumpy:  # steps of 35 and 43 ms in turn: quartiles 35 and 43 around a median of 39
        r["other"] += 8 * (r["step"] % 2)
    after = rep(jumpy, knobs={"batch_size": 8, "world_size": 2, "device": "cpu"})
    c = compare(before, after)
    pred = next(p for p in c.predictions if p.knob == "batch_size")
    assert pred.noise_pct == pytest.approx(100 * 4 / 39)
    assert "±10%" in render(c, width=140)
    assert c.to_dict()["predictions"][0]["noise_pct"] == pytest.approx(10.3)
    # issue 71, 20.: three AFTER steps tell no spread: unknown ("?", null), never "±0%"
    short = rep([r for r in jumpy if r["step"] < 3],
                knobs={"batch_size": 8, "world_size": 2, "device": "cpu"})
    c = compare(before, short)
    pred = next(p for p in c.predictions if p.knob == "batch_size")
    assert pred.noise_pct is None and c.to_dict()["predictions"][0]["noise_pct"] is None
    text = render(c, width=140)
    assert "±0%" not in text and "its times are noisy" in text


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_comparison_text_ends_no_line_with_spaces_and_keeps_figures_whole(width):
    """Rich pads table titles and wrapped lines with spaces; and '470.9 KiB' was split across
    two lines of the rates."""
    import re

    from gpuscope.render.compare import render

    before, after = comm_bound(30), comm_bound(3, batch=8)
    c = compare(before, after)
    c.rates["resident_growth_bytes_per_step"] = (482_201.6, 878.0)
    c.rates["resident_peak_bytes"] = (336_068_608.0, 326_631_424.0)
    lines = render(c, width=width).splitlines()
    assert not [x for x in lines if x.endswith(" ")]
    for a, b in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", a) and re.match(r"\s*(KiB|MiB|B\b|%)", b)), (a, b)
