"""The injected-faults table's design: which faults, on which parallelisms and world sizes
(run.py runs it, tables.py writes its section of docs/accuracy.md)."""

#: row kinds: train.py's faults, `two` (forward on two ranks) and `data_workers` (data with
#: loader processes)
KINDS = ("control", "data", "data_workers", "forward", "backward", "optimizer", "between",
         "comm", "intermittent", "two", "rotating")
#: (parallelism, ranks) of the whole table; the quick subset is the first
CONFIGS = (("ddp", 2), ("ddp", 4), ("accum", 2), ("fsdp2", 2), ("ddp", 8), ("pipeline", 4),
           ("accum", 4), ("fsdp2", 4))
