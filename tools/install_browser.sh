#!/usr/bin/env bash
# Headless Chromium for the report's browser tests (pytest marker `browser`): Debian's
# `chromium` and `chromium-driver`, plus fonts so pages render text. Idempotent: nothing
# happens when both commands are already on PATH. Needs apt-get and root (or password-less
# sudo); where either is missing, or the install fails, it says why on stderr and exits 0,
# and the browser tests skip naming what is missing.
set -uo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
say() { echo "install_browser: $*; the browser tests will skip" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get on this machine (install Chromium and chromedriver yourself)"
    exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        say "not root and no password-less sudo: run 'sudo tools/install_browser.sh'"
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get update -qq \
    || ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-dejavu-core fonts-liberation; then
    say "apt-get could not install chromium and chromium-driver"
    exit 0
fi
chromium --version >&2 || true
