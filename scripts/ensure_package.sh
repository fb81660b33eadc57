#!/usr/bin/env bash
# ensure_package.sh COMMAND PACKAGE PURPOSE: make sure COMMAND exists, installing Debian's
# PACKAGE when it is missing and we are root (CI and the development machines run as root);
# otherwise say how. The viewer test needs chromium, `make memcheck` valgrind.
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: ensure_package.sh COMMAND PACKAGE PURPOSE" >&2
    exit 2
fi
command=$1 package=$2 purpose=$3
if command -v "$command" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $package for $purpose (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
else
    echo "$command is missing: install it (Debian: apt-get install $package) for $purpose" >&2
    exit 1
fi
