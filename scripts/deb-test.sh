#!/usr/bin/env bash
# The package test: builds the Debian package (scripts/deb.sh) and installs it with apt in a
# clean Debian bookworm container, then checks what it installed and runs it.
#
#   scripts/deb-test.sh          (or: make deb-test; .ci/run runs it after the image test)
#
# 0. Whether it can run here, as the image test decides it (scripts/container-test-lib.sh): root
#    and a Debian mirror, else SKIPPED (exit 77), a failure where it is required
#    (BACKHAUL_DEB_TEST=required, the default when CI=true).
# 1. make deb: the release build, the package, lintian (no errors).
# 2. The base image the image test uses (debootstrap, cached in BACKHAUL_IMAGE_CACHE): a
#    container of it with nothing else installed, on the host's network for apt.
# 3. apt-get install of the .deb, its Depends from the mirror; then: `backhaul --version` and
#    `backhauld --version` print the code's version; the system user; /var/lib/backhaul its own
#    and 0700; the conffile; the unit in /lib/systemd/system, and `systemd-analyze verify` on it
#    (systemd installed in the container for that: it is not PID 1 there, so the unit is not
#    started by systemd).
# 4. backhauld started as the unit starts it: its ExecStart line, read from the installed unit,
#    run as its User=; /healthz answers 200 and GET /v1/info names the version. The unit lets the
#    daemon write in its allowed root (ReadWritePaths=, not ReadOnlyPaths=), and an upload from
#    /var/spool/outbox with delete_file_on_success, to a sink on the host, arrives whole and the
#    file is gone from the outbox after it.
# 5. A second install of the same package (postinst again: the user is kept as it was); apt-get
#    remove keeps the state, apt-get purge removes it (the user stays).
# Every step is bounded in time, the whole run by BACKHAUL_DEB_TEST_LIMIT seconds (default 1200).
# The trap removes the container whatever way the run ends; the cache keeps the base only.
set -euo pipefail
cd "$(dirname "$0")/.."
test_name="package test"
test_variable=BACKHAUL_DEB_TEST
test_limit=${BACKHAUL_DEB_TEST_LIMIT:-1200}
status_file=${BACKHAUL_DEB_TEST_STATUS:-}   # .ci/run reads the outcome from here
untested="The Debian package (make deb) was NOT installed or tested on this machine."
make_target=deb-test
# shellcheck source=scripts/container-test-lib.sh
. scripts/container-test-lib.sh

# --- 0. can it run here? -------------------------------------------------------------------
check_can_run
bounded 600 bash scripts/install-deps.sh --image || fail "installing podman, debootstrap, lintian, dpkg-dev"

name=backhaul-deb-test-$$
work=
sink_pid=
exec 3>&1 4>&2   # the script's own output, for the trap
stopped_by=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    exec 1>&3 2>&4
    if [ -n "$stopped_by" ]; then
        printf '\n%s FAILED: stopped by %s after %d s\n' "$test_name" "$stopped_by" $(($(date +%s) - started)) >&2
        note_status "failed: stopped by $stopped_by"
    fi
    [ -z "$step" ] || kill "$step" 2>/dev/null
    [ -z "$sink_pid" ] || kill "$sink_pid" 2>/dev/null
    if [ -n "$locked" ]; then
        timeout 60 "${podman[@]}" rm -f -t 2 "$name" >/dev/null 2>&1
        : >"$cache/lock.holder"
    fi
    [ -z "$work" ] || remove_tree "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'stopped_by=SIGTERM; exit 143' TERM
trap 'stopped_by=SIGINT; exit 130' INT
trap 'stopped_by=SIGHUP; exit 129' HUP

work=$(mktemp -d /var/tmp/backhaul-deb-test-XXXXXX)

# --- 1. the package (before the cache's lock: the build needs no container) ------------------
say "make deb (scripts/deb.sh)"
bounded 1500 bash scripts/deb.sh >"$work/deb.log" 2>&1 || { tail -40 "$work/deb.log"; fail "make deb"; }
sed -n '/^== lintian/,$p' "$work/deb.log"
package=$(ls .build/deb/backhaul_*.deb)
version=$(dpkg-deb --field "$package" Version)
package_kib=$(du -k "$package" | cut -f1)
installed_kib=$(dpkg-deb --field "$package" Installed-Size)

# --- 2. a clean Debian container -------------------------------------------------------------
lock_cache
base=$(base_image)
cache_state=warm
ensure_base "$base" || cache_state=cold
say "a container of $base ($cache_state cache)"
# The host's network: apt reaches the mirror, and the daemon's port is the host's loopback.
# The same limits as the image test's containers (podman's defaults may exceed this process's).
bounded 120 "${podman[@]}" run -d --name "$name" --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
    -v "$PWD/.build/deb:/packages:ro" "$base" sleep infinity >/dev/null 2>"$work/run.log" \
    || { cat "$work/run.log"; fail "podman run"; }
inside() { bounded "$1" "${podman[@]}" exec "${@:2}"; }
in_container() { local limit=$1; shift; inside "$limit" "$name" "$@"; }

# --- 3. apt-get install ----------------------------------------------------------------------
say "apt-get install ./$(basename "$package")"
in_container 300 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$1"' \
    install "/packages/$(basename "$package")" >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log"; fail "apt-get install of the package"; }
echo "apt installed $(grep -c '^Setting up' "$work/apt.log") packages: $(sed -n 's/^Setting up \([^ :]*\).*/\1/p' "$work/apt.log" | tr '\n' ' ')"
in_container 30 dpkg-query -W -f='${Status}\n' backhaul | grep -qx 'install ok installed' || fail "dpkg does not list backhaul as installed"

printed=$(in_container 30 backhaul --version) || fail "backhaul --version"
[ "$printed" = "backhaul $version" ] || fail "backhaul --version prints '$printed', not 'backhaul $version'"
daemon_printed=$(in_container 30 backhauld --version) || fail "backhauld --version"
[[ $daemon_printed == *"$version"* ]] || fail "backhauld --version prints '$daemon_printed', without $version"
echo "backhaul --version: $printed; backhauld --version: $daemon_printed"

user=$(in_container 30 getent passwd backhaul) || fail "postinst made no user backhaul"
uid=$(cut -d: -f3 <<<"$user")
[ "$uid" -lt 1000 ] || fail "backhaul is not a system user: $user"
[[ $user == *:/var/lib/backhaul:/usr/sbin/nologin ]] || fail "the user's home or shell: $user"
state=$(in_container 30 stat -c '%U:%G %a' /var/lib/backhaul) || fail "no /var/lib/backhaul"
[ "$state" = "backhaul:backhaul 700" ] || fail "/var/lib/backhaul is $state, not backhaul:backhaul 700"
in_container 30 dpkg-query -W -f='${Conffiles}\n' backhaul | grep -q '^ /etc/backhaul/backhauld.json ' \
    || fail "/etc/backhaul/backhauld.json is not a conffile"
unit=/lib/systemd/system/backhauld.service
in_container 30 test -f "$unit" || fail "no $unit"
outbox=$(in_container 30 stat -c '%U:%G %a' /var/spool/outbox) || fail "no /var/spool/outbox"
[ "$outbox" = "root:backhaul 2775" ] || fail "/var/spool/outbox is $outbox, not root:backhaul 2775 (the group drops files there)"
echo "user: $user; state: /var/lib/backhaul $state; outbox $outbox; conffile /etc/backhaul/backhauld.json"

say "systemd-analyze verify $unit"
in_container 300 sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd' >"$work/systemd.log" 2>&1 \
    || { tail -20 "$work/systemd.log"; fail "apt-get install systemd (for systemd-analyze)"; }
# verify also loads the units the unit names (network-online.target, multi-user.target).
in_container 60 systemd-analyze verify "$unit" >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "systemd-analyze verify $unit"; }
if [ -s "$work/verify.log" ]; then
    cat "$work/verify.log"
    fail "systemd-analyze verify $unit printed warnings"
fi
echo "systemd-analyze verify: clean"

# --- 4. backhauld as the unit starts it -------------------------------------------------------
exec_start=$(in_container 30 sed -n 's/^ExecStart=//p' "$unit") || fail "reading $unit"
run_as=$(in_container 30 sed -n 's/^User=//p' "$unit")
[ -n "$exec_start" ] && [ "$run_as" = backhaul ] || fail "the unit's ExecStart ($exec_start) or User ($run_as)"
# Every directory the unit names must exist: a missing ReadOnlyPaths= stops the unit from starting.
for path in $(in_container 30 sed -n 's/^\(ReadOnlyPaths\|ReadWritePaths\)=//p' "$unit"); do
    in_container 30 test -d "$path" || fail "the unit names $path, which the package does not make"
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "as $run_as: $exec_start (listening on 127.0.0.1:$port)"
# The conffile says 127.0.0.1:8427; BACKHAUL_LISTEN (which beats the file) picks a free port, as
# another daemon may hold 8427 on this machine.
inside 30 -d --user "$run_as" -e BACKHAUL_LISTEN="127.0.0.1:$port" "$name" sh -c "exec $exec_start >/tmp/backhauld.log 2>&1" \
    >/dev/null || fail "starting backhauld"
deadline_ready=$(($(date +%s) + 20))
until code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/healthz") && [ "$code" = 200 ]; do
    [ "$(date +%s)" -lt "$deadline_ready" ] || { in_container 30 cat /tmp/backhauld.log; fail "/healthz did not answer 200 within 20 s (last: $code)"; }
    sleep 0.1
done
info_version=$(curl -fsS --max-time 5 "http://127.0.0.1:$port/v1/info" | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])') \
    || fail "GET /v1/info"
[ "$info_version" = "$version" ] || fail "GET /v1/info says version $info_version"
# The daemon's process inside the container, by its /proc entry (no procps in the base).
daemon_pid=$(in_container 30 sh -c 'for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = backhauld ] && echo "${p#/proc/}"; done; true')
[ "$(wc -w <<<"$daemon_pid")" = 1 ] || fail "not one backhauld process in the container: '$daemon_pid'"
daemon_user=$(in_container 30 stat -c %U "/proc/$daemon_pid")
[ "$daemon_user" = "$run_as" ] || fail "backhauld runs as '$daemon_user', not $run_as"
in_container 30 sh -c 'ls -A /var/lib/backhaul | grep -q .' || fail "backhauld wrote no state in /var/lib/backhaul"
echo "healthz 200; /v1/info version $info_version; backhauld runs as $daemon_user; state in /var/lib/backhaul"

say "delete_file_on_success from the outbox"
# The unit's sandbox must let the daemon remove files in its allowed root (the container has no
# systemd to apply it: the unit is read for it).
allowed_root=$(sed -n 's/.*--allow-root \([^ ]*\).*/\1/p' <<<"$exec_start")
[ -n "$allowed_root" ] || fail "the unit's ExecStart names no --allow-root: $exec_start"
writable=$(in_container 30 sed -n 's/^ReadWritePaths=//p' "$unit")
[[ " $writable " == *" $allowed_root "* ]] || fail "the unit's ReadWritePaths= ($writable) leaves out the allowed root $allowed_root"
! in_container 30 grep -q "^ReadOnlyPaths=.*$allowed_root" "$unit" || fail "the unit makes $allowed_root read-only"
# A sink on the host (the container shares its network) that keeps the body it gets.
sink_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -c '
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with open(sys.argv[2], "wb") as received:
            received.write(body)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *arguments):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
' "$sink_port" "$work/received.bin" &
sink_pid=$!
# Dropped by root, as a member of the group backhaul would: the setgid outbox gives it the group.
in_container 30 sh -c "head -c 300000 /dev/urandom >$allowed_root/deb-test.bin && chmod 0640 $allowed_root/deb-test.bin" \
    || fail "writing a file in $allowed_root"
sent_sum=$(in_container 30 sha256sum "$allowed_root/deb-test.bin" | cut -d' ' -f1)
api() { curl -fsS --max-time 10 -X "$1" -H 'Content-Type: application/json' "http://127.0.0.1:$port$2" ${3:+--data "$3"}; }
api PUT /v1/sessions/deb-test '{"configuration": {}}' >/dev/null || fail "PUT /v1/sessions/deb-test"
task_id=$(api POST /v1/sessions/deb-test/tasks "{\"file\": \"$allowed_root/deb-test.bin\", \"delete_file_on_success\": true,
    \"request\": {\"url\": \"http://127.0.0.1:$sink_port/deb-test.bin\", \"method\": \"PUT\"}}" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])') || fail "POST a task with delete_file_on_success"
deadline_task=$(($(date +%s) + 30))
until task_state=$(api GET "/v1/tasks/$task_id" | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])') \
    && [ "$task_state" = completed ]; do
    [ "$(date +%s)" -lt "$deadline_task" ] || { api GET "/v1/tasks/$task_id"; fail "the upload is $task_state after 30 s"; }
    sleep 0.2
done
[ "$(sha256sum "$work/received.bin" | cut -d' ' -f1)" = "$sent_sum" ] || fail "the sink did not get the file's bytes"
deadline_gone=$(($(date +%s) + 10))
while in_container 30 test -e "$allowed_root/deb-test.bin"; do
    [ "$(date +%s)" -lt "$deadline_gone" ] || { api GET "/v1/tasks/$task_id"; fail "delete_file_on_success left $allowed_root/deb-test.bin"; }
    sleep 0.2
done
kill "$sink_pid" 2>/dev/null
sink_pid=
echo "delete_file_on_success: 300000 bytes arrived, $allowed_root/deb-test.bin removed by $run_as"
in_container 30 sh -c 'kill -TERM "$1"' stop "$daemon_pid" || fail "stopping backhauld"
deadline_stop=$(($(date +%s) + 30))
while in_container 30 test -d "/proc/$daemon_pid"; do
    [ "$(date +%s)" -lt "$deadline_stop" ] || fail "backhauld did not stop within 30 s of SIGTERM"
    sleep 0.2
done

# --- 5. again, remove, purge -------------------------------------------------------------------
say "a second install, remove, purge"
in_container 120 apt-get install -y -q --reinstall "/packages/$(basename "$package")" >>"$work/apt.log" 2>&1 \
    || { tail -20 "$work/apt.log"; fail "installing the package a second time"; }
[ "$(in_container 30 getent passwd backhaul)" = "$user" ] || fail "the second install changed the user: $(in_container 30 getent passwd backhaul)"
in_container 120 apt-get remove -y -q backhaul >>"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log"; fail "apt-get remove"; }
in_container 30 test -d /var/lib/backhaul || fail "apt-get remove removed the state"
in_container 30 test -f /etc/backhaul/backhauld.json || fail "apt-get remove removed the conffile"
in_container 120 apt-get purge -y -q backhaul >>"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log"; fail "apt-get purge"; }
! in_container 30 test -e /var/lib/backhaul || fail "apt-get purge left /var/lib/backhaul"
! in_container 30 test -e /etc/backhaul/backhauld.json || fail "apt-get purge left the conffile"
in_container 30 getent passwd backhaul >/dev/null || fail "apt-get purge removed the user (Debian keeps system users)"

say "passed"
printf 'package %s: %d KiB (%d KiB installed); Depends: %s\n' "$(basename "$package")" "$package_kib" "$installed_kib" \
    "$(dpkg-deb --field "$package" Depends)"
note_status "passed: $(($(date +%s) - started)) s, $(basename "$package") $package_kib KiB"
