"""`gpuscope demo`: small 2-rank DDP trainings with one bottleneck injected on purpose."""

#: the bottleneck each scenario injects (train.py builds them)
SCENARIOS = ("data", "comm", "imbalanced", "compute")
