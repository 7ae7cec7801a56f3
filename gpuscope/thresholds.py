"""Classification thresholds (shares of step time); defaults from DESIGN.md, all configurable."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class Thresholds:
    data_high: float = 0.20       # data-bound ("highly"); XProf input-bound 20%
    data_moderate: float = 0.05   # "moderately" data-bound: reported, label only if nothing else
    comm: float = 0.15            # exposed transfer share for comm-bound; XProf 15%
    wait: float = 0.10            # wait share on the waiting ranks for imbalanced
    straggler_steps: float = 0.5  # a consistently late rank slow in >= this share of imbalanced steps
    comm_target: float = 0.05     # sync-frequency suggestion aims exposed comm below this
    warmup_steps: int = 1         # first steps per rank left out (lazy init, allocator warm-up)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_overrides(self, spec: str | None) -> "Thresholds":
        """Apply "name=value,name=value" (as given on the command line)."""
        if not spec:
            return self
        known = {f.name: f.type for f in fields(self)}
        changes = {}
        for part in spec.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in known:
                from .errors import InputError

                raise InputError(f"unknown threshold {name!r}; known: {', '.join(known)}")
            changes[name] = int(value) if name == "warmup_steps" else float(value)
        return replace(self, **changes)
