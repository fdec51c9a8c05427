#!/usr/bin/env bash
# Installs redis-server (and redis-cli) from Debian's packages where they are missing.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    echo "redis: $(redis-server --version)"
    exit 0
fi

echo "redis-server not found: installing Debian's redis-server package" >&2
bash "$(dirname "$0")/apt-install.sh" redis-server redis-tools
# The package may start a system service on 6379; the tests start their own servers and do not
# use it.
command -v redis-server >/dev/null 2>&1 || { echo "redis-server still missing after install" >&2; exit 1; }
echo "redis: $(redis-server --version)"
