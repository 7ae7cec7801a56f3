"""What the stall watcher (stall.py) reads of a recorder, from its own thread: its state, its
steps, the rows it may write while steps stopped coming, whether a SIGTERM came, and the close
it writes itself when the training thread is blocked in native code (the end record made by
the recorder's one builder, Recorder._end_record)."""

from __future__ import annotations

import os
import signal

from .lifecycle import State


class Watched:
    """What the stall watcher (stall.py) reads of a recorder, from its own thread."""

    def __init__(self, rec):
        self._rec = rec
        self.log = rec._log
        self.clock = rec.options.clock
        self.unix = rec._unix

    @property
    def active(self) -> bool:
        return self._rec._active

    @property
    def steps(self) -> int:
        return self._rec.steps

    @property
    def started(self) -> int | None:
        """When the recording started (its clock)."""
        return self._rec._t0_perf

    def last_step_end(self) -> int | None:
        """When the last micro-step ended (the recording's start before the first)."""
        start = self.log.start
        return start if start is not None else self._rec._t0_perf

    def idle_flush(self) -> None:
        """Steps stopped coming: the rows made so far go to the file (not the side channels:
        they stay for the next flush, or the end)."""
        rec = self._rec
        writer = rec._writer
        if not rec._raw or writer is None or writer.error is not None:
            return
        with rec._flush_lock:
            if rec._raw and rec._active:
                writer.add_rows(rec._drain().rows)

    def sigterm_came(self) -> bool:
        """A SIGTERM reached the process since the last look (the wakeup fd's bytes)."""
        return self._rec._sigterm.came()

    def sigterm_unhandled(self) -> bool:
        """Our SIGTERM handler is in place and has not run (the recording is open)."""
        rec = self._rec
        return rec._active and rec.state is State.RUNNING and rec._sigterm.handler is not None

    def terminate(self, frame) -> None:
        """The training thread cannot take the SIGTERM that came (blocked in native code): write
        the rows and the end record from here, then end the process as SIGTERM's default action
        would have (exit status 128 + 15)."""
        rec = self._rec
        try:
            rec._terminated = "SIGTERM"
            rec._terminated_where = rec._where_signalled(frame)
            writer = rec._writer
            if writer is not None:
                with rec._flush_lock:
                    if rec._raw:
                        writer.add_rows(rec._drain().rows)
                writer.close(rec._end_record(False, blocked=True))
        finally:
            from .fatal import drop_if_empty

            drop_if_empty(rec.path)  # no fatal signal came: its trace file goes
            os._exit(128 + signal.SIGTERM)

    def write_side(self, obj: dict) -> None:
        writer = self._rec._writer
        if writer is not None:
            writer.add_meta(obj)

    def dump_flight_recorder(self) -> dict | None:
        """torch's Flight Recorder, where it records (TORCH_FR_BUFFER_SIZE), written beside the
        record file: {"file", "entries"}; None where it records nothing."""
        from .stall import dump_flight_recorder

        return dump_flight_recorder(self._rec.path)
