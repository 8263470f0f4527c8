#!/usr/bin/python3
"""The `layers` test: no include or import points up the layer order of docs/ARCHITECTURE.md.

The order is read from the fenced blocks ```layers (C++ folders) and ```python-layers (modules of
the Python package) in docs/ARCHITECTURE.md, top layer first; names on one line are peers, which
may not include each other. A file belongs to the longest folder of the order that contains it.
Every `#include "..."` of a C++ source in those folders, and every import between modules of the
Python package, must point to the same folder or module or to a lower layer. Anything else is
reported as FILE:LINE with both layers, and the exit status is 1. README.md's layout table must
have a row for every top-level folder of the order.

Usage: layers_check.py [--root DIR]   (DIR: the checkout, default this file's parent's parent)
"""
import argparse
import ast
import pathlib
import re
import sys

CPP_SUFFIXES = {".hpp", ".cpp", ".cu", ".cuh", ".inc", ".h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_order(doc, block):
    """[[names of the top layer], ..., [names of the bottom layer]] from ```block in doc."""
    text = doc.read_text()
    match = re.search(r"^```" + re.escape(block) + r"\n(.*?)^```", text, re.S | re.M)
    if not match:
        raise SystemExit(f"{doc}: no ```{block} block (the layer order this test checks)")
    layers = [line.split("#")[0].split() for line in match.group(1).splitlines()]
    return [names for names in layers if names]


def rank_table(order):
    """{name: level}: the bottom layer is level 0."""
    levels = {}
    for level, names in enumerate(reversed(order)):
        for name in names:
            levels[name] = level
    return levels


def owner(name, levels, separator="/"):
    """The longest name of the order that is `name` or contains it (None: outside every layer)."""
    parts = name.split(separator)
    for cut in range(len(parts), 0, -1):
        candidate = separator.join(parts[:cut])
        if candidate in levels:
            return candidate
    return None


def allowed(source, target, levels):
    if source == target:
        return True
    if levels[target] < levels[source]:
        return True
    # A folder may include the folders nested in it when they sit below it (optimizers/ and
    # optimizers/scape), never a peer or anything above.
    return False


def violation(where, what, source, target, levels):
    """The report line of `where` (FILE:LINE) pointing from layer `source` to `target`, or None."""
    if target is None or allowed(source, target, levels):
        return None
    relation = "a peer" if levels[target] == levels[source] else "above it"
    return f"{where}: {what}: {source} (layer {levels[source]}) may not reach {target} (layer {levels[target]}, {relation})"


def cpp_includes(file):
    """(line number, included path) of every #include "..." of the file."""
    for number, line in enumerate(file.read_text(errors="replace").splitlines(), start=1):
        m = INCLUDE.match(line)
        if m:
            yield number, m.group(1)


def check_cpp(root, order):
    levels = rank_table(order)
    problems = []
    for name in sorted(levels):
        folder = root / name
        if not folder.is_dir():
            problems.append(f"docs/ARCHITECTURE.md: layer {name}/ does not exist")
            continue
        files = [f for f in sorted(folder.rglob("*")) if f.suffix in CPP_SUFFIXES and f.is_file()]
        for file in files:
            rel = file.relative_to(root).as_posix()
            if owner(rel, levels) != name:
                continue  # a nested layer of its own, checked under its name
            for number, path in cpp_includes(file):
                problems.append(violation(f"{rel}:{number}", f'includes "{path}"', name, owner(path, levels), levels))
    return [p for p in problems if p]


def module_name(root, file):
    rel = file.relative_to(root / "python").with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(tree, module, is_package):
    """(line, absolute module name) of every import of the file, relative ones resolved."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if node.module is None or node.level:
                # `from . import x` may name a submodule: check each name as one.
                for alias in node.names:
                    yield node.lineno, f"{stem}.{alias.name}" if stem else alias.name
            if node.module is not None:
                yield node.lineno, stem


def check_python(root, order):
    levels = rank_table(order)
    problems = []
    for file in sorted((root / "python" / "scape").rglob("*.py")):
        module = module_name(root, file)
        source = owner(module, levels, ".")
        if source is None:
            problems.append(f"{file.relative_to(root)}: module {module} is in no layer of ```python-layers")
            continue
        tree = ast.parse(file.read_text(), str(file))
        # The package itself (scape) is its facade: importing it from below runs it, so it counts.
        for line, name in imported_modules(tree, module, file.name == "__init__.py"):
            where = f"{file.relative_to(root)}:{line}"
            problems.append(violation(where, f"imports {name}", source, owner(name, levels, "."), levels))
    return [p for p in problems if p]


def check_readme(root, order):
    """README.md's layout table has a row for every top-level folder of the order."""
    readme = root / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    tops = sorted({name.split("/")[0] for names in order for name in names})
    return [f"README.md: the layout table has no row | `{top}/` | (docs/ARCHITECTURE.md's layer {top}/)"
            for top in tops if f"| `{top}/` |" not in text]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    doc = args.root / "docs" / "ARCHITECTURE.md"
    if not doc.is_file():
        print(f"{doc}: missing (the layer order this test checks)", file=sys.stderr)
        return 2
    order = read_order(doc, "layers")
    problems = check_cpp(args.root, order) + check_readme(args.root, order)
    if (args.root / "python" / "scape").is_dir():
        problems += check_python(args.root, read_order(doc, "python-layers"))
    for p in problems:
        print(p)
    if problems:
        print(f"layers: {len(problems)} include(s) or import(s) against the order of docs/ARCHITECTURE.md")
        return 1
    print("layers: every include and import points down the order of docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
