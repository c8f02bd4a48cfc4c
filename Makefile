# Entry points. Interfaces kept stable: demo, test, check, lab-up, lab-down (and lint, unit, integration, molecule).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_HOSTS ?= 1
LAB_ROUTERS ?= 0
WINDOW ?= 2048
# Where lab/build-wheelhouse puts the SGLang wheels (~2.9 GiB) and everything reads them from (exported:
# lab/build-wheelhouse, lab/build-sglang-venv and the tests take it from the environment too). Root uses
# the shared system cache; any other user gets one in their home, e.g. for `make check` in CI.
ifeq ($(shell id -u),0)
WHEELHOUSE ?= /var/cache/sglang-lab/wheelhouse
else
WHEELHOUSE ?= $(HOME)/.cache/sglang-lab/wheelhouse
endif
export WHEELHOUSE
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv deps wheelhouse sglang-venv replay lab-up lab-down demo check test lint unit suite-ids lab-server \
	lab-tooling integration lab-tests molecule bench sweep-ddtree clean

help:
	@echo "make demo      set up, bring up a lab host, deploy window=$(WINDOW), show the verified running arguments"
	@echo "make check     quick feedback, no lab host, no root (<= 3 min): lint, unit tests (module docs included), suite ids"
	@echo "make test      the whole suite: check, then lab server, lab tooling and integration in one run, molecule (<= 20 min warm)"
	@echo "make lab-up    start LAB_HOSTS (default 1) lab hosts + LAB_ROUTERS router hosts (default 0), write inventory/lab/hosts.yml"
	@echo "make lab-down  stop them and remove every namespace, veth and mount they used"

# Controller toolchain (pinned in requirements.txt, constraints.txt and requirements.yml).
$(BIN)/ansible-playbook: requirements.txt constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found"; exit 1; }
	$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install python3-venv"; exit 1; }
	$(BIN)/pip install -q pip==26.3
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	touch $@

.ansible/collections/.stamp: requirements.yml $(BIN)/ansible-playbook
	$(BIN)/python tools/install-collections
	touch $@

venv: $(BIN)/ansible-playbook .ansible/collections/.stamp

# Controller packages the lab and the tests need (Debian 12).
deps:
	@missing=""; for p in systemd-container debootstrap iproute2 openssh-client rsync python3-venv; do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

wheelhouse: venv
	lab/build-wheelhouse $(WHEELHOUSE)

# The controller's copy of the lab SGLang environment and the tiny checkpoints, for tests that
# run SGLang's real parser or the lab server without a lab host.
SGLANG_VENV := $(CURDIR)/.lab/sglang-venv
sglang-venv: wheelhouse
	lab/build-sglang-venv $(SGLANG_VENV) $(WHEELHOUSE)
	$(PYTHON) lab/make_checkpoint.py target .lab/models/target >/dev/null
	$(PYTHON) lab/make_checkpoint.py draft .lab/models/draft >/dev/null

# The lab DDTree build (a LAB REPLAY of PR sgl-project/sglang#29907, lab/replay/): a small wheel that
# inventory/lab/ddtree.yml installs from this directory (seconds; deterministic, rebuilt when changed).
REPLAY_DIR := /var/cache/sglang-lab/replay
replay:
	$(PYTHON) lab/replay/build-wheel ddtree-pr29907 $(REPLAY_DIR)

lab-up: deps venv replay
	lab/labctl up --hosts $(LAB_HOSTS) --routers $(LAB_ROUTERS)

lab-down:
	lab/labctl down

demo: deps venv wheelhouse lab-up
	$(BIN)/ansible-playbook deploy.yml -e window=$(WINDOW)

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/check-headers
	$(BIN)/actionlint -color=false .github/workflows/*.yml
	$(BIN)/zizmor --offline --no-progress .github/workflows/

# The parts of `make test`, as pytest arguments: a test's directory decides where it runs (tests/README.md).
# `make suite-ids` checks that every test id of tests/suite-baseline.txt is still collected and that every
# collected test is selected by one of them.
UNIT_TESTS := tests/unit
LAB_SERVER_TESTS := tests/integration/lab_server
LAB_TOOLING_TESTS := tests/integration/labctl
INTEGRATION_TESTS := tests/integration --ignore=$(LAB_SERVER_TESTS) --ignore=$(LAB_TOOLING_TESTS)
# What `make test` runs after `check`, besides molecule: the three above in ONE pytest-xdist run (lab-tests),
# so the lab server's processes on the controller fill the time the lab hosts' runs leave the CPUs idle.
# A lab test whose prerequisite is missing fails, never skips (tests/integration/conftest.py).
LAB_TESTS := tests/integration
MOLECULE_EXCLUDE := gpu
# The unit tests are independent: pytest-xdist spreads them over the CPUs (at most 4; none on 1 CPU).
UNIT_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); if [ $$n -ge 4 ]; then echo 4; elif [ $$n -ge 2 ]; then echo $$n; else echo 0; fi)

# Unit tests (module docs included: tests/unit/library/test_module_docs.py; the lab tooling's tests that
# need no lab host: tests/unit/lab). No root needed.
unit: venv sglang-venv
	SGLANG_LAB_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/pytest -q -n $(UNIT_WORKERS) $(UNIT_TESTS)

suite-ids: venv
	$(BIN)/python tests/check_suite_ids.py --selection '$(UNIT_TESTS)' --selection '$(LAB_TESTS)' \
	  $(addprefix --molecule-exclude ,$(MOLECULE_EXCLUDE))

check: lint unit suite-ids

lab-server: venv sglang-venv
	SGLANG_LAB_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/pytest -q $(LAB_SERVER_TESTS)

# lab/labctl itself, on two lab hosts of its own (lab240, lab241); root.
lab-tooling: deps venv
	$(BIN)/pytest -q $(LAB_TOOLING_TESTS)

# The lab tests on IT_WORKERS pytest-xdist workers, one test file at a time per worker, longest first
# (tests/conftest.py). The files that share a deployed host (fixture lab_host) get one per worker
# (lab100 + N, tests/integration/conftest.py); the others bring up hosts of their own. SGLANG_LAB_LAYER=1:
# hosts boot with SGLang already installed (labctl up --sglang-layer; built once, cached) - all but
# tests/integration/gpu_roles/test_sample_inventory.py, which installs it through the role. lab99 is the plain
# systemd host of the tests that only need one (SGLANG_LAB_INVENTORY).
# 3 workers on 2 cores: a lab test spends most of its time waiting for a lab server to load, crash or stay
# stable (measured: 3 workers 1083 s, 4 workers 1047 s, so 3, for less load). --durations: the 20 slowest.
# stdin from /dev/null: ansible-playbook refuses a non-blocking stdin, and make -j shares make's.
IT_INVENTORY := inventory/lab/it.yml
IT_WORKERS ?= 3
define lab_run
lab/labctl up --no-sglang-layer --hosts 1 --first-index 99 --inventory $(IT_INVENTORY)
rc=0; SGLANG_LAB_LAYER=1 SGLANG_LAB_INVENTORY=$(CURDIR)/$(IT_INVENTORY) SGLANG_LAB_PYTHON=$(SGLANG_VENV)/bin/python \
  $(BIN)/pytest -q -n $(IT_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(1) < /dev/null || rc=$$?; \
  lab/labctl down --inventory $(IT_INVENTORY); exit $$rc
endef
integration: deps venv wheelhouse replay
	$(call lab_run,$(INTEGRATION_TESTS))

lab-tests: deps venv wheelhouse replay sglang-venv
	$(call lab_run,$(LAB_TESTS))

# Every scenario but the excluded ones, each `molecule test -s` in its own process at the same time (each
# has its own lab host, booted with the SGLang layer; molecule's --workers needs a collection layout).
# Logs in .lab/molecule/<scenario>.log, printed when all are done; fails if any scenario failed.
MOLECULE_SCENARIOS = $(filter-out $(MOLECULE_EXCLUDE),$(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))
molecule: deps venv wheelhouse
	mkdir -p .lab/molecule
	pids=""; for s in $(MOLECULE_SCENARIOS); do \
	  $(BIN)/molecule test -s $$s < /dev/null > .lab/molecule/$$s.log 2>&1 & pids="$$pids $$!:$$s"; done; \
	rc=0; failed=""; for p in $$pids; do wait $${p%%:*} || { rc=1; failed="$$failed $${p#*:}"; }; done; \
	for s in $(MOLECULE_SCENARIOS); do cat .lab/molecule/$$s.log; done; \
	if [ $$rc -ne 0 ]; then echo "molecule scenarios FAILED:$$failed (logs in .lab/molecule/)"; fi; exit $$rc

# After check, the lab tests and the molecule scenarios run AT THE SAME TIME (their lab hosts are distinct:
# lab99/lab100+N/... and lab11/lab12): both mostly wait for lab servers to load and stay stable, so two
# cores serve both. Molecule's output goes to its logs and is printed when it ends.
test: check
	$(MAKE) --no-print-directory -j2 lab-tests molecule

bench: deps venv wheelhouse
	$(BIN)/python bench/deploy_timings.py

# The committed LAB RUN report docs/sweep/ddtree/ from the current code (docs/sweep.md): a lab host of its own
# (lab$(SWEEP_DDTREE_INDEX)) with SGLang 0.5.23 deployed (the benchmark client), the seed's sweep (playbooks/sweep.yml's
# example: DDTree budget x top-k at window 2048) on the lab DDTree build from a fresh state directory, the report
# written into docs/sweep/ddtree/; the host is stopped whatever happened.
SWEEP_DDTREE_INDEX ?= 60
SWEEP_DDTREE_INVENTORY := inventory/lab/sweep-ddtree.yml
SWEEP_DDTREE_STATE := $(CURDIR)/.sweep/ddtree-docs
sweep-ddtree: deps venv wheelhouse replay
	lab/labctl up --sglang-layer --hosts 1 --first-index $(SWEEP_DDTREE_INDEX) --inventory $(SWEEP_DDTREE_INVENTORY)
	rc=0; { rm -rf $(SWEEP_DDTREE_STATE) \
	  && $(BIN)/ansible-playbook -i $(SWEEP_DDTREE_INVENTORY) deploy.yml -e window=2048 \
	  && $(BIN)/ansible-playbook -i $(SWEEP_DDTREE_INVENTORY) playbooks/sweep.yml -e @inventory/lab/ddtree.yml \
	    -e sweep_name=ddtree -e sweep_state_dir=$(SWEEP_DDTREE_STATE) -e sweep_report_dir=$(CURDIR)/docs/sweep/ddtree \
	    -e sweep_bench_python=/opt/sglang/venv/bin/python; } < /dev/null || rc=$$?; \
	lab/labctl down --inventory $(SWEEP_DDTREE_INVENTORY); exit $$rc

clean: lab-down
	rm -rf $(VENV) .ansible .lab
