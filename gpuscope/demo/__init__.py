"""`gpuscope demo`: small 2-rank DDP trainings with one bottleneck injected on purpose."""

#: the bottleneck each scenario injects (train.py builds them)
SCENARIOS = ("data", "comm", "imbalanced", "compute")
#: processes each scenario trains with by default. The balanced one takes one: two ranks sharing
#: a 2-core machine's cores trade lateness from step to step (each rank's compute varies by a
#: third from one step to the next there), and gpuscope rightly reads that jitter-bound: the
#: healthy state shows with one rank, or with two on a machine with a core each to spare
NPROC = {"data": 2, "comm": 2, "imbalanced": 2, "compute": 1}
#: the demo's option for each knob its suggestions name (what its "next" lines apply)
FLAGS = {"num_workers": "--num-workers", "sync_frequency": "--sync-every",
         "batch_size": "--batch-size"}
