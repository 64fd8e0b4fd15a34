"""Addresses, through the programs as a user starts them (issue 22, items 1, 12 and 18).

A PORT alone (or :PORT) is 127.0.0.1:PORT for every HOST:PORT option of every program, listen
addresses included, and udp://PORT is udp://127.0.0.1:PORT: a number is never a host
(`--server 8268` once connected to 0.0.32.76, off this machine). The proof that nothing leaves
127.0.0.0/8 is the loopback guard (tests/support/netguard.py: every connect, sendto and bind of
each process recorded, any other address refused), which needs nothing but CPython and so always
runs; a network namespace with only `lo` checks the client at the kernel's level where
`unshare -rn` is allowed."""

from __future__ import annotations

import os
import socket
from typing import Iterator, Optional

import pytest

from tests.cli.helpers import CLIENT, COMPANION, DOMAIN, GATEWAY, run
from tests.support.loopback_ports import free_port
from tests.support.netguard import (guard_records, guarded_env, in_lo_namespace,
                                    lo_namespace_unavailable)
from tests.support.procs import ROOT, Proc, child_env

STRING = "std_msgs/msg/String"
HINT = ("(8269 is the default port of the link between a gateway and its companion; the gateway "
        "serves clients on 8268)")


def test_bare_ports_keep_the_whole_chain_on_this_machine(tmp_path) -> None:
    # companion --link udp://PORT, gateway --listen 0 --link udp://PORT, client --server PORT:
    # every process under the guard, data published into ROS through all three
    log = str(tmp_path / "addresses.log")
    env = guarded_env(log, child_env(DOMAIN))
    lport = free_port(socket.SOCK_DGRAM)
    comp = Proc(COMPANION + ["--link", "udp://%d" % lport, "--backend", "dds", "--domain",
                             str(DOMAIN), "--no-diagnostics"], env=env)
    gw = Proc(GATEWAY + ["--listen", "0", "--link", "udp://%d" % lport, "--profile", "mcu"],
              env=env)
    try:
        gport = int(gw.wait_line(r"listening on 127\.0\.0\.1:(\d+), link udp://%d$" % lport,
                                 30).group(1))
        gw.wait_line(r"ROS side up", 30)
        r = run(CLIENT + ["pub", "/ubrb_bare_ports", STRING, "{data: hi}", "--server",
                          str(gport)], env=env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.startswith("publishing #1: std_msgs/msg/String {'data': 'hi'}")
    finally:
        gw.stop()
        comp.stop()
    records = guard_records(log)
    assert records and all(rec.ok for rec in records), records
    seen = {(rec.kind, rec.host, rec.port) for rec in records}
    assert ("bind", "127.0.0.1", lport) in seen, records       # the companion's end of the link
    assert ("sendto", "127.0.0.1", lport) in seen, records     # the gateway's end
    assert ("bind", "127.0.0.1", 0) in seen, records           # the gateway's --listen 0
    assert ("connect", "127.0.0.1", gport) in seen, records    # the client


def test_the_client_with_a_bare_port_stays_in_a_namespace_with_only_lo() -> None:
    # Off loopback the namespace has no route: 0.0.32.76 is "network unreachable"; 127.0.0.1:8268,
    # where nothing listens in there, "connection refused".
    why = lo_namespace_unavailable()
    if why:
        pytest.skip(why)
    r = run(in_lo_namespace(CLIENT + ["pub", "/x", STRING, "{data: hi}", "--server", "8268",
                                      "--wait", "1", "--reconnect-interval", "0.25"]))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1] == (
        "pub: could not connect to 127.0.0.1:8268 within 1 s: connection refused: nothing "
        "listens there"), r.stderr


@pytest.mark.parametrize("argv, says", [
    (GATEWAY + ["--listen", ":0", "--link", "none"], r"listening on 127\.0\.0\.1:\d+, link none"),
    (COMPANION + ["--listen", "0", "--backend", "dds", "--domain", str(DOMAIN),
                  "--no-diagnostics"], r"direct mode: UBRB bridge on 127\.0\.0\.1:\d+"),
], ids=["gateway", "companion direct mode"])
def test_a_bare_listen_port_listens_on_this_machine_only(tmp_path, argv, says) -> None:
    log = str(tmp_path / "listen.log")
    p = Proc(argv, env=guarded_env(log, child_env(DOMAIN)))
    try:
        p.wait_line(says, 30)
    finally:
        p.stop()
    binds = [rec for rec in guard_records(log) if rec.kind == "bind" and rec.port == 0]
    assert [(rec.host, rec.ok) for rec in binds] == [("127.0.0.1", True)], binds


def test_a_bare_listen_port_on_micropython_is_this_machine_too() -> None:
    from tests.support.mp_unix import micropython_exe

    port = free_port()
    g = Proc([micropython_exe(), os.path.join(ROOT, "ubrb_min.py"), "--listen", str(port),
              "--link", "none"], cwd="/")
    try:
        g.wait_line(r"listening on 127\.0\.0\.1:%d, link none" % port, 20)
    finally:
        g.stop()


# -- item 18: the link's port is not the gateway's ----------------------------------------------
@pytest.fixture
def link_port_refused() -> Iterator[Optional[socket.socket]]:
    """TCP 127.0.0.1:8269 held by a socket that does not listen (a connection there is refused,
    and nobody else can listen there meanwhile); None when it is taken: then the test runs in a
    namespace of its own."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 8269))
    except OSError:
        s.close()
        why = lo_namespace_unavailable()
        if why:
            pytest.skip("TCP port 8269 is in use here, and " + why)
        yield None
        return
    yield s
    s.close()


def test_a_client_pointed_at_the_link_port_is_told_the_gateway_port(
        link_port_refused: Optional[socket.socket]) -> None:
    argv = CLIENT + ["pub", "/x", STRING, "{data: hi}", "--server", "8269", "--wait", "1",
                     "--reconnect-interval", "0.25"]
    r = run(argv if link_port_refused is not None else in_lo_namespace(argv))
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == ("pub: could not connect to 127.0.0.1:8269 within 1 s: connection "
                         "refused: nothing listens there " + HINT), lines
    assert "Traceback" not in r.stderr, lines


def test_a_refused_client_port_other_than_the_links_gets_no_hint() -> None:
    port = free_port()
    r = run(CLIENT + ["pub", "/x", STRING, "--server", str(port), "--wait", "0.5",
                      "--reconnect-interval", "0.25"])
    assert r.returncode == 1 and "8269" not in r.stderr, r.stderr


# -- item 12: a link URL's port ------------------------------------------------------------------
@pytest.mark.parametrize("program", [GATEWAY, COMPANION], ids=["gateway", "companion"])
def test_help_says_the_link_port_default(program) -> None:
    r = run(program + ["--help"])
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # argparse wraps at the terminal's width
    assert "udp://HOST alone is port 8269, udp://PORT is udp://127.0.0.1:PORT" in text
    assert "a PORT alone (or :PORT) is 127.0.0.1:PORT, this machine only" in text
