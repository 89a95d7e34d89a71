#!/usr/bin/env bash
# Builds the Debian package of backhauld and the backhaul CLI (make deb), on Debian 12 (bookworm).
#
#   scripts/deb.sh       → .build/deb/backhaul_VERSION_ARCH.deb, then lintian on it
#
# The version is the code's one version, BackhaulVersion.string (Sources/BackhaulCore). The
# programs are the release build with the Swift standard library linked statically and debug
# information stripped (as in Deploy/Dockerfile); the package depends on the C libraries they
# link, as dpkg-shlibdeps finds them. What it installs:
#   /usr/bin/backhauld, /usr/bin/backhaul
#   /lib/systemd/system/backhauld.service   Deploy/systemd/backhauld.service, run from /usr/bin
#   /etc/backhaul/backhauld.json             a conffile (Deploy/debian/backhauld.json)
#   /var/spool/outbox                        the directory the unit lets the daemon upload from
# postinst makes the system user `backhaul` and /var/lib/backhaul (0700, its own); postrm
# removes that state on purge only (Deploy/debian/). scripts/deb-test.sh installs the package in
# a clean Debian container and starts it.
#
# The package is native (its version is the code's, with no Debian revision), so its Debian
# changelog is /usr/share/doc/backhaul/changelog.gz. The programs keep their symbol table, which
# lintian reports as unstripped: Deploy/debian/lintian-overrides says why.
# Reproducible: file times and the changelog's date are the last commit's (SOURCE_DATE_EPOCH).
# lintian's errors fail the build (DEB_LINTIAN=0 skips it); its warnings are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
SWIFT=${SWIFT:-swift}
out=.build/deb

versions=$(sed -n 's/^ *public static let string = "\([^"]*\)".*/\1/p' Sources/BackhaulCore/*.swift)
[ "$(wc -l <<<"$versions")" = 1 ] && [ -n "$versions" ] \
    || { echo "deb: not exactly one BackhaulVersion.string in Sources/BackhaulCore: '$versions'" >&2; exit 1; }
version=$versions
arch=$(dpkg --print-architecture)
package=$out/backhaul_${version}_$arch.deb
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

unit=Deploy/systemd/backhauld.service
grep -q '^ExecStart=/usr/local/bin/backhauld --config /etc/backhaul/backhauld.json ' "$unit" \
    || { echo "deb: $unit does not start /usr/local/bin/backhauld with --config /etc/backhaul/backhauld.json" >&2; exit 1; }

echo "== release build of backhauld and backhaul $version"
build_started=$(date +%s)
for product in backhauld backhaul; do
    "$SWIFT" build -c release --static-swift-stdlib -Xlinker --strip-debug --product "$product"
done
bin=$("$SWIFT" build -c release --show-bin-path)
echo "release build: $(($(date +%s) - build_started)) s"

rm -rf "$out/root"
root=$out/root
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/backhaul" \
    "$root/usr/share/doc/backhaul" "$root/usr/share/lintian/overrides" "$root/var/spool/outbox" \
    "$root/usr/share/man/man1" "$root/usr/share/man/man8"
install -m 0755 "$bin/backhauld" "$bin/backhaul" "$root/usr/bin/"
# The unit as the repository has it, with the programs where the package puts them.
sed -e 's|/usr/local/bin/|/usr/bin/|g' \
    -e '1s|^# /etc/systemd/system/backhauld.service$|# /lib/systemd/system/backhauld.service (the backhaul package; override in /etc/systemd/system)|' \
    "$unit" >"$root/lib/systemd/system/backhauld.service"
chmod 0644 "$root/lib/systemd/system/backhauld.service"
# The manual pages are the programs' own --help and --version (help2man), so they say what the
# settings table says; dated by SOURCE_DATE_EPOCH.
help2man --no-info --section 8 --name "background upload daemon: hands files to servers and finishes them" \
    "$bin/backhauld" | gzip -9n >"$root/usr/share/man/man8/backhauld.8.gz"
help2man --no-info --section 1 --name "hand uploads to backhauld and follow them" \
    "$bin/backhaul" | gzip -9n >"$root/usr/share/man/man1/backhaul.1.gz"
chmod 0644 "$root/usr/share/man/man8/backhauld.8.gz" "$root/usr/share/man/man1/backhaul.1.gz"
install -m 0644 Deploy/debian/backhauld.json "$root/etc/backhaul/backhauld.json"
install -m 0644 Deploy/debian/copyright "$root/usr/share/doc/backhaul/copyright"
install -m 0644 Deploy/debian/lintian-overrides "$root/usr/share/lintian/overrides/backhaul"
{
    printf 'backhaul (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * backhauld and backhaul %s (the changes: CHANGELOG.md in the repository).\n\n' "$version"
    printf ' -- Backhaul maintainers <maintainers@users.noreply.a-seed-470f7474.example>  %s\n' \
        "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$root/usr/share/doc/backhaul/changelog.gz"
chmod 0644 "$root/usr/share/doc/backhaul/changelog.gz"
install -m 0755 Deploy/debian/postinst Deploy/debian/prerm Deploy/debian/postrm "$root/DEBIAN/"
echo /etc/backhaul/backhauld.json >"$root/DEBIAN/conffiles"

# The libraries the two programs link, as the packages that hold them (dpkg-shlibdeps reads a
# debian/control of the source, which a scratch directory stands in for).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/debian"
printf 'Source: backhaul\n\nPackage: backhaul\nArchitecture: any\n' >"$scratch/debian/control"
depends=$(cd "$scratch" && dpkg-shlibdeps -O "$OLDPWD/$root/usr/bin/backhauld" "$OLDPWD/$root/usr/bin/backhaul" |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@SIZE@|$size|" -e "s|@DEPENDS@|$depends|" \
    Deploy/debian/control >"$root/DEBIAN/control"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -f "$out"/backhaul_*.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$package" >/dev/null
echo "== $package: $(du -k "$package" | cut -f1) KiB (installed $size KiB)"
dpkg-deb --field "$package" Package Version Architecture Depends

if [ "${DEB_LINTIAN:-1}" != 0 ]; then
    command -v lintian >/dev/null || { echo "deb: lintian is not installed (apt-get install lintian; DEB_LINTIAN=0 skips it)" >&2; exit 1; }
    echo "== lintian"
    lintian --fail-on error "$package" || { echo "deb: lintian found errors" >&2; exit 1; }
    echo "lintian: no errors"
fi
