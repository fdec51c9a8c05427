#!/usr/bin/env bash
# Installs Debian packages non-interactively (with sudo when not root): apt-install.sh PKG...
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "$@" >/dev/null
