#!/usr/bin/env bash
# The fuzz campaign (docs/security.md): builds the libFuzzer binary with AddressSanitizer into
# .build-fuzz, then runs each target for FUZZ_SECONDS on its corpus (.build/fuzz/corpus/NAME,
# grown from the seeds in Fuzz/Seeds/NAME), with its dictionary when it has one. One line per
# target, `fuzz NAME: E executions, F features, C crashes`, then the sum. Fails on any crash,
# any input slower than 1 s or any run above 2 GiB; the input that did it is kept as
# .build/fuzz/NAME-crash-…, -timeout-… or -oom-…, and libFuzzer's log as .build/fuzz/NAME.log.
#   FUZZ_SECONDS  seconds per target (60)
#   FUZZ_TARGETS  the targets to run, space-separated (all)
#   FUZZ_JOBS     targets run at once (1)
set -uo pipefail
cd "$(dirname "$0")/.."
SWIFT=${SWIFT:-swift}
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
out=.build/fuzz
binary=.build-fuzz/debug/backhaul-fuzz

# One -sanitize flag with both: `--sanitize fuzzer --sanitize address` hands swiftc two flags in
# an order that changes from run to run, and swiftc keeps the last one only (no coverage, or no
# ASan, and every module rebuilt when the order flips).
BACKHAUL_FUZZ=1 $SWIFT build --product backhaul-fuzz --scratch-path .build-fuzz \
    -Xswiftc -sanitize=fuzzer,address 2>&1 | grep -v "Cannot export local symbol" || exit 1
[ -x "$binary" ] || { echo "fuzz: $binary was not built" >&2; exit 1; }

names=${FUZZ_TARGETS:-$(BACKHAUL_FUZZ_TARGET=list "$binary" | cut -f1)}
mkdir -p "$out"

run() {
    local name=$1 corpus=$out/corpus/$1 dict=()
    mkdir -p "$corpus"
    [ -f "Fuzz/Dictionaries/$name.dict" ] && dict=(-dict="Fuzz/Dictionaries/$name.dict")
    # Leak checks off: the Swift runtime's caches and the store's threads outlive an input by
    # design. Swift's own backtracer off: libFuzzer and ASan report the crash.
    ASAN_OPTIONS=detect_leaks=0 SWIFT_BACKTRACE=enable=no BACKHAUL_FUZZ_TARGET=$name "$binary" "$corpus" "Fuzz/Seeds/$name" "${dict[@]}" \
        -max_total_time="$seconds" -timeout=1 -rss_limit_mb=2048 -detect_leaks=0 \
        -artifact_prefix="$out/$name-" -print_final_stats=1 >"$out/$name.log" 2>&1
    local status=$? executions features crashes=0
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$name.log" | tail -n 1)
    features=$(grep -o ' ft: [0-9]*' "$out/$name.log" | tail -n 1 | grep -o '[0-9]*')
    [ "$status" -ne 0 ] && crashes=1
    echo "fuzz $name: ${executions:-0} executions, ${features:-0} features, $crashes crashes"
    [ "$crashes" -eq 0 ] || grep -E "^(==|fuzz check failed|Fatal error|SUMMARY|artifact_prefix|Test unit written)" \
        "$out/$name.log" | head -n 12 | sed "s/^/  $name: /"
}

export -f run
export out seconds binary
results=$(printf '%s\n' $names | xargs -P "$jobs" -I{} bash -c 'run {}')
echo "$results"
count=$(grep -c '^fuzz ' <<<"$results")
executions=$(grep -o '[0-9]* executions' <<<"$results" | awk '{s += $1} END {print s + 0}')
crashes=$(grep -o '[0-9]* crashes' <<<"$results" | awk '{s += $1} END {print s + 0}')
echo "fuzz: $count targets, $executions executions, $crashes crashes"
[ "$crashes" -eq 0 ]
