# PML: `make run` starts the whole system locally; `make test` runs the whole suite.
# Both install what is missing first (see `deps`).

SHELL := /bin/bash
UV_VERSION := 0.13.9
KUSTOMIZE_VERSION := v5.5.0
export UV_PYTHON_DOWNLOADS := never
export UV_FROZEN := 1
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NEO4J_DIR := deploy/local/neo4j
PROTO_OUT := libs/proto
PROTOS := $(wildcard proto/pml/v1/*.proto)
PROTO_STAMP := $(PROTO_OUT)/pml/v1/.generated

.PHONY: deps system-deps python-deps neo4j proto run test lint typecheck fmt bench clean up down compose-secrets

## deps: everything a fresh machine needs (system packages, Python lockfile, Neo4j jars, protos)
deps: system-deps python-deps neo4j proto

system-deps:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server; }
	@command -v java >/dev/null || { echo "JDK 17 is required (apt package openjdk-17-jdk-headless)"; exit 1; }
	@command -v mvn >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq maven; }
	@command -v uv >/dev/null || [ -x $(HOME)/.local/bin/uv ] || python3 -m pip install --quiet --user "uv==$(UV_VERSION)"
	@# kustomize renders deploy/k8s for its tests: kubectl's, or the Go module when kubectl is missing
	@command -v kubectl >/dev/null || command -v kustomize >/dev/null || [ -x $(HOME)/go/bin/kustomize ] \
	  || go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

python-deps: system-deps
	@$(UV) sync --all-packages --quiet

neo4j: $(NEO4J_DIR)/target/lib/.built
$(NEO4J_DIR)/target/lib/.built: $(NEO4J_DIR)/pom.xml $(wildcard $(NEO4J_DIR)/src/main/java/pml/local/*.java)
	mvn -q -B -f $(NEO4J_DIR)/pom.xml package
	@touch $@

proto: $(PROTO_STAMP)
$(PROTO_STAMP): $(PROTOS) | python-deps
	$(UV) run python -m grpc_tools.protoc -I proto \
	  --python_out=$(PROTO_OUT) --grpc_python_out=$(PROTO_OUT) \
	  --mypy_out=quiet:$(PROTO_OUT) --mypy_grpc_out=quiet:$(PROTO_OUT) $(PROTOS)
	@touch $@

## run: Redis, Neo4j and every service on loopback, with the demo catalog loaded (Ctrl-C stops all)
run: deps
	$(UV) run pml run

## test: lint, type checks and the whole suite against real Redis and Neo4j
test: deps lint typecheck
	$(UV) run pytest

lint:
	$(UV) run ruff check .
	$(UV) run ruff format --check .

typecheck:
	$(UV) run mypy

fmt:
	$(UV) run ruff format .
	$(UV) run ruff check --fix .

## up / down: the containerised system (docker compose), traces in Jaeger on :16686
up: compose-secrets
	docker compose up -d --build

## compose-secrets: random store passwords for compose, once (.pml is ignored by git)
COMPOSE_SECRETS := .pml/compose-secrets
compose-secrets:
	@mkdir -p $(COMPOSE_SECRETS) && chmod 700 $(COMPOSE_SECRETS)
	@for name in redis_password neo4j_password qdrant_api_key; do \
	  [ -s $(COMPOSE_SECRETS)/$$name ] || python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_urlsafe(24))' > $(COMPOSE_SECRETS)/$$name; \
	done
	@[ -s $(COMPOSE_SECRETS)/neo4j_auth ] || printf 'neo4j/%s' "$$(cat $(COMPOSE_SECRETS)/neo4j_password)" > $(COMPOSE_SECRETS)/neo4j_auth
	@chmod 644 $(COMPOSE_SECRETS)/*

down:
	docker compose down

clean:
	rm -rf .pml $(NEO4J_DIR)/target $(PROTO_OUT)/pml/v1/*_pb2*.py* $(PROTO_STAMP)
