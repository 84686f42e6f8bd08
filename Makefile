# The two commands a newcomer needs: `sudo make demo` and `sudo make test`.
# Both install what they need first (Debian packages and a venv with pinned deps).
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
APT_PKGS := mininet iperf3 libiperf0 iputils-ping ethtool iproute2 net-tools procps openssh-server openssh-client sudo
STAMP   := $(VENV)/.installed

.PHONY: install sysdeps venv test test-cluster test-long test-unit floors torch-suite demo lint layers docs clean-venv

install: sysdeps $(STAMP)

sysdeps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# pip installs without byte-compiling every file it unpacks (--no-compile: about 40 s of a
# fresh install on 2 cores, most of it torch's and transformers' modules no process here
# imports); the warm import after it compiles what the toolkit, its workers and its tests
# do import, once, instead of in each of the suite's processes at their first import.
WARM_IMPORTS := torch torch.distributed torch.distributed.pipelining torch.testing._internal.common_utils \
  numpy matplotlib.pyplot pydantic click yaml scapy.all pyroute2 iperf3 transformers \
  transformers.models.llama.modeling_llama jsonschema mkdocs.commands.build material \
  mkdocstrings_handlers.python hypothesis importlinter pytest xdist pytest_timeout numba testbed.cli

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --no-compile --upgrade pip
	# torch first, alone: the CPU wheel on disk satisfies the pin, nothing pulls a CUDA build.
	$(PIP) install -q --no-compile "torch==2.13.0"
	$(PIP) install -q --no-compile -e ".[dev]"
	PYTHONDONTWRITEBYTECODE= $(PY) -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $(WARM_IMPORTS)
	touch $(STAMP)

# The layer contracts (pyproject.toml [tool.importlinter]) first: a structure that no
# longer holds fails before the slower tests run. Then the suite in three parts, each run
# even when one before it failed (the exit status is the first failure's):
# 1. the tests that build no topology (everything outside tests/root and tests/cluster),
#    three workers on the two cores (pytest-xdist, one test file per worker): a third
#    fills the time the others spend waiting on child processes and sockets;
# 2. the root and cluster tests three at a time (they mostly wait: on the emulated WAN, on
#    processes starting), one test file per worker; the cluster tests and the root tests
#    that crash runs and clean up after them are one group (tests/conftest.py);
# 3. the tests marked `alone` one at a time, nothing beside them: their checks are
#    measurements (RTT, loss, order) that a concurrent run would skew.
PYTEST_UNIT  := $(VENV)/bin/pytest -q -n 3 --dist loadgroup --ignore=tests/root --ignore=tests/cluster tests
PYTEST_ROOT  := $(VENV)/bin/pytest -q -n 3 --dist loadgroup -m "not alone" tests/cluster tests/root
PYTEST_ALONE := $(VENV)/bin/pytest -q -m alone tests/cluster tests/root

# Compiled modules kept (__pycache__, ignored by git) even where the environment sets
# PYTHONDONTWRITEBYTECODE (an empty value counts as unset): the Python processes the suite
# starts (ranks, CLI runs, probes) then compile this checkout once, not each (about 3% of
# the CPU of the tests that start them, measured on tests/unit/launch and tests/unit/front).
test: export PYTHONDONTWRITEBYTECODE =
test: install
	$(VENV)/bin/lint-imports --no-cache
	@rc=0; \
	for part in '$(PYTEST_UNIT) --durations=15' '$(PYTEST_ROOT) --durations=20' '$(PYTEST_ALONE) --durations=10'; do \
	  echo "$$part"; eval "$$part" || { r=$$?; [ $$rc -ne 0 ] || rc=$$r; }; \
	done; exit $$rc

# The multi-server tests alone (as root: server namespaces with their own sshd; `make test`
# runs them too, except the `long` runs, which this target includes).
test-cluster: install
	TESTBED_LONG_TESTS=1 $(VENV)/bin/pytest -q -m cluster tests/cluster

# The end-to-end runs of a minute or more each (pytest marker `long`): the 3-DC run, the
# prefill controller comparison, real prefill in real training.
test-long: install
	TESTBED_LONG_TESTS=1 $(VENV)/bin/pytest -q -m long

test-unit: install
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not root and not cluster"

# Benchmark floors (pytest marker `floor`: throughputs, speedups and build times asserted
# against the issues' targets with a margin, their figures printed): run as root on a
# quiet machine; `make test` checks the same runs for correctness and skips these.
floors: install
	TESTBED_FLOOR_TESTS=1 $(VENV)/bin/pytest -q -s -m floor tests

# PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
# the collectives, point-to-point and DDP tests) with BACKEND=gloo and BACKEND=atlas, 2 and 3
# ranks on CPU, as PyTorch runs it for gloo; per-test outcomes and the tests that pass with
# gloo but not with atlas, with the reason, in results/torch-dist-suite
# (docs/results/torch-suite.md). Not part of `make test`: 10-15 minutes on 2 shared cores.
torch-suite: install
	$(PY) scripts/torch_dist_suite.py --out results/torch-dist-suite

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

layers: install
	$(VENV)/bin/lint-imports --no-cache

demo: install
	$(VENV)/bin/testbed demo

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors; offline.
# `make test` runs the same strict build (tests/unit/docs/test_site.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean-venv:
	rm -rf $(VENV)
