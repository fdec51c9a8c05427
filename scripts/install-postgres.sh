#!/usr/bin/env bash
# Installs PostgreSQL (the server's programs: initdb, postgres) from Debian's packages where they are
# missing. The tests need no server running: they use the one at 127.0.0.1:5432 (or $IDEM_PG_URL)
# when it answers, in a database of their own that they drop at the end, and otherwise start
# clusters of their own with initdb on free ports, as they do for the restart tests.
set -euo pipefail

find_initdb() {
    command -v initdb 2>/dev/null || ls -1 /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1
}

if [ -n "$(find_initdb)" ]; then
    echo "postgresql: $("$(dirname "$(find_initdb)")/postgres" --version)"
    exit 0
fi

echo "initdb not found: installing Debian's postgresql package" >&2
bash "$(dirname "$0")/apt-install.sh" postgresql
# The package may start a system cluster on 5432; the tests use it when it answers, in a database
# of their own.
[ -n "$(find_initdb)" ] || { echo "initdb still missing after install" >&2; exit 1; }
echo "postgresql: $("$(dirname "$(find_initdb)")/postgres" --version)"
