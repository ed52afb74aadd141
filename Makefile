# crosscloud: `make demo` runs a cross-cloud training job; `make test` runs the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ENV := source scripts/env.sh &&
SHELL := /bin/bash

.PHONY: install demo test bench-gap bench-scheduling bench-preheat bench-electricity bench-demand-response bench-faults bench-sdk bench-exchange bench-admission bench-inference bench-queue bench-control-plane bench-soak airflow-ui mlflow-ui clean

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: install
	PROGRAM="$(PROGRAM)" bash scripts/demo.sh

# two processes, a test file each at a time (module fixtures start servers once), in the order tests/conftest.py
# puts them (the whole-deployment files first, not the largest); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2

test: install
	$(ENV) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

bench-gap: install
	$(ENV) $(PY) bench/gap.py $(ARGS)

bench-scheduling: install
	$(ENV) $(PY) bench/scheduling.py $(ARGS)

bench-preheat: install
	$(ENV) $(PY) bench/preheat.py $(ARGS)

bench-electricity: install
	$(ENV) $(PY) bench/electricity.py $(ARGS)

bench-demand-response: install
	$(ENV) $(PY) bench/demand_response.py $(ARGS)

bench-faults: install
	$(ENV) $(PY) bench/faults.py $(ARGS)

bench-sdk: install
	$(ENV) $(PY) bench/sdk.py $(ARGS)

bench-exchange: install
	$(ENV) $(PY) bench/exchange.py $(ARGS)

bench-admission: install
	$(ENV) $(PY) bench/admission.py $(ARGS)

bench-inference: install
	$(ENV) $(PY) bench/inference.py $(ARGS)

bench-queue: install
	$(ENV) $(PY) bench/queue_scale.py $(ARGS)

bench-soak: install
	$(ENV) $(PY) bench/soak.py $(ARGS)

bench-control-plane: install
	$(ENV) $(PY) bench/control_plane.py $(ARGS)

airflow-ui: install
	$(ENV) mkdir -p $$AIRFLOW_HOME && $(VENV)/bin/airflow standalone

mlflow-ui: install
	$(ENV) $(VENV)/bin/mlflow ui --backend-store-uri $$MLFLOW_TRACKING_URI --default-artifact-root $$CROSSCLOUD_MLFLOW_ARTIFACTS --port 5000

clean:
	rm -rf .state
