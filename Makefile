# Entry points. Interfaces kept stable: demo, test, lab-up, lab-down.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_HOSTS ?= 1
WINDOW ?= 2048
WHEELHOUSE ?= /var/cache/sglang-lab/wheelhouse
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv deps wheelhouse sglang-venv lab-up lab-down demo test lint unit lab-server integration molecule bench clean

help:
	@echo "make demo      set up, bring up a lab host, deploy window=$(WINDOW), show the verified running arguments"
	@echo "make test      the whole suite (lint, unit, lab server, lab integration, molecule)"
	@echo "make lab-up    start LAB_HOSTS (default 1) lab hosts, write inventory/lab/hosts.yml"
	@echo "make lab-down  stop them and remove every namespace, veth and mount they used"

# Controller toolchain (pinned in requirements.txt and requirements.yml).
$(BIN)/ansible-playbook: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found"; exit 1; }
	$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install python3-venv"; exit 1; }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
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

lab-up: deps venv
	lab/labctl up --hosts $(LAB_HOSTS)

lab-down:
	lab/labctl down

demo: deps venv wheelhouse lab-up
	$(BIN)/ansible-playbook deploy.yml -e window=$(WINDOW)

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint
	$(BIN)/ruff check .
	$(BIN)/actionlint -color=false .github/workflows/*.yml
	$(BIN)/zizmor --offline --no-progress .github/workflows/

unit: venv sglang-venv
	SGLANG_LAB_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/pytest -q -m "not lab" tests/unit

lab-server: venv sglang-venv
	SGLANG_LAB_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/pytest -q tests/lab_server

# One shared lab host (lab100) carries every integration test that needs SGLang deployed;
# the tests of the lab tooling, the GPU roles and the weights bring up small hosts of their own.
IT_INVENTORY := inventory/lab/it.yml
integration: deps venv wheelhouse
	lab/labctl up --hosts 1 --first-index 100 --inventory $(IT_INVENTORY)
	rc=0; LAB_REUSE_INVENTORY=$(CURDIR)/$(IT_INVENTORY) SGLANG_LAB_INVENTORY=$(CURDIR)/$(IT_INVENTORY) \
	  $(BIN)/pytest -q -m lab tests --ignore=tests/lab_server || rc=$$?; \
	  lab/labctl down --inventory $(IT_INVENTORY); exit $$rc

molecule: deps venv wheelhouse
	cd molecule/.. && $(BIN)/molecule test --all --exclude gpu

test: lint unit lab-server integration molecule

bench: deps venv wheelhouse
	$(BIN)/python bench/deploy_timings.py

clean: lab-down
	rm -rf $(VENV) .ansible .lab
