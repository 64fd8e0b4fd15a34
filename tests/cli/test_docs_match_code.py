"""The docs' claims that can be checked against the code, checked (issue 22: 9 of 12 spot-checked
claims had gone stale - a file renamed, flags added, backend members probed but not listed).
Figures are not restated in the docs (they point at a bench's output), so what is left to rot is
names: files, flags, interface members."""

from __future__ import annotations

import ast
import os
import re
from typing import List, Set

from ports.micropython import gateway as board
from tests.support.procs import ROOT

DOCS = ["README.md", "docs/DESIGN.md", "docs/PROTOCOL.md", "docs/CLIENT.md",
        "ports/micropython/README.md", "ubrb_min.py"]
# not paths of this repository: MicroPython's own source files the board README cites, and the
# client's subcommands written as one word ("pub/echo/hz/bench/sim", docs/CLIENT.md)
NOT_OURS = {"ports/esp32/mpconfigport.h", "ports/rp2/main.c", "bench/sim"}
TOP = ("ports", "tests", "tools", "bench", "docs", "ros_side", "ubrb_client")


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    rx = re.compile(r"\b((?:%s)/[\w./-]*\w)" % "|".join(TOP))
    for doc in DOCS:
        for path in sorted(set(rx.findall(read(doc)))):
            if path not in NOT_OURS and not os.path.exists(os.path.join(ROOT, path)):
                missing.append("%s names %s" % (doc, path))
    assert missing == []


def test_the_board_flag_table_names_every_flag_of_the_board() -> None:
    # ports/micropython/README.md, "Flags": the port's OPTIONS are what the board accepts
    text = read("ports/micropython/README.md")
    flags = ["--" + o[0].replace("_", "-") for o in board.OPTIONS]
    assert [f for f in flags if not re.search(r"`%s\b" % re.escape(f), text)] == []


def _backend_members() -> Set[str]:
    """What ros_side asks of a backend: backend.NAME calls and getattr/hasattr probes."""
    found: Set[str] = set()
    for name in sorted(os.listdir(os.path.join(ROOT, "ros_side"))):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(read("ros_side/" + name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
                owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                if owner == "backend":
                    found.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
                owner_node = node.args[0]
                owner = (owner_node.id if isinstance(owner_node, ast.Name) else
                         owner_node.attr if isinstance(owner_node, ast.Attribute) else "")
                key = node.args[1]
                if owner == "backend" and isinstance(key, ast.Constant):
                    found.add(str(key.value))
    return found


def test_the_backend_table_lists_every_member_the_companion_uses() -> None:
    # docs/DESIGN.md, "Companion and backends": the table of what a Backend provides
    text = read("docs/DESIGN.md")
    table = text[text.index("## Companion and backends"):text.index("## Where each piece lives")]
    rows: List[str] = re.findall(r"^\| `(\w+)", table, re.M)
    used = _backend_members()
    assert used, "found no backend members in ros_side (the scan is broken)"
    assert sorted(used - set(rows)) == []
