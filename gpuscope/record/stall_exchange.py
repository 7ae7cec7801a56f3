"""Live word of a stall (in any job of several ranks): each rank's stall watcher leaves what its
training thread is in under a key of the job's store (torch.distributed's, which any thread may
use); rank 0's reads them all and logs, once, who waits where and which ranks said nothing (a
dead or frozen process), and, where steps come again, that it was a pause. Nothing here runs on
the training thread."""

from __future__ import annotations

import json
import time

from .._log import logger

#: how long rank 0 waits for its peers' word after its own watcher noticed (seconds)
GATHER_S = 2.0
PREFIX = "gpuscope/stall/"


def _store():
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def brief(stall: dict) -> dict:
    """What a rank tells of its stall: the step, where, since when, its innermost user frame."""
    top = next((f for f in stall.get("stack") or () if f.get("user")), None)
    return {k: stall[k] for k in ("step", "in", "kind", "group", "seq", "sizes", "waits_on",
                                  "groups", "since_unix_ns") if k in stall} | ({"at": f"{top['file']}:{top['line']}"} if top else {})


class Exchange:
    def __init__(self, rank: int, world_size: int, log: bool = True, store=None):
        self.rank, self.world_size, self.log = rank, world_size, log
        self._store = store
        self._asked_at: float | None = None
        self.line: str | None = None  # rank 0: the line it logged

    def store(self):
        if self._store is None:
            self._store = _store()
        return self._store

    def said(self, stall: dict) -> None:
        """This rank's watcher noticed a stall: its word goes to the store."""
        try:
            self.store().set(f"{PREFIX}{self.rank}", json.dumps(brief(stall)))
        except Exception:
            pass
        self._asked_at = time.monotonic()

    def resumed(self, stall: dict) -> None:
        try:
            self.store().delete_key(f"{PREFIX}{self.rank}")
        except Exception:
            pass
        if self.line is not None and self.log:  # rank 0 said it stalled: now it was a pause
            since = stall.get("since_unix_ns")
            lasted = f" after {time.time() - since / 1e9:.0f} s" if since else ""
            logger.warning("gpuscope live: steps resumed at step %s%s: a pause (a checkpoint, "
                           "an evaluation), not a hang", stall.get("step"), lasted)
        self._asked_at = None
        self.line = None

    def look(self, stall: dict) -> None:
        """Rank 0, still stalled: once its peers had GATHER_S to answer, read and log."""
        if self.rank != 0 or self.line is not None or self._asked_at is None:
            return
        if time.monotonic() - self._asked_at < GATHER_S:
            return
        words = {}
        for r in range(self.world_size):
            try:
                key = f"{PREFIX}{r}"
                if self.store().check([key]):
                    words[r] = json.loads(self.store().get(key))
            except Exception:
                continue
        self.line = live_line(words, self.world_size)
        if self.log:
            logger.warning("%s", self.line)


def live_line(words: dict, world_size: int) -> str:
    """One line from the ranks' words {rank: brief(stall)}."""
    from ..stall_story import tell

    since = [w["since_unix_ns"] for w in words.values() if w.get("since_unix_ns")]
    quiet = f"no step for {time.time() - min(since) / 1e9:.0f} s, " if since else ""
    return "gpuscope live: " + quiet + tell({r: dict(w) for r, w in words.items()}, world_size)
