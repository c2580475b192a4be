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
# then systemd itself boots the tree in a container (systemd-nspawn): it starts
# sandboxd.service, a member of the sandboxd group (not root) runs code through
# the Unix socket, a non-member is refused, the service stops and leaves no
# process, mount, loop device, cgroup or socket behind. Last, `apt-get purge`
# removes the package and its state.
#
#   tests/fresh_host.sh            run it (as root; 15-25 minutes, most of it the rootfs build)
#   tests/fresh_host.sh --stale    exit 0 when the Makefile, rootfs/, .ci/, packaging/ or
#                                  systemd/ changed since it last passed (tests/fresh_host.stamp)
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
  (cd "$repo" && find Makefile rootfs .ci packaging systemd tests/fresh_host.sh -type f ! -name '*.pyc' -print0 \
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
for tool in debootstrap unshare pivot_root nsenter python3; do
  command -v "$tool" >/dev/null || fail "$tool is missing (apt-get install debootstrap util-linux python3)"
done
# systemd-nspawn boots systemd in the tree (step 5): Debian's systemd-container.
if ! command -v systemd-nspawn >/dev/null; then
  say "installing systemd-container (systemd-nspawn) on this host"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd-container >/dev/null \
    || fail "systemd-nspawn is missing and apt-get install systemd-container failed"
fi

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
# --- Step 5: systemd boots the tree in a container ---------------------------------
# systemd-nspawn with no systemd on the host to register with (--register=no) keeps
# the container in the cgroup it starts in (--keep-unit): one of its own, made
# below this script's in every hierarchy, so that what the container leaves is
# easy to see and remove. With systemd as the host's PID 1, nspawn asks it for a
# scope instead (with the loop devices in its device policy).
machine="sdfresh-$$"
nspawn_pid="" container_pid="" container_cgroups=()
cgroup_hierarchies() {  # "mount point<TAB>this process's cgroup there", per hierarchy
  python3 -c '
own = {}
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.rstrip("\n").split(":", 2)
    own[ctrls] = path
for line in open("/proc/self/mountinfo"):
    f = line.split()
    sep = f.index("-")
    fstype, opts, root, point = f[sep + 1], f[sep + 3].split(","), f[3], f[4]
    if root != "/":
        continue
    if fstype == "cgroup2" and "" in own:
        print(point + "\t" + own[""])
    elif fstype == "cgroup":
        for ctrls, path in own.items():
            if ctrls and all(c in opts for c in ctrls.split(",")):
                print(point + "\t" + path)
'
}
in_container() {
  nsenter -t "$container_pid" -a /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}
stop_container() {  # the container down, its cgroups and nspawn's directory removed
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # SIGTERM makes nspawn ask the container's systemd to power off (--kill-signal).
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
    [ -z "$container_pid" ] || kill -KILL "$container_pid" 2>/dev/null || true
    sleep 1
  fi
  nspawn_pid="" container_pid=""
  local d
  for d in "${container_cgroups[@]}"; do
    if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  rmdir "/run/systemd/nspawn/propagate/$machine" 2>/dev/null || true
}
# Loop devices backed by the service's files (the rootfs image, the workspaces),
# matched by inode: the backing paths are the container's.
service_loops() {
  losetup --list --noheadings --output NAME,BACK-INO,BACK-FILE | while read -r dev ino file; do
    case $file in
      /var/lib/sandboxd/*) [ "$(stat -c %i "$tree${file% (deleted)}" 2>/dev/null)" != "$ino" ] || echo "$dev $ino $file" ;;
    esac
  done
}
boot_systemd() {
  local log="$base/systemd-boot.log" point own dir child state out sid loops deadline keep_unit=() scope=()
  # The host side as a user's machine has it: a user in the sandboxd group. The
  # state `make run` left (its unpacked rootfs) goes, so that the service unpacks
  # the rootfs itself as on a first install; the rootfs tarball stays (the unit's
  # ExecStartPre finds it up to date instead of building it again).
  chroot "$tree" useradd --create-home --groups sandboxd --shell /bin/bash sdfresh
  rm -rf --one-file-system "$tree/var/lib/sandboxd"
  # PID 1 until it execs systemd. nspawn mounts the host's cgroup v1 controller
  # hierarchies (v1 and hybrid hosts) read-only in a container without a user
  # namespace, where systemd on a real host has them writable: make them writable
  # before systemd starts (it checks once, at start, which controllers it may
  # use). The container's /dev is nspawn's own: add the loop devices, for the
  # loop-mounted rootfs image and workspaces.
  cat >"$tree/usr/local/sbin/fresh-host-init" <<'INIT'
#!/bin/sh
set -e
awk '{ for (i = 7; $i != "-"; i++); if ($(i + 1) == "cgroup" && ("," $6 ",") ~ /,ro,/) print $5 }' /proc/self/mountinfo |
  while read -r m; do mount -o remount,bind,rw "$m"; done
[ -e /dev/loop-control ] || mknod -m 0660 /dev/loop-control c 10 237
last=$(ls /sys/class/block | sed -n 's/^loop\([0-9]*\)$/\1/p' | sort -n | tail -1)
n=0
while [ "$n" -le $(( ${last:-0} + 64 )) ]; do
  [ -e "/dev/loop$n" ] || mknod -m 0660 "/dev/loop$n" b 7 "$n"
  n=$((n + 1))
done
chgrp disk /dev/loop-control /dev/loop[0-9]*
exec /usr/lib/systemd/systemd "$@"
INIT
  chmod 0755 "$tree/usr/local/sbin/fresh-host-init"
  if [ -d /run/systemd/system ]; then
    scope=(--property="DeviceAllow=/dev/loop-control rwm" --property="DeviceAllow=block-loop rwm")
  else
    keep_unit=(--keep-unit)
    while IFS=$'\t' read -r point own; do
      dir="$point${own%/}/$machine"
      mkdir "$dir" || fail "cannot make the container's cgroup $dir"
      container_cgroups+=("$dir")
      if [ -e "$dir/cpuset.cpus" ]; then
        cat "$point$own/cpuset.cpus" >"$dir/cpuset.cpus" && cat "$point$own/cpuset.mems" >"$dir/cpuset.mems"
      fi
    done < <(cgroup_hierarchies)
  fi
  (
    for dir in "${container_cgroups[@]}"; do echo "$BASHPID" >"$dir/cgroup.procs"; done
    # --private-network: the service's loopback HTTP port is the container's own.
    # nspawn's system call allow-list (systemd 252) lacks Landlock's three calls:
    # without them the daemon would run its sandboxes without Landlock.
    exec systemd-nspawn --quiet --directory="$tree" --machine="$machine" --register=no "${keep_unit[@]}" "${scope[@]}" \
      --private-network --console=read-only --kill-signal=SIGRTMIN+3 \
      --system-call-filter="landlock_create_ruleset landlock_add_rule landlock_restrict_self" /usr/local/sbin/fresh-host-init
  ) >"$log" 2>&1 </dev/null &
  nspawn_pid=$!
  deadline=$(( $(date +%s) + 120 ))
  # The container's PID 1 is the child of nspawn in another PID namespace (nspawn's
  # first child, in this one, only sets up and exits).
  until [ -n "$container_pid" ]; do
    for child in $(cat "/proc/$nspawn_pid/task/$nspawn_pid/children" 2>/dev/null); do
      [ "$(readlink "/proc/$child/ns/pid")" = "$(readlink /proc/self/ns/pid)" ] || container_pid=$child
    done
    kill -0 "$nspawn_pid" 2>/dev/null || { tail -20 "$log" >&2; fail "systemd-nspawn ended (log $log)"; }
    [ "$(date +%s)" -lt "$deadline" ] || fail "systemd-nspawn started no container within 2 minutes (log $log)"
    sleep 1
  done
  until state=$(in_container systemctl is-system-running --wait 2>/dev/null); [ "$state" = running ] || [ "$state" = degraded ]; do
    kill -0 "$nspawn_pid" 2>/dev/null || { tail -20 "$log" >&2; fail "the container ended before systemd booted (log $log)"; }
    [ "$(date +%s)" -lt "$deadline" ] || { tail -20 "$log" >&2; fail "systemd did not boot within 2 minutes (state: $state; log $log)"; }
    sleep 1
  done
  say "systemd $(in_container systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p') booted in the container ($state; failed units: $(in_container systemctl --failed --plain --no-legend | cut -d' ' -f1 | tr '\n' ' '))"

  in_container systemctl start sandboxd.service \
    || { in_container journalctl -u sandboxd.service --no-pager -n 30 >&2; fail "systemctl start sandboxd.service"; }
  in_container journalctl --boot -u sandboxd.service --no-pager -o cat | grep -m1 'cgroups ready' >&2 || true
  # The service sees the host's kernel features as the host does (Landlock above all).
  out=$(in_container runuser -u sdfresh -- sandboxctl doctor 2>&1) || fail "sandboxctl doctor in the container: $out"
  local landlock_abi
  landlock_abi=$(python3 -c 'import ctypes
libc = ctypes.CDLL(None, use_errno=True)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
print(max(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)), 0))')
  if [ "$landlock_abi" -gt 0 ]; then
    echo "$out" | grep -q "✓ Landlock *ABI $landlock_abi\$" \
      || fail "the service in the container lacks the host's Landlock ABI $landlock_abi: $(echo "$out" | grep -A1 Landlock)"
  fi
  say "sandboxctl doctor in the container: $(echo "$out" | grep -E '^. (Landlock|cgroups|loop devices) ' | sed 's/  */ /g' | tr '\n' ';')"
  # A member of the sandboxd group, through the Unix socket: a run, and a session
  # whose file (in its loop-mounted workspace) the next run reads back.
  out=$(echo 'print(sum(range(10)))' | in_container runuser -u sdfresh -- sandboxctl run - 2>&1) \
    || fail "a run by a member of the sandboxd group failed: $out"
  [ "$out" = 45 ] || fail "the run printed '$out', not 45"
  sid=$(in_container runuser -u sdfresh -- sandboxctl sessions new) || fail "sandboxctl sessions new: $sid"
  echo 'open("kept.txt", "w").write("kept")' | in_container runuser -u sdfresh -- sandboxctl run --session "$sid" - >/dev/null 2>&1 \
    || fail "a run in session $sid failed"
  out=$(echo 'print(open("kept.txt").read())' | in_container runuser -u sdfresh -- sandboxctl run --session "$sid" - 2>/dev/null) \
    || fail "the second run in session $sid failed: $out"
  [ "$out" = kept ] || fail "the session's file read back as '$out'"
  # Anyone else is refused by the socket's mode and group.
  if out=$(in_container runuser -u nobody -- sandboxctl health 2>&1); then fail "a user outside the sandboxd group used the socket"; fi
  case $out in *"Permission denied"*) ;; *) fail "a user outside the sandboxd group got '$out', not EACCES" ;; esac
  # What the running service holds, seen the same way as after the stop below
  # (so that finding nothing there means something): its processes, mounts (in
  # every mount namespace of the container, and the host's), loop devices,
  # cgroups, runtime files.
  service_procs() { in_container sh -c 'for p in /proc/[0-9]*; do [ "$(readlink "$p/exe")" != /usr/bin/sandboxd ] || echo "${p#/proc/}"; done'; }
  service_mounts() {
    in_container sh -c 'cat /proc/[0-9]*/mountinfo 2>/dev/null | grep -E " /(var/lib|run)/sandboxd[/ ]" | sort -u; true'
    grep -F " $tree/var/lib/sandboxd" /proc/self/mountinfo || true
  }
  service_cgroups() { in_container find /sys/fs/cgroup -name 'sandboxd*' -type d; }
  service_runtime() { in_container sh -c 'ls -d /run/sandboxd /run/sandboxd/sandboxd.sock 2>/dev/null; true'; }
  loops=$(service_loops)
  [ "$(echo "$loops" | grep -c .)" -ge 2 ] || fail "expected the rootfs image and a workspace on loop devices, found: $loops"
  [ -n "$(service_procs)" ] || fail "no sandboxd process seen while the service runs"
  [ -n "$(service_mounts)" ] || fail "no mount under /var/lib/sandboxd seen while the service runs"
  [ -n "$(service_cgroups)" ] || fail "no sandboxd cgroup seen while the service runs"
  [ -n "$(service_runtime)" ] || fail "no /run/sandboxd/sandboxd.sock while the service runs"
  say "a member of the sandboxd group ran code through /run/sandboxd/sandboxd.sock, nobody else could; $(service_procs | wc -l) sandboxd processes, $(service_mounts | wc -l) mounts, $(echo "$loops" | wc -l) loop devices, $(service_cgroups | wc -l) cgroups"

  in_container systemctl stop sandboxd.service || fail "systemctl stop sandboxd.service"
  state=$(in_container systemctl is-active sandboxd.service) || true
  [ "$state" = inactive ] || fail "sandboxd.service is $state after the stop, not inactive"
  out=$(service_procs)
  [ -z "$out" ] || fail "sandboxd processes left after the stop: $out"
  out=$(service_mounts)
  [ -z "$out" ] || fail "mounts left after the stop: $out"
  out=$(service_loops
    losetup --list --noheadings --output NAME,BACK-INO | while read -r dev ino; do
      echo "$loops" | grep -q " $ino " && echo "$dev still backed by inode $ino"
    done; true)
  [ -z "$out" ] || fail "loop devices left after the stop: $out"
  out=$(service_cgroups)
  [ -z "$out" ] || fail "cgroups left after the stop: $out"
  out=$(service_runtime)
  [ -z "$out" ] || fail "runtime files left after the stop: $out"

  # (poweroff.target directly: `systemctl poweroff` first asks logind over D-Bus, not in the tree)
  in_container systemctl start --no-block --job-mode=replace-irreversibly poweroff.target || fail "systemctl start poweroff.target"
  for _ in $(seq 60); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$nspawn_pid" 2>/dev/null && fail "the container did not power off within a minute (log $log)"
  wait "$nspawn_pid" || { tail -20 "$log" >&2; fail "systemd-nspawn exited with an error (log $log)"; }
  nspawn_pid="" container_pid=""
  stop_container
  for dir in "${container_cgroups[@]}"; do
    [ ! -e "$dir" ] || fail "the container's cgroup $dir could not be removed: $(find "$dir" -name cgroup.procs -exec cat {} + | wc -l) processes in it"
  done
  container_cgroups=()
  rm -f "$tree/usr/local/sbin/fresh-host-init"
  say "sandboxd.service stopped and left nothing behind; the container powered off"
}
# --- end of step 5 -------------------------------------------------------------------

daemon_pid=""
cleanup() {
  rc=$?
  set +e
  if [ -n "$daemon_pid" ]; then kill -TERM -- "-$daemon_pid" 2>/dev/null; sleep 3; kill -KILL -- "-$daemon_pid" 2>/dev/null; fi
  # A step that failed with the container up leaves it to no one else: the next
  # run would find the tree busy.
  stop_container
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

say "step 1/6: debootstrap Debian 13 (trixie) minbase + make + a C compiler into $tree"
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

say "step 2/6: the README's first command in the tree: make run (installs host tools, builds the rootfs; log $base/make-run.log)"
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

say "step 3/6: /v1/health, a run that makes a figure, a run that installs a package"
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
# Packages out of the box: the default policy installs from the real index, through
# the egress proxy and the fresh host's CA bundle, into the run's session.
pkg = json.loads(call("POST", "/v1/runs", {"code": "import tabulate\nprint(tabulate.__version__)", "packages": ["tabulate==0.9.0"]}))
assert pkg["status"] == "ok" and pkg["stdout"] == "0.9.0\n", pkg
assert "files.pythonhosted.org:443" in pkg["usage"]["net"]["hosts"], pkg["usage"]
print(f"health ok (rootfs {health['rootfs_sha256'][:12]}), figure {figures[0]['path']} {len(png)} bytes, tabulate installed")
PY
# The rootfs built on this Debian 13 host, next to the recipe's: the content hash
# must not depend on the host that built it.
manifest=$(ls "$tree"/var/cache/sandboxd/rootfs/rootfs-*.manifest.json)
cp "$manifest" "$base/fresh-host.manifest.json"
say "rootfs built in the tree: $(basename "$manifest"), $(grep -o '"content_hash": "[^"]*"' "$manifest"), tarball sha256 $(cat "$tree"/var/cache/sandboxd/rootfs/rootfs-*.tar.zst.sha256)"
kill -TERM -- "-$daemon_pid" 2>/dev/null || true
wait "$daemon_pid" 2>/dev/null || true
daemon_pid=""

say "step 4/6: the Debian package in the tree: make deb, apt-get install, systemd-analyze verify, reinstall"
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
  echo "package ok: $deb"
' || fail "the Debian package in the fresh tree"

say "step 5/6: systemd boots the tree in a container (systemd-nspawn) and runs sandboxd.service (log $base/systemd-boot.log)"
boot_systemd

say "step 6/6: apt-get purge"
in_tree '
  set -e
  apt-get purge -y -q sandboxd >/dev/null 2>&1
  [ ! -e /var/lib/sandboxd ] && [ ! -e /var/cache/sandboxd ] || { echo "purge left the state behind"; exit 1; }
  [ ! -e /usr/bin/sandboxd ] || { echo "purge left the binary"; exit 1; }
  echo "purged"
' || fail "apt-get purge in the fresh tree"

say "passed in $(( $(date +%s) - started ))s; writing tests/fresh_host.stamp"
inputs_hash >"$stamp_file"
