"""`gpuscope try` (issue 69, 1.): the suggested changes run beside the baseline and measured.
The plan (placeholders, the baseline's values, what the report suggests, what the command lacks)
on report dicts; the recorder's trial end on a real loop; a real 2-rank run of the demo's
training script (gloo, CPU), a loader short of workers, tried by the command a user types."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gpuscope.errors import GpuscopeError
from gpuscope.trials import (Candidate, filled, make_plan, parse_knob_values, placeholders,
                             summary)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "gpuscope", "demo", "train.py")

REPORT = {"knobs": {"num_workers": 0, "batch_size": 16, "sync_interval": 1},
          "suggestions": [
              {"knob": "num_workers", "current": 0, "proposed": 4, "estimated_step_ms": 10.0,
               "estimated_step_ms_range": [8.0, 13.0]},
              {"knob": "pin_memory", "current": False, "proposed": True,
               "estimated_step_ms": 30.0, "estimated_step_ms_range": [28.0, 31.0]},
              {"knob": "sync_frequency", "current": 1, "proposed": 8,
               "estimated_step_ms": 25.0, "estimated_step_ms_range": [20.0, 30.0]}]}


def test_placeholders_are_filled_and_other_braces_left_alone():
    cmd = ["train.py", "--nw={num_workers}", "--cfg", '{"a": 1}', "--x", "{unknown}{batch_size}"]
    assert placeholders(cmd) == ["num_workers", "unknown", "batch_size"]
    assert filled(cmd, {"num_workers": 4, "batch_size": 32}) == [
        "train.py", "--nw=4", "--cfg", '{"a": 1}', "--x", "{unknown}32"]


def test_a_placeholder_counted_over_the_ranks_is_multiplied():
    # nanoGPT's --gradient_accumulation_steps counts micro-steps over all ranks: on 2 ranks,
    # syncing every 8 micro-steps of each rank is 16
    cmd = ["train.py", "--gradient_accumulation_steps={sync_frequency*2}", "--b={batch_size}"]
    assert placeholders(cmd) == ["sync_frequency", "batch_size"]
    assert filled(cmd, {"sync_frequency": 8, "batch_size": 4}) == [
        "train.py", "--gradient_accumulation_steps=16", "--b=4"]
    with pytest.raises(GpuscopeError, match="not a number"):
        filled(cmd, {"sync_frequency": "every 8 steps", "batch_size": 4})


def test_the_plan_tries_the_suggestions_the_command_holds_and_names_the_others():
    plan = make_plan(REPORT, ["t", "--w", "{num_workers}", "--k", "{sync_frequency}"])
    assert [c.label for c in plan.candidates] == ["baseline", "num_workers=4",
                                                  "sync_frequency=8"]
    assert plan.candidates[0].values == {"num_workers": 0, "sync_frequency": 1}
    assert plan.candidates[1].values == {"num_workers": 4, "sync_frequency": 1}
    assert plan.candidates[1].estimate == 10.0 and plan.candidates[1].estimate_range == (8, 13)
    assert len(plan.not_in_command) == 1 and "pin_memory" in plan.not_in_command[0]
    # a straggler's fix is no value a command takes: not offered as a placeholder to add
    odd = {**REPORT, "suggestions": REPORT["suggestions"] + [
        {"knob": "straggler", "current": "rank 1 on host vm", "proposed": "match the median rank",
         "estimated_step_ms": 9.0}]}
    assert make_plan(odd, ["t", "{num_workers}"]).not_in_command == make_plan(
        REPORT, ["t", "{num_workers}"]).not_in_command
    assert make_plan(REPORT, ["t", "{num_workers}", "{sync_frequency}"], top=1).candidates[-1] \
        .label == "num_workers=4"


def test_values_named_on_the_command_line_and_a_baseline_the_report_lacks():
    plan = make_plan(REPORT, ["t", "{num_workers}", "{seq_len}"],
                     parse_knob_values(["num_workers=2,8", "num_workers=3"]), {"seq_len": 128})
    assert [c.label for c in plan.candidates] == ["baseline", "num_workers=2", "num_workers=8",
                                                  "num_workers=3"]
    assert plan.candidates[2].values == {"num_workers": 8, "seq_len": 128}
    assert plan.candidates[2].estimate is None
    with pytest.raises(GpuscopeError, match="seq_len.*--base seq_len=VALUE"):
        make_plan(REPORT, ["t", "{num_workers}", "{seq_len}"])
    with pytest.raises(GpuscopeError, match="no {lr} placeholder"):
        make_plan(REPORT, ["t", "{num_workers}"], parse_knob_values(["lr=0.1"]))
    with pytest.raises(GpuscopeError, match="no {knob} placeholder"):
        make_plan(REPORT, ["t", "--workers", "4"])
    with pytest.raises(GpuscopeError, match="nothing to try.*pin_memory"):
        make_plan({**REPORT, "suggestions": REPORT["suggestions"][1:2]}, ["t", "{num_workers}"])
    with pytest.raises(GpuscopeError, match="NAME=VALUE"):
        parse_knob_values(["num_workers"])


def test_the_summary_pairs_each_round_with_its_baseline_and_checks_the_range():
    base = Candidate("baseline", {"num_workers": 0}, steps_ms=[40.0, 44.0, 42.0])
    four = Candidate("num_workers=4", {"num_workers": 4}, "num_workers", 10.0, (8.0, 13.0),
                     steps_ms=[10.0, 22.0, None], failures=["round 3: exit status 1: boom"])
    rows = summary([base, four])
    assert rows[0]["step_ms"] == 42.0 and rows[0]["step_ms_range"] == [40.0, 44.0]
    assert rows[1]["step_ms"] == 16.0 and rows[1]["failed"] == 1
    # ratios 0.25 and 0.5 (300% and 100%): their mean 0.375, a gain of 167%; they stray 47% from
    # it: with one degree of freedom a repeat may measure anything above a 62% loss
    assert rows[1]["gain_pct"] == pytest.approx(100 * (1 / 0.375 - 1), abs=0.1)
    assert rows[1]["gain_pct_range"] == [-61.9, None]
    assert rows[1]["within_range"] is False and rows[1]["best"] and not rows[0]["best"]


def test_a_gains_interval_is_the_rounds_spread_pooled_over_the_candidates():
    """The interval a repeat falls in is read from the rounds, not from each round's steps: a
    whole-epoch trial's steps spread +-30% (a loader's bursts, one epoch start) where its rounds
    agree to 1%. Each candidate's rounds against the same round's baseline, their spread pooled
    over the candidates (2 degrees of freedom, t = 4.303), a repeat of 2 rounds: root(2/2)."""
    base = Candidate("baseline", {"num_workers": 0}, steps_ms=[40.0, 40.0], rel_se=[0.3, 0.3])
    four = Candidate("num_workers=4", {"num_workers": 4}, "num_workers", steps_ms=[20.0, 20.4],
                     rel_se=[0.3, 0.3])
    two = Candidate("num_workers=2", {"num_workers": 2}, "num_workers", steps_ms=[30.0, 29.4],
                    rel_se=[0.3, 0.3])
    rows = summary([base, four, two])
    ss = sum((x / 20.2 - 1) ** 2 for x in (20.0, 20.4)) + sum(
        (x / 29.7 - 1) ** 2 for x in (30.0, 29.4))
    h = 4.303 * (ss / 2) ** 0.5
    r = 20.2 / 40
    assert rows[1]["gain_pct_range"] == [pytest.approx(100 * (1 / (r * (1 + h)) - 1), abs=0.05),
                                         pytest.approx(100 * (1 / (r * (1 - h)) - 1), abs=0.05)]
    assert rows[1]["gain_pct_range"][1] - rows[1]["gain_pct_range"][0] < 30  # +-6%, not +-60%
    assert rows[1]["rounds_ms"] == [20.0, 20.4]
    assert rows[1]["gain_pct"] == pytest.approx(100 * (1 / r - 1), abs=0.05)
    # a single round knows nothing of the rounds' spread: twice its own error (3% and 4%: 5%),
    # root 2 for a repeat
    one = summary([Candidate("baseline", {}, steps_ms=[40.0], rel_se=[0.03]),
                   Candidate("x=1", {}, "x", steps_ms=[20.0], rel_se=[0.04])])
    h = 2 * 0.05 * 2 ** 0.5
    assert one[1]["gain_pct_range"] == [pytest.approx(100 * (1 / (0.5 * (1 + h)) - 1), abs=0.05),
                                        pytest.approx(100 * (1 / (0.5 * (1 - h)) - 1), abs=0.05)]


_LOOP = r"""
import os, sys, torch
import gpuscope
done = 0
with gpuscope.record(sys.argv[1]) as rec:
    for i in range(50):
        torch.ones(4).sum()
        done += 1
        rec.step()
print("never here", done)
"""


def test_the_recorder_ends_a_trial_after_the_steps_it_is_told(tmp_path):
    """GPUSCOPE_STOP_AFTER=7: the loop ends after its 7th step with exit status 0, the recording
    closed cleanly with 7 steps in $GPUSCOPE_RUN_DIR, not in the directory the code names."""
    from gpuscope.readers import read_path

    env = dict(os.environ, GPUSCOPE_STOP_AFTER="7", GPUSCOPE_RUN_DIR=str(tmp_path / "trial"))
    proc = subprocess.run([sys.executable, "-c", _LOOP, str(tmp_path / "code")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "never here" not in proc.stdout and not (tmp_path / "code").exists()
    table = read_path(str(tmp_path / "trial"))
    assert len(table.frame) == 7 and not any("no end record" in w or "raised" in w
                                             for w in table.warnings)


def test_try_measures_the_suggested_workers_and_calibrates_the_next_estimate(tmp_path,
                                                                             monkeypatch):
    """The demo's data-bound training (2 ranks, gloo, CPU: each batch sleeps in the loader) is
    recorded, then `gpuscope try RUN -- torchrun ... --num-workers {num_workers}` runs the
    baseline and the report's top suggestion (a worker count) interleaved: both run, each in its
    own run dir, and the workers measure faster than none (the loader's sleep is most of a step;
    a worker sleeps beside the training, so a busy machine keeps the order). What was measured
    is kept for this host, and the next analysis of the run says its estimate is calibrated."""
    import gpuscope

    run = tmp_path / "base"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", TRAIN, "--scenario", "data", "--steps", "40"]
    cal = tmp_path / "calibration.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", GPUSCOPE_CALIBRATION=str(cal))
    proc = subprocess.run(torchrun + ["--run-dir", str(run), "--steps", "12"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "trials"
    proc = subprocess.run([sys.executable, "-m", "gpuscope", "try", str(run), "--top", "1",
                           "--warmup", "3", "--steps", "8", "--repeats", "1",
                           "--out", str(out), "--json", str(tmp_path / "try.json"), "--",
                           *torchrun, "--run-dir", str(tmp_path / "ignored"), "--num-workers",
                           "{num_workers}"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    got = json.loads((tmp_path / "try.json").read_text())
    base, more = got["trials"]
    assert base["label"] == "baseline" and more["knob"] == "num_workers" and more["value"] > 0
    assert base["failed"] == more["failed"] == 0 and "estimated_step_ms" in more
    assert more["step_ms"] < base["step_ms"] and more["best"]
    assert sorted(os.listdir(out)) == ["00-baseline-r1", f"01-num_workers={more['value']}-r1"]
    assert not (tmp_path / "ignored").exists()
    assert "Trials" in proc.stdout and f"num_workers={more['value']}" in proc.stdout
    kept = json.loads(cal.read_text())["trials"]
    host = gpuscope.analyze(str(run)).ranks[0].host
    assert [(t["host"], t["knob"], t["value"]) for t in kept] == [
        (host, "num_workers", more["value"])]
    assert kept[0]["measured_ms"] == pytest.approx(more["step_ms"], rel=1e-3)
    # with its round's baseline and the step of the run its estimate came from (the ratios)
    assert kept[0]["baseline_ms"] == pytest.approx(base["step_ms"], rel=1e-3)
    assert kept[0]["report_step_ms"] == pytest.approx(
        max(r.step_ns for r in gpuscope.analyze(str(run)).ranks) / 1e6, rel=1e-3)
    # this very change, from a run of this setup: the same statistic as try's spread
    assert kept[0]["setup"] and 0 < kept[0]["rel_se"] < 1 and 0 < kept[0]["baseline_rel_se"] < 1
    monkeypatch.setenv("GPUSCOPE_CALIBRATION", str(cal))
    sug = next(s for s in gpuscope.analyze(str(run)).suggestions if s.knob == "num_workers")
    assert "calibrated on this host by gpuscope try: 1 trial(s) of" in sug.why


def test_a_trial_measures_a_whole_epoch_where_epochs_are_short():
    """Each epoch's start (an empty loader queue) weighs in a trial as in the training: epochs of
    32 batches make the 20 steps asked 32 (said); of 500, 20 stay; with 4 micro-steps an
    optimizer step, 8 steps load an epoch: 20 stay."""
    knobs = REPORT["knobs"]
    plan = lambda **k: make_plan({**REPORT, "knobs": {**knobs, **k}},  # noqa: E731
                                 ["t", "{num_workers}"], parse_knob_values(["num_workers=4"]))
    short = plan(batches_per_epoch=32)
    assert short.steps == 32 and "a whole epoch (32 batches)" in short.steps_why
    assert plan(batches_per_epoch=500).steps == 20 and not plan(batches_per_epoch=500).steps_why
    assert plan(batches_per_epoch=32, sync_interval=4).steps == 20


def test_a_trial_is_measured_per_optimizer_step_of_the_reports_run(tmp_path):
    """The estimates are per optimizer step of the report's run: where it accumulated 4
    micro-steps, a trial that syncs every micro-step is measured over 4 of them (it was one,
    a quarter of the estimate's basis)."""
    from gpuscope.trials import Plan, measured_step

    env = dict(os.environ, GPUSCOPE_RUN_DIR=str(tmp_path / "trial"))
    proc = subprocess.run([sys.executable, "-c", _LOOP.replace("range(50)", "range(12)"),
                           str(tmp_path / "code")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cand = Candidate("baseline", {"num_workers": 0})
    one = Plan(["t"], [cand], [], 2, 5, 1)
    four = make_plan({**REPORT, "knobs": {**REPORT["knobs"], "sync_interval": 4}},
                     ["t", "{num_workers}"], parse_knob_values(["num_workers=4"]), warmup=2,
                     steps=5)
    assert four.base_every == 4 and one.base_every is None
    a, failed = measured_step(str(tmp_path / "trial"), one, cand)
    b, _ = measured_step(str(tmp_path / "trial"), four, cand)
    assert failed is None and b == pytest.approx(4 * a)
    # each measured round keeps its mean's standard error, a share of it
    assert len(cand.rel_se) == 2 and 0 < cand.rel_se[0] == cand.rel_se[1] < 1


def test_a_trial_that_ends_before_its_steps_is_a_failure_not_a_measurement(tmp_path):
    """A command that stops on its own after 12 micro-steps where the trial records 5 + 20: said,
    not measured from the 12 (a sync trial of 32 micro-steps per step needs 800)."""
    from gpuscope.trials import Plan, run_trial

    loop = tmp_path / "loop.py"
    loop.write_text(_LOOP.replace("range(50)", "range(12)").replace('print("never here", done)',
                                                                      ""))
    plan = Plan([sys.executable, str(loop), str(tmp_path / "code"), "{num_workers}"],
                [Candidate("baseline", {"num_workers": 0})], [], 5, 20, 1)
    step, failed = run_trial(plan, plan.candidates[0], str(tmp_path / "t"), 120)
    assert step is None and re.search(r"ended after 1[12] of the 25 micro-steps", failed), failed


def test_rounds_go_on_until_each_gain_is_known_to_the_precision_asked(tmp_path, monkeypatch):
    """--precision: after the least rounds, more while a repeat of a candidate's step over the
    same round's baseline may land further than +-PCT (95%), up to --max-repeats; without it,
    the rounds asked."""
    from gpuscope import trials

    def plan_of(cand_steps):
        steps.update(baseline=iter([40.0] * 8), **{"num_workers=4": iter(cand_steps)})
        return make_plan(REPORT, ["t", "{num_workers}"], parse_knob_values(["num_workers=4"]),
                         repeats=2)

    steps: dict = {}
    monkeypatch.setattr(trials, "run_trial",
                        lambda plan, cand, where, timeout: (next(steps[cand.label]), None))
    # ratios 0.25, 0.275, then 0.2625, 0.2625: a repeat within +-86% after 2 rounds (t = 12.7
    # at one degree of freedom), +-17% after 3, +-8.8% after 4: within +-10%, no fifth
    plan = plan_of([10.0, 11.0, 10.5, 10.5, 10.5, 10.5])
    trials.run_plan(plan, str(tmp_path), precision_pct=10.0, most=6)
    assert plan.repeats == 4
    plan = plan_of([10.0, 11.0, 10.5, 10.5, 10.5, 10.5])
    trials.run_plan(plan, str(tmp_path), precision_pct=10.0, most=3)
    assert plan.repeats == 3  # --max-repeats: +-17% still, no fourth
    plan = plan_of([10.0, 10.04, 99.0])
    trials.run_plan(plan, str(tmp_path), precision_pct=5.0)
    assert plan.repeats == 2  # 0.25 and 0.251: +-3.6%, known after the least rounds
    plan = plan_of([10.0, 11.0, 10.5])
    trials.run_plan(plan, str(tmp_path))
    assert plan.repeats == 2  # no --precision: the rounds asked
    # the two rounds' ratios stray 6.7% from their mean; t(1) = 12.71; a repeat of two rounds:
    # root(1/2 + 1/2)
    rel = sum((x / 0.2625 - 1) ** 2 for x in (0.25, 0.275)) ** 0.5
    cands = [Candidate("b", {}, steps_ms=[40.0, 40.0]),
             Candidate("c", {}, "c", steps_ms=[10.0, 11.0])]
    assert trials.spread_pct(cands, cands[1]) == pytest.approx(100 * 12.71 * rel)

def test_the_budget_is_for_the_rounds_precision_adds(tmp_path, monkeypatch):
    """--budget-s counts the rounds past the least: two rounds of 100 s (two trials of 50 s)
    run whatever they take; a third fits in 150 s, a fourth would not."""
    from gpuscope import trials

    clock = [0.0]
    steps = {"baseline": iter([40.0] * 8), "num_workers=4": iter([10.0, 20.0, 10.0, 20.0])}

    def trial(plan, cand, where, timeout):
        clock[0] += 50.0
        return next(steps[cand.label]), None

    monkeypatch.setattr(trials, "run_trial", trial)
    monkeypatch.setattr(trials.time, "perf_counter", lambda: clock[0])
    plan = make_plan(REPORT, ["t", "{num_workers}"], parse_knob_values(["num_workers=4"]),
                     repeats=2)
    trials.run_plan(plan, str(tmp_path), precision_pct=1.0, most=8, budget_s=150.0)
    assert plan.repeats == 3
