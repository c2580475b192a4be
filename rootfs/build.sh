#!/usr/bin/env bash
# Build the sandbox rootfs: Debian bookworm minbase + Debian's python3.11 + a venv at
# /opt/py filled offline from the wheels pinned in requirements.lock.
#
#   rootfs/build.sh [OUT_DIR]      (default /var/cache/sandboxd/rootfs)
#
# Writes OUT_DIR/rootfs-<recipe-hash>.tar.zst, a .sha256 beside it, and a
# manifest.json (content hash, Python version, every package), then points
# OUT_DIR/current.tar.zst at it. A recipe that has not changed is not rebuilt.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/var/cache/sandboxd/rootfs}
mirror=${SANDBOXD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
steps=8
step=0

say() { printf '[rootfs] %s\n' "$*" >&2; }
next() { step=$((step + 1)); say "step $step/$steps: $*"; }
die() { say "FAILED at step $step/$steps ($current): $*"; exit 1; }
current="start"
trap 'rc=$?; [ $rc -eq 0 ] || say "FAILED at step $step/$steps ($current), exit code $rc; see the output above"' EXIT

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap and chroot need it)"
for tool in debootstrap zstd tar sha256sum python3; do
  command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install debootstrap zstd python3)"
done
python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "the host python3 must be 3.11 to install cp311 wheels (found $(python3 -V 2>&1))"

# Only what goes into the image counts: support/kernel.py is embedded in the daemon.
recipe_hash=$(cd "$here" && cat build.sh packages.txt requirements.lock support/runner.py support/sandboxd_runner.py support/sitecustomize.py | sha256sum | cut -c1-16)
tarball="$out/rootfs-$recipe_hash.tar.zst"
if [ -s "$tarball" ] && [ -s "$tarball.sha256" ]; then
  say "up to date: $tarball (recipe $recipe_hash)"
  ln -sfn "$(basename "$tarball")" "$out/current.tar.zst"
  trap - EXIT
  echo "$tarball"
  exit 0
fi

mkdir -p "$out" "$out/wheels"
work=$(mktemp -d "$out/.build-XXXXXX")
root="$work/root"
cleanup() {
  rc=$?
  for m in proc dev; do mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"; done
  rm -rf --one-file-system "$work"
  [ $rc -eq 0 ] || say "FAILED at step $step/$steps ($current), exit code $rc; see the output above"
}
trap cleanup EXIT

current="debootstrap"; next "debootstrap $suite minbase from $mirror (about a minute)"
include=$(grep -v '^#' "$here/packages.txt" | grep -v '^$' | paste -sd, -)
mkdir -p "$out/debs"
debootstrap --variant=minbase --cache-dir="$out/debs" --include="$include" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log tail above): is $mirror reachable? Set SANDBOXD_DEBIAN_MIRROR to use another mirror"; }

current="wheels"; next "download $(grep -c -- '--hash' "$here/requirements.lock") pinned wheels (cached in $out/wheels)"
PIP_FIND_LINKS= python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
  --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any \
  -d "$out/wheels" -r "$here/requirements.lock" \
  || die "could not download the wheels: is PyPI reachable, and do the hashes in requirements.lock match?"

current="venv"; next "create the venv /opt/py and install the wheels"
chroot "$root" /usr/bin/python3.11 -m venv --without-pip /opt/py || die "venv creation failed"
PIP_FIND_LINKS= python3 -m pip install --quiet --ignore-installed --no-index --find-links "$out/wheels" --require-hashes --no-deps \
  --no-compile --no-warn-script-location --root "$root" --prefix /opt/py -r "$here/requirements.lock" \
  || die "pip install into the rootfs failed"
# Scripts written by the host pip carry the host's interpreter path: none is needed.
find "$root/opt/py/bin" -type f ! -name 'python*' ! -name 'activate*' -delete

current="support"; next "install the sandbox support code and the sandbox user"
mkdir -p "$root/opt/sandboxd" "$root/mnt/data" "$root/tmp" "$root/proc" "$root/dev" "$root/sys"
cp "$here/support/runner.py" "$here/support/sandboxd_runner.py" "$root/opt/sandboxd/"
cp "$here/support/sitecustomize.py" "$root/opt/py/lib/python3.11/site-packages/sitecustomize.py"
echo "sandbox:x:1000:1000:sandbox:/tmp:/bin/bash" >>"$root/etc/passwd"
echo "sandbox:x:1000:" >>"$root/etc/group"
echo "sandbox" >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n::1 localhost\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"

current="slim"; next "remove docs, caches, tests and headers"
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda,bug} "$root"/var/cache/apt/* \
  "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/var/cache/debconf/*-old "$root"/dev/*
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
chroot "$root" /opt/py/bin/python -m compileall -q -j0 --invalidation-mode unchecked-hash /opt/py/lib/python3.11/site-packages /usr/lib/python3.11 /opt/sandboxd >/dev/null \
  || die "compileall failed"
mkdir -p "$root/opt/sandboxd/mplconfig"
chroot "$root" /usr/bin/env -i HOME=/tmp MPLCONFIGDIR=/opt/sandboxd/mplconfig MPLBACKEND=Agg /opt/py/bin/python -c '
import numpy, pandas, scipy, sklearn, matplotlib, matplotlib.pyplot, seaborn, PIL, openpyxl, pyarrow, reportlab
import numpy.testing, scipy.stats, scipy.optimize, sklearn.ensemble, sklearn.linear_model, pandas.plotting
import pyarrow.parquet, reportlab.pdfgen.canvas, PIL.Image
import matplotlib.font_manager as fm
fm.fontManager  # writes fontlist-*.json into MPLCONFIGDIR
' || die "an installed package failed to import"
ls "$root/opt/sandboxd/mplconfig"/fontlist-*.json >/dev/null || die "matplotlib did not write its font cache"

umount -l "$root/dev"
umount -l "$root/proc"

current="manifest"; next "write the manifest"
chroot "$root" /usr/bin/env -i /opt/py/bin/python - "$recipe_hash" >"$work/manifest.partial.json" <<'PY'
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

current="pack"; next "pack $tarball"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --xattrs-exclude='*' \
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
