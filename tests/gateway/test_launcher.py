"""`python ubrb_min.py ...` starts the CPython port through the core's launcher block, and the
core is loaded once: the script's own copy (`__main__`) defines nothing of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CORE = ROOT / "ubrb_min.py"

# Runs the file as __main__ the way `python ubrb_min.py` does, then looks at both copies.
PROBE = """
import os, sys
sys.path.insert(0, os.path.dirname(%r))  # what `python ubrb_min.py` does for the script's dir
sys.argv = ["ubrb_min.py", "--max-clients", "many"]
g = {"__name__": "__main__", "__file__": %r}
try:
    exec(compile(open(%r).read(), %r, "exec"), g)
except SystemExit as e:
    print("exit", e.code)
print("main copy defines Gateway:", "Gateway" in g)
print("ubrb_min loaded:", "ubrb_min" in sys.modules)
print("port:", "ubrb_host.gateway" in sys.modules)
"""


def test_bad_flag_is_refused_with_one_line_and_status_2() -> None:
    proc = subprocess.run([sys.executable, str(CORE), "--max-clients", "many"], cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--max-clients: invalid int value: 'many'" in proc.stderr


def test_help_lists_every_limit_from_the_core_table() -> None:
    proc = subprocess.run([sys.executable, str(CORE), "--help"], cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--listen", "--link", "--baud", "--link-mtu", "--profile", "--max-clients",
                 "--queue-bytes", "--control-reserve", "--log-level", "--link-key",
                 "--insecure-link"):
        assert flag in proc.stdout, flag


def test_the_script_copy_defines_no_core() -> None:
    path = str(CORE)
    proc = subprocess.run([sys.executable, "-c", PROBE % (path, path, path, path)], cwd="/",
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout
    assert "exit 2" in out, proc.stderr
    assert "main copy defines Gateway: False" in out
    assert "ubrb_min loaded: True" in out
    assert "port: True" in out
