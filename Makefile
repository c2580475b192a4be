# The two commands of README.md:  `make run` and `make test`.
CARGO ?= cargo
ROOTFS_DIR ?= /var/cache/sandboxd/rootfs
ROOTFS := $(ROOTFS_DIR)/current.tar.zst
PREFIX ?= /usr/local
PYTHON ?= python3

.PHONY: run build rootfs test unit-test system-test lint bench install verify-units clean

## Build everything, build the rootfs on first use (with progress), start sandboxd in the foreground.
run: build rootfs
	./target/release/sandboxd --policies-dir policies --rootfs-tarball $(ROOTFS)

build:
	$(CARGO) build --release --locked

## Build the Python rootfs tarball; does nothing when the recipe has not changed.
rootfs:
	rootfs/build.sh $(ROOTFS_DIR)

## The whole test suite: unit tests, then the black-box suite against real daemons (as root).
test: build rootfs unit-test system-test

unit-test:
	$(CARGO) test --release --locked

system-test:
	SANDBOXD_ROOTFS_TARBALL=$(ROOTFS) $(PYTHON) -m pytest tests

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings

## Side-by-side timings (see bench/bench.py).
bench: build rootfs
	SANDBOXD_ROOTFS_TARBALL=$(ROOTFS) $(PYTHON) bench/bench.py

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

clean:
	$(CARGO) clean
