#!/usr/bin/env bash
# The power-loss crash states (Tests/crash-states, README "What survives a power loss and how it
# is proved"): compiles the recorder (an LD_PRELOAD library) with cc and runs the harness against
# the debug build, which the caller has built (make crash-states, make test).
#   scripts/crash-states.sh [harness arguments]   CRASH_STATES states (1000 unless set)
# e.g. --size short (make test's workload), --seed S (the same states again), --keep.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .build/crash-states
cc -O2 -Wall -shared -fPIC -o .build/crash-states/recorder.so Tests/crash-states/recorder.c -ldl -lpthread
exec python3 Tests/crash-states/crash_states.py --states "${CRASH_STATES:-1000}" \
  --recorder .build/crash-states/recorder.so "$@"
