"""Op and kernel names as a report shows them, and a straggler's excess down to the op in
words: one wording for the analysis (a suggestion's why) and every renderer."""

from __future__ import annotations

#: characters of a name shown (kernel names run to hundreds with their templates)
NAME_CHARS = 60


def short(name: str) -> str:
    """A kernel's or op's name without "void ", its argument list and template arguments,
    cut to NAME_CHARS."""
    core = name[5:] if name.startswith("void ") else name
    if "(" in core and not core.startswith("autograd::"):
        core = core.split("(", 1)[0] or core
    if "<" in core:
        core = core.split("<", 1)[0] or core
    return core if len(core) <= NAME_CHARS else core[:NAME_CHARS - 3] + "..."


def excess_words(ops: list) -> str:
    """A straggler's excess down to the op, in words: "+14.2 ms per step in aten::linalg_svd
    (not run by its peers); ..."."""
    return "; ".join(
        f"+{o['excess_ms']:,.1f} ms per step in {short(o['name'])}"
        + (" (not run by its peers)" if o.get("only_here") else
           f" ({o['rank_ms']:,.1f} against {o['peers_ms']:,.1f} ms)") for o in ops[:3])
