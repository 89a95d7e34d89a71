#!/usr/bin/env bash
# The image test: builds Deploy/Dockerfile without a Docker engine and starts the image.
#
#   scripts/image-test.sh          (or: make image-test)
#
# 1. hadolint on the Dockerfiles.
# 2. Base images made here, since nothing can be pulled: Debian bookworm from debootstrap
#    (minbase, trimmed like debian:bookworm-slim) in place of debian:bookworm-slim, and that base
#    plus the toolchain's packages in place of swift:6.3-bookworm, with the host's toolchain
#    mounted into the build. Both are kept between runs; BACKHAUL_IMAGE_FRESH=1 remakes them.
# 3. buildah bud of Deploy/Dockerfile (chroot isolation, vfs storage), timed.
# 4. The image's configuration: non-root user, HEALTHCHECK, state volume, entrypoint.
# 5. podman run with the hardening of Deploy/compose.yaml (read-only root, no capabilities,
#    no-new-privileges), the state on a named volume and a data directory at /data, then from
#    the outside: the health check, an upload made with the image's CLI to a sink on loopback,
#    its webhook verified by the independent standardwebhooks receiver, a download checked by
#    digest, and the tasks still there after the container is replaced.
# Prints the build time and the image size at the end. Every wait is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { printf '== %s (%ds)\n' "$*" $(($(date +%s) - started)); }
fail() { printf 'image test FAILED: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- tools ---------------------------------------------------------------------------------
bash scripts/install-deps.sh --image
command -v hadolint >/dev/null || fail "hadolint is not installed"
python3 -c 'import standardwebhooks' || fail "standardwebhooks is not installed"

storage=(--storage-driver vfs)
buildah=(buildah "${storage[@]}")
podman=(podman "${storage[@]}" --cgroup-manager cgroupfs --runtime runc)
swift_root=$(dirname "$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")")
swift_version=$(swift --version 2>&1 | sed -n 's/.*Swift version \([0-9.]*\).*/\1/p' | head -1)
base=localhost/debian:bookworm-slim
builder=localhost/swift:${swift_version}-bookworm
image=localhost/backhauld:image-test
work=$(mktemp -d /var/tmp/backhaul-image-test-XXXXXX)
name=backhaul-image-test-$$
volume=$name-state
peers=()
cleanup() {
    "${podman[@]}" rm -f -t 2 "$name" >/dev/null 2>&1 || true
    "${podman[@]}" volume rm -f "$volume" >/dev/null 2>&1 || true
    for pid in "${peers[@]}"; do kill "$pid" 2>/dev/null || true; done
    as_root rm -rf "$work"
}
trap cleanup EXIT

# --- 1. lint -------------------------------------------------------------------------------
say "hadolint"
hadolint Deploy/Dockerfile Deploy/test/swift-builder.Dockerfile

# --- 2. base images ------------------------------------------------------------------------
if [ "${BACKHAUL_IMAGE_FRESH:-0}" = 1 ]; then
    "${podman[@]}" rmi -f "$image" "$builder" "$base" >/dev/null 2>&1 || true
fi
if ! "${podman[@]}" image exists "$base"; then
    say "debootstrap bookworm (minbase) for $base"
    rootfs=$work/rootfs
    as_root debootstrap --variant=minbase bookworm "$rootfs" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
    # What debian:bookworm-slim leaves out: documentation, manuals, translations, apt's caches;
    # the dpkg excludes and apt settings below keep later installs as small.
    as_root rm -rf "$rootfs"/usr/share/{doc,man,info,locale}/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
    as_root tee "$rootfs/etc/dpkg/dpkg.cfg.d/slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    as_root tee "$rootfs/etc/apt/apt.conf.d/slim" >/dev/null <<'EOF'
APT::Keep-Downloaded-Packages "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    as_root tar -C "$rootfs" -c . | "${podman[@]}" import --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
    as_root rm -rf "$rootfs"
fi
if ! "${podman[@]}" image exists "$builder"; then
    say "the build image $builder (packages only; the toolchain at $swift_root is mounted)"
    "${buildah[@]}" bud --isolation chroot --build-arg BASE_IMAGE="$base" \
        -f Deploy/test/swift-builder.Dockerfile -t "$builder" Deploy/test >"$work/builder.log" 2>&1 \
        || { tail -30 "$work/builder.log"; fail "building $builder"; }
fi

# --- 3. the image --------------------------------------------------------------------------
# A machine that reaches GitHub through a local mirror (git's url.<dir>.insteadOf) lends the build
# that mirror and the git configuration naming it, so the package's dependencies resolve.
mirror=()
while read -r key _; do
    directory=${key#url.}
    directory=${directory%.insteadof}
    [ -d "$directory" ] && mirror+=(--volume "$directory:$directory:ro")
done < <(git config --system --get-regexp '^url\..*\.insteadof' 2>/dev/null | sort -u)
[ ${#mirror[@]} -gt 0 ] && mirror+=(--volume /etc/gitconfig:/etc/gitconfig:ro)
say "buildah bud Deploy/Dockerfile"
"${podman[@]}" rmi -f "$image" >/dev/null 2>&1 || true   # no dangling copy of the last run's image
build_started=$(date +%s)
"${buildah[@]}" bud --isolation chroot --format docker \
    --volume "$swift_root:/opt/swift:ro" "${mirror[@]}" \
    --build-arg SWIFT_IMAGE="$builder" --build-arg RUNTIME_IMAGE="$base" \
    -f Deploy/Dockerfile -t "$image" . >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; fail "building the image"; }
build_seconds=$(($(date +%s) - build_started))
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
"${podman[@]}" volume create "$volume" >/dev/null

start_container() {
    "${podman[@]}" run -d --name "$name" --network host \
        --read-only --cap-drop ALL --security-opt no-new-privileges \
        --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
        -e BACKHAUL_LISTEN="127.0.0.1:$api_port" \
        -v "$volume:/var/lib/backhaul" -v "$data:/data" "$image" >/dev/null 2>>"$work/run.log" \
        || { cat "$work/run.log"; fail "podman run"; }
    local deadline=$(($(date +%s) + 30))
    until curl -fsS "$api/healthz" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || { "${podman[@]}" logs "$name" | tail -20; fail "not healthy within 30 s"; }
        sleep 0.1
    done
}
say "podman run"
run_started=$(date +%s%N)
start_container
ready_ms=$((($(date +%s%N) - run_started) / 1000000))
"${podman[@]}" healthcheck run "$name" >/dev/null || fail "the image's HEALTHCHECK fails"
uid=$("${podman[@]}" top "$name" huser | tail -1 | tr -d ' ')
[ "$uid" = 10001 ] || fail "backhauld runs as $uid on the host, not 10001"
"${podman[@]}" logs "$name" 2>&1 | head -1 | python3 -c 'import json, sys; line = json.loads(sys.stdin.readline()); assert "level" in line and "msg" in line, line' \
    || fail "the log is not JSON lines"

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

api_call() { curl -sS -X "$1" "$api$2" -H 'content-type: application/json' ${3:+-d "$3"}; }
json_field() { python3 -c 'import json, sys; value = json.load(sys.stdin); [value := value[key] for key in sys.argv[1:]]; print(value)' "$@"; }
api_call PUT /v1/sessions/image '{}' >/dev/null
hook_port=$(free_port)
secret=$(api_call POST /v1/sessions/image/webhooks \
    "{\"url\": \"http://127.0.0.1:$hook_port/hook\", \"events\": [\"task.completed\", \"task.failed\"]}" | json_field secret)
python3 Tests/peers/webhook_receiver.py --port "$hook_port" --secret "$secret" --log "$work/hooks.jsonl" >/dev/null &
peers+=($!)
for port in "$sink_port" "$files_port" "$hook_port"; do
    deadline=$(($(date +%s) + 20))
    until curl -s -o /dev/null "http://127.0.0.1:$port/"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "peer on port $port did not start"
        sleep 0.1
    done
done

say "an upload with the image's CLI, its webhook verified"
"${podman[@]}" exec -e BACKHAUL_URL="$api" "$name" \
    backhaul upload /data/clip.bin --to "http://127.0.0.1:$sink_port/clip.bin" --session image --wait --timeout 60 \
    || fail "backhaul upload --wait"
cmp "$data/clip.bin" "$work/sink/clip.bin" || fail "the upload arrived different"
deadline=$(($(date +%s) + 30))
until grep -q '"task.completed"' "$work/hooks.jsonl" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no task.completed webhook within 30 s"
    sleep 0.2
done
grep '"task.completed"' "$work/hooks.jsonl" | head -1 | grep -q '"verified_with": \[0\]' || fail "the webhook did not verify"

say "a download into /data, checked by digest"
digest=$(sha256sum "$work/firmware.bin" | cut -d' ' -f1)
download=$(api_call POST /v1/sessions/image/tasks "{\"kind\": \"download\",
    \"request\": {\"url\": \"http://127.0.0.1:$files_port/firmware.bin\"},
    \"destination\": \"/data/firmware.bin\", \"expected_sha256\": \"$digest\"}" | json_field id)
deadline=$(($(date +%s) + 30))
until [ "$(api_call GET "/v1/tasks/$download" | json_field state)" = completed ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the download did not complete: $(api_call GET "/v1/tasks/$download")"
    sleep 0.2
done
cmp "$work/firmware.bin" "$data/firmware.bin" || fail "the download differs"

say "the container replaced: state kept on the volume"
"${podman[@]}" stop -t 10 "$name" >/dev/null
"${podman[@]}" rm "$name" >/dev/null
start_container
[ "$(api_call GET "/v1/tasks/$download" | json_field state)" = completed ] || fail "the task was lost with the container"
completed=$(api_call GET '/v1/sessions/image/tasks?state=completed' | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["tasks"]))')
[ "$completed" = 2 ] || fail "the completed tasks are not both listed after the restart"

mib() { python3 -c "print(f'{$1 / 1048576:.1f} MiB')"; }
say "passed"
printf 'image %s: %s (its base %s; the build image and toolchain are not in it)\n' "$image" "$(mib "$image_bytes")" "$(mib "$base_bytes")"
printf 'build time %d s; ready %d ms after podman run; image test %d s in all\n' \
    "$build_seconds" "$ready_ms" $(($(date +%s) - started))
