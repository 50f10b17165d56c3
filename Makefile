# One path: setup -> fetch -> tree -> install -> checks. Every step is
# idempotent; see README.md. Tools: tools/ws.py (workspace), tools/checks.sh.
PYTHON ?= python3
WS := $(PYTHON) tools/ws.py

.PHONY: all setup fetch tree install export check-series lint check-each \
	upstream-tests project-tests test demo

all: install

setup:
	$(WS) setup

fetch: setup
	$(WS) fetch

tree: fetch
	$(WS) tree

install: tree
	$(WS) install

export:
	$(WS) export

check-series: tree
	$(WS) check-series

lint: install
	bash tools/checks.sh lint

check-each: install
	bash tools/checks.sh check-each

upstream-tests: install
	bash tools/checks.sh upstream-tests

project-tests: install
	bash tools/checks.sh project-tests

# The README's main job: `make demo`, or `make demo ARGS=--json`.
demo: install
	. tools/testenv.sh && .venv/bin/python bench/demo.py $(ARGS)

# The README's test command (and CI's, through .ci/run).
test: install
	bash tools/checks.sh all
