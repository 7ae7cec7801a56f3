"""`import gpuscope` in a training process loads none of the heavy analysis libraries."""

import json
import subprocess
import sys

HEAVY = ("pandas", "plotly", "tensorboard", "numpy", "rich", "msgspec", "torch", "pynvml")


def test_import_gpuscope_stays_light():
    code = ("import sys, json, gpuscope\n"
            "rec = gpuscope.record('unused')\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_analysis_side_is_importable_on_demand():
    code = "import sys, gpuscope.pipeline; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"  # the check above can fail: pandas does get loaded here
