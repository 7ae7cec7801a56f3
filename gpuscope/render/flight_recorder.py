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


def html(doc: dict, path: str) -> str:
    """The same as one self-contained page."""
    from html import escape

    lines = render(doc, path).splitlines()
    head, rest = lines[:2], lines[2:]
    return ("<!doctype html><meta charset=utf-8><title>gpuscope flight recorder</title>"
            "<style>body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}"
            "pre{white-space:pre-wrap}.died{color:#b00020;font-weight:600}</style>"
            f"<h1>gpuscope <small>flight recorder: {escape(path)}</small></h1>"
            f"<p>{escape(head[1]) if len(head) > 1 else ''}</p>"
            + (f'<p class="died" id="hang">{escape(rest[0])}</p>' if rest else "")
            + f"<pre>{escape(chr(10).join(rest[1:]))}</pre>")
