"""The link key on the command line: `make link-key`, reading a key file (ubrb_host.cli), and the
rule that an unkeyed UDP link stays on loopback unless --insecure-link (docs/LINK.md, 3a)."""

from __future__ import annotations

import argparse
import logging
import os
import stat
import subprocess
from typing import Any

import pytest

import ubrb_setup
from ubrb_host import cli
from tests.support.procs import ROOT


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
    for bad, why in (("abcdef", "at least 32"), ("xy" * 16, "hex digits only")):
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
