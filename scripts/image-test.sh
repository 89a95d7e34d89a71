#!/usr/bin/env bash
# The image test: builds Deploy/Dockerfile without a Docker engine and starts the image.
#
#   scripts/image-test.sh          (or: make image-test; .ci/run runs it after make test)
#
# 0. Whether it can run here: it needs root (debootstrap, podman) and a Debian mirror. Where it
#    cannot, it says so loudly and exits 77 (skipped), never 0; where it is required
#    (BACKHAUL_IMAGE_TEST=required, the default when CI=true) that is a failure instead.
# 1. hadolint on the Dockerfiles.
# 2. Base images made here, since nothing can be pulled: Debian bookworm from debootstrap
#    (minbase, trimmed like debian:bookworm-slim) in place of debian:bookworm-slim, and that base
#    plus the toolchain's packages in place of swift:6.3-bookworm, with the host's toolchain
#    mounted into the build. Both are cached between runs in a container storage of the container
#    tests' own (BACKHAUL_IMAGE_CACHE, default /var/cache/backhaul-image-test; scripts/deb-test.sh
#    installs the package in the same base), tagged with a key of what they were made from: the
#    suite's Release file on the mirror, the code that makes them (scripts/container-test-lib.sh,
#    make_builder below), Deploy/test/swift-builder.Dockerfile, the Swift version. Another key
#    makes them anew and the old ones are removed. BACKHAUL_IMAGE_FRESH=1 empties the cache first.
# 3. buildah bud of Deploy/Dockerfile (chroot isolation, vfs storage), timed.
# 4. The image's configuration: non-root user, HEALTHCHECK, state volume, entrypoint.
# 5. podman run with the hardening of Deploy/compose.yaml (read-only root, no capabilities,
#    no-new-privileges), the state on a named volume and a data directory at /data, then from
#    the outside: the health check, an upload made with the image's CLI to a sink on loopback,
#    its webhook verified by the independent standardwebhooks receiver, a download checked by
#    digest, and the tasks still there after the container is replaced.
# 6. The host's NetworkManager through a mounted bus: a private dbus-daemon on the host
#    with python-dbusmock's NetworkManager and ModemManager (Tests/peers/network-bus.py), a gsm
#    primary connection on it; the directory of its socket mounted read-only at /host/run/dbus as
#    Deploy/compose.yaml mounts the host's /run/dbus; the default --network-source (auto) must
#    read `networkmanager` and `cellular` through the API, and follow a change (roaming) pushed
#    over that bus. Without the mount the same image reads the routing table.
# Prints the build time and the image size at the end.
#
# Every step is bounded in time, and the whole run by BACKHAUL_IMAGE_TEST_LIMIT seconds (default
# 1800). Whatever way it ends (failure, timeout, SIGTERM), the trap removes the containers, the
# volume, the private bus and its mocks (killed, as a process group of their own: dbusmock does
# not always heed SIGTERM), buildah's working containers, the image under test
# (BACKHAUL_IMAGE_KEEP=1 keeps it) and dangling images, so the cache holds the two base images
# and nothing that grows run after run.
# One run at a time uses the cache (a lock, waited for at most BACKHAUL_IMAGE_LOCK_WAIT seconds).
# What the container tests share is in scripts/container-test-lib.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
test_name="image test"
test_variable=BACKHAUL_IMAGE_TEST
test_limit=${BACKHAUL_IMAGE_TEST_LIMIT:-1800}
status_file=${BACKHAUL_IMAGE_TEST_STATUS:-}   # .ci/run reads the outcome from here
untested="The container image (Deploy/Dockerfile) was NOT built or tested on this machine."
make_target=image-test
# shellcheck source=scripts/container-test-lib.sh
. scripts/container-test-lib.sh

# --- 0. can it run here? -------------------------------------------------------------------
check_can_run

# --- tools ---------------------------------------------------------------------------------
bounded 600 bash scripts/install-deps.sh --image || fail "installing buildah, podman, runc, debootstrap, hadolint, standardwebhooks, dbus-daemon, python-dbusmock"
command -v hadolint >/dev/null || fail "hadolint is not installed"
python3 -c 'import standardwebhooks' || fail "standardwebhooks is not installed"
/usr/bin/python3 -c 'import dbus, dbusmock' || fail "python-dbusmock (with Debian's python3-dbus) is not installed"
command -v dbus-daemon >/dev/null || fail "dbus-daemon is not installed"
command -v swift >/dev/null || fail "no swift on PATH (the build mounts the host's toolchain)"

swift_root=$(dirname "$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")")
swift_version=$(swift --version 2>&1 | sed -n 's/.*Swift version \([0-9.]*\).*/\1/p' | head -1)
image=localhost/backhauld:image-test
name=backhaul-image-test-$$
volume=$name-state
work=
peers=()
bus_pid=     # the private bus's process group (network-bus.py, dbus-daemon, the two mocks)
bus_run=()   # podman run's options that give the container that bus
exec 3>&1 4>&2   # the script's own output, for the trap: a signal can land while a step's is redirected
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    exec 1>&3 2>&4
    if [ -n "$stopped_by" ]; then
        printf '\nimage test FAILED: stopped by %s after %d s\n' "$stopped_by" $(($(date +%s) - started)) >&2
        note_status "failed: stopped by $stopped_by"
    fi
    # Only processes this script started and that are still its children (a pid can be reused).
    for pid in "${peers[@]}" $step; do
        [ "$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')" = $$ ] && kill "$pid" 2>/dev/null
    done
    [ -z "$bus_pid" ] || kill -9 -- "-$bus_pid" "$bus_pid" 2>/dev/null
    if [ -n "$locked" ]; then
        # This storage is the test's own and the lock is held: nothing in it belongs to another run.
        timeout 60 "${podman[@]}" rm -a -f -t 2 >/dev/null 2>&1
        timeout 60 "${podman[@]}" volume rm -a -f >/dev/null 2>&1
        timeout 60 "${buildah[@]}" rm --all >/dev/null 2>&1
        if [ "${BACKHAUL_IMAGE_KEEP:-0}" != 1 ]; then
            timeout 60 "${podman[@]}" rmi -f "$image" >/dev/null 2>&1
        fi
        timeout 60 "${podman[@]}" image prune -f >/dev/null 2>&1
        printf 'image test cache %s: %s\n' "$cache" "$(du -sh "$cache/storage" 2>/dev/null | cut -f1)"
        : >"$cache/lock.holder"
    fi
    [ -z "$work" ] || remove_tree "$work"
    exit "$rc"
}
stopped_by=
trap cleanup EXIT
trap 'stopped_by=SIGTERM; exit 143' TERM
trap 'stopped_by=SIGINT; exit 130' INT
trap 'stopped_by=SIGHUP; exit 129' HUP

lock_cache
work=$(mktemp -d /var/tmp/backhaul-image-test-XXXXXX)

# --- 1. lint -------------------------------------------------------------------------------
say "hadolint"
hadolint Deploy/Dockerfile Deploy/test/swift-builder.Dockerfile || fail "hadolint found problems in the Dockerfiles"

# --- 2. base images ------------------------------------------------------------------------
make_builder() {   # $1: the tag, $2: the base
    bounded 900 "${buildah[@]}" bud --isolation chroot --build-arg BASE_IMAGE="$2" \
        -f Deploy/test/swift-builder.Dockerfile -t "$1" Deploy/test >"$work/builder.log" 2>&1 \
        || { tail -30 "$work/builder.log"; fail "building the build image $1"; }
}
base=$(base_image)   # the Debian base (scripts/container-test-lib.sh)
base_key=${base##*-}
builder_key=$({ echo "$base_key $swift_version"; cat Deploy/test/swift-builder.Dockerfile; declare -f make_builder; } | short_digest)
builder=localhost/swift:$swift_version-$suite-$builder_key

# Not podman system reset: it would also remove the machine's network configuration.
empty_cache() {
    timeout 60 "${podman[@]}" rm -a -f -t 2 >/dev/null 2>&1 || true
    remove_tree "$cache/storage"
    remove_tree "$runroot"
    mkdir -p "$runroot"
}
if [ "${BACKHAUL_IMAGE_FRESH:-0}" = 1 ]; then
    say "BACKHAUL_IMAGE_FRESH=1: emptying the cache"
    empty_cache
fi
# Leftovers of an earlier run that was killed too hard for its trap, and images of other keys.
timeout 60 "${podman[@]}" rm -a -f -t 2 >/dev/null 2>&1 || true
timeout 60 "${buildah[@]}" rm --all >/dev/null 2>&1 || true
timeout 60 "${podman[@]}" volume rm -a -f >/dev/null 2>&1 || true
keep=$("${podman[@]}" image inspect --format '{{.Id}}' "$base" "$builder" 2>/dev/null || true)
for id in $("${podman[@]}" images -a -q --no-trunc 2>/dev/null | sed 's/^sha256://' | sort -u); do
    grep -q "$id" <<<"$keep" || timeout 60 "${podman[@]}" rmi -f "$id" >/dev/null 2>&1 || true
done
cache_mb=$(du -sm "$cache/storage" 2>/dev/null | cut -f1)
if [ "${cache_mb:-0}" -gt "${BACKHAUL_IMAGE_CACHE_MAX_MB:-6000}" ]; then
    say "the cache holds $cache_mb MB after pruning (more than ${BACKHAUL_IMAGE_CACHE_MAX_MB:-6000}): emptying it"
    empty_cache
fi

cache_state=warm
ensure_base "$base" || cache_state=cold
if ! "${podman[@]}" image exists "$builder"; then
    cache_state=cold
    say "the build image $builder (packages only; the toolchain at $swift_root is mounted)"
    make_builder "$builder" "$base"
fi
say "base images ready ($cache_state cache)"

# --- 3. the image --------------------------------------------------------------------------
# A machine that reaches GitHub through a local mirror (git's url.<dir>.insteadOf) lends the build
# that mirror and the git configuration naming it, so the package's dependencies resolve.
mirror=()
while read -r directory; do
    [ -d "$directory" ] && mirror+=(--volume "$directory:$directory:ro")
done < <(git config --system --get-regexp '^url\..*\.insteadof' 2>/dev/null |
    sed -E 's/^url\.(.*)\.insteadof .*/\1/' | sort -u)
[ ${#mirror[@]} -gt 0 ] && mirror+=(--volume /etc/gitconfig:/etc/gitconfig:ro)
say "buildah bud Deploy/Dockerfile"
build_started=$(date +%s)
# Each line of the build's log stamped with the seconds since the build started.
stamp() {
    local line now
    while IFS= read -r line; do
        printf -v now '%(%s)T' -1
        printf '%4d s %s\n' $((now - build_started)) "$line"
    done
}
export -f stamp
export build_started
bounded 1500 bash -c 'set -o pipefail; "$@" 2>&1 | stamp' stamped "${buildah[@]}" bud --isolation chroot --format docker \
    --volume "$swift_root:/opt/swift:ro" "${mirror[@]}" \
    --build-arg SWIFT_IMAGE="$builder" --build-arg RUNTIME_IMAGE="$base" \
    -f Deploy/Dockerfile -t "$image" . >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; fail "building the image from Deploy/Dockerfile (log above)"; }
build_seconds=$(($(date +%s) - build_started))
echo "where the build's time went (seconds since its start):"
grep -E '^ *[0-9]+ s (\[[0-9]+/[0-9]+\] )?(STEP|COMMIT)|Build of product' "$work/build.log" | cut -c1-110 || true
image_bytes=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
base_bytes=$("${podman[@]}" image inspect --format '{{.Size}}' "$base")

# --- 4. its configuration ------------------------------------------------------------------
say "image configuration"
config() { "${podman[@]}" image inspect --format "$1" "$image"; }
[ "$(config '{{.Config.User}}')" = "10001:10001" ] || fail "the image does not run as 10001: $(config '{{.Config.User}}')"
config '{{json .Config.Volumes}}' | grep -q '/var/lib/backhaul' || fail "no state volume"
config '{{json .HealthCheck}}' | grep -q healthz || fail "no HEALTHCHECK: $(config '{{json .HealthCheck}}')"
config '{{json .Config.Entrypoint}}' | grep -q backhauld || fail "entrypoint"

# --- 5. started ----------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api_port=$(free_port)
api=http://127.0.0.1:$api_port
data=$work/data
mkdir -p "$data" "$work/sink"
chmod 0777 "$data"   # the container's user (10001) writes downloads here
head -c 5000000 /dev/urandom >"$data/clip.bin"
head -c 3000000 /dev/urandom >"$work/firmware.bin"
chmod 0644 "$data/clip.bin"
bounded 60 "${podman[@]}" volume create "$volume" >/dev/null || fail "podman volume create"

# --health-interval disable: no systemd timer (there is no systemd here); the check itself is
# run below with podman healthcheck run.
start_container() {
    bounded 120 "${podman[@]}" run -d --name "$name" --network host \
        --read-only --cap-drop ALL --security-opt no-new-privileges \
        --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --health-interval disable \
        -e BACKHAUL_LISTEN="127.0.0.1:$api_port" "${bus_run[@]}" \
        -v "$volume:/var/lib/backhaul" -v "$data:/data" "$image" >/dev/null 2>>"$work/run.log" \
        || { cat "$work/run.log"; fail "podman run"; }
    local deadline=$(($(date +%s) + 30))
    until curl -fsS --max-time 5 "$api/healthz" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || { timeout 30 "${podman[@]}" logs "$name" 2>&1 | tail -20; fail "not healthy within 30 s"; }
        sleep 0.1
    done
}
say "podman run"
run_started=$(date +%s%N)
start_container
ready_ms=$((($(date +%s%N) - run_started) / 1000000))
bounded 30 "${podman[@]}" healthcheck run "$name" >/dev/null || fail "the image's HEALTHCHECK fails"
uid=$(bounded 30 "${podman[@]}" top "$name" huser | tail -1 | tr -d ' ') || fail "podman top"
[ "$uid" = 10001 ] || fail "backhauld runs as $uid on the host, not 10001"
# conmon writes the container's log behind it: wait (bounded) for the first line.
deadline_log=$(($(date +%s) + 20))
until bounded 30 "${podman[@]}" logs "$name" >"$work/container.log" 2>&1 && [ -s "$work/container.log" ]; do
    [ "$(date +%s)" -lt "$deadline_log" ] || fail "podman logs shows nothing within 20 s: $(cat "$work/container.log")"
    sleep 0.2
done
head -1 "$work/container.log" | python3 -c 'import json, sys; line = json.loads(sys.stdin.readline()); assert "level" in line and "msg" in line, line' \
    || fail "the log is not JSON lines; it begins: $(head -3 "$work/container.log")"

# Peers on loopback: an upload sink, a file server, the webhook receiver.
sink_port=$(free_port)
python3 - "$sink_port" "$work/sink" <<'EOF' &
import http.server, os, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        with open(os.path.join(sys.argv[2], os.path.basename(self.path)), "wb") as out:
            out.write(body)
        self.send_response(201); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
EOF
peers+=($!)
files_port=$(free_port)
mkdir -p "$work/served"
cp "$work/firmware.bin" "$work/served/"
python3 Tests/peers/download_server.py --port "$files_port" --root "$work/served" --log "$work/served.jsonl" &
peers+=($!)

api_call() { curl -sS --max-time 30 -X "$1" "$api$2" -H 'content-type: application/json' ${3:+-d "$3"}; }
json_field() { python3 -c 'import json, sys; value = json.load(sys.stdin); [value := value[key] for key in sys.argv[1:]]; print(value)' "$@"; }
# GET /v1/network as one line: source, type, interface, expensive, roaming, constrained.
network_line() {
    api_call GET /v1/network | python3 -c 'import json, sys; network = json.load(sys.stdin)
print(" ".join(f"{key}={network.get(key)}" for key in ("source", "type", "interface", "expensive", "roaming", "constrained")))'
}
# Without a bus (the variable names a socket that is not there) the routing table is read.
network_without_bus=$(network_line) || fail "GET /v1/network"
[[ $network_without_bus == "source=routing_table "* ]] || fail "with no bus mounted the network is not read from the routing table: $network_without_bus"
api_call PUT /v1/sessions/image '{}' >/dev/null || fail "PUT /v1/sessions/image"
hook_port=$(free_port)
secret=$(api_call POST /v1/sessions/image/webhooks \
    "{\"url\": \"http://127.0.0.1:$hook_port/hook\", \"events\": [\"task.completed\", \"task.failed\"]}" | json_field secret) \
    || fail "POST /v1/sessions/image/webhooks"
python3 Tests/peers/webhook_receiver.py --port "$hook_port" --secret "$secret" --log "$work/hooks.jsonl" >/dev/null &
peers+=($!)
for port in "$sink_port" "$files_port" "$hook_port"; do
    deadline_peer=$(($(date +%s) + 20))
    until curl -s --max-time 5 -o /dev/null "http://127.0.0.1:$port/"; do
        [ "$(date +%s)" -lt "$deadline_peer" ] || fail "peer on port $port did not start within 20 s"
        sleep 0.1
    done
done

say "an upload with the image's CLI, its webhook verified"
bounded 120 "${podman[@]}" exec -e BACKHAUL_URL="$api" "$name" \
    backhaul upload /data/clip.bin --to "http://127.0.0.1:$sink_port/clip.bin" --session image --wait --timeout 60 \
    || fail "backhaul upload --wait (the image's CLI)"
cmp "$data/clip.bin" "$work/sink/clip.bin" || fail "the upload arrived different"
deadline_hook=$(($(date +%s) + 30))
until grep -q '"task.completed"' "$work/hooks.jsonl" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline_hook" ] || fail "no task.completed webhook within 30 s"
    sleep 0.2
done
grep '"task.completed"' "$work/hooks.jsonl" | head -1 | grep -q '"verified_with": \[0\]' || fail "the webhook did not verify"

say "a download into /data, checked by digest"
digest=$(sha256sum "$work/firmware.bin" | cut -d' ' -f1)
download=$(api_call POST /v1/sessions/image/tasks "{\"kind\": \"download\",
    \"request\": {\"url\": \"http://127.0.0.1:$files_port/firmware.bin\"},
    \"destination\": \"/data/firmware.bin\", \"expected_sha256\": \"$digest\"}" | json_field id) \
    || fail "POST a download task"
deadline_download=$(($(date +%s) + 30))
until [ "$(api_call GET "/v1/tasks/$download" | json_field state)" = completed ]; do
    [ "$(date +%s)" -lt "$deadline_download" ] || fail "the download did not complete within 30 s: $(api_call GET "/v1/tasks/$download")"
    sleep 0.2
done
cmp "$work/firmware.bin" "$data/firmware.bin" || fail "the download differs"

say "the container replaced: state kept on the volume"
# (podman says it cannot remove a health check timer through systemd, which is not here: the
# log below keeps that noise and shows it only if a step fails.)
replace_container() {
    bounded 30 "${podman[@]}" stop -t 10 "$name" >/dev/null 2>>"$work/run.log" || { cat "$work/run.log"; fail "podman stop"; }
    bounded 30 "${podman[@]}" rm "$name" >/dev/null 2>>"$work/run.log" || { cat "$work/run.log"; fail "podman rm"; }
    start_container
}
replace_container
[ "$(api_call GET "/v1/tasks/$download" | json_field state)" = completed ] || fail "the task was lost with the container"
completed=$(api_call GET '/v1/sessions/image/tasks?state=completed' | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["tasks"]))')
[ "$completed" = 2 ] || fail "the completed tasks are not both listed after the restart"

# --- 6. the host's NetworkManager through the mounted bus ------------------------------------
say "the host's NetworkManager: a private bus's directory mounted at /host/run/dbus"
# The directory stands for the host's /run/dbus: the container's user (10001, no capabilities)
# must be able to enter it and connect to the socket, as it can the real one.
bus_dir=$work/dbus
mkdir -m 0755 "$bus_dir"
# network-bus.py starts dbus-daemon (its policy allows every user: sd-bus in the container
# authenticates by EXTERNAL as 10001, its uid on the host too) and the two mocks, then answers
# `ok` per JSON command. dbus-daemon refuses a uid whose groups it cannot look up, whatever its
# policy says, so a host must know the container's uid (docs/network.md): here the bus runs in a
# mount namespace of its own whose /etc/passwd and /etc/group have a user 10001, which leaves
# this machine's files alone. It leads a process group of its own (unshare and setsid without
# --fork keep the pid, and a script's child leads no group), so that the trap can kill the four
# processes together by that group's id.
cp /etc/passwd "$work/passwd"
cp /etc/group "$work/group"
echo 'backhaul:x:10001:10001::/nonexistent:/usr/sbin/nologin' >>"$work/passwd"
echo 'backhaul:x:10001:' >>"$work/group"
coproc bus {
    exec unshare --mount --propagation private sh -c 'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group \
        && exec setsid /usr/bin/python3 Tests/peers/network-bus.py --dir "$3"' bus "$work/passwd" "$work/group" "$bus_dir" \
        2>>"$work/bus.log"
}
bus_answer() {
    local reply
    IFS= read -r -t 30 reply <&"${bus[0]}" || { cat "$work/bus.log" >&2; fail "the private bus said nothing within 30 s ($1)"; }
    printf '%s\n' "$reply"
}
bus_command() {
    local reply
    printf '%s\n' "$1" >&"${bus[1]}"
    reply=$(bus_answer "$1")
    [ "$reply" = ok ] || { cat "$work/bus.log" >&2; fail "the private bus answered $1 with: $reply"; }
}
bus_pid=$bus_PID
address=$(bus_answer "its address")
[ "$(ps -o pgid= -p "$bus_pid" | tr -d ' ')" = "$bus_pid" ] || fail "the private bus does not lead a process group of its own"
[[ $address == "address unix:path=$bus_dir/system_bus_socket"* ]] || fail "the private bus is not at $bus_dir: $address"
# A gsm primary connection on a modem device (8) backed by ModemManager's modem, registered at home.
bus_command '{"op": "connect", "type": "gsm", "device_type": 8, "interface": "wwan0", "modem": true, "registration": 1}'
bus_run=(--volume "$bus_dir:/host/run/dbus:ro")
replace_container
wait_network() {   # $1: a pattern the line must match, $2: what it means
    local line deadline_network=$(($(date +%s) + 15))
    until line=$(network_line) && [[ $line == $1 ]]; do
        [ "$(date +%s)" -lt "$deadline_network" ] || {
            timeout 30 "${podman[@]}" logs "$name" 2>&1 | grep -i -E 'bus|network' | tail -10 >&2
            fail "$2 within 15 s: GET /v1/network reads $line"
        }
        sleep 0.1
    done
    printf '%s\n' "$line"
}
network_cellular=$(wait_network "source=networkmanager type=cellular interface=wwan0 *roaming=False*" \
    "the container does not read the host's NetworkManager (cellular, wwan0, at home)")
# A change on the host's bus reaches the container as a signal: the modem starts roaming (5).
bus_command '{"op": "set", "object": "modem3gpp", "name": "RegistrationState", "value": 5}'
network_roaming=$(wait_network "source=networkmanager type=cellular *roaming=True*" \
    "the modem's roaming did not reach the container")
bus_run=()
# The bus ends when its input closes: network-bus.py then kills its dbus-daemon and mocks.
bus_input=${bus[1]}
exec {bus_input}>&-
for _ in $(seq 50); do kill -0 "$bus_pid" 2>/dev/null || break; sleep 0.1; done
kill -9 -- "-$bus_pid" "$bus_pid" 2>/dev/null || true
wait "$bus_pid" 2>/dev/null || true
bus_pid=

mib() { python3 -c "print(f'{$1 / 1048576:.1f} MiB')"; }
total=$(($(date +%s) - started))
say "passed"
printf 'image %s: %s (its base %s; the build image and toolchain are not in it)\n' "$image" "$(mib "$image_bytes")" "$(mib "$base_bytes")"
printf 'network without a bus: %s\n' "$network_without_bus"
printf 'network through the mounted bus: %s\n' "$network_cellular"
printf '  after the modem roams:         %s\n' "$network_roaming"
printf 'build time %d s; ready %d ms after podman run; image test %d s in all (%s cache)\n' \
    "$build_seconds" "$ready_ms" "$total" "$cache_state"
note_status "passed: $total s, $cache_state cache, image built in $build_seconds s"
