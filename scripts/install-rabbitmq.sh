#!/usr/bin/env bash
# RabbitMQ for the RabbitMQ consumer's tests: installs Debian's rabbitmq-server where it is
# missing and starts it where no broker answers (`rabbitmq-server -detached`, on its default port
# 5672, guest/guest on loopback). The tests never use its existing vhosts or queues: each makes a
# vhost of its own with rabbitmqctl and deletes it at the end.
set -euo pipefail

if ! command -v rabbitmqctl >/dev/null 2>&1; then
    echo "rabbitmqctl not found: installing Debian's rabbitmq-server package" >&2
    bash "$(dirname "$0")/apt-install.sh" rabbitmq-server
fi
if ! timeout 30 rabbitmqctl -q status >/dev/null 2>&1; then
    echo "no RabbitMQ broker answers: starting one" >&2
    rabbitmq-server -detached
    timeout 120 rabbitmqctl -q await_startup
fi
echo "rabbitmq: $(rabbitmqctl -q version 2>/dev/null || echo running)"
