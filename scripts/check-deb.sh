#!/usr/bin/env bash
# Builds mt6d's .deb with cargo-deb (installed by scripts/install-deps.sh) and installs it with
# `dpkg -i` into a clean Debian chroot of this machine's release: the package must install on
# its own (its dependencies preinstalled in the chroot as apt would), create the mt6d user,
# carry the binary, unit, sysusers entry, manual pages, completions and example configurations,
# and `mt6d --version` and `mt6d check` on every example must pass inside it.
#
# The chroot comes from debootstrap (minbase, plus the package's dependencies) with the mirror
# of this machine's apt sources; the pristine tree is kept as a tarball in
# /var/cache/mt6d-check-deb, so only the first run downloads anything. Everything mounted in a
# chroot is unmounted and the trees removed on every exit path.
#
# Leaves the package at $CARGO_TARGET_DIR/debian/ (target/debian/ by default).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deb >/dev/null 2>&1; then
    echo "check-deb: cargo-deb not found; run scripts/install-deps.sh" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap
fi

target=${CARGO_TARGET_DIR:-$PWD/target}
work=$(mktemp -d /tmp/mt6d-check-deb.XXXXXX)
# Unmounts whatever is mounted below $1 (deepest first), then removes the tree without crossing
# into a file system that is still mounted.
release_tree() {
    local root=$1 m
    [ -d "$root" ] || return 0
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m"
    done < <(awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r)
    rm -rf --one-file-system "$root"
}
cleanup() { release_tree "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The package.
cargo build --release --locked -p mt6d
bin="$target/release/mt6d"
assets="$target/release/deb-assets"
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man --out "$assets/man" >/dev/null
# Debian ships manual pages compressed (policy 12.1); -n keeps the archive reproducible.
gzip -9n "$assets/man/"*.1
"$bin" completions bash >"$assets/completions/mt6d.bash"
"$bin" completions zsh >"$assets/completions/_mt6d"
"$bin" completions fish >"$assets/completions/mt6d.fish"
rm -f "$target"/debian/mt6d_*.deb
cargo deb -p mt6d --no-build --no-strip
deb=$(ls "$target"/debian/mt6d_*.deb)
echo "check-deb: built $deb"

# 2. A clean chroot of this release.
. /etc/os-release
suite=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
    mirror=$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
# What the package depends on beyond minbase, installed in the chroot as apt would first.
extra=nftables
cache_dir=/var/cache/mt6d-check-deb
cache="$cache_dir/$suite-minbase-$extra.tar"
if [ ! -f "$cache" ]; then
    echo "check-deb: debootstrap $suite (minbase, $extra) from $mirror, once"
    debootstrap --variant=minbase --include="$extra" "$suite" "$work/bootstrap" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log"
        echo "check-deb: debootstrap failed" >&2
        exit 1
    }
    mkdir -p "$cache_dir"
    tar -C "$work/bootstrap" -cf "$cache.tmp" .
    mv "$cache.tmp" "$cache"
    release_tree "$work/bootstrap"
fi
root="$work/root"
mkdir -p "$root"
tar -C "$root" -xf "$cache"
mount -t proc proc "$root/proc"

# 3. Install and check.
cp "$deb" "$root/tmp/mt6d.deb"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root dpkg -i /tmp/mt6d.deb
in_root mt6d --version
files=$(in_root dpkg -L mt6d)
for f in /usr/bin/mt6d /lib/systemd/system/mt6d@.service /usr/lib/sysusers.d/mt6d.conf \
    /usr/share/man/man1/mt6d.1.gz /usr/share/man/man1/mt6d-peer.1.gz \
    /usr/share/bash-completion/completions/mt6d /usr/share/zsh/vendor-completions/_mt6d \
    /usr/share/fish/vendor_completions.d/mt6d.fish /usr/share/doc/mt6d/copyright \
    /usr/share/doc/mt6d/examples/gateway-a.toml /usr/share/doc/mt6d/examples/gateway-b.toml \
    /usr/share/doc/mt6d/examples/host-a.toml /usr/share/doc/mt6d/examples/server.toml \
    /usr/share/doc/mt6d/examples/server-clients /usr/share/doc/mt6d/examples/client-c1.toml \
    /usr/share/doc/mt6d/examples/relay.toml /usr/share/doc/mt6d/examples/edge-a.toml \
    /usr/share/doc/mt6d/examples/gateway-tcp-policy.toml; do
    if ! grep -qx "$f" <<<"$files"; then
        echo "$files"
        echo "check-deb: the package does not carry $f" >&2
        exit 1
    fi
done
in_root getent passwd mt6d >/dev/null || {
    echo "check-deb: installing did not create the mt6d user" >&2
    exit 1
}
# The examples name key files beside them: make them in a copy, then check every example. The
# peers file holds keys, so the server wants it 0600 (the package installs documents 0644); the
# relay role checks that its interface exists, so the copy uses lo for eth0.
in_root sh -ec '
    cp -r /usr/share/doc/mt6d/examples /tmp/examples
    cd /tmp/examples
    for k in gateway-a gateway-b host-a server client-c1 relay edge-a; do
        mt6d keygen "$k.key" >/dev/null 2>&1
    done
    chmod 600 server-clients
    sed -i "s/\"eth0\"/\"lo\"/" *.toml
    for c in *.toml; do mt6d check -c "$c"; done
'
echo "check-deb: $(basename "$deb") installs with dpkg -i in a clean $suite chroot; mt6d --version and mt6d check on the examples pass"
