# backhauld: the two commands are `make run` and `make test`.
SWIFT ?= swift
ARGS ?=
SHELL := /bin/bash

.PHONY: deps test-deps bench-deps build release run test ietf-peer torture bench image-test lint format clean

deps:
	@scripts/install-deps.sh

test-deps:
	@scripts/install-deps.sh --test

bench-deps:
	@scripts/install-deps.sh --bench

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --static-swift-stdlib

## Starts backhauld on its defaults (127.0.0.1:8427, ./backhaul-state, the working directory as root).
run: build
	.build/debug/backhauld $(ARGS)

## Builds everything and runs every test: unit tables, store, API, end to end against real servers.
## The run takes about 4 minutes; past TEST_TIME_LIMIT seconds it is stopped and fails, so a test
## that hangs costs CI minutes, not its whole 90-minute budget. The whole log is kept in
## .build/test.log; its failures are printed again at the end, where CI's tail shows them.
TEST_TIME_LIMIT ?= 1200
test: test-deps lint ietf-peer
	$(SWIFT) build --build-tests
	@set -o pipefail; timeout --kill-after=30 $(TEST_TIME_LIMIT) $(SWIFT) test --skip-build 2>&1 | tee .build/test.log \
	  || { echo "==== failures (from .build/test.log)"; grep -a -E 'recorded an issue|✘ Test .* failed|error:' .build/test.log | tail -60; exit 1; }

## The IETF resumable-upload test peer: Apple's NIOResumableUpload (swift-nio-extras, from the
## package mirror) in a package of its own under Tests/IETFPeer, so that the daemon never depends on
## NIO. A debug build: 3.7 minutes the first time on 2 cores (release: 12), then cached in
## .build-ietfpeer (a no-op build takes a second).
ietf-peer: test-deps
	$(SWIFT) build --package-path Tests/IETFPeer --scratch-path .build-ietfpeer

## The fault-injection suite in its long form (50 uploads and 10 SIGKILLs, 60 flaky-server
## uploads, full disk, signals), three times in a row; `make test` runs its short form.
torture: test-deps
	$(SWIFT) build --build-tests
	for round in 1 2 3; do \
	  BACKHAUL_TORTURE=full $(SWIFT) test --skip-build --filter 'EndToEndTests/(crashLoop|flakyServer|signalsAndRecovery|fullDisk|webhooksSurviveOutageAndCrash)' || exit 1; \
	done

## Builds Deploy/Dockerfile with buildah (no Docker engine), starts it with podman and drives it:
## health check, an upload with its webhook, a download, state kept across a new container.
## Needs root and a Debian mirror (else: SKIPPED, exit 77; a failure when CI=true). The base
## images are cached in /var/cache/backhaul-image-test; .ci/run runs it after make test.
image-test:
	bash scripts/image-test.sh

## Style: swift-format's rules (.swift-format) as errors; `make format` fixes most in place.
lint:
	$(SWIFT) format lint --strict --parallel --recursive --configuration .swift-format Sources Tests Package.swift

format:
	$(SWIFT) format format --in-place --parallel --recursive --configuration .swift-format Sources Tests Package.swift

clean:
	rm -rf .build .build-ietfpeer

## Side by side on loopback (release build of backhauld alone): one big file vs curl, 2,000 small
## files to nginx WebDAV vs curl and curl -Z (and to rclone serve webdav vs rclone), the API under
## wrk, a million queued tasks, instructions per task under callgrind; prints every target of
## issue 16 with met / not met and writes bench-results/latest.json. About 15 minutes;
## BENCH_ARGS="--quick" checks the script in one, BENCH_ARGS="--only many,profile" runs sections.
bench: bench-deps
	$(SWIFT) build -c release --static-swift-stdlib --product backhauld
	scripts/bench.py $(BENCH_ARGS)
