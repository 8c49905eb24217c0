#!/usr/bin/env bash
# Installs everything humanset needs on a fresh Debian/Ubuntu machine with Python 3.11:
# apt packages from deps/*.apt.txt, then a virtualenv with the package and deps/*.pip.txt
# (deps/*.nodeps.txt are installed with --no-deps: packages whose declared deps we replace).
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."

apt_pkgs=$(cat deps/*.apt.txt 2>/dev/null | sed 's/#.*//' | xargs -r echo)
if [ -n "$apt_pkgs" ]; then
  missing=$(for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs -r echo)
  if [ -n "$missing" ]; then
    echo "install: apt packages: $missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# torch/torchvision first, as a pair (ultralytics needs torchvision)
$PIP install -q "torch==2.14.1" "torchvision==0.29.1"
reqs=(); for f in deps/*.pip.txt; do [ -e "$f" ] && reqs+=(-r "$f"); done
$PIP install -q -e ".[test]" "${reqs[@]}"
for f in deps/*.nodeps.txt; do [ -e "$f" ] && $PIP install -q --no-deps -r "$f"; done
echo "install: done ($($VENV/bin/python --version), venv $VENV)"
