"""The Flight Recorder section (analyze/hang_report.py) in the terminal: the ranks that stopped
the job first, then who waits on them, the kinds of group, and what the dumps left unsaid."""

from __future__ import annotations


def render(doc: dict, path: str) -> str:
    lines = doc["text"].splitlines()
    head = "THE JOB HUNG: " if doc.get("hung") else ""
    out = [f"gpuscope flight recorder {path}",
           f"{doc['dumps']} of {doc['world_size']} ranks left a dump"]
    if lines:
        out.append(head + lines[0])
        out += lines[1:]
    out += [f"warning: {n}" for n in doc.get("notes") or ()]
    return "\n".join(out)
