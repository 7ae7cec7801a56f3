"""Write gpuscope/analyze/t_table.py: one-sided Student's t and normal critical values at the
significance levels the straggler test uses (analyze/consistency.py). Needs scipy, which the
package does not depend on: the table is data, computed once.

    pip install scipy && python scripts/make_t_table.py
"""

import os

from scipy import stats

LEVELS = [0.05, 0.025, 0.01, 0.005, 0.0025, 0.001, 5e-4, 2.5e-4, 1e-4, 5e-5, 1e-5, 1e-6]
DOFS = list(range(1, 31)) + [40, 60, 120]
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpuscope",
                   "analyze", "t_table.py")


def main() -> None:
    lines = ['"""One-sided critical values of Student\'s t (by degrees of freedom) and of the normal',
             'distribution, at the significance levels LEVELS; written by scripts/make_t_table.py',
             '(scipy.stats.t.ppf / norm.ppf, 4 significant digits). Do not edit by hand."""', "",
             f"LEVELS = {tuple(LEVELS)!r}", "", "T = {"]
    for a in LEVELS:
        vals = ", ".join(f"{d}: {stats.t.ppf(1 - a, d):.4g}" for d in DOFS)
        lines.append(f"    {a!r}: {{{vals}}},")
    lines += ["}", "", "Z = {" + ", ".join(f"{a!r}: {stats.norm.ppf(1 - a):.4f}" for a in LEVELS)
              + "}", ""]
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
