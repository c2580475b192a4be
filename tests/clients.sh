#!/usr/bin/env bash
# The black-box suite's Python clients (tests/requirements.txt: pytest, httpx, the
# official MCP SDK), pinned, in a virtual environment of their own, so that
# `make test` needs nothing installed by hand and never touches the host's Python
# packages (Debian's python3 is "externally managed", PEP 668). Called by the
# Makefile; does nothing when the venv already holds these exact pins.
#
#   tests/clients.sh VENV_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: tests/clients.sh VENV_DIR}
say() { printf '[test-clients] %s\n' "$*" >&2; }

want=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
command -v python3 >/dev/null || { say "python3 is missing: packaging/host-tools.sh --test installs it"; exit 1; }
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  say "python3 cannot make a virtual environment (Debian and Ubuntu ship that part as python3-venv):"
  say "  apt-get install python3-venv   (dnf/pacman/zypper: it comes with python3)"
  exit 1
fi
say "installing the test clients (tests/requirements.txt) into $venv"
rm -rf "$venv"
python3 -m venv "$venv"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt; then
  say "pip could not install tests/requirements.txt from PyPI (behind a proxy? set PIP_INDEX_URL or HTTPS_PROXY)"
  rm -rf "$venv"
  exit 1
fi
echo "$want" >"$venv/.requirements"
say "ready: $("$venv/bin/python" -m pytest --version 2>&1 | head -1)"
