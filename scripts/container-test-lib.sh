# What the two container tests share (sourced by scripts/image-test.sh and scripts/deb-test.sh):
# how a run reports (passed, FAILED, SKIPPED with exit 77, a status file for .ci/run), steps
# bounded in time, whether it can run here (root, a Debian mirror), the container storage of the
# tests' own in BACKHAUL_IMAGE_CACHE (default /var/cache/backhaul-image-test) with its lock, and
# the Debian bookworm base image made there with debootstrap and cached under a key.
#
# The sourcing script sets first:
#   test_name      how it names itself in its messages ("image test")
#   test_variable  the variable that says required, auto or skip (BACKHAUL_IMAGE_TEST); its
#                  default is required when CI=true, else auto
#   test_limit     seconds the whole run may take
#   status_file    where .ci/run reads the outcome, or empty
#   untested       the line a skip prints on what was not tested
#   make_target    the make target that runs it, for the message asking for root
# and has cd'ed to the repository's root, with set -euo pipefail.

started=$(date +%s)
deadline=$((started + test_limit))
mode=${!test_variable:-$([ "${CI:-}" = true ] && echo required || echo auto)}
say() { printf '== %s (%ds)\n' "$*" $(($(date +%s) - started)); }
note_status() { [ -z "$status_file" ] || printf '%s\n' "$*" >"$status_file"; }
timed_out=   # set by bounded when a step ran out of time
fail() {
    local why="$*${timed_out:+ ($timed_out)}"
    printf '\n%s FAILED: %s\n' "$test_name" "$why" >&2
    note_status "failed: $why"
    exit 1
}
skip() {
    if [ "$mode" = required ]; then
        fail "it cannot run here, and it is required ($test_variable=required; CI=${CI:-unset}): $*"
    fi
    printf '\n%s\n' '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!' >&2
    printf '!!! %s SKIPPED: %s\n' "$test_name" "$*" >&2
    printf '!!! %s\n' "$untested" >&2
    printf '%s\n\n' '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!' >&2
    note_status "skipped: $*"
    exit 77
}

# A step bounded in time: at most LIMIT seconds and never past the run's deadline. It runs in
# the background and the script waits for it, so a SIGTERM to the script is handled at once (the
# trap ends the step and cleans up) instead of after the step.
step=
bounded() {
    local limit=$1 left
    shift
    left=$((deadline - $(date +%s)))
    [ "$left" -gt 0 ] || { echo "the $test_name's time limit is used up before: $*" >&2; return 124; }
    [ "$limit" -le "$left" ] || limit=$left
    timeout --kill-after=10 "$limit" "$@" &
    step=$!
    local rc=0
    wait "$step" || rc=$?
    step=
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        timed_out="timed out after $limit s"
        echo "$timed_out: ${*:1:6} …" >&2
    fi
    return "$rc"
}

# Unmounts whatever is mounted below a directory (deepest first), so that rm -rf never walks
# into a mounted /proc or a container's shm.
unmount_under() {
    local dir
    dir=$(readlink -f "$1" 2>/dev/null) || return 0
    awk -v prefix="$dir/" 'index($5, prefix) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r point; do umount -l "$point" 2>/dev/null || true; done
}
remove_tree() { unmount_under "$1"; rm -rf --one-file-system "$1"; }

# Whether it can run here: the mode, root, a Debian mirror (whose Release file is kept in
# $release: it is part of the base image's key).
suite=bookworm
debian_mirror=${BACKHAUL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
check_can_run() {
    case $mode in
        skip) skip "$test_variable=skip" ;;
        auto | required) ;;
        *) fail "$test_variable is '$mode': one of required, auto, skip" ;;
    esac
    [ "$(id -u)" = 0 ] || skip "it needs root (debootstrap, podman with vfs storage); run it as root: sudo make $make_target"
    release=$(curl -fsS --max-time 20 --retry 2 "$debian_mirror/dists/$suite/Release" 2>&1) \
        || skip "no Debian mirror reachable at $debian_mirror (BACKHAUL_DEBIAN_MIRROR names another): $release"
}

# The container storage of the tests' own, one run at a time.
cache=${BACKHAUL_IMAGE_CACHE:-/var/cache/backhaul-image-test}
runroot=/run/backhaul-image-test
storage=(--root "$cache/storage" --runroot "$runroot/storage" --storage-driver vfs)
buildah=(buildah "${storage[@]}")
podman=(podman "${storage[@]}" --tmpdir "$runroot/libpod" --cgroup-manager cgroupfs --runtime runc --events-backend file)
locked=
lock_cache() {
    mkdir -p "$cache" "$runroot"
    exec 9>>"$cache/lock"
    if ! flock -n 9; then
        say "waiting for another container test on this machine ($(cat "$cache/lock.holder" 2>/dev/null))"
        flock -w "${BACKHAUL_IMAGE_LOCK_WAIT:-900}" 9 \
            || fail "another container test held $cache/lock for ${BACKHAUL_IMAGE_LOCK_WAIT:-900} s: $(cat "$cache/lock.holder" 2>/dev/null)"
    fi
    locked=1
    echo "$test_name, pid $$ since $(date -u +%FT%TZ) in $PWD" >"$cache/lock.holder"
}

# The base image: Debian bookworm from debootstrap (minbase, trimmed like debian:bookworm-slim),
# in place of debian:bookworm-slim, which cannot be pulled here. $work is the run's scratch
# directory.
make_base() {   # $1: the tag. A change to this function's text changes the key, so the base is made anew.
    local rootfs=$work/rootfs
    bounded 900 debootstrap --variant=minbase "$suite" "$rootfs" "$debian_mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log"; fail "debootstrap $suite from $debian_mirror"; }
    unmount_under "$rootfs"
    # What debian:bookworm-slim leaves out: documentation, manuals, translations, apt's caches;
    # the dpkg excludes and apt settings below keep later installs as small.
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale}/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/slim" <<'EOF'
APT::Keep-Downloaded-Packages "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    tar -C "$rootfs" -cf "$work/rootfs.tar" . || fail "packing the debootstrap tree"
    remove_tree "$rootfs"
    bounded 300 "${podman[@]}" import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$1" >"$work/import.log" 2>&1 \
        || { tail -20 "$work/import.log"; fail "podman import of the base"; }
    rm -f "$work/rootfs.tar"
}
short_digest() { sha256sum | cut -c1-12; }
# The base's tag, keyed by the suite's Release file on the mirror and the code that makes it
# (after check_can_run).
base_image() {
    local key
    key=$({ echo "$suite minbase"; printf '%s\n' "$release"; declare -f make_base; } | short_digest)
    echo "localhost/debian:$suite-slim-$key"
}
# Makes the base unless the cache holds it (after lock_cache); says whether it did.
ensure_base() {   # $1: the tag
    if "${podman[@]}" image exists "$1"; then
        return 0
    fi
    say "debootstrap $suite (minbase) for $1"
    make_base "$1"
    return 1
}
