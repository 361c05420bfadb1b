#!/usr/bin/env bash
# One entry point for developers and CI. Every command sets up what it needs first:
# a virtual environment in .venv with the pinned packages of constraints.txt, and the
# graphviz `dot` binary (through apt-get where it is missing).
#
#   ./dev.sh demo     set up, then run examples/quickstart_torch.py
#   ./dev.sh test     set up, then run the whole test suite (extra args go to pytest)
#   ./dev.sh bench    set up, then run the benchmarks and write bench/RESULTS.md
#   ./dev.sh lint     set up, then ruff format --check and ruff check
#   ./dev.sh docs     set up, then build the docs site into site/ (mkdocs build --strict);
#                     ./dev.sh docs serve serves it with live reload
#   ./dev.sh zoo      set up, then sweep the model zoo and write docs/models.md (resumable;
#                     --only FAMILY, -k PATTERN, --jobs N, --timeout S; see bench/zoo)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=.venv

setup_dot() {
  command -v dot >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1; then
    echo "==> installing graphviz (the dot binary) with apt-get"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq graphviz >/dev/null
  else
    echo "warning: graphviz's dot binary is missing; install it (brew install graphviz) to render drawings" >&2
  fi
}

# Debian's Chromium, for the explorer's browser tests (driven by Playwright through
# executable_path; Playwright's own browser download cannot work offline).
setup_chromium() {
  command -v chromium >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1; then
    echo "==> installing chromium with apt-get (browser tests)"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null ||
      echo "warning: chromium did not install; the browser tests will be skipped" >&2
  else
    echo "warning: chromium is missing; the browser tests will be skipped" >&2
  fi
}

# Install clouseau[$1] with the pins, only when the pins or the package metadata changed
# since the last install of these extras (its stamp file is older than them). The build
# backend's deprecation warnings are not ours to act on: they are silenced.
install_extras() {
  local stamp="$VENV/.clouseau-installed${2:-}"
  if [ -f "$stamp" ] && [ ! constraints.txt -nt "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
    return 0
  fi
  echo "==> installing clouseau[$1] with the pins of constraints.txt"
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --upgrade pip &&
    PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[$1]"
  local status=$?
  touch "$stamp"  # a failed optional install is not retried until the pins change
  return $status
}

setup_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
  fi
  install_extras dev || { rm -f "$VENV/.clouseau-installed"; exit 1; }
}

setup() { setup_dot; setup_venv; }

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; "$VENV/bin/python" examples/quickstart_torch.py "$@" ;;
  test) setup; setup_chromium; "$VENV/bin/python" -m pytest -q "$@" ;;
  bench)
    setup
    # TorchLens, for the comparison against it (optional: skipped when it cannot install).
    install_extras dev,bench -bench ||
      echo "warning: TorchLens did not install; its comparison is skipped" >&2
    "$VENV/bin/python" -m bench "$@" ;;
  lint) setup; "$VENV/bin/ruff" format --check . && "$VENV/bin/ruff" check . ;;
  docs)
    setup
    export NO_MKDOCS_2_WARNING=1  # Material's banner about its successor, on every build
    if [ "${1:-}" = serve ]; then
      shift; "$VENV/bin/mkdocs" serve "$@"
    else
      "$VENV/bin/mkdocs" build --strict "$@"
    fi ;;
  zoo) setup; "$VENV/bin/python" -m bench.zoo "$@" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
