#!/usr/bin/env bash
# Build the sandbox rootfs: Debian bookworm minbase + Debian's python3.11 + a venv at
# /opt/py filled from the wheels pinned in requirements.lock.
#
#   rootfs/build.sh [OUT_DIR]      (default /var/cache/sandboxd/rootfs)
#
# The host needs no Python: the wheels are downloaded and installed by the rootfs's
# own python3.11, inside the tree being built, with a pip wheel pinned below by
# version and sha256. Host tools: debootstrap, zstd, tar, coreutils, util-linux.
#
# Writes OUT_DIR/rootfs-<recipe-hash>.tar.zst, a .sha256 beside it, and a
# manifest.json (content hash, Python version, every package), then points
# OUT_DIR/current.tar.zst at it. A recipe that has not changed is not rebuilt.
#
# Environment:
#   SANDBOXD_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   SANDBOXD_PIP_INDEX_URL   Python package index (default PIP_INDEX_URL, else https://pypi.org/simple)
#   SANDBOXD_PIP_WHEEL_URL   where to fetch the pinned pip wheel (default: files.pythonhosted.org)
#   SANDBOXD_CA_BUNDLE       CA certificates for the downloads (default: the host's
#                            /etc/ssl/certs/ca-certificates.crt if any, else the rootfs's own)
#   SANDBOXD_ROOTFS_CACHE    cache of downloaded .debs and wheels (default OUT_DIR)
#   SANDBOXD_ROOTFS_MIN_FREE_MB  free space OUT_DIR must have (default 4096)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/var/cache/sandboxd/rootfs}
mirror=${SANDBOXD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
index=${SANDBOXD_PIP_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}
# pip itself, pinned: it runs from its wheel under the rootfs's python3.11.
pip_version=25.1.1
pip_sha256=2913a38a2abf4ea6b64ab507bd9e967f3b53dc1ede74b01b0931e1ce548751af
pip_wheel=pip-$pip_version-py3-none-any.whl
pip_url=${SANDBOXD_PIP_WHEEL_URL:-https://files.pythonhosted.org/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/$pip_wheel}
min_free_mb=${SANDBOXD_ROOTFS_MIN_FREE_MB:-4096}
min_kernel=5.15
suite=bookworm
steps=8
step=0

say() { printf '[rootfs] %s\n' "$*" >&2; }
next() { step=$((step + 1)); say "step $step/$steps: $*"; }
die() { say "FAILED at step $step/$steps ($current): $*"; exit 1; }
# Checks before anything is written: one line with the cause and the fix.
refuse() { say "cannot build the rootfs: $*"; trap - EXIT; exit 1; }
current="start"
trap 'rc=$?; [ $rc -eq 0 ] || say "FAILED at step $step/$steps ($current), exit code $rc; see the output above"' EXIT

[ "$(id -u)" -eq 0 ] || refuse "not running as root (debootstrap, mount and chroot need it); run: sudo $0 $*"
for tool in debootstrap zstd tar sha256sum chroot mount umount mountpoint unshare df flock; do
  command -v "$tool" >/dev/null \
    || refuse "$tool is not installed; run: apt-get install debootstrap zstd tar coreutils util-linux mount (or: sudo make run, which installs them)"
done
kernel=$(uname -r)
kmaj=${kernel%%.*}; kmin=${kernel#*.}; kmin=${kmin%%[!0-9]*}
if [ "$kmaj" -lt "${min_kernel%%.*}" ] || { [ "$kmaj" -eq "${min_kernel%%.*}" ] && [ "$kmin" -lt "${min_kernel#*.}" ]; }; then
  refuse "kernel $kernel is older than $min_kernel, which sandboxd needs (Landlock, idmapped mounts, cgroup v2); boot a newer kernel (Debian 12's is 6.1)"
fi

# Every mount this build makes lives in a private mount namespace: when the
# script ends, however it ends, none is left on the host.
if [ -z "${SANDBOXD_ROOTFS_UNSHARED:-}" ]; then
  trap - EXIT
  SANDBOXD_ROOTFS_UNSHARED=1 exec unshare --mount --propagation private -- "$0" "$@"
fi

# Free space where OUT_DIR is (or will be): nothing is made before this passes.
probe=$out
while [ ! -d "$probe" ]; do probe=$(dirname "$probe"); done
free_mb=$(df -Pm "$probe" | awk 'NR==2 {print $4}')
[ "$free_mb" -ge "$min_free_mb" ] \
  || refuse "only $free_mb MiB free in $probe, the build needs $min_free_mb MiB; free some space or pass another directory (rootfs/build.sh DIR)"
mkdir -p "$out" 2>/dev/null || refuse "cannot create $out; choose another output directory"

# Only what goes into the image counts: support/kernel.py is embedded in the daemon.
recipe_hash=$(cd "$here" && cat build.sh packages.txt requirements.lock support/runner.py support/sandboxd_runner.py support/sandboxd_outcome.py support/sandboxd_install.py support/sandboxd_installer.py support/sitecustomize.py | sha256sum | cut -c1-16)
tarball="$out/rootfs-$recipe_hash.tar.zst"
if [ -s "$tarball" ] && [ -s "$tarball.sha256" ]; then
  say "up to date: $tarball (recipe $recipe_hash)"
  ln -sfn "$(basename "$tarball")" "$out/current.tar.zst"
  trap - EXIT
  echo "$tarball"
  exit 0
fi

# One build at a time per output directory; a build killed outright left its
# work directory behind: remove it now.
exec 9>"$out/.build.lock"
flock -n 9 || refuse "another rootfs build is running in $out; wait for it to finish"
for stale in "$out"/.build-*; do
  [ -d "$stale" ] && { say "removing $stale, left by a build that was killed"; rm -rf --one-file-system "$stale"; }
done

cache=${SANDBOXD_ROOTFS_CACHE:-$out}
mkdir -p "$cache/debs" "$cache/wheels" "$cache/pip"
work=$(mktemp -d "$out/.build-XXXXXX")
root="$work/root"
unmount_all() {
  # Deepest first; lazily, so that a busy one cannot keep the rest mounted.
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
cleanup() {
  rc=$?
  set +e
  unmount_all
  rm -rf --one-file-system "$work" || say "could not remove $work (the next build removes it)"
  [ $rc -eq 0 ] || say "FAILED at step $step/$steps ($current), exit code $rc; see the output above"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The CA certificates the downloads trust: a host behind a TLS-inspecting proxy
# has its CA in its own bundle. What is downloaded is checked by sha256 either way.
ca_bundle=${SANDBOXD_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-}}}
[ -n "$ca_bundle" ] || { [ -s /etc/ssl/certs/ca-certificates.crt ] && ca_bundle=/etc/ssl/certs/ca-certificates.crt; }
ca_env=()
# What runs inside the tree: its own python3.11, a clean environment.
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LANG=C.UTF-8 "${ca_env[@]}" \
    ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} ${no_proxy:+no_proxy=$no_proxy} \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore "$@"
}

current="debootstrap"; next "debootstrap $suite minbase from $mirror (about a minute)"
include=$(grep -v '^#' "$here/packages.txt" | grep -v '^$' | paste -sd, -)
debootstrap --variant=minbase --cache-dir="$cache/debs" --include="$include" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap from $mirror failed (log tail above): is $mirror reachable? To use another Debian mirror, set SANDBOXD_DEBIAN_MIRROR=http://<mirror>/debian"; }
mkdir -p "$root/tmp/wheels" "$root/tmp/pip" "$root/tmp/recipe" "$root/proc" "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
mount --bind "$cache/wheels" "$root/tmp/wheels"
mount --bind "$cache/pip" "$root/tmp/pip"
cp "$here/requirements.lock" "$root/tmp/recipe/requirements.lock"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
if [ -n "$ca_bundle" ]; then
  cp "$ca_bundle" "$root/tmp/recipe/ca.pem" || die "cannot read the CA bundle $ca_bundle (SANDBOXD_CA_BUNDLE)"
  ca_env=(SSL_CERT_FILE=/tmp/recipe/ca.pem PIP_CERT=/tmp/recipe/ca.pem)
fi

current="wheels"; next "download pip $pip_version and $(grep -c -- '--hash' "$here/requirements.lock") pinned wheels with the rootfs's python3.11 (cached in $cache/wheels)"
in_root /usr/bin/python3.11 - "$pip_url" "/tmp/pip/$pip_wheel" "$pip_sha256" <<'PY' || die "could not fetch the pip wheel from $pip_url: is it reachable? To use a mirror, set SANDBOXD_PIP_WHEEL_URL to the URL of $pip_wheel there (sha256 $pip_sha256)"
import hashlib, os, sys, urllib.request
url, dest, want = sys.argv[1:4]
def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
if not (os.path.exists(dest) and digest(dest) == want):
    with urllib.request.urlopen(url, timeout=60) as r, open(dest + ".part", "wb") as f:
        f.write(r.read())
    got = digest(dest + ".part")
    if got != want:
        os.unlink(dest + ".part")
        sys.exit(f"{url} has sha256 {got}, the recipe pins {want}")
    os.replace(dest + ".part", dest)
PY
pip=(/usr/bin/python3.11 "/tmp/pip/$pip_wheel/pip")
wheel_args=(--quiet --no-deps --require-hashes --only-binary=:all: --python-version 3.11 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any
  -d /tmp/wheels -r /tmp/recipe/requirements.lock)
# From the cache when every pinned wheel is there; else from the index.
in_root "${pip[@]}" download --no-index --find-links /tmp/wheels "${wheel_args[@]}" >/dev/null 2>&1 \
  || in_root "${pip[@]}" download --index-url "$index" "${wheel_args[@]}" \
  || die "could not download the wheels from $index: is it reachable, and do the hashes in requirements.lock match? To use another package index, set SANDBOXD_PIP_INDEX_URL=https://<mirror>/simple"

current="venv"; next "create the venv /opt/py and install the wheels with the rootfs's python3.11"
in_root /usr/bin/python3.11 -m venv --without-pip /opt/py || die "venv creation failed"
in_root /opt/py/bin/python "/tmp/pip/$pip_wheel/pip" install --quiet --no-index --find-links /tmp/wheels --require-hashes \
  --no-deps --no-compile --no-warn-script-location -r /tmp/recipe/requirements.lock \
  || die "pip install into the rootfs failed"
# Nothing of the host stays mounted in the tree (the slim step empties its /dev).
unmount_all
rm -rf "$root/tmp/wheels" "$root/tmp/pip" "$root/tmp/recipe"
: >"$root/etc/resolv.conf"

current="support"; next "install the sandbox support code, pip's configuration and the sandbox user"
mkdir -p "$root/opt/sandboxd" "$root/mnt/data" "$root/tmp" "$root/proc" "$root/dev" "$root/sys"
cp "$here/support/runner.py" "$here/support/sandboxd_runner.py" "$here/support/sandboxd_outcome.py" \
  "$here/support/sandboxd_install.py" "$here/support/sandboxd_installer.py" "$root/opt/sandboxd/"
cp "$here/support/sitecustomize.py" "$root/opt/py/lib/python3.11/site-packages/sitecustomize.py"
# Debian's python3.11 has a sitecustomize of its own (apport's hook) earlier on
# sys.path, which would hide the venv's: it goes.
rm -f "$root/usr/lib/python3.11/sitecustomize.py" "$root/etc/python3.11/sitecustomize.py"
# Every package of the image, pinned: what pip and the installer may not replace.
grep -v '^#' "$here/requirements.lock" | sed -e 's/ --hash=.*//' >"$root/opt/sandboxd/constraints.txt"
# pip in a sandbox installs into the session's package layer (pip reads sys.prefix's
# pip.conf), never over the image's packages, wheels only unless the policy says
# otherwise (the daemon then sets PIP_ONLY_BINARY=:none:). No cache (HOME is the
# small /tmp), no questions, no version check and no progress bars (a run's output
# is not a terminal), no warning that the layer's bin is not on PATH (it is).
cat >"$root/opt/py/pip.conf" <<'CONF'
[global]
disable-pip-version-check = true
no-input = true
no-cache-dir = true
progress-bar = off
[install]
prefix = /opt/packages/current
constraint = /opt/sandboxd/constraints.txt
only-binary = :all:
no-warn-script-location = true
CONF
echo "sandbox:x:1000:1000:sandbox:/tmp:/bin/bash" >>"$root/etc/passwd"
echo "sandbox:x:1000:" >>"$root/etc/group"
echo "sandbox" >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n::1 localhost\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"

current="slim"; next "remove docs, caches, tests and headers"
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda,bug} "$root"/var/cache/apt/* \
  "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/var/cache/debconf/*-old
# ldconfig's aux-cache records the inodes and times of this build's libraries: the
# one file by which two builds of a recipe differed. Only ldconfig reads it.
rm -f "$root"/var/cache/ldconfig/aux-cache
rm -rf --one-file-system "$root"/dev/*
# Left by some debootstrap versions (mount's utab): /run is empty in the image.
rm -rf --one-file-system "$root"/run/*
sp="$root/opt/py/lib/python3.11/site-packages"
# numpy.testing imports numpy/_core/tests/_natype.py: keep that one module.
find "$sp" -depth -type d \( -name tests -o -name test -o -name __pycache__ \) ! -path '*/numpy/_core/tests' -prune -exec rm -rf {} +
find "$sp/numpy/_core/tests" -mindepth 1 ! -name __init__.py ! -name _natype.py -exec rm -rf {} +
find "$root/usr/lib/python3.11" -depth -type d \( -name test -o -name tests -o -name idlelib -o -name tkinter -o -name __pycache__ \) -prune -exec rm -rf {} + 2>/dev/null || true
rm -rf "$sp"/pyarrow/include "$sp"/pyarrow/src "$sp"/numpy/_core/include "$sp"/numpy/f2py/src
find "$sp" \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.hpp' -o -name '*.a' \) -delete

current="compile"; next "precompile .pyc, build the matplotlib font cache, import every package"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
# Reproducible whatever the host's environment: no .pyc written by imports (only
# compileall's, hash-based), a fixed hash seed (set constants, matplotlib's font list).
in_root PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 /opt/py/bin/python -m compileall -q -j0 --invalidation-mode unchecked-hash /opt/py/lib/python3.11/site-packages /usr/lib/python3.11 /opt/sandboxd >/dev/null \
  || die "compileall failed"
mkdir -p "$root/opt/sandboxd/mplconfig"
chroot "$root" /usr/bin/env -i PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 HOME=/tmp MPLCONFIGDIR=/opt/sandboxd/mplconfig MPLBACKEND=Agg /opt/py/bin/python -c '
import numpy, pandas, scipy, sklearn, matplotlib, matplotlib.pyplot, seaborn, PIL, openpyxl, pyarrow, reportlab
import numpy.testing, scipy.stats, scipy.optimize, sklearn.ensemble, sklearn.linear_model, pandas.plotting
import pyarrow.parquet, reportlab.pdfgen.canvas, PIL.Image
import matplotlib.font_manager as fm
fm.fontManager  # writes fontlist-*.json into MPLCONFIGDIR
' || die "an installed package failed to import"
# The installers: pip for the code's own `pip install`, uv for the daemon's installs.
chroot "$root" /usr/bin/env -i PYTHONDONTWRITEBYTECODE=1 HOME=/tmp /opt/py/bin/python -m pip --version >/dev/null || die "pip does not run in the image"
chroot "$root" /usr/bin/env -i HOME=/tmp /opt/py/bin/uv --version >/dev/null || die "uv does not run in the image"
ls "$root/opt/sandboxd/mplconfig"/fontlist-*.json >/dev/null || die "matplotlib did not write its font cache"

unmount_all

current="manifest"; next "write the manifest"
chroot "$root" /usr/bin/env -i PYTHONDONTWRITEBYTECODE=1 /opt/py/bin/python - "$recipe_hash" >"$work/manifest.partial.json" <<'PY'
import hashlib, importlib.metadata as md, json, os, sys, platform
h = hashlib.sha256()
for top, dirs, files in os.walk("/", topdown=True):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "tmp")]
    dirs.sort()
    for name in sorted(files):
        p = os.path.join(top, name)
        if p == "/opt/sandboxd/manifest.json":
            continue
        st = os.lstat(p)
        h.update(p.encode() + b"\0" + oct(st.st_mode).encode() + b"\0")
        if os.path.islink(p):
            h.update(os.readlink(p).encode())
        elif os.path.isfile(p):
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
pkgs = sorted(({"name": d.metadata["Name"], "version": d.version} for d in md.distributions()), key=lambda x: x["name"].lower())
json.dump({"recipe_hash": sys.argv[1], "content_hash": "sha256:" + h.hexdigest(),
           "python_version": platform.python_version(), "packages": pkgs}, sys.stdout, indent=1)
PY
cp "$work/manifest.partial.json" "$root/opt/sandboxd/manifest.json"
# Where a session's package layer is mounted: empty in the image. Made after the
# last Python in the tree ran: sitecustomize gives a writable /opt/packages (as any
# is to root) the layer's site directory.
mkdir "$root/opt/packages"

current="pack"; next "pack $tarball"
# The same bytes from the same tree: no build's times (the pax format records
# atime and ctime), no pid in a header's name.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --xattrs-exclude='*' \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$root" -cf - . | zstd -q -T0 -12 -o "$work/rootfs.tar.zst" || die "tar/zstd failed"
(cd "$work" && sha256sum rootfs.tar.zst | cut -d' ' -f1) >"$work/rootfs.tar.zst.sha256"
mv "$work/rootfs.tar.zst.sha256" "$tarball.sha256.tmp"
mv "$work/rootfs.tar.zst" "$tarball"
mv "$tarball.sha256.tmp" "$tarball.sha256"
cp "$work/manifest.partial.json" "$out/rootfs-$recipe_hash.manifest.json"
ln -sfn "$(basename "$tarball")" "$out/current.tar.zst"
unpacked=$(du -sm "$root" | cut -f1)
packed=$(( $(stat -c %s "$tarball") / 1048576 ))
say "done: $tarball (${packed} MiB packed, ${unpacked} MiB unpacked)"
echo "$tarball"
