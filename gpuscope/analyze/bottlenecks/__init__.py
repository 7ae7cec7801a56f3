"""One module per bottleneck: each holds its suggestions and their estimates, callable alone with
a Findings and a TypicalStep (analyze/findings.py): data, comm, host, imbalance (stragglers and
jitter), pipeline (pipeline-parallel stages), dataparallel (nn.DataParallel). Each bottleneck
label's module declares its SPEC (spec.py: share column, threshold, what removing it recovers,
when it is asked for suggestions and how it makes them); table.py gathers them for classify's
neighbours (confidence, invariants) and analyze/suggestions.py's dispatch. The driver (run.py)
calls pipeline's and dataparallel's summaries itself."""
