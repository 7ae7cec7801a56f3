"""A record file's body in its common shape, decoded and checked by msgspec in C.

Nearly every file the recorder writes has one shape: step rows of the current columns, each
with at most a trailing {"_comm": {key: [comm_ns, exposed_ns, count]}, "_samples": n}, and a few
side records (knobs, NVML samples, device times, the end record). msgspec decodes such a body
straight into typed rows, with every value's type and range checked as it is parsed, so nothing
is looked at twice in Python. Anything else (a value of the wrong type or out of range, a row
too short or too long, named phases, a repeated step, a blank, cut or corrupt line, an older
column layout) makes `decode_body` return None, and the reader takes its careful path, which
skips and counts each bad value: this path never decides what is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Annotated, Any, Optional, Union

import msgspec
import numpy as np

from ..run_format import STEP_COLUMNS
from .validate import MAX_NS, column_bounds

_NS = Annotated[int, msgspec.Meta(ge=0, le=MAX_NS)]
#: each column's range (validate.column_bounds, as the careful path checks it)
_COLUMN_TYPES = {c: Annotated[int, msgspec.Meta(ge=lo, le=hi)]
                 for c, (lo, hi) in zip(STEP_COLUMNS, map(column_bounds, STEP_COLUMNS))}


class _Extra(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A row's trailing object when it holds only collectives and the batch's size."""

    # absent: none; an explicit null is left to the careful path, which counts it as bad
    comm: dict[str, tuple[_NS, _NS, _NS]] = msgspec.field(default_factory=dict, name="_comm")
    samples: Annotated[int, msgspec.Meta(ge=0, le=1 << 40)] = msgspec.field(default=-1,
                                                                           name="_samples")


_COLUMNS = tuple(_COLUMN_TYPES.get(c, _NS) for c in STEP_COLUMNS)
_Row = msgspec.defstruct(  # rows with and without a trailing object in one file
    "_Row", [(c, t) for c, t in zip(STEP_COLUMNS, _COLUMNS)]
    + [("extra", Optional[_Extra], None)], array_like=True, forbid_unknown_fields=True, gc=False)
_WIDTH = len(STEP_COLUMNS)
#: the decoders tried in turn: every row with its trailing object (DDP: collectives every step),
#: no row with one (no communication timed), a mix (no_sync micro-steps have none). Tuples
#: decode faster than structs; a decoder that does not fit stops at the first row it rejects.
_DECODERS = [
    (msgspec.json.Decoder(Union[tuple[_COLUMNS + (_Extra,)], dict[str, Any]]).decode_lines, tuple,
     itemgetter(slice(0, _WIDTH)), itemgetter(_WIDTH)),
    (msgspec.json.Decoder(Union[tuple[_COLUMNS], dict[str, Any]]).decode_lines, tuple, None, None),
    (msgspec.json.Decoder(Union[_Row, dict[str, Any]]).decode_lines, _Row,
     attrgetter(*STEP_COLUMNS), attrgetter("extra")),
]
_comm_of = attrgetter("comm")
_samples_of = attrgetter("samples")


@dataclass
class Body:
    columns: dict          # {"rank", STEP_COLUMNS..., "samples" where a row gave one}: arrays
    comm: tuple | None     # (steps, keys, [[comm_ns, exposed_ns, count]]) or None
    side: list             # [(line number, side record dict)]
    ends: list             # the first and the last row's values (lists), for the span
    n_rows: int
    coded: bool = False    # comm is already (steps, distinct keys, codes, values)
    block: Any = None      # BLOCK_ROWS x rows, one C array: the columns above are its rows


#: the rows of a Body's block: the rank, then the step columns
BLOCK_ROWS = ("rank",) + tuple(STEP_COLUMNS)


def block_of(arr: np.ndarray, rank: int, place=None) -> np.ndarray:
    """Rows x STEP_COLUMNS values -> the column-major block (BLOCK_ROWS x rows): each column
    contiguous, made while the rows are still in the cache (a column taken from the rows later
    reads every row's cache lines again, once per column). `place(n)`: where to write it
    (rowblock.Region.place), else a new array."""
    block = place(len(arr)) if place is not None else np.empty((len(BLOCK_ROWS), len(arr)),
                                                               np.int64)
    block[0] = rank
    block[1:] = arr.T
    return block


def block_columns(block: np.ndarray) -> dict:
    """{column: its row of the block (a view)}."""
    return dict(zip(BLOCK_ROWS, block))


def _decode(body: bytes):
    """(objects, the row type, its values getter, its trailing object getter) or None."""
    for decode, row_type, values, extra in _DECODERS:
        try:
            return decode(body), row_type, values, extra
        except msgspec.ValidationError:  # another shape: the next decoder
            continue
        except msgspec.DecodeError:  # not JSON (a corrupt or cut line): the careful path
            return None
    return None


def _split(objs: list, row_type: type) -> tuple[list, list]:
    """(rows, [(line number, side record)]): side records are few, rows are taken in slices."""
    types = list(map(type, objs))
    if types.count(row_type) == len(objs):
        return objs, []
    at = [i for i, t in enumerate(types) if t is not row_type]
    bounds = [-1] + at + [len(objs)]
    rows = list(chain.from_iterable(objs[a + 1:b] for a, b in zip(bounds, bounds[1:])))
    return rows, [(i + 2, objs[i]) for i in at]


def decode_body(body: bytes, columns: list, rank: int, place=None) -> Body | None:
    """The body (the file after its header line) when it has the common shape, else None.
    `place`: see block_of."""
    if list(columns) != list(STEP_COLUMNS) or (body and not body.endswith(b"\n")):
        return None
    got = _decode(body)
    if got is None:
        return None
    objs, row_type, values, extra = got
    if len(objs) != body.count(b"\n"):  # blank lines: line numbers would not follow
        return None
    rows, side = _split(objs, row_type)
    n = len(rows)
    flat = chain.from_iterable(map(values, rows)) if values else chain.from_iterable(rows)
    arr = np.fromiter(flat, np.int64, n * _WIDTH).reshape(n, _WIDTH)
    block = block_of(arr, rank, place)
    steps = block[1]
    if n > 1 and not (steps[1:] > steps[:-1]).all() and np.unique(steps).size < n:
        return None  # a step repeated: the careful path keeps the first and counts the rest
    cols = block_columns(block)
    comm = None
    extras = list(map(extra, rows)) if extra else []
    if extras and any(e is not None for e in extras):
        every = None not in extras  # every row has its trailing object
        comms = list(map(_comm_of, extras)) if every else [{} if e is None else e.comm
                                                            for e in extras]
        counts = list(map(len, comms))
        present = comms if 0 not in counts else [c for c in comms if c]
        total = sum(counts)
        if total:
            vals = np.fromiter(chain.from_iterable(chain.from_iterable(map(dict.values, present))),
                               np.int64, 3 * total).reshape(-1, 3)
            comm = (np.repeat(steps, counts), list(chain.from_iterable(present)), vals)
        samples = (list(map(_samples_of, extras)) if every
                   else [-1 if e is None else e.samples for e in extras])
        if max(samples) >= 0:
            cols["samples"] = np.array(samples, np.int64)
    ends = [list(arr[0].tolist()), list(arr[-1].tolist())] if n else []
    return Body(cols, comm, side, ends, n, block=block)


def with_implied(frame: dict, comm: tuple | None, key: str) -> tuple | None:
    """Coded collectives (see coded) with the rows' implied ones added: a row with collectives
    (n_comm > 0) and no entry of its own had them all under the header's comm_key, its own
    [comm_ns, comm_exposed_ns, n_comm] (run_format.py; a DDP step writes no "_comm"). Kept in
    the order of the steps."""
    steps, n = frame["step"], frame["n_comm"]
    want = n > 0
    if comm is not None and len(comm[0]):
        want &= ~np.isin(steps, comm[0])
    if not want.any():
        return comm
    vals = np.stack([frame["comm_ns"][want], frame["comm_exposed_ns"][want], n[want]], axis=1)
    if comm is None:
        return steps[want], [key], np.zeros(len(vals), np.int64), vals
    at, names, codes, had = comm
    if key not in names:
        names = [*names, key]
    order = np.argsort(np.concatenate([at, steps[want]]), kind="stable")
    return (np.concatenate([at, steps[want]])[order], names,
            np.concatenate([codes, np.full(len(vals), names.index(key), np.int64)])[order],
            np.concatenate([had.reshape(-1, 3), vals])[order])


def coded(comm: tuple | None) -> tuple | None:
    """(steps, keys, values) -> (steps, distinct keys, each row's index into them, values): a
    rank repeats a handful of keys over all its rows; codes travel and concatenate as arrays."""
    if comm is None:
        return None
    steps, keys, vals = comm
    names = list(dict.fromkeys(keys))
    if len(names) == 1:
        codes = np.zeros(len(keys), np.int64)
    else:
        index = {k: i for i, k in enumerate(names)}
        codes = np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))
    return steps, names, codes, vals
