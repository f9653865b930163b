# nudge — run `make help` for the targets.

GO                     ?= go
GOLANGCI_LINT_VERSION  := v2.15.0
BIN                    := $(CURDIR)/bin
GOLANGCI_LINT          := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
BENCH_TIME             ?= 2s
# TEST_TIMEOUT bounds each package's test binary; it fits a busy shared machine, where a
# package that takes one minute alone can take ten (go test's own default is 10m).
TEST_TIMEOUT           ?= 20m
# CPUHOG_SECONDS bounds the load of make test-loaded; CPUHOG_WORKERS busy loops (default: one
# per core).
CPUHOG_SECONDS         ?= 2700
CPUHOG_WORKERS         ?=
# CHAOS_TIMEOUT_SCALE multiplies the chaos harness's deadlines and its default budget (not the
# bounds it asserts); make chaos-loaded runs with CHAOS_LOADED_SCALE.
CHAOS_TIMEOUT_SCALE    ?= 1
CHAOS_LOADED_SCALE     ?= 3

# OUTAGE_TESTS run a second time without -race (see test).
OUTAGE_TESTS           := TestPublishersAcrossOutages|TestBrokerOutageWhileRunning|TestDeclareWaitsForTheConnection|TestNewAfterALostConnection

.DEFAULT_GOAL := help
.PHONY: help up tools down test test-loaded lint chaos chaos-fleet chaos-loaded bench bench-go demo docs

help: ## Show the targets and what they do.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

up: ## Find or start PostgreSQL and RabbitMQ (docker compose, else the local services).
	@scripts/services.sh

tools: ## Install what some tests drive when missing (gdb, PostgreSQL's and RabbitMQ's server programs, promtool).
	@scripts/tools.sh

down: ## Stop the docker compose services (local services are left running).
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		docker compose down; \
	else \
		echo "down: no Docker engine here; local PostgreSQL and RabbitMQ are left running"; \
	fi

test: up tools ## Run every test, with the race detector, against real PostgreSQL and RabbitMQ.
	@# watermill-amqp v2.1.3 races on its connection flag when publishes overlap a connection
	@# loss; the tests of RabbitMQ outages therefore run once more without -race. The second
	@# pass runs even when the first fails; make test fails if either did.
	@race=0; outages=0; \
	echo "$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./..."; \
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./... || race=$$?; \
	echo "$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '$(OUTAGE_TESTS)' ./channel/amqp/ ./worker/"; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '$(OUTAGE_TESTS)' ./channel/amqp/ ./worker/ || outages=$$?; \
	if [ $$race -ne 0 ] || [ $$outages -ne 0 ]; then \
		echo "test: FAILED: every test with -race: $$(if [ $$race -eq 0 ]; then echo ok; else echo FAIL; fi);" \
			"RabbitMQ outages without -race: $$(if [ $$outages -eq 0 ]; then echo ok; else echo FAIL; fi)" >&2; \
		exit 1; \
	fi

test-loaded: ## Run make test while every core is kept busy (scripts/cpuhog.sh), as on a shared machine.
	@scripts/cpuhog.sh -t $(CPUHOG_SECONDS) $(if $(CPUHOG_WORKERS),-n $(CPUHOG_WORKERS)) -- $(MAKE) --no-print-directory test

lint: $(GOLANGCI_LINT) ## Check formatting, go vet and golangci-lint.
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...

chaos: up tools ## Inject faults (kills, outages, poison, bad input) and verify every read model (RELIABILITY.md).
	$(GO) run ./internal/chaos -timeout-scale $(CHAOS_TIMEOUT_SCALE) $(CHAOS_FLAGS)

chaos-fleet: up tools ## The scale-fleet chaos scenario alone: 50 projections, 8 of them × 64 partitions, on 16 workers, kills (minutes; RELIABILITY.md).
	$(GO) run ./internal/chaos -scenario scale-fleet -budget 20m -timeout-scale $(CHAOS_TIMEOUT_SCALE) $(CHAOS_FLAGS)

chaos-loaded: ## Run make chaos while every core is kept busy (scripts/cpuhog.sh), its deadlines ×3.
	@scripts/cpuhog.sh -t $(CPUHOG_SECONDS) $(if $(CPUHOG_WORKERS),-n $(CPUHOG_WORKERS)) -- \
		$(MAKE) --no-print-directory chaos CHAOS_TIMEOUT_SCALE=$(CHAOS_LOADED_SCALE)

bench: up ## Run the benchmark harness: every figure beside its baseline; rewrites docs/performance.md (BENCH_FLAGS=-quick).
	$(GO) run ./internal/bench -write-docs docs/performance.md $(BENCH_FLAGS)

bench-go: up ## Run the Go micro-benchmarks (go test -bench), each beside its baseline (BENCH_TIME=2s).
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCH_TIME) -timeout 30m \
		./eventstore/postgres/ ./projection/postgres/ ./channel/amqp/ ./channel/postgres/ ./metrics/
	$(GO) test -run '^$$' -bench AppendOverhead -benchtime $(BENCH_TIME) -timeout 30m ./worker/
	@# Each live-latency scenario appends for NUDGE_BENCH_DURATION (10s by default).
	$(GO) test -run '^$$' -bench LiveLatency -benchtime 1x -timeout 30m ./worker/

docs: ## Regenerate docs/reference (configuration, CLI, metrics) from the code; a test fails when they are stale.
	$(GO) run ./internal/docgen

demo: ## Run the embedded quickstart: a projection fails, is dead-lettered, fixed, replayed (no servers).
	$(GO) run ./examples/quickstart

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	@mv $(BIN)/golangci-lint $(GOLANGCI_LINT)
