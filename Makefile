# qxfer — the two commands of the quick start are `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test release clean

deps:
	@scripts/install-deps.sh

build: deps
	$(SWIFT) build

## Installs what is missing, builds, and runs the loopback demo: qxfer recv and qxfer send over
## QUIC and TCP+TLS (scripts/demo.sh), then the connection API's own demo.
demo: build
	QXFER=$$($(SWIFT) build --show-bin-path)/qxfer scripts/demo.sh
	$(SWIFT) run qxfer-demo

## Runs the whole test suite.
test: deps
	$(SWIFT) build --build-tests
	# The engine's simulated-link tests are CPU-bound; run them apart from the socket tests
	# so that timeouts in the latter measure the code, not a starved machine.
	$(SWIFT) test --skip-build --filter QUICEngineTests
	$(SWIFT) test --skip-build --skip QUICEngineTests
	LINKEMU_BIN=$$($(SWIFT) build --show-bin-path)/qxfer-linkemu bench/netns/selftest.sh
	QXFER=$$($(SWIFT) build --show-bin-path)/qxfer Tests/e2e/transfer.sh

release: deps
	$(SWIFT) build -c release

clean:
	rm -rf .build
