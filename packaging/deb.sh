#!/usr/bin/env bash
# Build target/debian/sandboxd_<version>_<arch>.deb with dpkg-deb from the release
# build: both binaries, libsandboxd.so, the systemd unit (with a drop-in that builds
# the rootfs on first start), the policies, sysusers.d, tmpfiles.d and the rootfs
# recipe. dpkg-deb rather than cargo-deb: it is on every Debian and Ubuntu host
# already, where cargo-deb is one more long `cargo install` for CI and users.
#
#   packaging/deb.sh            (after cargo build --release; `make deb` does both)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
say() { printf '[deb] %s\n' "$*" >&2; }
for f in target/release/sandboxd target/release/sandboxctl target/release/libsandboxd.so; do
  [ -f "$f" ] || { say "$f is missing: run cargo build --release --locked first (make deb does)"; exit 1; }
done
command -v dpkg-deb >/dev/null || { say "dpkg-deb is missing: apt-get install dpkg"; exit 1; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
# The newest glibc symbol version the binaries use is the oldest libc6 they run on.
glibc=$(for f in target/release/sandboxd target/release/sandboxctl target/release/libsandboxd.so; do
  LC_ALL=C od -An -c "$f" | tr -d ' \n' | grep -o 'GLIBC_2\.[0-9]*' ; done | sort -Vu | tail -1)
glibc=${glibc#GLIBC_}

mkdir -p target
stage=$(mktemp -d target/debian-stage-XXXXXX)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 target/release/sandboxd "$stage/usr/bin/sandboxd"
install -D -m 0755 target/release/sandboxctl "$stage/usr/bin/sandboxctl"
install -D -m 0644 target/release/libsandboxd.so "$stage/usr/lib/sandboxd/libsandboxd.so"
install -d "$stage/etc/sandboxd/policies"
install -m 0644 policies/*.toml "$stage/etc/sandboxd/policies/"
# The unit as in systemd/, with the binary where the package puts it.
install -d "$stage/usr/lib/systemd/system/sandboxd.service.d"
sed 's|^ExecStart=/usr/local/bin/sandboxd|ExecStart=/usr/bin/sandboxd|' systemd/sandboxd.service \
  >"$stage/usr/lib/systemd/system/sandboxd.service"
install -m 0644 packaging/debian/rootfs.conf "$stage/usr/lib/systemd/system/sandboxd.service.d/rootfs.conf"
install -D -m 0644 systemd/sandboxd.sysusers "$stage/usr/lib/sysusers.d/sandboxd.conf"
install -D -m 0644 systemd/sandboxd.tmpfiles "$stage/usr/lib/tmpfiles.d/sandboxd.conf"
# The rootfs recipe: the unit builds the rootfs from it on first start.
install -d "$stage/usr/share/sandboxd/rootfs/support"
install -m 0755 rootfs/build.sh "$stage/usr/share/sandboxd/rootfs/build.sh"
install -m 0644 rootfs/packages.txt rootfs/requirements.lock "$stage/usr/share/sandboxd/rootfs/"
install -m 0644 rootfs/support/runner.py rootfs/support/sandboxd_runner.py rootfs/support/sandboxd_outcome.py \
  rootfs/support/sandboxd_install.py rootfs/support/sandboxd_installer.py rootfs/support/sitecustomize.py "$stage/usr/share/sandboxd/rootfs/support/"
# Every file the recipe reads must be in the package: a missing one fails the
# unit's first start, on the user's machine (fresh_host.sh step 5 found one so).
for f in $(grep -o '\$here/[A-Za-z0-9_./-]*' rootfs/build.sh | sort -u); do
  [ -e "$stage/usr/share/sandboxd/rootfs/${f#\$here/}" ] \
    || { echo "deb: rootfs/${f#\$here/} (rootfs/build.sh reads it) is not in the package: add it above" >&2; exit 1; }
done
install -D -m 0644 README.md "$stage/usr/share/doc/sandboxd/README.md"

install -d "$stage/DEBIAN"
for s in postinst prerm postrm; do install -m 0755 "packaging/debian/$s" "$stage/DEBIAN/$s"; done
find "$stage/etc" -type f | sed "s|^$stage||" | sort >"$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: sandboxd
Version: $version
Architecture: $arch
Maintainer: sandboxd developers <dev@sandboxd.local>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1, libseccomp2 (>= 2.5.0), debootstrap, zstd, tar, coreutils, util-linux, mount, e2fsprogs, systemd, ca-certificates
Section: admin
Priority: optional
Homepage: https://github.com/sandboxd/sandboxd
Description: native Linux sandboxes for untrusted, LLM-generated Python
 sandboxd runs untrusted Python in fresh namespaces under cgroups, Landlock and
 seccomp, and serves the results over a Unix socket, loopback HTTP, a CLI
 (sandboxctl) and MCP. The Python rootfs is built on the service's first start
 (progress in the journal: journalctl -u sandboxd).
CONTROL
mkdir -p target/debian
deb="target/debian/sandboxd_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
say "built $deb"
echo "$deb"
