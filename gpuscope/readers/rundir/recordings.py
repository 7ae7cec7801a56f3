"""A run dir's rank files grouped into recordings (a script run twice into one dir), the newest
(or the one a rank file given as the path belongs to) chosen, the others named."""

from __future__ import annotations

import datetime
import glob
import os

import gpuscope.progress as progress
from ...errors import InputError, TraceFormatError
from ...run_format import FILE_GLOB, is_record_file
from ...trace_files import file_size
from .parallel_load import load_all
from .rank_data import RankFile


def group_recordings(files: list[RankFile]) -> list[list[RankFile]]:
    """Split rank files into recordings, oldest first.

    Ranks of one recording run at the same time, so their [start, end] spans overlap; a later
    recording into the same dir starts after the earlier one ended. Files are swept in order of
    start: a file joins the current recording when it starts before that recording's last end
    and its job id (when both have one) is the same; otherwise it starts a new recording."""
    groups: list[list[RankFile]] = []
    reach = None
    ids: set = set()
    # a file with a job id and nothing after its header (the rank killed before its first
    # flush) has no span of its own: it joins the recording of its job that it started in
    bare = [f for f in files if f.run_id and not f.rows and not f.end]
    spare = {id(f) for f in bare}
    for f in sorted((f for f in files if id(f) not in spare), key=lambda f: f.span()[0]):
        start, end = f.span()
        rid = f.run_id
        if groups and start <= reach and (not rid or not ids or ids == {rid}):
            groups[-1].append(f)
            reach = max(reach, end)
            ids |= {rid} - {""}
        else:
            groups.append([f])
            reach, ids = end, {rid} - {""}
    for f in bare:
        mine = [g for g in groups if any(x.run_id == f.run_id for x in g)]
        start = f.span()[0]
        # the first recording of its job that ends after it started (they start together)
        home = next((g for g in mine if max(x.span()[1] for x in g) >= start), None)
        if home is not None:
            home.append(f)
        else:
            groups.append([f])
    groups.sort(key=lambda g: min(x.span()[0] for x in g))
    return groups


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds")


def _pick_recording(path: str, files: list[RankFile], want: str | None,
                    warnings: list[str]) -> list[RankFile]:
    groups = group_recordings(files)
    if want is None:
        chosen = groups[-1]
    else:
        chosen = next(g for g in groups if any(f.path == want for f in g))
    if len(groups) > 1:
        others = sorted(os.path.basename(f.path) for g in groups if g is not chosen for f in g)
        which = "the newest" if want is None else "the one that holds " + os.path.basename(want)
        warnings.append(
            f"this run dir holds {len(groups)} recordings; analysed {which} (started "
            f"{_when(min(f.span()[0] for f in chosen))}, {len(chosen)} rank file(s)); left out "
            f"{len(others)} file(s) of the other recording(s) ({', '.join(others[:4])}"
            f"{' ...' if len(others) > 4 else ''}): give one of them as the path to analyse its "
            "recording")
    by_rank: dict[int, RankFile] = {}
    for f in chosen:
        seen = by_rank.get(f.rank)
        if seen is None:
            by_rank[f.rank] = f
            continue
        keep, drop = (f, seen) if f.n_rows > seen.n_rows else (seen, f)
        by_rank[f.rank] = keep
        warnings.append(f"two files for rank {f.rank} in one recording; kept "
                        f"{os.path.basename(keep.path)} ({keep.n_rows} steps), left out "
                        f"{os.path.basename(drop.path)}")
    return [by_rank[r] for r in sorted(by_rank)]


def chosen_files(path: str, loaded: list | None, warnings: list, warm: int = 0) -> tuple:
    """(the run dir, the rank files of the recording read, where their rows were placed): every
    record file read (or `loaded`'s), those that cannot be skipped, the newest recording (or
    the one a rank file given as `path` belongs to)."""
    want = None
    url = "://" in path
    if is_record_file(path):
        want = path if url else os.path.abspath(path)
        path = os.path.dirname(want)
    if loaded is None:
        names = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
        if not names:
            raise InputError(f"{path}: no gpuscope record files ({FILE_GLOB}) here")
        with progress.reading(sum(file_size(n) for n in names), len(names), path):
            loaded, placed = load_all(names, warnings, warm)
    else:
        placed = None
    names = [n for n, _ in loaded]
    files: list[RankFile] = []
    for name, got in loaded:
        if isinstance(got, TraceFormatError):
            if len(names) == 1 or (want is not None and (name if url else
                                                         os.path.abspath(name)) == want):
                raise got
            warnings.append(f"skipped: {got}")  # the other ranks are still analysed
        else:
            files.append(got)
    if not files:
        raise TraceFormatError(f"{path}: no readable record file ({warnings[0][9:]})")
    if want is not None and not url:
        for f in files:
            f.path = os.path.abspath(f.path)
    return path, _pick_recording(path, files, want, warnings), placed
