"""Fuzz gpuscope's readers and reports: mutate one file of a real input, analyse, check.

    python scripts/fuzz.py --cases 10000            # the figure in docs/performance.md (~25 min on 2 cores)
    python scripts/fuzz.py --cases 300 --seed 7     # quicker
    python scripts/fuzz.py --case 123 --keep /tmp/c  # one case again, its input kept to look at

Inputs: every record dir and trace folder under sample_traces/ (external/ included), the shared
HTA traces (../shared/traces/hta) and the shared external traces (../shared/traces/external), and each record dir again with column side files (made under
build/fuzz-inputs: a damaged side file, or a record file changed under an intact one). A case copies one input, mutates one of its files once (truncation, byte
flips, inserted or deleted bytes, deleted keys, values of the wrong type, huge and negative
numbers, duplicated, dropped or reordered lines and events, unicode and markup in names), then
`gpuscope.analyze()`s it in a worker process (every other case as the command line does, the
trace files parsed by processes started first). A case fails when

- anything but a GpuscopeError escapes (the family the CLI turns into exit code 2);
- the report holds NaN or inf, or its JSON / terminal text (/ HTML, every 10th case) fails;
- the analysis runs past --timeout seconds (a hang);
- a process the analysis started is still alive when it returns (a leaked decoder);
- the report does not add up (analyze/invariants.py): a part negative or longer than its step,
  shares that do not sum, waiting above exposed communication. A row the reader gives that does
  not add up is clipped and said in a warning: that is the readers' damage handling, not a
  failure; a finished report that still does not add up is.

Exit 0 when no case failed; failures are listed with the command that replays them.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HTA = os.path.join(os.path.dirname(ROOT), "shared", "traces", "hta")
EXTERNAL = os.path.join(os.path.dirname(ROOT), "shared", "traces", "external")

WRONG = ["x", "", [], {}, None, True, False, 1.5, -1, 0, [1, 2], {"a": 1}]
HUGE = [2 ** 63 - 1, 2 ** 63, 2 ** 64 + 5, -(2 ** 63), -(2 ** 70), 1e308, -1e308, 1e-300, -1,
        -123456789, 10 ** 30, 79099635, 10 ** 7, 2 ** 31]
NAMES = ["<script>alert(1)</script>", "[bold red]x[/bold red]", "\u202egnp.exe", "😀🚀",
         "a\x00b", "\\u0000", "ProfilerStep#", "ProfilerStep#-1", "ProfilerStep#99999999999999999999",
         "nccl:all_reduce", "ncclKernel_AllReduce", "{{}}%s%n", "\ud7ff", "x" * 5000]
RAW_TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-0", b"null", b"\"\\ud800\"",
              b"99999999999999999999999", b"[]", b"{}"]


WITH_SIDE_FILES = os.path.join(ROOT, "build", "fuzz-inputs")


def inputs() -> list[str]:
    """Leaf folders that hold a record or trace: the sample traces and the HTA test data, and
    each record dir again with the column side files the recorder writes beside its files."""
    out = []
    for base in (os.path.join(ROOT, "sample_traces"), HTA, EXTERNAL):
        for dirpath, _, files in os.walk(base):
            if any(f.endswith((".jsonl", ".json", ".json.gz")) and "MANIFEST" not in f
                   for f in files):
                out.append(dirpath)
    shutil.rmtree(WITH_SIDE_FILES, ignore_errors=True)
    for src in [d for d in out if glob.glob(os.path.join(d, "rank-*.gpuscope.jsonl"))]:
        out.append(with_side_files(src))
    return sorted(out)


def with_side_files(src: str) -> str:
    """A copy of the record dir `src` with column side files (tests/helpers.add_side_files)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from helpers import add_side_files

    dst = os.path.join(WITH_SIDE_FILES, os.path.relpath(src, os.path.dirname(ROOT))
                       .replace(os.sep, "_").replace("..", "up"))
    shutil.copytree(src, dst)
    add_side_files(dst)
    return dst


def data_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder)
                  if f.endswith((".jsonl", ".json", ".json.gz", ".gpuscope.cols"))
                  and "MANIFEST" not in f)


# ---------------------------------------------------------------------------- mutations

def _value(rng: random.Random):
    pick = rng.random()
    if pick < 0.4:
        return rng.choice(WRONG)
    if pick < 0.8:
        return rng.choice(HUGE)
    return rng.choice(NAMES)


def _walk(obj, rng: random.Random, depth=0):
    """A random (container, key) inside obj, or None."""
    spots = []
    if isinstance(obj, dict):
        spots = [(obj, k) for k in obj]
    elif isinstance(obj, list):
        spots = [(obj, i) for i in range(len(obj))]
    if not spots:
        return None
    parent, key = rng.choice(spots)
    child = parent[key]
    if isinstance(child, (dict, list)) and child and depth < 4 and rng.random() < 0.6:
        return _walk(child, rng, depth + 1) or (parent, key)
    return parent, key


def mutate_obj(obj, rng: random.Random) -> str:
    """Change one thing inside a decoded JSON value, in place; returns what was done."""
    spot = _walk(obj, rng)
    if spot is None:
        return "nothing to change"
    parent, key = spot
    kind = rng.choice(["delete", "value", "value", "name", "dup"])
    if kind == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
        return f"deleted {key!r}"
    if kind == "name" and isinstance(parent[key], str) or kind == "name":
        parent[key] = rng.choice(NAMES)
        return f"name at {key!r}"
    if kind == "dup" and isinstance(parent, list):
        parent.insert(key, parent[key])
        return f"duplicated item {key}"
    parent[key] = _value(rng)
    return f"value at {key!r} -> {str(parent[key])[:30]!r}"


def mutate_lines(text: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A JSON-lines file (a gpuscope record): one line changed, dropped, duplicated or moved."""
    lines = text.split(b"\n")
    n = len(lines)
    i = rng.randrange(n)
    kind = rng.choice(["obj", "obj", "obj", "obj", "drop", "dup", "swap", "shuffle", "blank"])
    if kind == "obj":
        try:
            obj = json.loads(lines[i])
        except ValueError:
            kind = "drop"
        else:
            what = mutate_obj(obj, rng) if isinstance(obj, (dict, list)) else "scalar"
            lines[i] = json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8",
                                                                                 "surrogatepass")
            return b"\n".join(lines), f"line {i + 1}: {what}"
    if kind == "drop":
        del lines[i]
    elif kind == "dup":
        lines.insert(i, lines[i])
    elif kind == "swap":
        j = rng.randrange(n)
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "shuffle":
        body = lines[1:]
        rng.shuffle(body)
        lines[1:] = body
    else:
        lines[i] = b"   "
    return b"\n".join(lines), f"line {i + 1}: {kind}"


def mutate_trace(text: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A Chrome-trace document: one event or field changed, or events duplicated/reordered."""
    try:
        doc = json.loads(text)
    except ValueError:
        return mutate_bytes(text, rng)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    kind = rng.choice(["event", "event", "event", "event", "doc", "dup", "reorder", "drop",
                       "phase", "ts"])
    what = kind
    if not isinstance(events, list) or not events or kind == "doc":
        what = "doc: " + mutate_obj(doc, rng)
    elif kind == "event":
        e = rng.choice(events)
        what = "event: " + mutate_obj(e, rng) if isinstance(e, dict) else "event"
    elif kind == "dup":
        i = rng.randrange(len(events))
        events[i:i] = events[i:i + rng.randint(1, 50)]
    elif kind == "reorder":
        i = rng.randrange(len(events))
        part = events[i:i + rng.randint(2, 500)]
        rng.shuffle(part)
        events[i:i + len(part)] = part
    elif kind == "drop":
        i = rng.randrange(len(events))
        del events[i:i + rng.randint(1, len(events) // 2 + 1)]
    elif kind == "phase":
        e = rng.choice(events)
        if isinstance(e, dict):
            e["ph"] = rng.choice(["B", "E", "X", "i", "M", "Z", "", 7, None])
    else:  # a timestamp moved far off: huge, negative, backwards
        e = rng.choice(events)
        if isinstance(e, dict):
            e[rng.choice(["ts", "dur"])] = rng.choice(HUGE + [-5.0, 0.0, 1e15])
    return json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"), \
        what


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Byte-level damage: truncation, flips, garbage in, a range cut out or repeated."""
    n = len(data)
    kind = rng.choice(["truncate", "flip", "insert", "cut", "repeat", "token", "empty"])
    if n == 0 or kind == "empty":
        return b"", "emptied"
    i = rng.randrange(n)
    if kind == "truncate":
        return data[:i], f"truncated at {i} of {n}"
    if kind == "flip":
        buf = bytearray(data)
        k = rng.randint(1, 8)
        for _ in range(k):
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return bytes(buf), f"{k} bit flips"
    if kind == "insert":
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        return data[:i] + junk + data[i:], f"{len(junk)} bytes inserted at {i}"
    if kind == "cut":
        j = min(n, i + rng.randint(1, 4096))
        return data[:i] + data[j:], f"bytes {i}:{j} cut"
    if kind == "repeat":
        j = min(n, i + rng.randint(1, 4096))
        return data[:j] + data[i:j] + data[j:], f"bytes {i}:{j} repeated"
    # a bare token (NaN, 1e400, a lone surrogate ...) put where a number was
    digits = [k for k in range(max(0, i - 2000), min(n, i + 2000)) if 48 <= data[k] <= 57]
    if not digits:
        return data, "no number near"
    k = rng.choice(digits)
    j = k
    while j < n and (48 <= data[j] <= 57 or data[j] in b".eE+-"):
        j += 1
    tok = rng.choice(RAW_TOKENS)
    return data[:k] + tok + data[j:], f"number at {k} -> {tok.decode()}"


def mutate_file(path: str, rng: random.Random) -> str:
    with open(path, "rb") as fh:
        raw = fh.read()
    gz = raw[:2] == b"\x1f\x8b"
    if gz and rng.random() < 0.15:  # damage the archive itself
        out, what = mutate_bytes(raw, rng)
        with open(path, "wb") as fh:
            fh.write(out)
        return "gzip bytes: " + what
    try:
        text = gzip.decompress(raw) if gz else raw
    except (OSError, EOFError, ValueError, zlib.error):  # damaged already (a second mutation)
        gz, text = False, raw
    if rng.random() < 0.35 or path.endswith(".cols"):  # side files are binary
        text, what = mutate_bytes(text, rng)
    elif path.endswith(".jsonl"):
        text, what = mutate_lines(text, rng)
    else:
        text, what = mutate_trace(text, rng)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(text, compresslevel=1) if gz else text)
    return what


def make_case(seed: int, index: int, where: str, corpus: list[str]) -> tuple[str, str]:
    """Copy one input into `where` and damage one file: (path to analyse, description)."""
    rng = random.Random(seed * 1_000_003 + index)
    src = rng.choice(corpus)
    dst = os.path.join(where, "in")
    shutil.copytree(src, dst)
    files = data_files(dst)
    name = rng.choice(files)
    what = mutate_file(os.path.join(dst, name), rng)
    if rng.random() < 0.1:  # sometimes a second file of the same input too
        other = rng.choice(files)
        what += f"; {other}: " + mutate_file(os.path.join(dst, other), rng)
    target = os.path.join(dst, name) if rng.random() < 0.1 else dst
    return target, f"{os.path.relpath(src, os.path.dirname(ROOT))} / {name}: {what}"


# ---------------------------------------------------------------------------- checks

def children() -> list[int]:
    """Live child processes of this process (the tests' helper, read from /proc), and forks
    orphaned on the way (a grandchild whose parent died: adopted by init, running this very
    command line)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from helpers import live_children

    return live_children() + orphans()


def orphans() -> list[int]:
    """Processes adopted by init that run this process's command line: forks left behind."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            mine = fh.read()
    except OSError:
        return []
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[1] != "1" or fields[0] in ("Z", "X"):
                continue
            pid = int(stat.split("/")[2])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read() == mine and pid != os.getpid():
                    out.append(pid)
        except (OSError, IndexError, ValueError):
            continue
    return out


def finite(obj, path="report") -> str | None:
    """Where a NaN or inf sits in the report's dict, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else path
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad = finite(v, f"{path}.{k}")
            if bad:
                return bad
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            bad = finite(v, f"{path}[{i}]")
            if bad:
                return bad
    return None


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def check(path: str, html: bool, early: bool = False) -> str | None:
    """Analyse `path`; None when gpuscope behaved, else what went wrong. With `early`, as the
    command line does: trace files parsed by processes started first (cli._early_parse)."""
    from contextlib import nullcontext

    import gpuscope
    from gpuscope.cli import _early_parse
    from gpuscope.render import json as json_render
    from gpuscope.render import terminal

    try:
        with _early_parse(path) if early else nullcontext():
            report = gpuscope.analyze(path)
    except gpuscope.GpuscopeError:
        return None
    d = report.to_dict()
    bad = finite(d)
    if bad:
        return f"non-finite number at {bad}"
    from gpuscope.analyze.invariants import violations
    wrong = violations(report) + [w for w in report.warnings if w.startswith("did not add up")]
    if wrong:
        return f"the report does not add up: {wrong[0]}"
    json.dumps(d, allow_nan=False)
    json_render.render(report)
    terminal.render(report, width=120)
    type(report).from_dict(json.loads(json.dumps(d)))
    if html:
        from gpuscope.render import html as html_render
        html_render.render(report, plotlyjs="cdn")
    return None


def _limit_memory(gib: float) -> None:
    """A case that tries to allocate more than this fails with MemoryError (counted), instead of
    bringing the machine down."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (int(gib * 2 ** 30), int(gib * 2 ** 30)))


def run_case(seed: int, index: int, corpus: list[str], timeout: float,
             keep: str | None = None) -> tuple[int, str | None, str, float]:
    """(index, failure or None, description, seconds), in a worker process."""
    import warnings

    warnings.simplefilter("ignore")
    where = keep or tempfile.mkdtemp(prefix="gpuscope-fuzz-")
    os.makedirs(where, exist_ok=True)
    t0 = time.perf_counter()
    what = "?"
    failure = None
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        path, what = make_case(seed, index, where, corpus)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            failure = check(path, html=index % 10 == 0, early=index % 2 == 1)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Hang:
        failure = f"hang: still running after {timeout:.0f} s"
    except Exception as exc:  # noqa: BLE001 - the point: anything that escaped
        tb = traceback.extract_tb(exc.__traceback__)
        site = next((f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}" for f in reversed(tb)
                     if "gpuscope" in f.filename and "scripts" not in f.filename), "?")
        failure = f"{type(exc).__name__} at {site}: {str(exc)[:200]}"
    finally:
        signal.signal(signal.SIGALRM, old)
        left = children()
        if left:
            failure = (failure + "; " if failure else "") + \
                f"{len(left)} process(es) left behind"
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
        if keep is None:
            shutil.rmtree(where, ignore_errors=True)
    return index, failure, what, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case is a hang")
    ap.add_argument("--case", type=int, help="run this one case in this process")
    ap.add_argument("--keep", help="with --case: leave its input in this folder")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--memory-gib", type=float, default=6.0,
                    help="address-space limit per worker; more is a failure")
    args = ap.parse_args(argv)
    corpus = inputs()
    if args.case is not None:
        i, failure, what, secs = run_case(args.seed, args.case, corpus, args.timeout, args.keep)
        print(f"case {i}: {what}\n  {failure or 'ok'} ({secs:.2f} s)")
        return 1 if failure else 0
    import multiprocessing as mp

    t0 = time.perf_counter()
    failures, slowest, done = [], (0.0, -1), 0
    # fork: workers are not daemons (the analysis forks its own decoders inside them)
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("fork"),
                             initializer=_limit_memory, initargs=(args.memory_gib,)) as pool:
        futures = [pool.submit(run_case, args.seed, i, corpus, args.timeout)
                   for i in range(args.cases)]
        for fut in as_completed(futures):
            i, failure, what, secs = fut.result()
            done += 1
            slowest = max(slowest, (secs, i))
            if failure:
                failures.append((i, failure, what))
                print(f"FAIL case {i}: {failure}\n     {what}", flush=True)
            if done % 500 == 0:
                print(f"{done}/{args.cases} cases, {len(failures)} failed, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from measured import commit  # benchmarks/measured.py

    summary = {"commit": commit(), "cases": args.cases, "failures": len(failures),
               "seed": args.seed,
               "inputs": len(corpus), "wall_s": round(wall, 1),
               "slowest_case": {"index": slowest[1], "s": round(slowest[0], 2)}}
    print(f"{args.cases} cases over {len(corpus)} inputs: {len(failures)} failed "
          f"({wall:.0f} s; slowest case {slowest[1]}: {slowest[0]:.1f} s)")
    for i, failure, what in sorted(failures)[:50]:
        print(f"  python scripts/fuzz.py --seed {args.seed} --case {i}   # {failure}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary | {"failed": [f[0] for f in failures]}, fh, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
