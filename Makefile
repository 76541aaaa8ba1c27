# The two commands a newcomer needs are `make serve` and `make test`; both set up what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
BUF := node_modules/.bin/buf
# Our contract only: protos/google/rpc is vendored for other languages' clients, and Python
# takes google.rpc from googleapis-common-protos like the server does.
PROTOS := $(shell find protos/agentrt -name '*.proto' | sort)

.PHONY: setup serve test lint gen check-gen wheel-check clean node-build breaking

# The stamp is rebuilt whenever the declared dependencies change, so a pull that adds one
# installs it without anybody deleting .venv by hand.
$(VENV)/.stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

node_modules/.stamp: package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	touch $@

setup: $(VENV)/.stamp

serve: $(VENV)/.stamp
	$(BIN)/agentrt serve

# The Node client tests (tests/polyglot) build their TypeScript with the tools in node_modules.
test: $(VENV)/.stamp node_modules/.stamp
	$(PY) -m pytest -q $(PYTEST_ARGS)

# One pinned command produces generated/: protoc from grpcio-tools with the mypy-protobuf plugins.
gen: $(VENV)/.stamp
	rm -rf generated/agentrt
	mkdir -p generated
	PATH="$(abspath $(BIN)):$$PATH" $(PY) -m grpc_tools.protoc -Iprotos \
	  --python_out=generated --grpc_python_out=generated \
	  --mypy_out=quiet:generated --mypy_grpc_out=quiet:generated $(PROTOS)
	find generated/agentrt -type d -exec touch {}/__init__.py \;

check-gen: gen
	@git add -N generated && git diff --exit-code --stat -- generated \
	  || { echo "generated/ is stale: run 'make gen' and commit the result"; exit 1; }

lint: $(VENV)/.stamp node_modules/.stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy agentrt_base registry runtime_service
	$(BUF) lint
	$(BUF) format --diff --exit-code

clean:
	rm -rf $(VENV) node_modules build dist .mypy_cache .pytest_cache .ruff_cache

# Polyglot clients (issue 19). TypeScript generated from protos/ by buf.gen.yaml with local
# plugins only (protoc-gen-es from node_modules, no network), then type-checked and compiled
# with the Node client test; both outputs are git-ignored. tests/polyglot runs the result.
node-build: node_modules/.stamp
	$(BUF) generate
	node_modules/.bin/tsc -p tests/polyglot/node

# The contract only grows (buf.yaml: breaking FILE): the protos are compared with those of
# BREAKING_AGAINST, by default the previous commit (in CI, a clone of main: main before the
# change under test). From a branch: make breaking BREAKING_AGAINST='.git#branch=main'.
BREAKING_AGAINST ?= .git\#ref=HEAD~1
breaking: node_modules/.stamp
	$(BUF) breaking --against '$(BREAKING_AGAINST)'
