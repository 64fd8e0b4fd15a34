"""Every program in bench/ and tools/ keeps the README's contract at its command line: --version
is one line and exit 0, an unknown flag one line on stderr and exit 2 (issue 22: 11 of 14 bench
scripts refused --version, bench/link_auth.py ignored unknown flags, bench/relay_paths.py died with
a ModuleNotFoundError traceback, tools/deploy.py and tools/ros_observer.py had no --version).

A program is a file of bench/ or tools/ with a `__main__` block; the modules without one are
listed in MODULES, so a new file is either a program (and tested here) or said to be a module."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Tuple

import pytest

import ubrb_min as U
from tests.cli.helpers import PY, run_all
from tests.support.procs import ROOT

# modules only, imported by the programs and the tests, never run
MODULES = {"bench/__init__.py", "tools/__init__.py", "tools/impair.py", "tools/ptyline.py"}
FILES = sorted("%s/%s" % (d, f) for d in ("bench", "tools")
               for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".py"))
PROGRAMS = [f for f in FILES if f not in MODULES]
# programs whose flags belong to a subcommand: the unknown flag after each subcommand too
SUBCOMMANDS = {"bench/chainkit.py": ["dds-writer", "ubrb-writer"],
               "bench/link_field.py": ["writer"],
               "bench/round_trip.py": ["rclpy-echo", "rclpy-ping"],
               "tools/deploy.py": ["build", "board", "check"],
               "tools/ros_observer.py": ["watch", "echo"]}
UNKNOWN = [[p] + ([s] if s else []) for p in PROGRAMS for s in [""] + SUBCOMMANDS.get(p, [])]


def _main_block(path: str) -> bool:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return re.search(r'^if __name__ == "__main__":', f.read(), re.M) is not None


def test_every_file_is_a_program_or_a_listed_module() -> None:
    assert all(_main_block(p) for p in PROGRAMS), [p for p in PROGRAMS if not _main_block(p)]
    assert not any(_main_block(m) for m in MODULES), [m for m in MODULES if _main_block(m)]
    assert set(SUBCOMMANDS) <= set(PROGRAMS)


@pytest.fixture(scope="module")
def ran() -> Dict[Tuple[str, ...], Any]:
    """Every command line of this module's tests (helpers.run_all)."""
    argvs = [(PY, p, "--version") for p in PROGRAMS] + \
        [tuple([PY] + a + ["--no-such-flag"]) for a in UNKNOWN]
    return dict(zip(argvs, run_all([(list(a), {}) for a in argvs])))


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_is_one_line_and_exit_0(ran: Dict[Tuple[str, ...], Any], program: str) -> None:
    r = ran[(PY, program, "--version")]
    assert r.returncode == 0 and not r.stderr, (r.returncode, r.stdout, r.stderr)
    assert re.fullmatch(r"%s %s\n" % (re.escape(program), re.escape(U.VERSION)), r.stdout), \
        r.stdout


@pytest.mark.parametrize("argv", UNKNOWN, ids=" ".join)
def test_an_unknown_flag_is_one_line_and_exit_2(ran: Dict[Tuple[str, ...], Any],
                                                argv: List[str]) -> None:
    r = ran[tuple([PY] + argv + ["--no-such-flag"])]
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, r.stderr
    assert err.startswith(argv[0].split("/")[-1].split(".")[0]) or err.startswith(argv[0]), err
    assert not r.stdout, r.stdout   # nothing ran


def _imports(path: str) -> List[Tuple[int, str]]:
    """(line, module) of every import in the file at ``path`` (relative to the repository)."""
    import ast

    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: List[Tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or ""))
    return found


def test_no_program_imports_from_tests() -> None:
    # bench/ and tools/ run without the test tree (a checkout for benchmarking, a board's
    # deploy): what they share with the tests lives in bench/chainkit.py or tools/ (issue 22:
    # bench/policy.py imported tests.e2e.helpers and tests.support)
    found = ["%s:%d %s" % (path, line, m) for path in FILES for line, m in _imports(path)
             if m == "tests" or m.startswith("tests.")]
    assert found == [], found


def test_no_test_module_imports_another() -> None:
    # what tests share is a rig in tests/support/ (or tests/core/*_rig.py for the MicroPython leg),
    # so a newcomer finds it by name and a test module can be read, moved or deleted alone
    # (issue 22: seven test modules imported rigs from other test modules)
    paths = [os.path.relpath(os.path.join(d, n), ROOT)
             for d, _, names in os.walk(os.path.join(ROOT, "tests")) for n in names
             if n.endswith(".py")]
    found = ["%s:%d %s" % (path, line, m) for path in paths for line, m in _imports(path)
             if m.split(".")[-1].startswith("test_")]
    assert found == [], found
