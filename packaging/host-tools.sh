#!/usr/bin/env bash
# Make sure the host has the tools `make run` and `make test` need, installing the
# missing ones on Debian and Ubuntu (apt-get), and printing the exact command
# elsewhere. Called by the Makefile before anything is built.
#
#   packaging/host-tools.sh [--test]     (--test: also what the test suite needs)
set -euo pipefail

say() { printf '[host] %s\n' "$*" >&2; }

# command -> Debian package, and why it is needed.
tools=(
  "cc:gcc:the Rust build links with the system C compiler"
  "debootstrap:debootstrap:builds the sandbox rootfs (Debian bookworm) once"
  "zstd:zstd:compresses the rootfs tarball"
  "tar:tar:packs the rootfs"
  "sha256sum:coreutils:hashes the rootfs recipe and tarball"
  "chroot:coreutils:runs the rootfs's own python3.11 while building it"
  "unshare:util-linux:keeps the rootfs build's mounts private"
  "flock:util-linux:one rootfs build at a time"
  "mountpoint:util-linux:the rootfs build's clean-up"
  "losetup:mount:session workspaces are ext4 images on loop devices"
  "mount:mount:mounts workspaces and the sandbox's file systems"
  "mkfs.ext4:e2fsprogs:makes session workspaces"
  "make:make:runs the Makefile"
)
if [ "${1:-}" = "--test" ]; then
  tools+=("python3:python3:runs the black-box test suite (its clients go in a venv: tests/clients.sh)")
  tools+=("/usr/bin/time:time:measures sandboxctl's peak memory in tests/test_cli.py")
  tools+=("ip:iproute2:the egress tests' own hosts: a network namespace, a veth pair and its routes (tests/egress_hosts.py)")
  tools+=("nsenter:util-linux:configures the egress test hosts' namespace; reads a stopped test daemon's mount namespace (tests/harness.py)")
fi

missing_cmds=()
missing_pkgs=()
for entry in "${tools[@]}"; do
  IFS=: read -r cmd pkg why <<<"$entry"
  if ! command -v "$cmd" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$cmd" ] && ! [ -x "/sbin/$cmd" ]; then
    missing_cmds+=("$cmd")
    case " ${missing_pkgs[*]-} " in *" $pkg "*) ;; *) missing_pkgs+=("$pkg") ;; esac
    say "missing $cmd (package $pkg): $why"
  fi
done
# The daemon compiles its seccomp filter with libseccomp: the build links it (its
# headers and the unversioned libseccomp.so come with the -dev package).
have_libseccomp() {
  pkg-config --exists libseccomp 2>/dev/null && return 0
  [ -e /usr/include/seccomp.h ] || return 1
  compgen -G '/usr/lib*/libseccomp.so' >/dev/null || compgen -G '/usr/lib/*-linux-gnu/libseccomp.so' >/dev/null \
    || compgen -G '/lib*/libseccomp.so' >/dev/null
}
if ! have_libseccomp; then
  missing_pkgs+=(libseccomp-dev)
  say "missing libseccomp's headers and library (package libseccomp-dev): the daemon compiles its seccomp filter with it"
fi
# The egress proxy verifies the servers sandboxes reach (the package index's) against
# the host's CA bundle, and sandboxes trust it: the daemon's ca_bundle.
if ! [ -s /etc/ssl/certs/ca-certificates.crt ] && ! [ -s /etc/pki/tls/certs/ca-bundle.crt ] && ! [ -s /etc/ssl/ca-bundle.pem ]; then
  missing_pkgs+=(ca-certificates)
  say "missing the host's CA certificates (package ca-certificates): the egress proxy verifies the package index against them"
fi
# Debian and Ubuntu ship Python's venv module apart, as python3-venv; the test suite
# puts its clients in a venv (tests/clients.sh).
if [ "${1:-}" = "--test" ] && command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  missing_pkgs+=(python3-venv)
  say "missing python3's venv module (package python3-venv): the test suite's clients go in a venv"
elif [ "${1:-}" = "--test" ] && ! command -v python3 >/dev/null 2>&1; then
  missing_pkgs+=(python3-venv)
fi

# The console's browser tests (tests/test_console.py) drive Debian's headless
# Chromium through its chromedriver. Installed apart, and never fatal here: Ubuntu
# ships Chromium only as a snap, which a container or CI host may not run (the tests
# then say so: skipped outside CI, failed in it).
if [ "${1:-}" = "--test" ] && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  if [ "$(id -u)" -eq 0 ] && [ -r /etc/os-release ] && [ "$(. /etc/os-release && echo "${ID:-}")" = debian ]; then
    say "installing chromium and chromium-driver with apt-get (once): the console's browser tests"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/tmp/sandboxd-apt-browser.log 2>&1; then
      apt-get update -q >>/tmp/sandboxd-apt-browser.log 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >>/tmp/sandboxd-apt-browser.log 2>&1 \
        || say "apt-get install chromium chromium-driver failed (log: /tmp/sandboxd-apt-browser.log): the console's browser tests cannot run"
    fi
  else
    say "no /usr/bin/chromium and /usr/bin/chromedriver: the console's browser tests need them (Debian: apt-get install chromium chromium-driver)"
  fi
fi

# Cargo first: it cannot come from the distribution's packages in a version this
# workspace builds with, and sudo's PATH often hides a user's ~/.cargo/bin.
if ! command -v "${CARGO:-cargo}" >/dev/null 2>&1; then
  say "cargo (Rust) is not installed for $(id -un). Install it with:"
  say "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal && . \"\$HOME/.cargo/env\""
  if [ -n "${SUDO_USER:-}" ]; then
    say "or, if $SUDO_USER has it already (sudo resets PATH): sudo env \"PATH=\$PATH\" make ${MAKECMDGOALS:-run}"
  fi
  cargo_missing=1
fi

if [ ${#missing_pkgs[@]} -eq 0 ]; then
  [ -z "${cargo_missing:-}" ] || exit 1
  exit 0
fi

id_like=""
if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  id_like="$(. /etc/os-release && echo "${ID:-} ${ID_LIKE:-}")"
fi
# The same tools under other distributions' package names ($1: fedora, arch, suse).
other_pkgs() {
  local p out=()
  for p in "${missing_pkgs[@]}"; do
    case "$p" in
      mount) out+=(util-linux) ;;
      libseccomp-dev) if [ "${1:-}" = arch ]; then out+=(libseccomp); else out+=(libseccomp-devel); fi ;;
      iproute2) if [ "${1:-}" = fedora ]; then out+=(iproute); else out+=(iproute2); fi ;;
      coreutils | tar | make | zstd | debootstrap | e2fsprogs | util-linux | python3 | gcc | time | ca-certificates) out+=("$p") ;;
      python3-venv) ;; # part of python3 elsewhere
    esac
  done
  printf '%s\n' "${out[@]}" | sort -u | paste -sd' ' -
}

case " $id_like " in
  *" debian "* | *" ubuntu "*)
    if [ "$(id -u)" -ne 0 ]; then
      say "run as root to install them (sudo make ...), or: sudo apt-get install --no-install-recommends ${missing_pkgs[*]}"
      exit 1
    fi
    say "installing ${missing_pkgs[*]} with apt-get (once)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing_pkgs[@]}" >/tmp/sandboxd-apt.log 2>&1; then
      apt-get update -q >>/tmp/sandboxd-apt.log 2>&1 || true
      apt-get install -y -q --no-install-recommends "${missing_pkgs[@]}" >>/tmp/sandboxd-apt.log 2>&1 \
        || { tail -15 /tmp/sandboxd-apt.log >&2; say "apt-get install ${missing_pkgs[*]} failed (log: /tmp/sandboxd-apt.log)"; exit 1; }
    fi
    say "installed ${missing_pkgs[*]}"
    ;;
  *" fedora "* | *" rhel "* | *" centos "*)
    say "install them with: sudo dnf install -y $(other_pkgs fedora)"
    exit 1 ;;
  *" arch "*)
    say "install them with: sudo pacman -S --needed $(other_pkgs arch)"
    exit 1 ;;
  *" suse "* | *" opensuse "*)
    say "install them with: sudo zypper install -y $(other_pkgs suse)"
    exit 1 ;;
  *)
    say "install these with your distribution's package manager: $(other_pkgs) (libseccomp's development files)"
    exit 1 ;;
esac
[ -z "${cargo_missing:-}" ] || exit 1
