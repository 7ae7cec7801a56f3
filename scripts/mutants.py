"""Mutation audit: break the code one way at a time and check that a test fails.

    python scripts/mutants.py            # every mutant below (~3 min on 2 cores)
    python scripts/mutants.py heatmap    # those whose name contains "heatmap"

Each mutant replaces one snippet of one file (the snippet must be found exactly once), runs the
tests that are meant to catch it, and puts the file back. A mutant that no test kills is a gap;
the script exits 1 when there is one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, snippet, replacement, tests)
MUTANTS = [
    ("kineto idle until a collective ends is not comm", "gpuscope/readers/kineto/steps.py",
     "            blocked = spans.union(blocked, gaps)\n", "",
     ["tests/test_kineto_steps.py", "-k", "idle_until"]),
    ("healthy run against one lost label only", "gpuscope/analyze/classify.py",
     "if by[best] - rest[rest > 0].sum() < NEAR_TIE:", "if by[best] - rest.max() < NEAR_TIE:",
     ["tests/test_invariants.py", "-k", "near_tie"]),
    ("teardown stops at a failing closer", "gpuscope/record/recorder.py",
     "            except Exception as exc:\n                warn_once(f\"recorder-close-{name}\"",
     "            except ZeroDivisionError as exc:\n                warn_once(f\"recorder-close-{name}\"",
     ["tests/test_recorder.py", "-k", "one_loop"]),
    ("plain path still forks", "gpuscope/readers/speed.py",
     "    return FAST and can_fork()", "    return can_fork()",
     ["tests/test_reader_fast_paths.py", "-k", "plain_path"]),
    ("comm hook averaging", "gpuscope/record/ddp_timing.py", "    buf.div_(group.size())\n",
     "    pass\n", ["tests/test_same_maths.py"]),
    ("kineto exposed = comm", "gpuscope/readers/kineto/steps.py",
     "exposed_ns = comm_ns - spans.overlap(comm, comp)", "exposed_ns = comm_ns",
     ["tests/test_kineto_steps.py"]),
    ("kineto data while GPU busy", "gpuscope/readers/kineto/steps.py",
     "data_ns = spans.length(data_set) - spans.overlap(data_set, spans.window(busy_all, lo, hi))",
     "data_ns = spans.length(data_set)", ["tests/test_kineto_steps.py"]),
    ("kineto kernels by start", "gpuscope/readers/kineto/steps.py",
     "        launched, found = launch_times(ev)\n",
     "        launched, found = ev.dev_start.copy(), launch_times(ev)[1]\n",
     ["tests/test_kineto_steps.py"]),
    ("kineto CPU exposed = comm", "gpuscope/readers/kineto/steps.py",
     "exposed = spans.subtract(comm, spans.union(busy, data_set))", "exposed = comm",
     ["tests/test_kineto_steps.py"]),
    ("flush on the timer", "gpuscope/record/recorder.py",
     " or now >= self._flush_at", "",
     ["tests/test_recorder.py", "-k", "flush_s or injected_clock"]),
    ("doctor result forced ok", "gpuscope/doctor.py", 'fh.write(f"{int(ok)} {ms:.1f}")',
     'fh.write(f"{int(True)} {ms:.1f}")', ["tests/test_doctor.py", "-k", "wrong"]),
    ("heatmap bins summed", "gpuscope/render/html.py",
     "z = np.where(count > 0, total / np.maximum(count, 1), np.nan)",
     "z = np.where(count > 0, total, np.nan)", ["tests/test_html.py", "-k", "binned"]),
    ("tensorboard cache off", "gpuscope/integrations/tensorboard/plugin.py",
     "            if hit and hit[0] == sig:\n", "            if False:\n",
     ["tests/test_tb_plugin.py", "-k", "cache"]),
    ("t_critical constant", "gpuscope/analyze/consistency.py", "    if dof >= 1000:\n",
     "    if True:\n", ["tests/test_consistency.py"]),
    ("telemetry off line dropped", "gpuscope/record/nvml.py",
     'info_once("nvml-off", "gpuscope: GPU telemetry off: %s", exc)', "pass",
     ["tests/test_gpu_seams.py", "-k", "one_line"]),
    ("CLI --skip ignored", "gpuscope/cli.py",
     "                               Thresholds().with_overrides(args.thresholds), skip=args.skip)",
     "                               Thresholds().with_overrides(args.thresholds))",
     ["tests/test_cli.py", "-k", "skip"]),
    ("CLI --html ignored", "gpuscope/cli.py", "        report.write_html(args.html)\n",
     "        pass\n", ["tests/test_cli_paths.py", "-k", "html"]),
    ("CLI -q ignored", "gpuscope/cli.py", "    if not args.quiet:\n        report.print",
     "    if True:\n        report.print", ["tests/test_cli_paths.py", "-k", "quiet"]),
    ("CLI internal error exit 0", "gpuscope/cli.py",
     "              file=sys.stderr)\n        return 1\n", "              file=sys.stderr)\n        return 0\n",
     ["tests/test_cli_paths.py", "-k", "internal"]),
    ("reader keeps out-of-range rows", "gpuscope/readers/rundir/frames.py",
     "    inside = ok & ((arr >= lo) & (arr <= hi)).all(axis=1)\n", "    inside = ok\n",
     ["tests/test_bad_input.py"]),
    ("decoder child left running", "gpuscope/readers/fork.py",
     "        if child.exitcode is None:  # never listened to, or stuck: stop it\n"
     "            child.terminate()\n            child.join(timeout=5)\n"
     "        if child.exitcode is None:\n            child.kill()\n            child.join()\n"
     "        child.close()\n", "",
     ["tests/test_bad_input.py", "tests/test_kineto_prefetch.py", "-k", "decoder or outlives"]),
    ("prefetch takes changed files", "gpuscope/readers/kineto/prefetch.py",
     " and _stamp(f) == self.stamps[i]", "", ["tests/test_kineto_prefetch.py", "-k", "changed"]),
    ("prefetch half-file child orphaned", "gpuscope/readers/kineto/prefetch.py",
     "            signal.signal(signal.SIGTERM, _unwind)\n", "",
     ["tests/test_kineto_prefetch.py", "-k", "while_a_file_is_cut"]),
    ("prefetch progress only at the end", "gpuscope/readers/kineto/prefetch.py",
     "            status, value = collect(tick)\n", "            status, value = collect()\n",
     ["tests/test_kineto_prefetch.py", "-k", "progress"]),
    ("CLI leaves without flushing", "gpuscope/cli.py",
     "    try:\n        sys.stdout.flush()\n    except (BrokenPipeError, ValueError):\n"
     "        _quiet_stdout()\n", "", ["tests/test_cli.py", "-k", "leaves"]),
    ("prefetch child a daemon", "gpuscope/readers/kineto/prefetch.py",
     "                                                               daemon=False)))",
     "                                                               daemon=True)))",
     ["tests/test_kineto_prefetch.py", "-k", "cut_in_two"]),
    ("CLI parses traces late", "gpuscope/cli.py", "    with _early_parse(args.path) as ahead:\n        if args.html:",
     "    if True:\n        ahead = None\n        if args.html:", ["tests/test_kineto_prefetch.py", "-k", "command_line"]),
    ("CLI parses a run dir's traces early", "gpuscope/cli.py",
     "not (is_run_dir(path) or is_record_file(path))", "True",
     ["tests/test_kineto_prefetch.py", "-k", "run_dir"]),
    ("writes on the step path", "gpuscope/record/writer.py",
     "            self._queue.append((\"\\n\".join(lines) + \"\\n\", rows))\n",
     "            self._fh.write((\"\\n\".join(lines) + \"\\n\").encode())\n            self._fh.flush()\n",
     ["tests/test_disk.py", "-k", "slow"]),
    ("stopped rank not named", "gpuscope/analyze/stopped.py",
     "        if mine < reach or (first and mine <= reach):", "        if mine < reach:",
     ["tests/test_dead_rank.py", "-k", "dies"]),
    ("trace CPU claimed", "gpuscope/readers/kineto/steps.py",
     '"data_cpu_ns": -1,', '"data_cpu_ns": data_ns,',
     ["tests/test_sample_traces.py", "-k", "claim"]),
    ("SIGTERM not held across the fork", "gpuscope/readers/fork.py",
     "    held = threading.current_thread() is threading.main_thread()\n", "    held = False\n",
     ["tests/test_kineto_prefetch.py", "-k", "right_after"]),
    ("side file crc not checked", "gpuscope/readers/record_columns.py",
     "crc32(side_[pos + _HEAD.size:end], crc32(record[off:off + length])) != crc",
     "False", ["tests/test_record_columns.py", "-k", "not_used"]),
    ("side file values not range-checked", "gpuscope/readers/record_columns.py",
     "    if n and ((arr.min(axis=0) < _LO).any() or (arr.max(axis=0) > _HI).any()):",
     "    if False:", ["tests/test_record_columns.py", "-k", "not_used"]),
    ("side file taken when the record is longer", "gpuscope/readers/record_columns.py",
     "    if at != len(blob):", "    if at > len(blob):",
     ["tests/test_record_columns.py", "-k", "not_used or killed"]),
    ("side file holds bools", "gpuscope/record/columns.py",
     "set(map(type, values)) != {int}", "not all(isinstance(v, int) for v in values)",
     ["tests/test_record_columns.py", "-k", "int64"]),
    ("side file keys in chunk order", "gpuscope/readers/record_columns.py",
     "    if all(p[3] == first for p in parts):", "    if True:",
     ["tests/test_record_columns.py", "-k", "many_chunks or not_used or sample"]),
]


def run(m) -> tuple[bool, float]:
    name, rel, old, new, tests = m
    path = os.path.join(ROOT, rel)
    src = open(path).read()
    if src.count(old) != 1:
        raise SystemExit(f"{name}: snippet found {src.count(old)} times in {rel}")
    t0 = time.perf_counter()
    try:
        with open(path, "w") as fh:
            fh.write(src.replace(old, new))
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              *tests], cwd=ROOT, capture_output=True, text=True)
    finally:
        with open(path, "w") as fh:
            fh.write(src)
    return out.returncode == 1, time.perf_counter() - t0


def main(argv) -> int:
    # stopped (timeout, kill): unwind, so that run() puts the mutated file back
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [m for m in MUTANTS if not argv or any(a in m[0] for a in argv)]
    gaps = 0
    for m in chosen:
        killed, secs = run(m)
        gaps += not killed
        print(f"{'killed' if killed else 'SURVIVED':9s} {m[0]:34s} {' '.join(m[4]):50s} {secs:5.1f} s",
              flush=True)
    print(f"{len(chosen) - gaps}/{len(chosen)} mutants killed")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
