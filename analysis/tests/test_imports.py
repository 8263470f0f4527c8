"""The analysis package imports top-down: no module imports, directly or through others, itself.

The graph is read from the source with `ast`, so imports inside functions (the lazy ones that keep
matplotlib out until a figure is drawn) count as much as the ones at the top of a file. An edge
A -> B for every `import analysis.B`, `from analysis import B`, `from analysis.B import x`,
`from . import B` and `from .B import x` in A; names imported from the package itself
(`from analysis import load_run`, `from . import load_run`) are an edge to `__init__`.
"""

import ast
from pathlib import Path

PACKAGE = "analysis"
ROOT = Path(__file__).resolve().parents[1]


def package_modules(root=ROOT):
    """{module name: path} of the package's top-level modules (`__init__` for the package itself)."""
    return {p.stem: p for p in sorted(root.glob("*.py"))}


def _target(name, modules):
    """The module a dotted name inside the package refers to ('runs', 'runs.load_run' -> 'runs')."""
    head = name.split(".", 1)[0] if name else ""
    return head if head in modules else "__init__"


def imports_of(source, modules):
    """The package modules `source` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    out.add(_target(alias.name[len(PACKAGE) + 1:], modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module or ""
            elif node.level == 0 and (node.module == PACKAGE or (node.module or "").startswith(PACKAGE + ".")):
                base = node.module[len(PACKAGE) + 1:]
            else:
                continue
            if base:
                out.add(_target(base, modules))
            else:  # from . import x / from analysis import x: a module, or a name of __init__
                out.update(_target(alias.name, modules) for alias in node.names)
    return out


def import_graph(modules):
    """{module: sorted modules it imports} (self-imports of __init__ left out)."""
    graph = {}
    for name, path in modules.items():
        deps = imports_of(path.read_text(encoding="utf-8"), modules) - {name}
        graph[name] = sorted(deps)
    return graph


def find_cycle(graph):
    """One cycle [a, b, ..., a] of the graph, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in graph.get(node, ()):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_checker_sees_every_import_form():
    modules = {m: None for m in ("__init__", "runs", "stats", "report", "figures")}
    source = ("import analysis.runs\n"
              "from . import stats\n"
              "from .figures import make_figures\n"
              "from analysis import load_run\n"
              "def f():\n"
              "    from analysis.report import write_report\n"
              "import json\n"
              "from numpy import nan\n")
    assert imports_of(source, modules) == {"runs", "stats", "figures", "__init__", "report"}
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None


def test_package_imports_are_acyclic():
    graph = import_graph(package_modules())
    assert {"report", "figures", "runs"} <= set(graph)  # the glob found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in analysis/: " + " -> ".join(cycle) + "\n" + "\n".join(
        f"  {m}: {', '.join(d) or '-'}" for m, d in graph.items())
