# qxfer — the two commands of the quick start are `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test release clean fuzz bench bench-full bench-deps

deps:
	@scripts/install-deps.sh

build: deps
	$(SWIFT) build

## Installs what is missing, builds, and runs the loopback demo: qxfer recv and qxfer send over
## QUIC and TCP+TLS (scripts/demo.sh), then the connection API's own demo.
demo: build
	QXFER=$$($(SWIFT) build --show-bin-path)/qxfer scripts/demo.sh
	$(SWIFT) run qxfer-demo

## Runs the whole test suite. Each step goes through scripts/test-step.sh: its duration is
## printed, the library's info lines and the sanitized linker's noise are left out of the log
## (kept in a file), and a step past its limit in seconds fails with what it left running.
STEP = scripts/test-step.sh
BIN = $$($(SWIFT) build --show-bin-path)
test: deps
	# The target graph, and a failure on a cycle or on an edge the layering forbids
	# (docs/ARCHITECTURE.md): before building, so a forbidden import is named, not just compiled.
	scripts/check-architecture.py
	$(STEP) 2400 $(SWIFT) build --build-tests
	# The fuzz targets compile the sources they exercise into one module of their own, outside
	# SwiftPM: a new import there breaks them unnoticed unless they are built here too.
	$(STEP) 900 fuzz/run.sh build
	# The engine's simulated-link tests are CPU-bound; run them apart from the socket tests
	# so that timeouts in the latter measure the code, not a starved machine.
	$(STEP) 900 $(SWIFT) test --skip-build --filter QUICEngineTests
	# The streaming tests push live frames for seconds at a time; alone, they neither starve
	# nor are starved by the socket tests' deadlines.
	$(STEP) 900 $(SWIFT) test --skip-build --filter QXferStreamTests
	# Offers and Accepts of hundreds of thousands of entries keep both cooperative threads of a
	# two-core machine busy for over a minute: beside the socket tests, every task of theirs
	# waited that long and a QUIC handshake timed out (CI run 30).
	$(STEP) 900 $(SWIFT) test --skip-build --filter LongMessageTests
	# Which stack wins a race is a matter of which handshake ends first: beside every other
	# socket suite, either stack's handshake outlasted a 3 s head start (CI runs 50 and 58).
	$(STEP) 900 $(SWIFT) test --skip-build --filter RaceTests
	$(STEP) 900 $(SWIFT) test --skip-build --skip QUICEngineTests --skip QXferStreamTests --skip LongMessageTests --skip RaceTests
	LINKEMU_BIN=$(BIN)/qxfer-linkemu $(STEP) 900 bench/netns/selftest.sh
	QXFER=$(BIN)/qxfer $(STEP) 900 Tests/e2e/transfer.sh
	# faults.sh moves ~25 GiB through the debug build (20 kills each way, cuts, floods): 400 s
	# on a fast machine of this kind, 800 s on a machine half as fast.
	QXFER=$(BIN)/qxfer $(STEP) 1500 Tests/e2e/faults.sh
	QXFER=$(BIN)/qxfer $(STEP) 900 Tests/e2e/pairing.sh
	QXFER=$(BIN)/qxfer $(STEP) 900 Tests/e2e/race.sh
	QXFER=$(BIN)/qxfer $(STEP) 600 Tests/e2e/paths.sh
	QXFER=$(BIN)/qxfer $(STEP) 900 Tests/e2e/hostile.sh
	QXFER=$(BIN)/qxfer $(STEP) 300 Tests/e2e/memory.sh
	QXFER=$(BIN)/qxfer $(STEP) 900 Tests/e2e/terminal.sh
	# AddressSanitizer over the library, transfer and CLI tests (its own build folder; leak
	# checking off: XCTest's runner leaks a few bytes of its own at exit), one test at a time
	# like ThreadSanitizer below: with ~270 sanitized tests at once on two cores, TLS handshakes
	# outlasted the listener's 10 s limit and tests their own deadlines (five parallel runs out of
	# five on a slow machine, on this build and on two before it).
	$(STEP) 2400 $(SWIFT) build --build-tests --sanitize=address --scratch-path .build-asan
	ASAN_OPTIONS=detect_leaks=0 $(STEP) 1800 $(SWIFT) test --skip-build --sanitize=address --scratch-path .build-asan \
		--no-parallel --skip QUICEngineTests --skip QXferStreamTests --skip RaceTests
	# RaceTests are left out of both sanitized runs: which stack wins depends on which loopback
	# handshake completes first, and a sanitized QUIC handshake takes longer than the race's
	# 250 ms attempt delay and 1 s refusal rule (docs/SECURITY.md, "Sanitizers").
	# ThreadSanitizer over the same suites (its own build folder), one test at a time: TSan slows
	# everything several-fold, and parallel suites then miss their own deadlines. A report fails
	# the run (exit 66); why two suites are left out: docs/SECURITY.md, "Sanitizers". Reports go
	# to files and are shown again, shortened, after the test run, where a log's tail shows them.
	$(STEP) 2400 $(SWIFT) build --build-tests --sanitize=thread --scratch-path .build-tsan
	rm -rf .build-tsan/reports && mkdir -p .build-tsan/reports
	TSAN_OPTIONS=halt_on_error=0:exitcode=66:log_path=$(CURDIR)/.build-tsan/reports/tsan:suppressions=$(CURDIR)/Tests/tsan-suppressions.txt \
		$(STEP) 2400 $(SWIFT) test --skip-build --sanitize=thread --scratch-path .build-tsan \
		--no-parallel --skip QUICEngineTests --skip QXferStreamTests --skip RaceTests \
		|| { status=$$?; scripts/tsan-summary.sh .build-tsan/reports; exit $$status; }

## Builds the libFuzzer targets (fuzz/harness: qxfer/1 codec and framing, path validation, resume
## journal, mDNS, TLV/Coder, IVF/Y4M, stream messages and datagrams, the QUIC listener's input,
## and both sides' sessions after decoding)
## and runs each for FUZZ_SECONDS (default 60); prints executions and coverage.
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh

## Benchmarks side by side with scp, rsync, iperf3, the ngtcp2 example pair and srt-live-transmit
## (bench/run.sh; as root; tables in bench/results/report-DATE.md, plots beside them).
## bench: ~14 minutes (256 MiB, one run each; many small files, 3 runs); bench-full: 1 GiB x 3 and
## everything else (~1 hour).
BENCH_SCRATCH ?= .build
bench-deps:
	@scripts/install-bench-deps.sh

bench: deps bench-deps
	SCRATCH=$(BENCH_SCRATCH) bench/run.sh quick

bench-full: deps bench-deps
	SCRATCH=$(BENCH_SCRATCH) bench/run.sh full

# The Swift runtime and Foundation linked in: a new `qxfer send` starts in ~9 ms instead of ~15
# (docs/benchmarks.md, "Process start").
release: deps
	$(SWIFT) build -c release --static-swift-stdlib

clean:
	rm -rf .build
