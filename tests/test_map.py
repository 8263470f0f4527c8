#!/usr/bin/python3
"""The `test_map` test: the test map of tests/labels.cmake stays true to the tree.

The map gives every ctest test the source folders it tests as ctest labels (tests/README.md).
It fails, naming the test or label, when
- a tests/test_*.cpp or tests/runtime/test_*.cpp has no row in the map,
- a row gives no folder label, or a test appears in two rows,
- a label is neither a folder of the checkout nor one of NON_FOLDER_LABELS,
- a label of the map is not listed in tests/README.md,
and, with --build, when a test that build registers has no folder label.

Usage: test_map.py [--root DIR] [--build BUILD_DIR [--ctest CTEST]]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

# Labels that name no folder: the SCAPE step's tests, and the debug preset's filter.
NON_FOLDER_LABELS = {"scape_step", "not_under_sanitizers"}


def read_map(labels_cmake):
    """{test name: [labels]} from the set(scape_test_map ...) block; duplicate rows as problems."""
    text = labels_cmake.read_text()
    block = re.search(r'set\(scape_test_map\b(.*?")\)', text, re.S)
    if not block:
        raise SystemExit(f"{labels_cmake}: no set(scape_test_map ...) block")
    table, problems = {}, []
    # Comment lines may hold quotes of their own: rows are the quoted strings outside them.
    rows = re.sub(r"#[^\n]*", "", block.group(1))
    for row in re.findall(r'"([^"]*)"', rows):
        name, *labels = row.split()
        if name in table:
            problems.append(f"{name}: two rows in {labels_cmake.name}")
        table[name] = labels
    return table, problems


def is_folder(root, label):
    return label not in NON_FOLDER_LABELS and (root / label).is_dir() and not label.startswith((".", "/"))


def check_map(root, table):
    problems = []
    tests = root / "tests"
    for src in sorted(list(tests.glob("test_*.cpp")) + list((tests / "runtime").glob("test_*.cpp"))):
        if src.stem not in table:
            problems.append(f"{src.relative_to(root)}: no row in tests/labels.cmake")
    readme = (tests / "README.md").read_text() if (tests / "README.md").exists() else ""
    for name, labels in sorted(table.items()):
        if not any(is_folder(root, label) for label in labels):
            problems.append(f"{name}: no label names a source folder")
        for label in labels:
            if label not in NON_FOLDER_LABELS and not is_folder(root, label):
                problems.append(f"{name}: label {label!r} names no folder of the checkout")
            if f"`{label}`" not in readme:
                problems.append(f"{name}: label {label!r} is not listed in tests/README.md")
    return problems


def check_build(root, build, ctest):
    """Every test the build registers carries a folder label."""
    out = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, check=True, capture_output=True, text=True)
    problems = []
    for test in json.loads(out.stdout)["tests"]:
        labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
        if not any(is_folder(root, label) for label in labels):
            problems.append(f"{test['name']}: registered without a folder label (add a row to tests/labels.cmake)")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    parser.add_argument("--build", type=pathlib.Path)
    parser.add_argument("--ctest", default="ctest")
    args = parser.parse_args()
    root = args.root.resolve()
    table, problems = read_map(root / "tests" / "labels.cmake")
    problems += check_map(root, table)
    if args.build:
        problems += check_build(root, args.build, args.ctest)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"test map: {len(table)} rows, every test file and registered test labelled by folder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
