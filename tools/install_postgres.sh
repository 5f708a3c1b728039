#!/usr/bin/env bash
# PostgreSQL for the distributed-tuning tests (pytest marker `postgres`): Debian's
# `postgresql` package. The tests start a throwaway server of their own
# (tests/integration/postgres.py: initdb into a temporary directory, pg_ctl on a free
# port), so only the binaries are needed; no system cluster is started here. Idempotent:
# nothing happens when initdb and pg_ctl are already installed (on PATH or in Debian's
# /usr/lib/postgresql/<version>/bin). Needs apt-get and root (or password-less sudo);
# where either is missing, or the install fails, it says why on stderr and exits 0, and
# the PostgreSQL tests skip naming what is missing.
set -uo pipefail

installed() {
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        return 0
    fi
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && return 0
    done
    return 1
}

if installed; then
    exit 0
fi
say() { echo "install_postgres: $*; the PostgreSQL tests will skip" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get on this machine (install PostgreSQL's server binaries yourself)"
    exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        say "not root and no password-less sudo: run 'sudo tools/install_postgres.sh'"
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get update -qq \
    || ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends postgresql; then
    say "apt-get could not install postgresql"
    exit 0
fi
if ! installed; then
    say "postgresql is installed but initdb and pg_ctl were not found"
    exit 0
fi
