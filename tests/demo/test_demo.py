"""`make demo` (tools/demo.py) and the bench echo (tools/ros_observer.py echo), end to end.

Real processes on 127.0.0.1 (free ports), DDS confined to loopback, a domain id of our own:
gateway (ubrb_min.py) ══UDP link══ companion (ros_side, dds backend) ══DDS══ observer / echo.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from tests.support.domains import test_domain
from tests.support.loopback_ports import free_port
from tests.support.procs import Proc, child_env

ROOT = Path(__file__).resolve().parent.parent.parent
DEMO = [sys.executable, str(ROOT / "tools" / "demo.py")]
ANSI = re.compile(r"\x1b\[")
NOMINAL_HZ = {"/clock": 100, "/tf": 50, "/odom": 50, "/imu": 100, "/scan": 10}

# `make test` runs this module after the rest, not beside other tests (tests/conftest.py,
# "serial"): topic rates against their nominal Hz.
pytestmark = pytest.mark.serial


# DDS domain ids of our own, one per test (tests/support/domains.py)
def domain(k: int) -> int:
    return test_domain("demo%d" % k)


def loopback_env() -> Dict[str, str]:
    """DDS on loopback; the demo picks its domain (--domain); colour decided by the demo."""
    return child_env(unset=("NO_COLOR",))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose (its parent has not reaped it yet)
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Run(Proc):
    """A process of the demo (by default with ``loopback_env()``)."""

    def __init__(self, argv: List[str], env: Optional[Dict[str, str]] = None) -> None:
        super().__init__(argv, env=env or loopback_env())


def child_pids(text: str) -> Dict[str, int]:
    """{'gateway': pid, ...} from the demo's progress lines."""
    out = {}
    for m in re.finditer(r"^starting (\w+).*?\.\.\. ok \(pid (\d+)", text, re.M):
        out[{"simulated": "sim"}.get(m.group(1), m.group(1))] = int(m.group(2))
    return out


def summary_rates(text: str) -> Dict[str, float]:
    """Rates of the summary table at the end of the demo's output."""
    part = text[text.index("summary (averages over the run)"):]
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(/\w+)(?: \(out\))?\s+\S+\s+([\d.]+) Hz", part, re.M)}


@pytest.fixture
def demo_runs() -> Iterator[List[Run]]:
    runs: List[Run] = []
    yield runs
    for r in runs:  # whatever happened: nothing of ours survives the test
        pids = child_pids(r.text())
        r.kill()
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def assert_no_children_left(pids: Dict[str, int]) -> None:
    assert set(pids) == {"gateway", "companion", "sim"}, pids
    time.sleep(0.2)
    left = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not left, "processes left behind: %s" % left


def test_demo_runs_the_whole_chain(demo_runs: List[Run], tmp_path: Path) -> None:
    t0 = time.monotonic()
    run = Run(DEMO + ["--duration", "4", "--ports", "0", "--domain", str(domain(0)),
                      "--log-dir", str(tmp_path)])
    demo_runs.append(run)
    rc = run.wait(60)
    text = run.text()
    assert rc == 0, text
    assert not ANSI.search(text), "colour codes although stdout is not a terminal"
    for step in ("starting gateway", "starting companion", "waiting for the companion link",
                 "starting ROS-side observer", "starting simulated robot", "DDS discovery"):
        assert re.search(r"^%s.*\.\.\. ok" % step, text, re.M), (step, text)
    # a live table at least every second or so
    assert len(re.findall(r"^UBRB demo \d\d:\d\d ", text, re.M)) >= 4, text
    rates = summary_rates(text)
    for topic, nominal in NOMINAL_HZ.items():
        assert 0 < rates.get(topic, 0) < 3 * nominal, (topic, rates, text)
    assert rates.get("/cmd_vel", 0) > 0, text
    assert re.search(r"^/tf_static\s+\S+\s+latched", text, re.M), text
    # the robot moved under /cmd_vel: 0.5 m/s for the 4 s
    m = re.search(r"travelled ([\d.]+) m", text)
    assert m and float(m.group(1)) > 0.5, text
    # the drop counters come from the companion's /diagnostics
    assert re.search(r"^drops\s+gateway \S+ \| link \d+ \| companion \d+", text, re.M), text
    assert "stopping: sim ok, observer ok, companion ok, gateway ok" in text, text
    assert_no_children_left(child_pids(text))
    for name in ("gateway", "companion", "sim"):
        assert (tmp_path / (name + ".log")).stat().st_size > 0
    print("demo --duration 4: %.1f s in all" % (time.monotonic() - t0))


def test_ctrl_c_stops_everything_and_exits_0(demo_runs: List[Run], tmp_path: Path) -> None:
    run = Run(DEMO + ["--ports", "0", "--domain", str(domain(1)), "--log-dir", str(tmp_path)])
    demo_runs.append(run)
    run.wait_line(r"^pose \(/odom\)\s+x", 30)
    run.proc.send_signal(signal.SIGINT)
    rc = run.wait(20)
    text = run.text()
    assert rc == 0, text
    assert "SIGINT: stopping" in text
    assert "stopping: sim ok, observer ok, companion ok, gateway ok" in text, text
    assert_no_children_left(child_pids(text))


def test_a_dying_child_is_reported_and_the_rest_stopped(demo_runs: List[Run],
                                                        tmp_path: Path) -> None:
    run = Run(DEMO + ["--duration", "30", "--ports", "0", "--domain", str(domain(2)),
                      "--log-dir", str(tmp_path)])
    demo_runs.append(run)
    run.wait_line(r"^up in ", 30)
    pids = child_pids(run.text())
    os.kill(pids["companion"], signal.SIGKILL)
    rc = run.wait(20)
    text = run.text()
    assert rc == 1, text
    assert re.search(r"FAILED: companion \(pid %d\) died: killed by SIGKILL" % pids["companion"],
                     text), text
    assert "last lines of" in text and "companion.log" in text
    assert "companion had died (killed by SIGKILL)" in text, text
    assert_no_children_left(pids)


def test_bench_round_trip_through_the_chain_with_the_echo(tmp_path: Path) -> None:
    """ubrb_client bench -> gateway -> link -> companion -> DDS -> echo -> back."""
    env = loopback_env()
    gw, link = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_DGRAM)
    dom = str(domain(3))
    py = sys.executable
    procs = [
        Run([py, "ubrb_min.py", "--listen", "127.0.0.1:%d" % gw,
             "--link", "udp://127.0.0.1:%d" % link], env),
        Run([py, "-m", "ros_side", "--link", "udp://127.0.0.1:%d" % link, "--backend", "dds",
             "--domain", dom], env),
        Run([py, "tools/ros_observer.py", "echo", "--domain", dom], env),
    ]
    try:
        procs[2].wait_line(r"^echo: /ubrb_bench/ping -> /ubrb_bench/pong", 20)
        results = {}
        for q in ("reliable", "best_effort"):
            bench = subprocess.run(
                [py, "-m", "ubrb_client", "bench", "--server", "127.0.0.1:%d" % gw,
                 "--count", "300", "--size", "256", "--rate", "300", "--qos", q, "--json",
                 "--wait", "20"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert bench.returncode == 0, bench.stdout + bench.stderr
            results[q] = r = json.loads(bench.stdout.strip().splitlines()[-1])
            assert r["sent"] == 300 and r["duplicates"] == 0, r
            assert r["rtt_p50_ms"] > 0, r
        assert results["reliable"]["received"] == 300, results
        assert results["best_effort"]["received"] >= 270, results  # newest-wins may thin
    finally:
        for p in reversed(procs):
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGINT)
        codes: List[Optional[int]] = []
        for p in reversed(procs):
            try:
                codes.append(p.wait(10))
            except AssertionError:  # still running after 10 s (Proc.wait)
                p.kill()
                codes.append(None)
    assert codes == [0, 0, 0], [p.text() for p in procs]
    assert re.search(r"echo: stopped after (\d+) messages \(0 errors\)", procs[2].text())
