# backhauld: the two commands are `make run` and `make test`.
SWIFT ?= swift
ARGS ?=
SHELL := /bin/bash

.PHONY: deps test-deps bench-deps build release run test fuzz ietf-peer torture soak crash-states fleet-faults bench image-test deb deb-test lint format clean

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

## Checks the style (lint), builds everything and runs every test: unit tables, store, API, end to
## end against real servers, and the soak's 2-minute form beside them. The tests take about 14
## minutes on 2 cores (the serialized end-to-end suite is the long pole; the soak runs beside it);
## past TEST_TIME_LIMIT seconds they are stopped and fail, so a test that hangs costs CI minutes,
## not its whole 90-minute budget. The whole log is kept in .build/test.log; its failures are
## printed again at the end, where CI's tail shows them. A run that dies of Foundation's known
## Process.run() crash (swift-corelibs-foundation#5472, in no Swift release yet) starts over, at
## most twice (scripts/run-tests.sh). Then the power-loss crash states' short form: 100 states of
## a shorter workload, about 30 s (see crash-states), the fleet's fault campaign's: 20 rounds,
## about 1.5 minutes (see fleet-faults), and last the fuzz targets for 3 s each (see fuzz).
TEST_TIME_LIMIT ?= 1500
test: test-deps lint ietf-peer
	$(SWIFT) build --build-tests
	@SWIFT="$(SWIFT)" TEST_TIME_LIMIT=$(TEST_TIME_LIMIT) scripts/run-tests.sh
	CRASH_STATES=100 scripts/crash-states.sh --size short
	scripts/fleet-faults.py --rounds 20 --tolerate-late-after-outage
	FUZZ_SECONDS=3 scripts/fuzz.sh

## The fuzz targets (docs/security.md): a libFuzzer binary with AddressSanitizer (.build-fuzz; its
## first build takes minutes), each target run FUZZ_SECONDS (60) on its corpus in .build/fuzz/.
## Fails on a crash, an input slower than 1 s or 2 GiB of memory, keeping the input in .build/fuzz/.
## `make test` runs it for 3 s a target.
FUZZ_SECONDS ?= 60
fuzz: test-deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) SWIFT="$(SWIFT)" scripts/fuzz.sh

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

## The soak: SOAK_SECONDS (30 minutes) of mixed load on the debug build: every upload
## protocol and downloads, webhooks to a consumer away for the middle third, a sink failing 20 % of
## requests, a SIGKILL every 3 minutes. Fails if anything accepted is lost or if RSS, descriptors,
## threads or the state directory end more than 10 % above where they settled (after D/6 = 5
## minutes). Prints the table, writes bench-results/soak-SECONDS.json and .md; `make test` runs the
## 2-minute form (Tests/EndToEndTests/SoakTests.swift).
SOAK_SECONDS ?= 1800
soak: test-deps ietf-peer
	$(SWIFT) build --build-tests
	BACKHAUL_SOAK_SECONDS=$(SOAK_SECONDS) timeout --kill-after=30 $$(( $(SOAK_SECONDS) + 1200 )) \
	  $(SWIFT) test --skip-build --filter SoakTests

## Power-loss crash states (Tests/crash-states): the daemon runs a workload (task bursts beside
## single POSTs, uploads to a loopback sink, webhooks, checkpoints, a retention prune with
## incremental vacuum, the v1 fixture's migration at start) under an LD_PRELOAD recorder of every
## write, truncation, rename, unlink and sync in its state directory; CRASH_STATES (1,000) states
## that a disk may hold after a power loss are rebuilt from it (random choices from a printed
## seed), each opened by the daemon and checked: it starts, passes integrity_check, and holds
## every write acknowledged before the crash point. Prints `crash states: N explored, L lost, U
## unopenable` and fails unless L and U are 0. 5 to 8 minutes on 2 cores; CRASH_ARGS passes
## more (--seed S, --keep, --directory-model ext4).
CRASH_STATES ?= 1000
crash-states: test-deps
	$(SWIFT) build --product backhauld
	CRASH_STATES=$(CRASH_STATES) scripts/crash-states.sh $(CRASH_ARGS)

## The fleet's fault campaign (scripts/fleet-faults.py, docs/fleet.md): three nodes (lease 2 s) on
## one PostgreSQL under a mixed workload (batches, single POSTs, uploads of every protocol to real
## peers, PATCHes, cancels, policy changes); FLEET_ROUNDS (100) rounds, each one fault drawn from a
## printed seed: kill -9 of a node, SIGSTOP of a node past its lease, its database backends
## stopped past its lease, the LISTEN connections terminated, a connection dropped right after its
## COMMIT, PostgreSQL restarted with -m immediate. Prints `fleet faults: N rounds, L lost, D done
## twice, O overlaps` and fails unless all are 0 and every policy change was in force on every
## node within 2 s. FLEET_ARGS passes more (--seed S, --keep); `make test` runs 20 rounds.
FLEET_ROUNDS ?= 100
fleet-faults: test-deps
	$(SWIFT) build --product backhauld
	scripts/fleet-faults.py --rounds $(FLEET_ROUNDS) $(FLEET_ARGS)

## Builds Deploy/Dockerfile with buildah (no Docker engine), starts it with podman and drives it:
## health check, an upload with its webhook, a download, state kept across a new container.
## Needs root and a Debian mirror (else: SKIPPED, exit 77; a failure when CI=true). The base
## images are cached in /var/cache/backhaul-image-test; .ci/run runs it after make test.
image-test:
	bash scripts/image-test.sh

## The Debian package (on Debian 12): .build/deb/backhaul_VERSION_ARCH.deb with backhauld and
## backhaul in /usr/bin (release, static Swift standard library, no debug information), the
## systemd unit, /etc/backhaul/backhauld.json as a conffile and a postinst that makes the user
## `backhaul`; the version is BackhaulVersion.string. lintian's errors fail it (scripts/deb.sh).
deb:
	bash scripts/install-deps.sh --deb
	bash scripts/deb.sh

## Installs that package with apt in a clean Debian bookworm container (the image test's cached
## base), starts backhauld as its unit does and checks /healthz, the version, the user, the
## state directory, systemd-analyze verify, remove and purge. Needs root and a Debian mirror,
## like image-test (else SKIPPED, exit 77; a failure when CI=true); .ci/run runs it third.
deb-test: deps
	bash scripts/deb-test.sh

## Style: swift-format's rules (.swift-format) as errors; `make format` fixes most in place.
lint:
	$(SWIFT) format lint --strict --parallel --recursive --configuration .swift-format Sources Tests Examples Package.swift

format:
	$(SWIFT) format format --in-place --parallel --recursive --configuration .swift-format Sources Tests Examples Package.swift

clean:
	rm -rf .build .build-ietfpeer

## Side by side on loopback (release build of backhauld alone): one big file vs curl, 2,000 small
## files to nginx WebDAV vs curl and curl -Z (and to rclone serve webdav vs rclone), the API under
## wrk, a million queued tasks, instructions per task under callgrind; prints every target of
## the benchmark with met / not met and writes bench-results/latest.json. About 6 minutes here;
## BENCH_ARGS="--quick" checks the script in one, BENCH_ARGS="--only many,profile" runs sections.
## As root, the background section measures background uploads on a shaped 40 Mbit
## link in network namespaces beside plain curl (scripts/benchlib/lab.py); elsewhere it is skipped.
bench: bench-deps
	$(SWIFT) build -c release --static-swift-stdlib --product backhauld
	scripts/bench.py $(BENCH_ARGS)
