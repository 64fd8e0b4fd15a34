"""The systemd units in tools/systemd/ (the gateway on a Pi, the companion on the ROS 2 PC, the
companion's rclpy drop-in): `systemd-analyze verify` accepts them, and the command line each
starts is one its program accepts.

The units name their install paths (/opt/ubrb-gateway, /etc/default/..., /etc/ubrb/link.key);
the test points them at this checkout and at temp files, as an install would have them.
Skipped when systemd-analyze is not installed (it comes with Debian's systemd package)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.procs import ROOT, child_env

UNITS = os.path.join(ROOT, "tools", "systemd")
INSTALL = "/opt/ubrb-gateway"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian: apt-get install systemd): "
                            "the units are not verified")


def _env_file(path: str) -> Dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (comments, optional quotes)."""
    env = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = " ".join(shlex.split(value))
    return env


def _installed(unit: str, tmp: Path, dropin: str = "") -> Path:
    """`unit` (and its drop-in) as installed from this checkout: paths into ROOT and `tmp`."""
    key = tmp / "link.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    name = unit.replace(".service", "")
    shutil.copy(os.path.join(UNITS, name + ".env"), tmp / (name + ".env"))

    def place(text: str) -> str:
        return (text.replace(INSTALL, ROOT).replace("/etc/ubrb/link.key", str(key))
                .replace("/etc/default/" + name, str(tmp / (name + ".env"))))

    out = tmp / unit
    out.write_text(place(open(os.path.join(UNITS, unit)).read()))
    if dropin:
        d = tmp / (unit + ".d")
        d.mkdir()
        (d / "override.conf").write_text(place(open(os.path.join(UNITS, dropin)).read()))
    return out


def _verify(path: Path) -> None:
    assert ANALYZE is not None
    r = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                       text=True, timeout=120)
    # any line is a finding (an unknown key is only a warning with exit 0)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), \
        (r.returncode, r.stdout, r.stderr)


def _exec_start(path: Path, tmp: Path) -> List[str]:
    """The service's last ExecStart= as systemd runs it: %d the credentials directory (here
    `tmp`, holding link.key), $VAR a word of its own replaced by the value split at spaces."""
    text = path.read_text()
    d = path.parent / (path.name + ".d")
    if d.is_dir():
        text += "".join(f.read_text() for f in sorted(d.iterdir()))
    line = [x for x in text.splitlines() if x.startswith("ExecStart=") and x != "ExecStart="][-1]
    env = {}
    for f in re.findall(r"^EnvironmentFile=-?(\S+)$", text, re.M):
        env.update(_env_file(f))
    argv: List[str] = []
    for word in shlex.split(line[len("ExecStart="):].replace("%d", str(tmp))):
        argv += env[word[1:]].split() if word.startswith("$") and word[1:] in env else [word]
    return argv


@needs_analyze
def test_gateway_unit_verifies_and_its_command_parses(tmp_path: Path) -> None:
    unit = _installed("ubrb-gateway.service", tmp_path)
    _verify(unit)
    argv = _exec_start(unit, tmp_path)
    assert argv[:2] == ["/usr/bin/python3", os.path.join(ROOT, "ubrb_min.py")]
    assert argv[2:4] == ["--link-key", str(tmp_path / "link.key")]
    # every flag read (types, link grammar, addresses) up to --version, which then exits 0
    r = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=60,
                       cwd="/", env=child_env())
    assert r.returncode == 0 and "UBRB v1" in r.stdout, (argv, r.stdout, r.stderr)


@needs_analyze
@pytest.mark.parametrize("dropin", ["", "ubrb-companion-rclpy.conf"], ids=["dds", "rclpy"])
def test_companion_unit_verifies_and_its_command_parses(tmp_path: Path, dropin: str) -> None:
    if not dropin and not os.path.exists(os.path.join(ROOT, ".venv", "bin", "python")):
        pytest.skip("no .venv here (make venv): the unit's interpreter")
    unit = _installed("ubrb-companion.service", tmp_path, dropin)
    _verify(unit)
    argv = _exec_start(unit, tmp_path)
    workdir = re.search(r"^WorkingDirectory=(\S+)$", unit.read_text(), re.M)
    assert workdir and workdir.group(1) == ROOT
    if dropin:  # bash sources ROS, then runs the companion: the command line is bash's
        assert argv[:2] == ["/bin/bash", "-c"] and "--backend rclpy" in argv[2]
        assert "--link-key %s/link.key" % tmp_path in argv[2]
        return
    assert argv[:3] == [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "ros_side"]
    r = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=child_env())
    assert r.returncode == 0 and "UBRB v1" in r.stdout, (argv, r.stdout, r.stderr)


def test_units_restart_on_run_time_failures_only() -> None:
    # exit 1 (a failure at run time) is retried, exit 2 (a usage mistake) is not: the contract
    from ubrb_host import cli as host_cli

    for unit in ("ubrb-gateway.service", "ubrb-companion.service"):
        text = open(os.path.join(UNITS, unit)).read()
        assert "Restart=on-failure" in text
        assert "RestartPreventExitStatus=%d" % host_cli.EXIT_USAGE in text
