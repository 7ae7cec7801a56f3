"""The package's layout holds: the recorder side stays light and never reaches into the analysis
side, no module imports one that imports it back, and the public names stay what they are."""

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "gpuscope")
HEAVY = ("pandas", "plotly", "tensorboard", "numpy", "rich", "msgspec", "orjson", "torch")
#: what a recording may load into the training process once it writes: orjson (one small C
#: extension, no dependency of its own), on the writer thread, to encode rows
RECORDING_LOADS = ("orjson",)
SIDES = ("record", "readers", "analyze", "render")


def _modules() -> dict[str, str]:
    """module name -> file, for every module of the package."""
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(ROOT))[:-3]
                name = rel.replace(os.sep, ".").removesuffix(".__init__")
                out[name] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _bound_names(path: str) -> set[str]:
    """Names a module binds at its top level (defs, classes, imports, assignments)."""
    names = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


#: package -> names its __init__ binds: `from gpuscope import analyze` is the function it
#: defines, not the package gpuscope/analyze/
BOUND = {m: _bound_names(p) for m, p in MODULES.items() if p.endswith("__init__.py")}


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: str, type_checking: bool = True) -> set[str]:
    """Modules `name` imports, at any depth of the file: lazy imports in functions count, and so
    do `if TYPE_CHECKING:` blocks unless `type_checking` is False (a circle of type hints is a
    circle of meaning all the same). Relative imports are resolved."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node):
        if not type_checking and _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            found.add(mod)
            for a in node.names:  # `from . import x` where x is a module
                if f"{mod}.{a.name}" in MODULES and a.name not in BOUND.get(mod, ()):
                    found.add(f"{mod}.{a.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(open(path).read()))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
#: what runs: the imports a module makes when it runs (type hints left out)
RUN_GRAPH = {name: _imports(name, path, False) for name, path in MODULES.items()}


def _side(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gpuscope" and parts[1] in SIDES else None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _side(m) == "record"))
def test_record_side_imports_nothing_heavy_and_nothing_of_the_analysis_side(module):
    bad = sorted(m for m in RUN_GRAPH[module]
                 if m.split(".")[0] in ("pandas", "numpy", "plotly")
                 or _side(m) in ("readers", "analyze", "render"))
    assert bad == [], f"{module} imports {bad}"


def test_every_side_imports_only_what_lies_below_it():
    allowed = {"readers": {"readers"}, "analyze": {"analyze"}, "render": {"render"},
               "record": {"record"}}
    bad = []  # what a side loads when it runs (a renderer may hint the analysis' result types)
    for module, imports in RUN_GRAPH.items():
        side = _side(module)
        if side is None:
            continue
        for m in imports:
            other = _side(m)
            if other is not None and other not in allowed[side]:
                bad.append(f"{module} -> {m}")
    assert bad == []


def test_no_import_cycles():
    """Tarjan's strongly connected components over gpuscope's own modules, lazy imports and
    type-checking imports included."""
    graph = {m: {i for i in deps if i in MODULES and i != m} for m, deps in GRAPH.items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            strong(v)
    assert cycles == []


def test_the_checker_sees_a_cycle_and_a_lazy_import():
    """The checks above can fail: a lazy import inside a function is seen (cli -> demo), and so
    is a type-checking one (render.html hints results.ReportData)."""
    assert "gpuscope.demo.launch" in GRAPH["gpuscope.cli"]
    assert "gpuscope.analyze.run" in GRAPH["gpuscope"]
    assert "gpuscope.results" in GRAPH["gpuscope.render.html"]  # TYPE_CHECKING only
    assert "gpuscope.results" not in RUN_GRAPH["gpuscope.render.html"]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_gpuscope_and_recording_stay_light(tmp_path):
    code = ("import sys, json, gpuscope\n"
            f"rec = gpuscope.record({str(tmp_path)!r})\n"
            "with rec:\n"
            "    for _ in rec.data(range(3)):\n"
            "        rec.step()\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert json.loads(_run(code)) == list(RECORDING_LOADS)  # the rows were encoded: it loaded


def test_every_record_module_loads_light():
    mods = sorted(m for m in MODULES if _side(m) == "record")
    code = ("import sys, json, importlib\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert json.loads(_run(code)) == []


def test_analysis_side_is_importable_on_demand():
    code = "import sys, gpuscope.analyze.run; print('pandas' in sys.modules)"
    assert _run(code) == "True"  # the check above can fail: pandas does get loaded here


def test_record_and_analyze_stay_functions_after_their_packages_load():
    code = ("import gpuscope, gpuscope.analyze.run, gpuscope.record.nvml\n"
            "from gpuscope.analyze import scaling\n"
            "print(callable(gpuscope.record), callable(gpuscope.analyze),\n"
            "      gpuscope.Report.__name__, gpuscope.Thresholds.__name__)")
    assert _run(code) == "True True Report Thresholds"


#: the longest a function in gpuscope/ may be, in lines (docstring included)
LONGEST_FUNCTION = 80


def long_functions(root: str = ROOT) -> list:
    """(path, function, lines) of every function in `root` longer than LONGEST_FUNCTION."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as fh:
                    tree = ast.parse(fh.read())
                out += [(os.path.relpath(path, root), n.name, n.end_lineno - n.lineno + 1)
                        for n in ast.walk(tree)
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.end_lineno - n.lineno + 1 > LONGEST_FUNCTION]
    return out


def test_no_function_is_longer_than_80_lines(tmp_path):
    assert long_functions() == []
    # the check sees one: a function of 81 lines
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 79 + "    return x\n")
    assert long_functions(str(tmp_path)) == [("long.py", "f", 81)]


#: the most parameters a function in gpuscope/ takes without a default (self aside), and in
#: all: more are a bag of locals moved into a signature; group them in a named tuple or a
#: frozen struct (kineto/steps.StepCut, bottlenecks/data.WorkerModel, kineto/events.Columns)
MOST_REQUIRED, MOST_PARAMETERS = 6, 9


def parameter_bags(root: str = ROOT) -> list:
    """(path, function, parameters without a default, parameters) of every function in `root`
    past MOST_REQUIRED or MOST_PARAMETERS."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            with open(path) as fh:
                tree = ast.parse(fh.read())
            for n in ast.walk(tree):
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = n.args
                pos = a.posonlyargs + a.args
                if pos and pos[0].arg in ("self", "cls"):
                    pos = pos[1:]
                required = len(pos) - len(a.defaults) + sum(d is None for d in a.kw_defaults)
                total = len(pos) + len(a.kwonlyargs)
                if required > MOST_REQUIRED or total > MOST_PARAMETERS:
                    out.append((os.path.relpath(path, root), n.name, required, total))
    return out


def test_no_function_takes_a_bag_of_parameters(tmp_path):
    assert parameter_bags() == []
    # the check sees both: seven without a default, and ten in all (four keyword options); not
    # six and three options
    (tmp_path / "bags.py").write_text(
        "def f(a, b, c, d, e, g, h):\n    return a\n\n\n"
        "class C:\n    def m(self, a, b, c, d, e, g, *, h=1, i=2, j=3, k=4):\n        return a"
        "\n\n\ndef ok(a, b, c, d, e, g, h=1, *, i=2, j=3):\n    return a\n")
    assert sorted(parameter_bags(str(tmp_path))) == [("bags.py", "f", 7, 7),
                                                      ("bags.py", "m", 6, 10)]
