#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver (Debian's chromium and chromium-driver packages)
# where they are missing, for the browser test of idempotent-http. Quiet when already there.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi

echo "chromium or chromedriver not found: installing Debian's chromium and chromium-driver packages" >&2
bash "$(dirname "$0")/apt-install.sh" chromium chromium-driver fonts-dejavu-core
for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool still missing after install" >&2; exit 1; }
done
echo "browser: $(chromium --version 2>/dev/null || echo chromium), $(chromedriver --version 2>/dev/null | head -n1)" >&2
