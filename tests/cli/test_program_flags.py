"""What every program has in common: --version, -v/-q/--log-level, one memory total at start-up,
the shutdown counters as a table, --help that never runs anything, temp files cleaned up, and
`pip install .[extra]` installing the project's own packages only."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence

import pytest

import ubrb_min as U
import ubrb_setup
from tests.cli.helpers import (CLIENT, COMPANION, DEMO, DOMAIN, GATEWAY, LATENCY, OBSERVER, PY,
                               one_line, run)
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc
from tests.support.raw_client import RawClient

BENCHES = [[PY, "bench/link_efficiency.py"], [PY, "bench/core_relay.py"]]
PROGRAMS = [GATEWAY, COMPANION, CLIENT, CLIENT + ["echo"], DEMO, LATENCY,
            OBSERVER + ["echo"]] + BENCHES


@pytest.mark.parametrize("argv", PROGRAMS, ids=lambda a: " ".join(a[1:]))
def test_version(argv: List[str]) -> None:
    r = run(argv + ["--version"])
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"\S.* %s( \(UBRB v1\))?\n" % re.escape(U.VERSION), r.stdout), r.stdout


@pytest.mark.parametrize("argv", [GATEWAY, COMPANION, CLIENT + ["pub"], DEMO, LATENCY,
                                  OBSERVER + ["watch"]] + BENCHES,
                         ids=lambda a: " ".join(a[1:]))
def test_log_flags_everywhere(argv: List[str]) -> None:
    out = run(argv + ["--help"]).stdout
    for flag in ("--log-level", "-v, --verbose", "-q, --quiet", "--version"):
        assert flag in out, (flag, out)


@pytest.mark.parametrize("argv", BENCHES, ids=lambda a: a[1])
def test_bench_help_does_not_run_the_bench(argv: List[str]) -> None:
    t0 = time.monotonic()
    r = run(argv + ["--help"])
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stderr
    # the figures' headers: link_efficiency's table, core_relay's first line
    assert "forward %" not in r.stdout and not re.search(r"^CPython \d", r.stdout, re.M)
    assert time.monotonic() - t0 < 20


def _gateways_on_missing_serial(*flag_sets: Sequence[str]) -> List[str]:
    """What each gateway logs, one per set of flags, all at once, waiting for a missing tty."""
    gs = [Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", "serial:/dev/ubrb-no-such-tty",
                          "--profile", "mcu", *flags]) for flags in flag_sets]
    try:
        for g in gs:
            g.wait_line(r"waiting for /dev/ubrb-no-such-tty to open", 20)
        time.sleep(0.6)  # one more reopen attempt (every 0.5 s)
    finally:
        for g in gs:
            g.stop(signal.SIGINT)
    return [g.text() for g in gs]


def test_quiet_keeps_warnings_only_and_verbose_adds_debug() -> None:
    quiet, verbose, explicit = _gateways_on_missing_serial(["-q"], ["-v"],
                                                           ["--log-level", "warning"])
    assert " INFO " not in quiet and " WARNING " in quiet, quiet
    assert " DEBUG ubrb.link: link: reopen failed" in verbose, verbose
    assert " INFO " not in explicit


def test_one_memory_total_at_start_up_link_buffers_included() -> None:
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link, "--profile", "mcu"])
    try:
        g.wait_line(r"listening on", 20)
    finally:
        g.stop(signal.SIGINT)
    text = g.text()
    p = ubrb_setup.make_profile("mcu")
    sizes = ubrb_setup.link_sizes(p["max_payload"], True, ubrb_setup.LINK_DEFAULT_MTU)
    total = ubrb_setup.memory_budget(p, sizes)["total"]
    assert total == ubrb_setup.memory_budget(p)["total"] + sizes["total"]
    heads = re.findall(r"worst-case memory budget (.+)$", text, re.M)
    assert heads == [ubrb_setup.human_bytes(total)], text


def test_shutdown_counters_are_a_short_aligned_table() -> None:
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", "none", "--profile", "mcu"])
    port = int(g.wait_line(r"listening on 127\.0\.0\.1:(\d+)", 20).group(1))
    socket.create_connection(("127.0.0.1", port)).close()
    time.sleep(0.2)
    assert g.stop(signal.SIGINT) == 0
    table = g.text().split("counters (non-zero):\n", 1)[1].splitlines()
    rows = [m for m in (re.match(r".* INFO ubrb\.gateway:   (\S+)( +)(\d+)$", line)
                        for line in table) if m is not None]
    assert rows and all(int(m.group(3)) > 0 for m in rows), table
    assert "gateway.clients_accepted" in [m.group(1) for m in rows]
    ends = {len(m.group(1)) + len(m.group(2)) + len(m.group(3)) for m in rows}
    assert len(ends) == 1, table  # numbers right-aligned in one column
    assert len(rows) < 10


@pytest.mark.parametrize("argv", [
    GATEWAY + ["--listen", "127.0.0.1:0", "--link", "none", "--profile", "mcu"],
    COMPANION + ["--listen", "127.0.0.1:0", "--backend", "dds", "--domain", str(DOMAIN)],
], ids=["gateway", "companion-direct"])
def test_sigusr1_logs_the_counters_table_while_it_keeps_serving(argv: List[str]) -> None:
    # issue 22: a running program's counters without stopping it (kill -USR1 PID)
    g = Proc(argv)
    try:
        port = int(g.wait_line(r"(?:listening on|bridge on) 127\.0\.0\.1:(\d+)", 30).group(1))
        socket.create_connection(("127.0.0.1", port)).close()
        g.wait_line(r"client 0 connected", 30)
        g.proc.send_signal(signal.SIGUSR1)
        g.wait_line(r"gateway\.clients_accepted +1$", 30)
        assert g.proc.poll() is None            # still running
        c = RawClient(port)                   # and still serving: a second client is
        c.hello()                             # answered before the next table is asked for
        c.expect(U.OP_HELLO_ACK)
        c.close()
        g.proc.send_signal(signal.SIGUSR1)
        g.wait_line(r"gateway\.clients_accepted +2$", 30)
    finally:
        assert g.stop(signal.SIGINT) == 0, g.text()
    assert "Traceback" not in g.text()


def test_the_demo_removes_its_temp_dir_after_a_clean_run(tmp_path: Path) -> None:
    r = run(DEMO + ["--duration", "1", "--ports", "0", "--domain", str(DOMAIN), "--no-color"],
            TMPDIR=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list(tmp_path.glob("ubrb-demo-*")), r.stdout
    assert "logs kept in" not in r.stdout


def test_latency_is_one_command_that_stops_what_it_started(tmp_path: Path) -> None:
    # through `make latency` (-o: never rebuild .venv from here; VBIN: this interpreter), the DDS
    # domain from ROS_DOMAIN_ID alone, as `make demo` takes it (it was ignored: issue 22)
    r = run(["make", "-s", "-o", ".venv/.stamp", "latency", "VBIN=" + os.path.dirname(PY),
             "LATENCY_ARGS=--count 100 --rate 200"],
            TMPDIR=str(tmp_path), timeout=180, ROS_DOMAIN_ID=str(DOMAIN))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "companion (dds, domain %d)" % DOMAIN in r.stderr, r.stderr
    assert "received 100" in r.stdout and "round trip ms:" in r.stdout, r.stdout
    assert not list(tmp_path.glob("ubrb-latency-*"))
    # nothing it started is left running
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    left = [line for line in ps.splitlines()
            if "--domain %d" % DOMAIN in line and ("ros_observer.py" in line or "ros_side" in line)]
    assert not left, left


CAPTURE = """
import json, setuptools, sys
def setup(**kw):
    print(json.dumps({k: kw.get(k) for k in ("packages", "py_modules", "package_dir",
                                              "extras_require", "install_requires")}))
setuptools.setup = setup
sys.argv = ["setup.py"]
exec(open("setup.py").read())
"""


def test_pip_installs_exactly_the_projects_packages_and_each_extra_its_deps() -> None:
    import json

    r = subprocess.run([PY, "-c", CAPTURE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    kw = json.loads(r.stdout)
    assert sorted(kw["packages"]) == ["ros_side", "ros_side.backends", "ubrb_client", "ubrb_host"]
    # the core and the modules beside it that start-up and the optional features load
    assert kw["py_modules"] == ["ubrb_min", "ubrb_setup", "ubrb_policy", "ubrb_keyed", "ubrb_stream",
                                 "ubrb_hold", "ubrb_keep"]
    assert sorted(f for f in os.listdir(ROOT) if f.endswith(".py") and f != "setup.py") == sorted(
        m + ".py" for m in kw["py_modules"])
    assert kw["package_dir"] == {"ubrb_host": "ports/cpython/ubrb_host"}
    for pkg in kw["packages"]:  # every package of the tree is listed, nothing else (no `ports`)
        where = kw["package_dir"].get(pkg, pkg.replace(".", "/"))
        assert os.path.isfile(os.path.join(ROOT, where, "__init__.py")), pkg
    for d in ("ros_side", "ubrb_client", "ports/cpython/ubrb_host"):
        subs = {e for e in os.listdir(os.path.join(ROOT, d))
                if os.path.isfile(os.path.join(ROOT, d, e, "__init__.py"))}
        listed = {p.split(".", 1)[1] for p in kw["packages"] if p.startswith(d.split("/")[-1] + ".")}
        assert subs == listed, (d, subs, listed)
    names = {k: {re.split(r"[=<>]", r)[0].lower() for r in v} for k, v in kw["extras_require"].items()}
    # the extras the one-line messages name install what those messages say is missing
    assert names["dds"] == {"cyclonedds", "rosbags"}
    assert names["client"] == {"rosbags", "pyyaml"}   # numpy comes with rosbags
    assert names["serial"] == {"pyserial"}
    from ubrb_host.cli import MISSING_FIXES

    assert "'.[dds]'" in MISSING_FIXES["cyclonedds"] and "'.[client]'" in MISSING_FIXES["yaml"]
    assert "'.[serial]'" in MISSING_FIXES["serial"]


def test_pip_install_gives_a_gateway_that_runs(tmp_path: Path) -> None:
    # `pip install .` (the wheel pip builds of this tree, built offline with the test venv's
    # setuptools and wheel) into a fresh venv: `python -m ubrb_min` and the `ubrb-gateway` command
    # start the gateway from the install, away from the source tree (cwd /), and it refuses a
    # bad flag with its one line
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    wheel = [str(p) for p in tmp_path.glob("*.whl")]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps"] + wheel,
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for argv in ([py, "-m", "ubrb_min"], [str(venv / "bin" / "ubrb-gateway")]):
        v = subprocess.run(argv + ["--version"], capture_output=True, text=True, cwd="/",
                           timeout=60)
        assert v.returncode == 0 and "UBRB v1" in v.stdout, argv + [v.stdout, v.stderr]
        bad = subprocess.run(argv + ["--max-clients", "many"], capture_output=True, text=True,
                             cwd="/", timeout=60)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        assert "--max-clients" in bad.stderr
    # what it ran is the installed copy, not this tree
    where = subprocess.run([py, "-c", "import ubrb_min, ubrb_host; print(ubrb_min.__file__)"],
                           capture_output=True, text=True, cwd="/", timeout=60).stdout
    assert "site-packages" in where, where
    # the distribution is named after the project, and `pip uninstall ubrb-gateway` removes it all
    assert [os.path.basename(w) for w in wheel] == ["ubrb_gateway-0.1.0-py3-none-any.whl"]
    import zipfile

    with zipfile.ZipFile(wheel[0]) as z:  # the license it declares, and its text
        meta = z.read("ubrb_gateway-0.1.0.dist-info/METADATA").decode()
        assert "License: Apache-2.0" in meta, meta
        text = z.read("ubrb_gateway-0.1.0.dist-info/LICENSE").decode()
    assert text == open(os.path.join(ROOT, "LICENSE")).read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    r = subprocess.run([py, "-m", "pip", "uninstall", "-y", "ubrb-gateway"], capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0 and "Successfully uninstalled ubrb-gateway-0.1.0" in r.stdout, \
        r.stdout + r.stderr
    gone = subprocess.run([py, "-c", "import importlib.util as u; print([m for m in ('ubrb_min', "
                           "'ubrb_setup', 'ubrb_host', 'ros_side', 'ubrb_client') "
                           "if u.find_spec(m)])"], capture_output=True, text=True, cwd="/",
                          timeout=60)
    assert gone.stdout.strip() == "[]", gone.stdout + gone.stderr
    assert not (venv / "bin" / "ubrb-gateway").exists()


def test_gateway_unopenable_link_and_companion_unopenable_link_share_exit_1() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        port = s.getsockname()[1]
        one_line(run(COMPANION + ["--link", "udp://127.0.0.1:%d" % port, "-q"]), 1,
                 "cannot open link")
    finally:
        s.close()
    one_line(run([PY, "-S", "ubrb_min.py", "--link", "serial:/dev/ttyUSB9", "-q"]), 1,
             "ubrb_min.py: cannot open link serial:/dev/ttyUSB9", "needs pyserial")


@pytest.mark.parametrize("path", ["/etc/passwd", "/dev/null"], ids=["a-file", "not-a-tty"])
def test_a_path_that_is_no_serial_device_is_one_line_and_exit_1(path: str) -> None:
    # issue 22: a device not there yet is waited for (hot-plug, a line every few seconds:
    # test_quiet_keeps_warnings_only_and_verbose_adds_debug); a path that is there but no serial
    # device never becomes one: the gateway and the companion say so and stop
    for argv in (GATEWAY + ["--listen", "127.0.0.1:0"], COMPANION + ["--backend", "dds"]):
        one_line(run(argv + ["--link", "serial:" + path, "-q"]), 1,
                 "cannot open link serial:%s" % path, "%s is not a serial device" % path)
