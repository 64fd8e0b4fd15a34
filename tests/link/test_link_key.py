"""The link key on the command line: `make link-key`, reading a key file (ubrb_host.cli), and the
rule that an unkeyed UDP link stays on loopback unless --insecure-link (docs/LINK.md, 3a)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import stat
import subprocess
import sys
from typing import Any

import pytest

import ubrb_setup
from ubrb_host import cli
from tests.cli.helpers import COMPANION, GATEWAY, one_line, run
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc


def test_make_link_key_writes_64_hex_digits_mode_0600_and_never_overwrites(tmp_path: Any) -> None:
    path = tmp_path / "k.key"
    r = subprocess.run(["make", "-s", "link-key", "LINK_KEY=%s" % path], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert len(text.strip()) == 64 and len(ubrb_setup.parse_link_key(text)) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    r = subprocess.run(["make", "-s", "link-key", "LINK_KEY=%s" % path], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not overwritten" in r.stderr
    assert path.read_text() == text


def args(link: str, key: Any = None, insecure: bool = False) -> argparse.Namespace:
    return argparse.Namespace(link=link, link_key=key, insecure_link=insecure)


def test_key_file_read_and_checked(tmp_path: Any, caplog: Any) -> None:
    k = tmp_path / "k"
    k.write_text("  00112233 44556677\n8899aabb ccddeeff \n")
    os.chmod(k, 0o600)
    with caplog.at_level(logging.WARNING):
        assert cli.link_key(args("udp://0.0.0.0:1", str(k))) == bytes.fromhex(
            "00112233445566778899aabbccddeeff")
    assert caplog.records == []
    os.chmod(k, 0o640)
    with caplog.at_level(logging.WARNING):
        cli.link_key(args("udp://0.0.0.0:1", str(k)))
    assert "chmod 600" in caplog.text
    for bad, why in (("abcdef", "too short: 6 hex digits"), ("xy" * 16, "not hex")):
        k.write_text(bad)
        with pytest.raises(cli.Fatal, match=why):
            cli.link_key(args("udp://0.0.0.0:1", str(k)))
    with pytest.raises(cli.Fatal, match="cannot read link key"):
        cli.link_key(args("udp://0.0.0.0:1", str(tmp_path / "missing")))


def test_unkeyed_udp_stays_on_loopback(caplog: Any) -> None:
    for link in ("udp://127.0.0.1:8269", "udp://localhost", "udp://[::1]:5", "serial:/dev/ttyS0",
                 "serial:socket://127.0.0.1:7000", "serial:loop://", "uart:1", "none"):
        assert cli.link_key(args(link)) is None, link
    for link in ("udp://0.0.0.0:8269", "udp://192.0.2.10", "udp://[::]:8269",
                 "serial:socket://192.0.2.1:7000", "serial:rfc2217://[2001:db8::1]:2217"):
        with pytest.raises(cli.Fatal, match="--insecure-link"):
            cli.link_key(args(link))
        with caplog.at_level(logging.WARNING):
            assert cli.link_key(args(link, insecure=True)) is None
        assert "has no key (--insecure-link)" in caplog.text


def _key(tmp_path: Any, name: str, data: bytes, mode: int = 0o600) -> str:
    path = os.path.join(str(tmp_path), name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("data, says", [
    (b"correct horse battery staple, my link passphrase\n", "not hex: the file holds text other"),
    (bytes(range(100, 132)), "the file holds binary data, not hex text (raw key bytes?"),
    (b"", "the file is empty"),
    (b"00112233445566778899aabbccddee\n", "too short: 30 hex digits (15 bytes)"),
], ids=["passphrase", "32-raw-bytes", "empty", "short"])
@pytest.mark.parametrize("program", ["gateway", "companion"])
def test_a_key_file_that_is_no_key_says_what_it_holds(tmp_path: Any, data: bytes, says: str,
                                                      program: str) -> None:
    path = _key(tmp_path, "link.key", data)
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    argv = (GATEWAY + ["--listen", "127.0.0.1:0"]) if program == "gateway" else COMPANION
    err = one_line(run(argv + ["--link", link, "--link-key", path]), 2, "link key %s: " % path,
                   says, "make link-key writes one")
    assert "digits (found" not in err


def test_the_companion_warns_about_a_readable_key_under_its_own_name(tmp_path: Any) -> None:
    path = _key(tmp_path, "loose.key", os.urandom(32).hex().encode() + b"\n", 0o644)
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    p = Proc(COMPANION + ["--backend", "dds", "--link", link, "--link-key", path])
    try:
        p.wait_line(r"companion on link", 60)
    finally:
        p.stop()
    line = [x for x in p.text().splitlines() if "can be read by group or others" in x]
    assert len(line) == 1 and " WARNING ros_side: link key %s " % path in line[0], p.text()
    assert "ubrb.gateway" not in p.text(), p.text()


def test_the_key_file_tests_leave_nothing_in_the_temp_dir(tmp_path: Any) -> None:
    # they wrote a fixed, world-readable /tmp/ubrb_test_link.key and left it (issue 22)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/core/test_mp_port.py", "-k", "key or launcher"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(tmp)) == [], r.stdout
