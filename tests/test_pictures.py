"""The README's pictures are current: what each shows (docs/pictures.json, written with them by
scripts/make_pictures.py) is what today's code and samples give."""

import json
import os

from helpers import script

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _maker():
    return script("make_pictures")


def test_each_picture_shows_what_the_code_and_samples_give_today():
    here = os.getcwd()
    try:
        now = _maker().shows()
    finally:
        os.chdir(here)
    with open(os.path.join(ROOT, "docs", "pictures.json")) as fh:
        drawn = json.load(fh)
    for name in ("dashboard.png", "tensorboard_tab.png", "timeline.png"):
        assert os.path.getsize(os.path.join(ROOT, "docs", name)) > 20_000, name
        assert drawn[name] == now[name], \
            f"docs/{name} is stale: run python scripts/make_pictures.py"
    assert drawn["run"] == now["run"]


def test_the_readme_shows_the_pictures_the_script_draws():
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
    for name in ("dashboard.png", "tensorboard_tab.png", "timeline.png"):
        assert f"(docs/{name})" in readme, name


def test_a_changed_report_makes_the_stamp_stale():
    """The check can fail: the same stamp against a report with one suggestion less."""
    mod = _maker()
    with open(os.path.join(ROOT, "docs", "pictures.json")) as fh:
        drawn = json.load(fh)["dashboard.png"]
    here = os.getcwd()
    try:
        os.chdir(os.path.join(ROOT))
        rep = mod._report()
    finally:
        os.chdir(here)
    rep.suggestions = rep.suggestions[1:]
    assert mod.report_shows(rep) != drawn
