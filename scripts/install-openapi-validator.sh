#!/usr/bin/env bash
# Installs openapi-spec-validator (the OpenAPI Initiative's schemas, checked by the reference
# Python validator) from PyPI into a virtual environment of its own, cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/idempotent/openapi-spec-validator-<version>/. The HTTP layer's
# tests validate the OpenAPI fragment it generates with it. Prints the absolute path of the
# validator's executable as its last line on stdout; everything else goes to stderr:
#   OPENAPI_VALIDATOR=$(bash scripts/install-openapi-validator.sh | tail -1)
# An $OPENAPI_VALIDATOR that points to an executable, or an existing install, is printed at once.
# Concurrent runs are serialised with flock.
set -euo pipefail

VERSION="0.9.0"
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/idempotent/openapi-spec-validator-${VERSION}"
BIN="$DIR/bin/openapi-spec-validator"

if [ -n "${OPENAPI_VALIDATOR:-}" ] && [ -x "$OPENAPI_VALIDATOR" ]; then
    echo "$OPENAPI_VALIDATOR"
    exit 0
fi
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if [ ! -x "$BIN" ]; then
    echo "install-openapi-validator: installing openapi-spec-validator $VERSION from PyPI into $DIR" >&2
    command -v python3 >/dev/null || bash "$(dirname "$0")/apt-install.sh" python3 python3-venv
    rm -rf "$DIR"
    python3 -m venv "$DIR" >&2 || { bash "$(dirname "$0")/apt-install.sh" python3-venv && python3 -m venv "$DIR" >&2; }
    "$DIR/bin/pip" install --quiet "openapi-spec-validator==$VERSION" >&2
fi
"$BIN" --help >/dev/null
echo "$BIN"
