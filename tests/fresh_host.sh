#!/usr/bin/env bash
# The README's first command on a fresh Debian 13 (trixie): a debootstrapped
# minbase tree with only make and a C compiler added, this host's Rust toolchain
# bound in and a copy of this repository's files (no build output: the tree builds
# everything itself, against its own libc) in /root/sandboxd, entered with pivot_root in a private mount
# namespace (not chroot: the kernel refuses new user namespaces in a chroot).
# There `make run` must install its host tools, build the daemon and the rootfs
# (no host Python), and serve: the test checks /v1/health and a run that makes a
# figure. Then the Debian package: `make deb`, `apt-get install ./…deb`,
# `systemd-analyze verify` of the installed unit, a reinstall keeping the state,
# and `apt-get purge` removing it.
#
#   tests/fresh_host.sh            run it (as root; 15-25 minutes, most of it the rootfs build)
#   tests/fresh_host.sh --stale    exit 0 when the Makefile, rootfs/, .ci/ or packaging/
#                                  changed since it last passed (tests/fresh_host.stamp)
#
# When it passes it writes the hash of those files to tests/fresh_host.stamp:
# commit that file. .ci/run runs this test only when the stamp is stale.
#
# Environment: SANDBOXD_FRESH_BASE (the tree's parent, default /var/tmp/sandboxd-fresh-host),
# SANDBOXD_FRESH_CACHE (debootstrap debs and wheels kept between runs, default
# /var/cache/sandboxd-fresh-host), SANDBOXD_FRESH_PORT (HTTP port, default 18781),
# SANDBOXD_DEBIAN_MIRROR.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stamp_file="$repo/tests/fresh_host.stamp"

# What the fresh-host result depends on: the set-up, not the daemon's code.
inputs_hash() {
  (cd "$repo" && find Makefile rootfs .ci packaging tests/fresh_host.sh -type f ! -name '*.pyc' -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}
if [ "${1:-}" = "--stale" ]; then
  [ "$(cat "$stamp_file" 2>/dev/null)" != "$(inputs_hash)" ]
  exit
fi

# Job control: `make run` in the background gets a process group of its own, so
# that stopping it stops make and the daemon together.
set -m
say() { printf '[fresh-host] %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap, mounts, pivot_root)"
for tool in debootstrap unshare pivot_root python3; do
  command -v "$tool" >/dev/null || fail "$tool is missing (apt-get install debootstrap util-linux python3)"
done

base=${SANDBOXD_FRESH_BASE:-/var/tmp/sandboxd-fresh-host}
cache=${SANDBOXD_FRESH_CACHE:-/var/cache/sandboxd-fresh-host}
port=${SANDBOXD_FRESH_PORT:-18781}
mirror=${SANDBOXD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
tree="$base/trixie"
cargo_bin=$(command -v cargo) || fail "cargo is missing on this host: its toolchain is bound into the tree"
cargo_home=${CARGO_HOME:-$(dirname "$(dirname "$cargo_bin")")}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
started=$(date +%s)

unmount_under() {
  awk -v r="$1" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
remove_tree() {
  unmount_under "$tree"
  rm -rf --one-file-system "$tree"
}
daemon_pid=""
cleanup() {
  rc=$?
  set +e
  if [ -n "$daemon_pid" ]; then kill -TERM -- "-$daemon_pid" 2>/dev/null; sleep 3; kill -KILL -- "-$daemon_pid" 2>/dev/null; fi
  if [ $rc -eq 0 ]; then remove_tree; else say "the tree is left in $tree for a look (the next run removes it); log: $base/make-run.log"; fi
}
trap cleanup EXIT

# In the tree, as a fresh host: a private mount namespace, pivot_root, a clean environment.
in_tree() {
  local script=$1
  unshare --mount --propagation private -- /bin/bash -c '
    set -euo pipefail
    tree=$1 src=$2 cargo_home=$3 rustup_home=$4 cache=$5 script=$6
    mount --bind "$tree" "$tree"
    for d in "$cargo_home" "$rustup_home"; do mkdir -p "$tree$d"; mount --bind "$d" "$tree$d"; done
    mkdir -p "$tree/var/cache/sandboxd-build-cache"
    mount --bind "$cache/rootfs" "$tree/var/cache/sandboxd-build-cache"
    mount -t proc proc "$tree/proc"
    mount --rbind /sys "$tree/sys"
    mount --rbind /dev "$tree/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$tree/run"
    mount -t tmpfs -o mode=1777 tmpfs "$tree/tmp"
    cd "$tree"
    mkdir -p .oldroot
    pivot_root . .oldroot
    cd /
    umount -l /.oldroot
    rmdir /.oldroot
    exec /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      PATH="$cargo_home/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      CARGO_HOME="$cargo_home" RUSTUP_HOME="$rustup_home" \
      SANDBOXD_ROOTFS_CACHE=/var/cache/sandboxd-build-cache $(test -s /root/host-ca.pem && echo SANDBOXD_CA_BUNDLE=/root/host-ca.pem) \
      SANDBOXD_HTTP=127.0.0.1:'"$port"' SANDBOXD_INSTANCE=sdfreshhost \
      /bin/bash -c "cd $src && $script"
  ' in-tree "$tree" /root/sandboxd "$cargo_home" "$rustup_home" "$cache" "$script"
}

say "step 1/5: debootstrap Debian 13 (trixie) minbase + make + a C compiler into $tree"
mkdir -p "$base" "$cache/debs" "$cache/rootfs"
remove_tree
debootstrap --variant=minbase --include=make,gcc,libc6-dev --cache-dir="$cache/debs" trixie "$tree" "$mirror" \
  >"$base/debootstrap.log" 2>&1 || { tail -20 "$base/debootstrap.log" >&2; fail "debootstrap trixie from $mirror failed"; }
cp /etc/resolv.conf "$tree/etc/resolv.conf"
# The repository's files as a clone would have them (tracked and new, not ignored:
# no target/), uncommitted edits included.
mkdir -p "$tree/root/sandboxd"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$tree/root/sandboxd"
[ -f "$tree/root/sandboxd/Makefile" ] || fail "could not copy the repository into the tree"
# This host's network may re-sign TLS (a proxy with its own CA): the tree gets the
# host's CA bundle for the rootfs build's downloads, nothing else of the host.
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then cp /etc/ssl/certs/ca-certificates.crt "$tree/root/host-ca.pem"; fi
if chroot "$tree" python3 -V >/dev/null 2>&1; then fail "the fresh tree has a python3: it should not"; fi

say "step 2/5: the README's first command in the tree: make run (installs host tools, builds the rootfs; log $base/make-run.log)"
in_tree "make run" >"$base/make-run.log" 2>&1 &
daemon_pid=$!
deadline=$(( $(date +%s) + 45 * 60 ))
until python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/v1/health', timeout=2)" 2>/dev/null; do
  if ! kill -0 "$daemon_pid" 2>/dev/null; then tail -40 "$base/make-run.log" >&2; fail "make run ended before the daemon served"; fi
  [ "$(date +%s)" -lt "$deadline" ] || { tail -40 "$base/make-run.log" >&2; fail "the daemon did not serve within 45 minutes"; }
  sleep 5
done
grep -q '^\[host\] installing .*debootstrap' "$base/make-run.log" || fail "make run did not install debootstrap itself (see $base/make-run.log)"
grep -q '^\[rootfs\] done' "$base/make-run.log" || fail "the rootfs was not built in the tree"

say "step 3/5: /v1/health and a run that makes a figure"
python3 - "$port" <<'PY' || fail "the daemon in the fresh tree did not answer as it should"
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()
health = json.loads(call("GET", "/v1/health"))
assert health["status"] == "ok" and len(health["rootfs_sha256"]) == 64, health
check = json.loads(call("GET", "/v1/check"))
assert check["ok"], check
run = json.loads(call("POST", "/v1/runs", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9, 16])\nprint('plotted')"}))
assert run["status"] == "ok" and run["stdout"] == "plotted\n", run
figures = [a for a in run["artifacts"] if a["kind"] == "figure"]
assert len(figures) == 1 and figures[0]["mime_type"] == "image/png", run["artifacts"]
png = urllib.request.urlopen(figures[0]["url"], timeout=30).read()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000, png[:16]
print(f"health ok (rootfs {health['rootfs_sha256'][:12]}), figure {figures[0]['path']} {len(png)} bytes")
PY
# The rootfs built on this Debian 13 host, next to the recipe's: the content hash
# must not depend on the host that built it.
manifest=$(ls "$tree"/var/cache/sandboxd/rootfs/rootfs-*.manifest.json)
cp "$manifest" "$base/fresh-host.manifest.json"
say "rootfs built in the tree: $(basename "$manifest"), $(grep -o '"content_hash": "[^"]*"' "$manifest"), tarball sha256 $(cat "$tree"/var/cache/sandboxd/rootfs/rootfs-*.tar.zst.sha256)"
kill -TERM -- "-$daemon_pid" 2>/dev/null || true
wait "$daemon_pid" 2>/dev/null || true
daemon_pid=""

say "step 4/5: the Debian package in the tree: make deb, apt-get install, systemd-analyze verify, reinstall, purge"
in_tree '
  set -e
  make deb >/dev/null
  deb=$(ls target/debian/sandboxd_*.deb)
  apt-get install -y -q --no-install-recommends "./$deb" >/var/tmp/apt.log 2>&1 || { tail -20 /var/tmp/apt.log; exit 1; }
  for f in /usr/bin/sandboxd /usr/bin/sandboxctl /usr/lib/sandboxd/libsandboxd.so /etc/sandboxd/policies/default.toml \
           /usr/lib/systemd/system/sandboxd.service /usr/lib/systemd/system/sandboxd.service.d/rootfs.conf \
           /usr/lib/sysusers.d/sandboxd.conf /usr/lib/tmpfiles.d/sandboxd.conf /usr/share/sandboxd/rootfs/build.sh; do
    [ -e "$f" ] || { echo "not installed: $f"; exit 1; }
  done
  getent group sandboxd >/dev/null || { echo "postinst made no sandboxd group"; exit 1; }
  systemd-analyze verify /usr/lib/systemd/system/sandboxd.service
  /usr/bin/sandboxd check --rootfs-tarball /var/cache/sandboxd/rootfs/current.tar.zst
  mkdir -p /var/lib/sandboxd/sessions/keep && echo kept >/var/lib/sandboxd/sessions/keep/marker
  dpkg -i "$deb" >/dev/null
  [ "$(cat /var/lib/sandboxd/sessions/keep/marker)" = kept ] || { echo "a reinstall lost the state"; exit 1; }
  apt-get purge -y -q sandboxd >/dev/null 2>&1
  [ ! -e /var/lib/sandboxd ] && [ ! -e /var/cache/sandboxd ] || { echo "purge left the state behind"; exit 1; }
  [ ! -e /usr/bin/sandboxd ] || { echo "purge left the binary"; exit 1; }
  echo "package ok: $deb"
' || fail "the Debian package in the fresh tree"

say "step 5/5: passed in $(( $(date +%s) - started ))s; writing tests/fresh_host.stamp"
inputs_hash >"$stamp_file"
