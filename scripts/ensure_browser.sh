#!/usr/bin/env bash
# The headless-browser test of `npumem view` needs Debian's chromium. Install it when it is
# missing and we are root (CI and the development machines run as root); otherwise say how.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the viewer test (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "chromium is missing: install it (Debian: apt-get install chromium) for the viewer test" >&2
    exit 1
fi
