"""A recorder's lifecycle: one state and the table of what moves it (as torch.profiler's
ProfilerAction and its action map). An event a state does not list is ignored: start() twice
starts once, stop() before start() or after the close does nothing.

    NEW --start--> RUNNING --stop--> STOPPING --closed--> STOPPED

RUNNING is also the state of a recorder that is disabled or failed to open: it records nothing
(Recorder._active, the hot path's one flag, is False) and stop() still closes it. STOPPING is
the close itself: a SIGTERM that comes then waits for it (sigterm.py).
"""

from __future__ import annotations

from enum import Enum


class State(Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


#: (state, event) -> the next state; every move a recorder makes is here
TRANSITIONS = {
    (State.NEW, "start"): State.RUNNING,
    (State.RUNNING, "stop"): State.STOPPING,
    (State.STOPPING, "closed"): State.STOPPED,
}


def next_state(state: State, event: str) -> State | None:
    """The state `event` moves `state` to, None where it does not apply."""
    return TRANSITIONS.get((state, event))
