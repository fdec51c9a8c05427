#!/usr/bin/env bash
# Installs nats-server (JetStream is built in) from Debian's packages where it is missing. The
# tests start servers of their own on free ports, each with its store in a directory of its own,
# and never use a server the machine runs.
set -euo pipefail

find_nats() {
    command -v nats-server 2>/dev/null || { [ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server; } || true
}
if [ -n "$(find_nats)" ]; then
    echo "nats: $("$(find_nats)" --version)"
    exit 0
fi

echo "nats-server not found: installing Debian's nats-server package" >&2
bash "$(dirname "$0")/apt-install.sh" nats-server
# The package may start a system service on 4222; the tests do not use it.
[ -n "$(find_nats)" ] || { echo "nats-server still missing after install" >&2; exit 1; }
echo "nats: $("$(find_nats)" --version)"
