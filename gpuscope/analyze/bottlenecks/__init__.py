"""One module per bottleneck: each holds its suggestions and their estimates, callable alone with
a Findings and a TypicalStep (analyze/findings.py): data, comm, host, imbalance (stragglers and
jitter), pipeline (pipeline-parallel stages), dataparallel (nn.DataParallel).
analyze/suggestions.py dispatches to the first four; the driver (run.py) to the last two."""
