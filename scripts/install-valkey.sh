#!/usr/bin/env bash
# Builds a Valkey 8.1.1 server from Debian trixie's source package and caches it under
# ${XDG_CACHE_HOME:-$HOME/.cache}/idempotent/valkey-8.1.1/ (the trixie binary package needs a
# newer glibc than bookworm's, and bookworm-backports has only 8.0, which lacks SET ... IFEQ).
# Prints the absolute path of the valkey-server binary as its last line on stdout; everything
# else goes to stderr:  VALKEY_SERVER=$(bash scripts/install-valkey.sh | tail -1)
# A $VALKEY_SERVER that points to an executable, or an already cached build, is printed at once.
# The source is fetched with an apt configuration of its own (deb-src lines only, for trixie and
# trixie-security, reusing the URIs of the machine's Debian sources); the machine's apt sources
# are neither used for this nor modified. Concurrent runs are serialised with flock.
set -euo pipefail

VALKEY_VERSION="8.1.1"
ORIG_TARBALL="valkey_${VALKEY_VERSION}+dfsg1.orig.tar.xz"
ORIG_SHA256="d9bbd82eecb82f359e649a0007ad3dc1b47cc15afa626348ca86b73c4ae2c7ee"
SOURCE_SUITE="trixie"
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/idempotent/valkey-${VALKEY_VERSION}"
CACHED_SERVER="$CACHE_DIR/valkey-server"

log() { echo "install-valkey: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Absolute path without resolving symlinks.
abs_path() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

cached_ok() {
    [ -x "$CACHED_SERVER" ] && "$CACHED_SERVER" --version 2>/dev/null | grep -q " v=${VALKEY_VERSION} "
}

# 1. An explicit $VALKEY_SERVER wins.
if [ -n "${VALKEY_SERVER:-}" ]; then
    candidate="$VALKEY_SERVER"
    if [[ "$candidate" != */* ]]; then
        candidate="$(command -v "$candidate" 2>/dev/null || true)"
    fi
    if [ -n "$candidate" ] && [ -f "$candidate" ] && [ -x "$candidate" ]; then
        log "using \$VALKEY_SERVER"
        abs_path "$candidate"
        exit 0
    fi
    log "warning: \$VALKEY_SERVER=$VALKEY_SERVER is not an executable; ignoring it"
fi

# 2. A cached build.
if cached_ok; then
    echo "$CACHED_SERVER"
    exit 0
fi

# 3. Build it, one process at a time.
mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/install.lock"
if ! flock -n 9; then
    log "another install of valkey ${VALKEY_VERSION} is running; waiting for it"
    flock 9
fi
if cached_ok; then
    echo "$CACHED_SERVER"
    exit 0
fi

# Build prerequisites, only those missing.
missing=()
command -v make >/dev/null 2>&1 || missing+=(make)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing build prerequisites: ${missing[*]}"
    bash "$(dirname "$0")/apt-install.sh" "${missing[@]}"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/install-valkey.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# apt downloads as the unprivileged _apt user when run as root: let it reach its directories.
chmod 0755 "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/download"
if [ "$(id -u)" -eq 0 ] && getent passwd _apt >/dev/null 2>&1; then
    chown _apt "$WORK/download"
fi

# Prints "URI SUITE SIGNED-BY" for each enabled entry of the machine's apt sources (deb822
# .sources files and one-line .list files); SIGNED-BY is "-" when absent.
list_machine_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            function flush(   n, m, i, j, U, S) {
                if (uris != "" && enabled != "no") {
                    n = split(uris, U, /[ \t]+/); m = split(suites, S, /[ \t]+/)
                    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++)
                        if (U[i] != "" && S[j] != "") print U[i], S[j], (signed == "" ? "-" : signed)
                }
                uris = ""; suites = ""; signed = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]/   { next }
            {
                key = tolower($0); sub(/:.*/, "", key)
                val = $0; sub(/^[^:]*:[ \t]*/, "", val); sub(/[ \t]+$/, "", val)
                if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "signed-by") signed = (val ~ /^\/[^ \t]*$/ ? val : "")
                else if (key == "enabled") enabled = tolower(val)
            }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '
            /^[ \t]*#/ { next }
            $1 == "deb" || $1 == "deb-src" {
                i = 2; signed = "-"
                if ($2 ~ /^\[/) {
                    while (i <= NF) {
                        opt = $i; gsub(/[\[\]]/, "", opt)
                        if (opt ~ /^signed-by=\//) { sub(/^signed-by=/, "", opt); signed = opt }
                        if ($i ~ /\]$/) { i++; break }
                        i++
                    }
                }
                if (i + 1 <= NF) print $i, $(i + 1), signed
            }' "$f"
    done
}

codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
sources="$(list_machine_sources)"
pick() { # pick SUITE: "URI SIGNED-BY" of the first entry for that suite
    awk -v s="$1" '$2 == s { print $1, $3; exit }' <<<"$sources"
}
main_entry="$(pick "$codename")"
security_entry="$(pick "${codename}-security")"
if [ -z "$main_entry" ]; then
    # No entry for the release's own codename: any Debian-looking suite without a dash.
    main_entry="$(awk '$2 ~ /^(stable|testing|unstable|sid|[a-z]+)$/ && $1 ~ /debian/ { print $1, $3; exit }' <<<"$sources")"
fi
[ -n "$main_entry" ] || die "found no Debian entry in /etc/apt/sources.list{,.d/} to take the mirror URI from"

default_keyring=/usr/share/keyrings/debian-archive-keyring.gpg
src_line() { # src_line "URI SIGNED-BY" SUITE
    local uri keyring opts=""
    read -r uri keyring <<<"$1"
    [ "$keyring" != "-" ] || keyring="$default_keyring"
    [ -e "$keyring" ] && opts="[signed-by=$keyring] "
    echo "deb-src ${opts}${uri} $2 main"
}
{
    src_line "$main_entry" "$SOURCE_SUITE"
    [ -z "$security_entry" ] || src_line "$security_entry" "${SOURCE_SUITE}-security"
} >"$WORK/apt/sources.list"
log "apt source entries (own configuration in $WORK/apt):"
sed 's/^/    /' "$WORK/apt/sources.list" >&2

APT_OPTS=(
    -o "Dir::Etc::sourcelist=$WORK/apt/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::Etc::preferences=/dev/null"
    -o "Dir::Etc::preferencesparts=-"
    -o "Dir::State::Lists=$WORK/apt/lists"
    -o "Dir::State::status=/dev/null"
    -o "Dir::Cache=$WORK/apt/cache"
    -o "APT::Get::List-Cleanup=false"
)
log "fetching the ${SOURCE_SUITE} source index"
apt-get -q "${APT_OPTS[@]}" update >&2

# The newest Debian revision of the wanted upstream version, and its pool directory.
showsrc="$(apt-cache "${APT_OPTS[@]}" showsrc valkey 2>/dev/null || true)"
debian_version="$(awk '/^Version:/ { print $2 }' <<<"$showsrc" \
    | grep -F "${VALKEY_VERSION}+dfsg1-" | sort -V | tail -1 || true)"
pool_dir="$(awk '/^Directory:/ { print $2; exit }' <<<"$showsrc")"
pool_dir="${pool_dir:-pool/main/v/valkey}"

orig="$WORK/download/$ORIG_TARBALL"
orig_ok() { [ -f "$orig" ] && echo "$ORIG_SHA256  $orig" | sha256sum -c --status; }

if [ -n "$debian_version" ]; then
    log "downloading source package valkey=$debian_version"
    # The .dsc of the newest revision may be missing from a mirror (404); the orig tarball,
    # the only file the build needs, is then usually still fetched, so a failure is tolerated.
    # apt's own output goes to a file: its 404 lines read like a failure when nothing failed.
    if ! (cd "$WORK/download" && apt-get -q "${APT_OPTS[@]}" source --download-only "valkey=$debian_version") \
        >"$WORK/apt-source.log" 2>&1; then
        log "the mirror lacks part of the source package (a 404 on the newest revision's .dsc is usual);"
        log "only the orig tarball is needed: checking for it (not an error unless that fails too)"
    fi
else
    log "no valkey ${VALKEY_VERSION} in the ${SOURCE_SUITE} index; trying the pool directly"
fi

if ! orig_ok; then
    rm -f "$orig"
    for entry in "$main_entry" "$security_entry"; do
        [ -n "$entry" ] || continue
        read -r uri _ <<<"$entry"
        url="${uri%/}/$pool_dir/$ORIG_TARBALL"
        log "downloading $url"
        if /usr/lib/apt/apt-helper download-file "$url" "$orig" "SHA256:$ORIG_SHA256" >&2; then
            break
        fi
        rm -f "$orig"
    done
fi
orig_ok || {
    [ -f "$WORK/apt-source.log" ] && sed 's/^/    apt: /' "$WORK/apt-source.log" >&2
    die "could not download $ORIG_TARBALL (sha256 $ORIG_SHA256)"
}
log "got $ORIG_TARBALL (sha256 verified)"

mkdir -p "$WORK/build"
tar -xJf "$orig" -C "$WORK/build"
srcdir="$WORK/build/valkey-${VALKEY_VERSION}"
[ -d "$srcdir" ] || srcdir="$(find "$WORK/build" -mindepth 1 -maxdepth 1 -type d | head -1)"
[ -n "$srcdir" ] && [ -f "$srcdir/Makefile" ] || die "unexpected tarball layout"

log "building in $srcdir (several minutes of CPU)"
(cd "$srcdir" && nice -n 10 make -j2 BUILD_TLS=no USE_SYSTEMD=no >&2)

built_version="$("$srcdir/src/valkey-server" --version)"
log "built: $built_version"
grep -q " v=8\.1\." <<<"$built_version" || die "built server is not version 8.1: $built_version"

# Atomic install: copy under a temporary name, then rename; the server last, since its
# presence is what marks the cache as complete.
install_atomic() {
    local tmp="$CACHE_DIR/.$2.tmp.$$"
    cp "$1" "$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$CACHE_DIR/$2"
}
if [ -x "$srcdir/src/valkey-cli" ]; then
    install_atomic "$srcdir/src/valkey-cli" valkey-cli
fi
install_atomic "$srcdir/src/valkey-server" valkey-server

cached_ok || die "cached $CACHED_SERVER does not report v=${VALKEY_VERSION}"
log "cached in $CACHE_DIR"
echo "$CACHED_SERVER"
