"""The programs of the project as a user starts them (real entry points, real processes), and
the check every mistake must pass: exit status, one line on stderr, no traceback."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from tests.support.domains import test_domain
from tests.support.procs import ROOT, child_env

PY = sys.executable
GATEWAY = [PY, "ubrb_min.py"]
COMPANION = [PY, "-m", "ros_side"]
CLIENT = [PY, "-m", "ubrb_client"]
DEMO = [PY, "tools/demo.py"]
LATENCY = [PY, "tools/latency.py"]
OBSERVER = [PY, "tools/ros_observer.py"]
# `python -S`: no site-packages at all, as on a machine where nothing was pip-installed
PLAIN = [PY, "-S"]
# A host name Python's IDNA codec refuses before any lookup: "cannot resolve" without sending a
# single DNS query (test traffic stays on this machine).
UNRESOLVABLE = "no..such"
# Any DDS participant a test starts uses this domain (log lines only, no data is compared).
DOMAIN = test_domain("cli")


def run(argv: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 60,
        extra_env: Optional[Dict[str, str]] = None, **env_set: str) -> subprocess.CompletedProcess:
    """`argv` in the repository with DDS on loopback, plus `extra_env` / `env_set` variables."""
    e = dict(env if env is not None else child_env(DOMAIN))
    e.update(extra_env or {})
    e.update(env_set)
    return subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_all(cmds: List[Tuple[List[str], Dict[str, str]]]) -> List[subprocess.CompletedProcess]:
    """`run(argv, extra_env=env)` for each (argv, env), four at a time, results in order: for a
    module of short-lived command lines, mostly interpreter start-up and imports, run up front
    by a module fixture."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: run(c[0], extra_env=c[1]), cmds))


def one_line(r: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """Assert exit `code` and exactly one line on stderr holding every fragment; that line."""
    err = r.stderr.strip()
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert len(err.splitlines()) == 1, r.stderr
    for f in fragments:
        assert f in err, (f, err)
    return err
