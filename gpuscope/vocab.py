"""The shared vocabulary: units, the parts of a step, the step labels and their colours."""

MS = 1e6  # ns per millisecond: times are integer ns inside; ms only when rendering

#: parts of a step that every RunTable has (columns f"{part}_ns"); comm_exposed and wait lie
#: inside comm, so data + compute + comm_exposed + other add up to the step
PARTS = ("data", "compute", "comm", "comm_exposed", "wait", "other")
#: short column heads for PARTS in tables
PART_HEADS = {"data": "data", "compute": "compute", "comm": "comm", "comm_exposed": "exposed",
              "wait": "wait", "other": "other"}
#: the disjoint parts drawn stacked (transfer = exposed comm minus waiting), with their colours
STACK_COLORS = {"data": "#e0a100", "compute": "#2e9d5b", "transfer": "#9b59b6", "wait": "#d9534f",
                "other": "#9aa5b1"}
#: named sub-phases of compute, each a RunTable column f"{name}_ns"
COMPUTE_PHASES = ("forward", "backward", "optimizer")

# step labels
DATA, COMM, IMBALANCED, COMPUTE = "data-bound", "comm-bound", "imbalanced", "compute-bound"
LABELS = (DATA, COMM, IMBALANCED, COMPUTE)
JITTER = "jitter"                       # secondary: waiting with no consistent late rank
MODERATE_DATA = "moderately data-bound"  # secondary: data wait between the two thresholds
LABEL_COLORS = {DATA: "#e0a100", COMM: "#9b59b6", IMBALANCED: "#d9534f", COMPUTE: "#2e9d5b"}
LABEL_STYLES = {DATA: "yellow", COMM: "magenta", IMBALANCED: "red", COMPUTE: "green"}  # terminal
