# The two commands of README.md:  `make run` and `make test`.
CARGO ?= cargo
ROOTFS_DIR ?= /var/cache/sandboxd/rootfs
ROOTFS := $(ROOTFS_DIR)/current.tar.zst
PREFIX ?= /usr/local
# The black-box suite and the benchmark run in a venv of their own (tests/clients.sh).
TEST_VENV ?= $(CURDIR)/target/test-venv
PYTHON ?= $(TEST_VENV)/bin/python

.PHONY: run build rootfs host-tools host-tools-test test test-clients unit-test system-test lint bench soak install verify-units deb fresh-host-test clean

## Install the missing host tools (apt-get on Debian/Ubuntu; elsewhere the exact command),
## build everything, build the rootfs on first use (with progress), check the host, start sandboxd.
run: host-tools build rootfs
	./target/release/sandboxd --policies-dir policies --rootfs-tarball $(ROOTFS)

## The tools the build, the rootfs and the daemon need (packaging/host-tools.sh says what and why).
host-tools:
	CARGO=$(CARGO) packaging/host-tools.sh

host-tools-test:
	CARGO=$(CARGO) packaging/host-tools.sh --test

build:
	$(CARGO) build --release --locked

## Build the Python rootfs tarball; does nothing when the recipe has not changed.
rootfs:
	rootfs/build.sh $(ROOTFS_DIR)

## The whole test suite: unit tests, then the black-box suite against real daemons (as root).
test: host-tools-test build rootfs test-clients unit-test system-test

## The suite's Python clients (tests/requirements.txt), pinned, in $(TEST_VENV).
test-clients:
	tests/clients.sh $(TEST_VENV)

unit-test:
	$(CARGO) test --release --locked

system-test:
	SANDBOXD_ROOTFS_TARBALL=$(ROOTFS) $(PYTHON) -m pytest tests

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings

## Side-by-side timings (see bench/bench.py).
bench: host-tools-test build rootfs test-clients
	SANDBOXD_ROOTFS_TARBALL=$(ROOTFS) $(PYTHON) bench/bench.py

## Mixed workloads from 8 clients with a SIGKILL and a SIGTERM in the middle (see
## tests/soak.py; a short version runs in the suite).
soak: host-tools-test build rootfs test-clients
	SANDBOXD_ROOTFS_TARBALL=$(ROOTFS) $(PYTHON) tests/soak.py

install: build
	install -D -m 0755 target/release/sandboxd $(DESTDIR)$(PREFIX)/bin/sandboxd
	install -D -m 0755 target/release/sandboxctl $(DESTDIR)$(PREFIX)/bin/sandboxctl
	install -D -m 0644 target/release/libsandboxd.so $(DESTDIR)$(PREFIX)/lib/sandboxd/libsandboxd.so
	install -d $(DESTDIR)/etc/sandboxd/policies
	install -m 0644 policies/*.toml $(DESTDIR)/etc/sandboxd/policies/
	install -D -m 0644 systemd/sandboxd.service $(DESTDIR)/etc/systemd/system/sandboxd.service
	install -D -m 0644 systemd/sandboxd.sysusers $(DESTDIR)/usr/lib/sysusers.d/sandboxd.conf
	install -D -m 0644 systemd/sandboxd.tmpfiles $(DESTDIR)/usr/lib/tmpfiles.d/sandboxd.conf

## Check the systemd units (needs the binaries installed where the unit expects them).
verify-units: install
	systemd-analyze verify $(DESTDIR)/etc/systemd/system/sandboxd.service

## A Debian package (dpkg-deb): target/debian/sandboxd_<version>_<arch>.deb
deb: build
	packaging/deb.sh

## The README's first command on a fresh Debian 13 tree entered with pivot_root (slow; see tests/fresh_host.sh).
fresh-host-test: build
	tests/fresh_host.sh

clean:
	$(CARGO) clean
