"""`gpuscope demo`'s closing lines: its own first suggestion applied, compared, and tried."""

from types import SimpleNamespace as NS

from gpuscope.cli import demo_next


def _args(**kw):
    base = dict(scenario="data", steps=30, nproc=2, out="runs/demo", num_workers=None,
                sync_every=None, batch_size=None)
    return NS(**{**base, **kw})


def test_the_next_commands_carry_this_runs_own_value_and_options():
    """A README's value is another machine's (issue 71, 9.): the demo prints the one its own
    report suggests, with the options the run had, and compare of the two run dirs."""
    report = NS(suggestions=[NS(knob="straggler", current="rank 1", proposed="match"),
                             NS(knob="sync_frequency", current="every 1 step(s)",
                                proposed="every 32 steps"),
                             NS(knob="batch_size", current=4, proposed=8)])
    lines = demo_next(_args(scenario="comm", steps=900, batch_size=4, out="runs/comm"), report)
    assert lines[1] == "Next: apply the first suggestion (sync_frequency 1 -> 32) and compare " \
                       "the two runs:"
    run, cmp, _, trial = (x.strip() for x in lines[2:])
    assert run.endswith("demo --scenario comm --steps 900 --sync-every 32 --batch-size 4 "
                        "--no-profile --out runs/after")
    assert cmp.endswith("compare runs/comm/record runs/after/record")
    assert trial.endswith("try runs/comm/record -- " + run.split(" try ")[0].split(" demo")[0]
                          + " demo --scenario comm --steps 900 --sync-every {sync_frequency} "
                          "--batch-size {batch_size} --no-profile")


def test_nothing_to_apply_prints_nothing():
    report = NS(suggestions=[NS(knob="straggler", current="rank 1", proposed="match")])
    assert demo_next(_args(), report) == []
