"""Every sample's and corpus input's report as JSON, to tell whether a change moved any of them.

    python scripts/snapshot_reports.py /tmp/before          # writes one JSON file per input
    python scripts/snapshot_reports.py /tmp/after --diff /tmp/before

Inputs: each run directory and trace folder under sample_traces/, and the corpus folders beside
the repository (../shared/traces/external, ../shared/traces/hta). `--diff` compares the reports
key by key (floats to 1e-9 relative) and exits 1 when any differs, naming where.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "traces")


def inputs() -> dict[str, str]:
    """{name: path} of every input: folders that hold a run (run.json / ranks) or traces."""
    out: dict[str, str] = {}
    for base, prefix in ((os.path.join(ROOT, "sample_traces"), "samples"),
                         (os.path.join(SHARED, "external"), "shared/external"),
                         (os.path.join(SHARED, "hta"), "shared/hta")):
        if not os.path.isdir(base):
            continue
        for d, subdirs, files in os.walk(base):
            data = [f for f in files if f.endswith((".json", ".gz", ".jsonl", ".parquet",
                                                    ".pt.trace.json"))
                    and f not in ("MANIFEST.json", "known.json")]
            if data and not any(os.path.isfile(os.path.join(d, s, "run.json")) for s in subdirs):
                name = prefix + "/" + os.path.relpath(d, base)
                # a run directory's rank folders belong to it
                if not any(name.startswith(k + "/") for k in out):
                    out[name] = d
    return dict(sorted(out.items()))


def snapshot(out_dir: str) -> dict[str, str]:
    import gpuscope

    os.makedirs(out_dir, exist_ok=True)
    result = {}
    for name, path in inputs().items():
        try:
            d = gpuscope.analyze(path).to_dict()
        except Exception as exc:  # noqa: BLE001 - an input that fails is a result too
            d = {"error": f"{type(exc).__name__}: {exc}"}
        d.pop("path", None)
        file = os.path.join(out_dir, name.replace("/", "__") + ".json")
        with open(file, "w") as fh:
            json.dump(d, fh, indent=1, sort_keys=True, default=str)
        result[name] = file
    return result


def diff(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'after' if k in b else 'before'}")
            else:
                out += diff(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items before, {len(b)} after"]
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in diff(p, q, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and \
            isinstance(a, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{where}: {a} -> {b}"]
    return [] if a == b else [f"{where}: {a!r} -> {b!r}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--diff", metavar="BEFORE")
    args = ap.parse_args()
    files = snapshot(args.out)
    print(f"{len(files)} reports in {args.out}")
    if not args.diff:
        return
    bad = 0
    for name, file in files.items():
        before = os.path.join(args.diff, os.path.basename(file))
        if not os.path.exists(before):
            print(f"new: {name}")
            continue
        with open(before) as fa, open(file) as fb:
            d = diff(json.load(fa), json.load(fb))
        if d:
            bad += 1
            print(f"DIFFERS {name}: " + "; ".join(d[:5]) + (f" (+{len(d) - 5})" if len(d) > 5
                                                              else ""))
    print(f"{bad} of {len(files)} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
