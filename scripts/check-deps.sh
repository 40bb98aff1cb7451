#!/usr/bin/env bash
# The dependency policy in deny.toml: licences, sources and duplicate versions always; known
# vulnerabilities (RustSec advisories) when the advisory database can be fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deny --version >/dev/null 2>&1; then
    cargo install cargo-deny --locked --version 0.20.2
fi
cargo deny --locked check licenses bans sources
# The advisory database is a git repository on github.com; a machine that only reaches package
# registries cannot fetch it. Say so instead of passing silently.
if timeout 20 git ls-remote https://github.com/RustSec/advisory-db HEAD >/dev/null 2>&1; then
    cargo deny --locked check advisories
else
    echo "check-deps: advisories NOT checked: github.com/RustSec/advisory-db is not reachable from this machine"
fi
