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
                "bubble": "#5bc0de", "other": "#9aa5b1"}
#: named sub-phases of compute, each a RunTable column f"{name}_ns"
COMPUTE_PHASES = ("forward", "backward", "optimizer")


def rest_of_other(forward_timed: bool) -> str:
    """What a recorded step's "other" holds beyond the loop's own work between steps: time
    nothing gpuscope timed covers, said as such (a sleep in forward is not launch overhead)."""
    if forward_timed:
        return ("the rest is inside the step but outside the data wait, forward, backward, "
                "optimizer and collectives gpuscope timed: not attributed (Python between them, "
                "the loop's own code)")
    return ("the rest is inside the step and not attributed: forward is not timed without "
            "record(model=...), so the model's forward counts here too")
#: a thread that runs again within this long (ns) of the end of a collective it issued and then
#: sat idle for was waiting for that collective (exposed communication); later, it was waiting
#: for a core (other). One rule for the recorder (record/rows.py) and traces (kineto/steps.py)
RESUME_NS = 2_000_000

# step labels
DATA, COMM, IMBALANCED, JITTER_BOUND, HOST, PIPELINE, COMPUTE = (
    "data-bound", "comm-bound", "imbalanced", "jitter-bound", "host-bound", "pipeline-bound",
    "compute-bound")
#: a step no bottleneck label holds whose time is mostly "other" (no op, no data wait, no
#: collective seen in it): not the healthy state, and not a fix gpuscope can estimate
UNEXPLAINED = "unexplained"
LABELS = (DATA, COMM, IMBALANCED, JITTER_BOUND, HOST, PIPELINE, UNEXPLAINED, COMPUTE)
#: secondary: waiting over the threshold with no consistent late rank (the label "jitter-bound"
#: when that waiting is the step's largest share)
JITTER = "jitter"
MODERATE_DATA = "moderately data-bound"  # secondary: data wait between the two thresholds
#: label colours, distinct from the part colours above (a label strip sits under the parts)
LABEL_COLORS = {DATA: "#2b6cb0", COMM: "#dd6b20", IMBALANCED: "#b83280",
                JITTER_BOUND: "#805ad5", HOST: "#975a16", PIPELINE: "#4a5568",
                UNEXPLAINED: "#718096", COMPUTE: "#2c7a7b"}
LABEL_STYLES = {DATA: "yellow", COMM: "magenta", IMBALANCED: "red", JITTER_BOUND: "bright_red",
                HOST: "cyan", PIPELINE: "blue", UNEXPLAINED: "white", COMPUTE: "green"}  # terminal
