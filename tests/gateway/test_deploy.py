"""`make deploy` / `make deploy-check` (tools/deploy.py): the precompiled board layout, the
board-side preparation step (run here under the real MicroPython unix port), the mpremote
command, and `make deploy-check` itself: the .mpy-files layout (stock firmware) at CHECK_HEAP, the
ROMFS layout at exactly 128 KiB (tools/romfs_board.py, which every other unix-port test uses)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mp_unix import micropython_exe
from tests.support.procs import ROOT

sys.path.insert(0, ROOT)
from tools import deploy  # noqa: E402


def test_the_layout_holds_only_precompiled_modules(tmp_path: Path) -> None:
    files = deploy.build(str(tmp_path), deploy.gateway_options("uart:1", ["--baud", "921600"]))
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert on_disk == sorted(files)
    sources = [f for f in on_disk if f.endswith(".py")]
    assert sources == ["config.py", "main.py"]  # no module as source: it would be compiled on the board
    assert "ubrb_min.mpy" in on_disk and "ports/micropython/run.mpy" in on_disk
    config = (tmp_path / "config.py").read_text()
    assert "'link': 'uart:1'," in config and "'baud': 921600," in config
    assert "run.main(sys.argv[1:])" in (tmp_path / "main.py").read_text()


def test_board_preparation_makes_folders_and_removes_stale_sources(tmp_path: Path) -> None:
    # What `make deploy` runs on the board before copying, run twice (idempotent) under the real
    # interpreter in a folder standing in for the board's filesystem.
    (tmp_path / "ports" / "micropython").mkdir(parents=True)
    for stale in ("ubrb_min.py", "ports/micropython/gateway.py", "ports/__init__.py",
                  "ports/micropython/__init__.mpy"):
        (tmp_path / stale).write_text("# an old copy\n")
    (tmp_path / "boot.py").write_text("# the user's\n")
    script = tmp_path / "prepare.py"
    script.write_text(deploy.prepare_script())
    for _ in range(2):
        r = subprocess.run([micropython_exe(), "prepare.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["boot.py", "ports", "ports/micropython", "prepare.py"]


def test_deploy_to_a_board_is_one_mpremote_session(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "tools/deploy.py", "board", "--port", "/dev/ttyUSB0",
                        "--link", "udp://192.0.2.10:8269", "--out", str(tmp_path), "--dry-run",
                        "--link-key", "link.key"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    cmd = r.stdout.strip().splitlines()[-1]
    assert cmd.startswith(os.path.join(os.path.dirname(sys.executable), "mpremote")
                          + " connect /dev/ttyUSB0 exec ")
    for _, mod in deploy.MODULES:
        assert " + fs cp %s/%s.mpy :%s.mpy" % (tmp_path, mod, mod) in cmd, mod
    assert " + fs cp %s/main.py :main.py" % tmp_path in cmd
    assert " + fs cp %s/config.py :config.py" % tmp_path in cmd
    assert "'link': 'udp://192.0.2.10:8269'" in (tmp_path / "config.py").read_text()


# issue 22 item 9: LINK and DEPLOY_ARGS are checked as the board checks them (the core's grammar,
# ports/micropython/gateway.check_options), before anything is built: one line, exit 2
@pytest.mark.parametrize("args, says", [
    (["--link", "tcp://x"],
     "tools/deploy.py: unknown link 'tcp://x': use udp://HOST:PORT or uart:ID"),
    (["--link", "udp://192.0.2.10:"], "'udp://192.0.2.10:' has an empty port"),
    (["--link", "serial:/dev/ttyUSB0"], "needs a UART number, e.g. uart:1"),
    (["--link", "serial:"], "serial: needs a UART number, e.g. uart:1"),
    (["--link", "udp://192.0.2.10:8269"], "is not a loopback address: give --link-key FILE"),
    (["--link", "uart:1", "--bogus", "1"], "gateway flags: unknown flag --bogus"),
    (["--link", "uart:1", "--baud", "fast"], "--baud expects an integer, got 'fast'"),
    (["--link", "uart:1", "--link-mtu", "10"], "--link-mtu must be 64-65507 bytes"),
    (["--link", "uart:1", "--profile", "huge"], "unknown profile 'huge'"),
    (["--link", "uart:1", "--queue-bytes", "100"], "queue_bytes (100) must hold"),
    (["--link", "uart:1", "--listen", "nonsense"], "expected HOST:PORT, got 'nonsense'"),
    (["--link", "uart:1", "--throttle", "/x=0"], "--throttle expects GLOB=HZ"),
    (["--link", "uart:1", "stray"], "unexpected argument 'stray'"),
])
def test_deploy_checks_link_and_flags_before_building(tmp_path: Path, args, says) -> None:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "tools/deploy.py", "board", "--port", "/dev/ttyUSB0",
                        "--dry-run", "--out", str(out)] + args,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stdout + r.stderr
    assert not out.exists()  # nothing built, no config.py with the bad value in it


def test_make_deploy_with_a_bad_link_writes_no_config(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = subprocess.run(["make", "-s", "deploy", "PORT=/dev/ttyUSB0", "LINK=tcp://x",
                        "DEPLOY_ARGS=--dry-run --out %s" % out],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("tools/deploy.py: unknown link 'tcp://x'"), r.stderr  # then make's own
    assert "Traceback" not in r.stderr and not out.exists()


def test_make_deploy_without_a_port_says_so() -> None:
    r = subprocess.run(["make", "-s", "deploy"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "PORT=/dev/ttyUSB0" in r.stdout + r.stderr


def test_make_deploy_check_passes() -> None:
    micropython_exe()  # skipped outside CI / failed in CI when the unix port is missing
    r = subprocess.run(["make", "-s", "deploy-check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "answered HELLO and PING" in out and "memory: budget 44.9 KiB + code" in out
    print([line for line in out.splitlines() if "memory:" in line or "(.mpy)" in line])


def test_romfs_layout_is_one_image_and_the_config(tmp_path: Path) -> None:
    files = deploy.build_romfs(str(tmp_path), deploy.gateway_options("uart:1", []))
    assert sorted(files) == ["config.py", "main.py"]  # the modules are in the image only
    image = (tmp_path / deploy.ROMFS_IMAGE).read_bytes()
    assert image.startswith(b"\xd2\xcd\x31")  # the ROMFS header mpremote writes
    for _, mod in deploy.MODULES:
        assert not (tmp_path / (mod + ".mpy")).exists(), mod
        assert (mod.rsplit("/", 1)[-1] + ".mpy").encode() in image, mod


def test_romfs_board_preparation_also_removes_the_module_files(tmp_path: Path) -> None:
    # The filesystem comes before /rom on sys.path: a left .mpy would be imported instead.
    (tmp_path / "ports" / "micropython").mkdir(parents=True)
    for stale in ("ubrb_min.mpy", "ports/micropython/run.mpy", "ports/micropython/loop.py"):
        (tmp_path / stale).write_text("# an old copy\n")
    (tmp_path / "prepare.py").write_text(deploy.prepare_script(romfs=True))
    r = subprocess.run([micropython_exe(), "prepare.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["prepare.py"]


def test_romfs_deploy_writes_the_image_then_the_files(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "tools/deploy.py", "board", "--port", "/dev/ttyUSB0",
                        "--romfs", "--out", str(tmp_path), "--dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    cmd = r.stdout.strip().splitlines()[-1]
    assert (" connect /dev/ttyUSB0 romfs --no-mpy deploy %s/romfs.img + exec " % tmp_path) in cmd
    assert ".mpy :" not in cmd  # no module copied to the filesystem
    assert cmd.endswith(" + fs cp %s/main.py :main.py + fs cp %s/config.py :config.py"
                        % (tmp_path, tmp_path))


def test_make_deploy_check_romfs_passes() -> None:
    # The image mapped outside the heap as a board's flash, mounted at /rom, code run in place;
    # the heap is 128 KiB exactly (ROMFS_CHECK_HEAP); >= 32 KiB free after start-up.
    micropython_exe()
    r = subprocess.run(["make", "-s", "deploy-check", "ROMFS=1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert deploy.ROMFS_CHECK_HEAP == "128k"
    m = re.search(r"started under a 128k heap \(the ROMFS image outside it, as in flash\) with "
                  r"(\d+) bytes free and answered HELLO and PING", out)
    assert m and int(m.group(1)) >= 32 * 1024, out


@pytest.mark.parametrize("image, says", [
    (None, "no ROMFS image"),
    (b"#!/bin/sh\n", "is not a ROMFS image"),
])
def test_romfs_board_without_an_image_says_so_in_one_line(tmp_path: Path, image, says) -> None:
    micropython_exe()
    if image is not None:
        (tmp_path / deploy.ROMFS_IMAGE).write_bytes(image)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "romfs_board.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and says in r.stderr and "tools/deploy.py build --romfs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr


def test_romfs_board_without_the_unix_port_says_make_venv(tmp_path: Path) -> None:
    # -S: no site-packages, so no micropython_run, as in an interpreter without the dev packages
    r = subprocess.run([sys.executable, "-S", os.path.join(ROOT, "tools", "romfs_board.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "`make venv`" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
