#!/usr/bin/env bash
# The layout rules of docs/ARCHITECTURE.md ("The map"), checked from the imports:
#   - a role (gateway/, server/, relay/) never names another role;
#   - the daemon kit (daemon/), the configuration (config/), the status schema (status/) and the
#     control socket (control.rs) name no role, and the configuration not the control socket;
#   - the daemon library never names the lab (crates/mt6d-lab; only the binary, for `mt6d demo`,
#     the tests and the bench do; cargo already refuses it outside test modules, where the lab is
#     a dev-dependency);
#   - no raw IPv6 address offsets outside mt6d-proto's wire/ views;
#   - the product crates hold no `unsafe` (all of it lives in mt6d-os), and say so with
#     `#![forbid(unsafe_code)]`;
#   - code, scripts and documents point at nothing a reader of the repository cannot follow:
#     no pointer into the issue tracker ("issue" and a number), which is not in the repository;
#     say what the requirement, finding or figure is. docs/results/ and CHANGELOG.md are
#     records and keep their words.
# A name counts when it appears as a path (`crate::server`, `mt6d::relay::`, `super::super::`)
# outside comments and before the file's `#[cfg(test)]` module.
set -euo pipefail
cd "$(dirname "$0")/.."
src=crates/mt6d-daemon/src
failed=0

# Product lines of a file: no comment lines, nothing from the first `#[cfg(test)]` on.
product_lines() {
    awk '/^#\[cfg\(test\)\]/ { exit } { print FILENAME ":" FNR ": " $0 }' "$1" |
        grep -Ev '^[^:]+:[0-9]+: *//' || true
}

# refuse DIR PATTERN WHY: no product line under DIR may match PATTERN.
refuse() {
    local dir=$1 pattern=$2 why=$3 hits
    hits=$(find "$dir" -name '*.rs' -print0 | sort -z | while IFS= read -r -d '' f; do
        product_lines "$f"
    done | grep -E "$pattern" || true)
    if [[ -n $hits ]]; then
        echo "check-layout: $why:" >&2
        echo "$hits" >&2
        failed=1
    fi
}

roles=(gateway server relay)
for role in "${roles[@]}"; do
    others=$(printf '%s\n' "${roles[@]}" | grep -vx "$role" | paste -sd'|')
    refuse "$src/$role" "(crate|mt6d)::($others)\\b|super::super::" \
        "the $role role names another role (move what both need into daemon/)"
done
for shared in daemon config status; do
    refuse "$src/$shared" '(crate|mt6d)::(gateway|server|relay)\b' \
        "$shared/ names a role"
done
refuse "$src/control.rs" '(crate|mt6d)::(gateway|server|relay)\b' \
    "the control socket names a role"
refuse "$src/config" '(crate|mt6d)::control\b' "the configuration names the control socket"
refuse "$src" '\bmt6d_lab\b' "the daemon library names the lab outside its tests"
# Packet layouts live in the protocol crate's wire/ views: no raw IPv6 address offsets elsewhere
# in the product (the lab and the bench may build and read packets by hand).
refuse "$src" '\b(8\.\.24|24\.\.40)\b' "raw IPv6 address offsets outside mt6d-proto's wire/ (use wire::address_bytes, IPV6_SRC_ADDR, IPV6_DST_ADDR)"
for f in $(find crates/mt6d-proto/src -name '*.rs' ! -path '*/wire/*' | sort); do
    refuse "$f" '\b(8\.\.24|24\.\.40)\b' "raw IPv6 address offsets outside wire/"
done

for crate in mt6d-proto mt6d-daemon mt6d-lab mt6d mt6d-bench; do
    for root in crates/$crate/src/lib.rs crates/$crate/src/main.rs; do
        [[ -f $root ]] || continue
        if ! grep -q '^#!\[forbid(unsafe_code)\]' "$root"; then
            echo "check-layout: $root lacks #![forbid(unsafe_code)] (unsafe code lives in mt6d-os)" >&2
            failed=1
        fi
    done
done

# Pointers into the issue tracker, in every text file a reader of the repository meets.
readable=(crates scripts docs README.md CONTRIBUTING.md examples packaging fuzz)
existing=()
for path in "${readable[@]}"; do
    [[ -e $path ]] && existing+=("$path")
done
pointers=$(grep -rInE '[Tt]racker [Ii]ssue|[Ii]ssue [0-9]+' --exclude-dir=target \
    --exclude-dir=corpus --exclude-dir=artifacts "${existing[@]}" | grep -v '^docs/results/' || true)
if [[ -n $pointers ]]; then
    echo "check-layout: a pointer into the issue tracker, which readers of the repository" \
        "cannot follow (say what the requirement, finding or figure is):" >&2
    echo "$pointers" >&2
    failed=1
fi

if [[ $failed -ne 0 ]]; then
    exit 1
fi
echo "check-layout: roles, kit, configuration, control socket and lab apart; no unsafe outside mt6d-os;" \
    "no issue tracker pointers"
