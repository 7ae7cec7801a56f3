"""Classification thresholds (shares of step time); defaults from DESIGN.md, all configurable."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from .errors import InputError

#: warm-up steps left out per rank when not set: recorded runs include their first (lazy init,
#: allocator warm-up) step; a profiler schedule has already skipped warm-up in its traces
DEFAULT_WARMUP = {"record": 1, "kineto": 0}


@dataclass(frozen=True)
class Thresholds:
    data_high: float = 0.20       # data-bound ("highly"); XProf input-bound 20%
    data_moderate: float = 0.05   # "moderately" data-bound: reported, label only if nothing else
    comm: float = 0.15            # exposed transfer share for comm-bound; XProf 15%
    host: float = 0.15            # GPU idle waiting for the host to launch, for host-bound
    bubble: float = 0.15          # a pipeline stage waiting on its neighbours, for pipeline-bound
    wait: float = 0.10            # wait share on the waiting ranks for imbalanced
    straggler_steps: float = 0.5  # a consistently late rank slow in >= this share of imbalanced steps
    comm_target: float = 0.05     # sync-frequency suggestion aims exposed comm below this
    warmup_steps: int | None = None  # first steps per rank left out; None: DEFAULT_WARMUP[source]

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "warmup_steps":
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                          or value < 0):
                    raise InputError(f"threshold warmup_steps must be a whole number >= 0, "
                                     f"not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= 1 or (f.name == "comm_target" and value == 0):
                raise InputError(f"threshold {f.name} is a share of step time between 0 and 1, "
                                 f"not {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def for_source(self, source: str) -> "Thresholds":
        """These thresholds with the warm-up resolved for a "record" or "kineto" table."""
        if self.warmup_steps is not None:
            return self
        return replace(self, warmup_steps=DEFAULT_WARMUP.get(source, 0))

    def with_overrides(self, spec: str | dict | None) -> "Thresholds":
        """Apply {"name": value} or "name=value,name=value" (as given on the command line)."""
        if not spec:
            return self
        if isinstance(spec, str):
            pairs = []
            for part in spec.split(","):
                name, eq, value = part.partition("=")
                if not eq:
                    raise InputError(f"thresholds are given as name=value, not {part.strip()!r}")
                pairs.append((name.strip(), value.strip()))
        else:
            pairs = list(spec.items())
        known = [f.name for f in fields(self)]
        changes = {}
        for name, value in pairs:
            if name not in known:
                raise InputError(f"unknown threshold {name!r}; known: {', '.join(known)}")
            try:
                changes[name] = int(value) if name == "warmup_steps" else float(value)
            except (TypeError, ValueError):
                raise InputError(f"threshold {name} must be a number, not {value!r}") from None
        return replace(self, **changes)
