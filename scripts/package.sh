#!/usr/bin/env bash
# The crates as crates.io would get them, and the Rust version they promise.
#
# 1. `cargo package` of dbmutex and dbmutex-cli (dbmutex-bench is
#    `publish = false`), together: cargo puts the not yet published dbmutex
#    in a local overlay registry, so the CLI's package resolves it from its
#    .crate. Each package is then verified: unpacked and built on its own,
#    the CLI against the packaged library.
# 2. The library's doctests, run from its unpacked .crate: a doc that pulls
#    in a file outside the package fails here, as it would for docs.rs and
#    for anyone who runs `cargo test` on the published crate.
# 3. The workspace README's Rust examples (in no package), compiled and run
#    by rustdoc against that library.
# 4. rust-version: only one toolchain is installed, so the check is what
#    can be decided without the old compiler: every package in Cargo.lock
#    declares a rust-version at most ours (or none; `resolver = "3"` keeps
#    `cargo update` to such versions), and clippy's `incompatible_msrv`
#    lint finds no standard-library API newer than ours in our code (it
#    reads `rust-version` from Cargo.toml). Language features newer than
#    ours are not caught.
# 5. Prints the crates each feature set compiles (the table in
#    crates/dbmutex/README.md, "Features").
#
# Every step runs; the exit status is non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'package.sh: %s\n' "$*" >&2; }
status=0
# The workspace's [profile.dev] (line tables only): the packaged manifests
# carry no profiles, and built with cargo's default (full debug info) the
# verification and doctest builds could reuse none of the workspace's
# dependencies (CI: 69 s more). The setting changes no code that is built.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}

# python3 reads cargo's JSON; a fresh Debian machine may lack it (test.sh
# installs its tools the same way).
if ! command -v python3 >/dev/null; then
  say "installing python3"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
fi

meta=$(cargo metadata --format-version 1 --locked)
field() { python3 -c "import json,sys; m=json.load(sys.stdin); print($1)" <<<"$meta"; }
target=$(field 'm["target_directory"]')
version=$(field '[p["version"] for p in m["packages"] if p["name"] == "dbmutex"][0]')
msrv=$(field '[p["rust_version"] for p in m["packages"] if p["name"] == "dbmutex"][0]')

# 1. Package and verify (no .crate left from an earlier run may stand in).
rm -f "$target/package/dbmutex-$version.crate" "$target/package/dbmutex-cli-$version.crate"
# cargo unpacks the overlay registry's dbmutex .crate into CARGO_HOME once
# per version and reuses that copy on every later run (a local registry is
# never unpacked twice), so the CLI would be verified against a stale
# library: drop it. Local registries' directories are the ones named `-*`.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/"dbmutex-$version"
cargo package --workspace --exclude dbmutex-bench --locked --allow-dirty || status=$?

# 2. Doctests from the package. Unpacked outside the workspace, so cargo
# does not take it for a member of it.
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
crate="$target/package/dbmutex-$version.crate"
rlib=
if tar -xzf "$crate" -C "$unpacked"; then
  pkg="$unpacked/dbmutex-$version"
  # The workspace's target directory: dependencies built for the tests are reused.
  export CARGO_TARGET_DIR="$target"
  (cd "$pkg" && cargo test --doc --locked) || status=$?
  # 3. The library those doctests used, for rustdoc.
  rlib=$(cd "$pkg" && cargo build --lib --locked --message-format=json |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "dbmutex":
        print(next(f for f in m["filenames"] if f.endswith(".rlib")))') || status=$?
  unset CARGO_TARGET_DIR
else
  say "no package to test: $crate"
  status=1
fi
if [ -n "$rlib" ]; then
  rustdoc --test README.md --edition 2021 --crate-name workspace_readme \
    --extern "dbmutex=$rlib" -L "dependency=$target/debug/deps" || status=$?
else
  say "README.md examples not tested: no library built"
  status=1
fi

# 4a. Locked dependencies declare a rust-version no newer than ours.
newer_than_ours=$(cat <<'EOF'
import json, sys
ours = sys.argv[1]
def ver(s):
    parts = [int(p) for p in s.split(".")]
    return parts + [0] * (3 - len(parts))
m = json.load(sys.stdin)
locked = {n["id"] for n in m["resolve"]["nodes"]}
newer = [f'{p["name"]} {p["version"]} needs Rust {p["rust_version"]}'
         for p in m["packages"]
         if p["id"] in locked and p.get("rust_version") and ver(p["rust_version"]) > ver(ours)]
for line in newer:
    print(f"package.sh: rust-version {ours}: {line}", file=sys.stderr)
sys.exit(1 if newer else 0)
EOF
)
python3 -c "$newer_than_ours" "$msrv" <<<"$meta" || status=$?
# 4b. No standard-library API newer than rust-version in what we ship. The
# library alone first: its dependencies are the ones .ci/run's feature
# checks have just checked, so only dbmutex is linted again; then the CLI
# (tokio with more features: the async stack is checked once more).
for package in "-p dbmutex --lib" "-p dbmutex-cli --bins"; do
  # shellcheck disable=SC2086 # two words each
  cargo clippy --locked $package -- -A warnings -D clippy::incompatible_msrv || status=$?
done

# 5. Crates per feature set (distinct name and version, dbmutex included).
crates() { cargo tree --locked -e normal --prefix none "$@" | sed 's/ (\*)//; s/ (proc-macro)//' | sort -u | wc -l; }
printf 'crates compiled (cargo tree -e normal):\n'
for f in "" postgres postgres,tls mysql mysql,tls; do
  printf '  %-22s %s\n' "${f:-no features}" "$(crates -p dbmutex --no-default-features --features "$f")"
done
printf '  %-22s %s\n' "default" "$(crates -p dbmutex)"
printf '  %-22s %s\n' "dbmutex-cli" "$(crates -p dbmutex-cli)"

[ "$status" = 0 ] || say "failed (status $status)"
exit "$status"
