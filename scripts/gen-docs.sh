#!/usr/bin/env bash
# Generates the CLI's man pages and shell completions from the binary (the
# same clap definition as `dbmutex --help`), and checks them:
#
#   $OUT/man/dbmutex.1, $OUT/man/dbmutex-<subcommand>.1   (roff; groff must format
#                                                          each without a warning)
#   $OUT/completions/dbmutex.bash, _dbmutex (zsh), dbmutex.fish, dbmutex.elv,
#   _dbmutex.ps1                                          (bash's passes `bash -n`)
#
# OUT is ${CARGO_TARGET_DIR:-target}. Builds the debug binary unless
# DBMUTEX_BIN names one. Exit status non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'gen-docs.sh: %s\n' "$*" >&2; }

out=${CARGO_TARGET_DIR:-target}
bin=${DBMUTEX_BIN:-}
if [[ -z $bin ]]; then
  cargo build -q -p dbmutex-cli --bin dbmutex
  bin=$out/debug/dbmutex
fi

mkdir -p "$out/man" "$out/completions"
rm -f "$out"/man/dbmutex*.1

"$bin" man > "$out/man/dbmutex.1"
# One page per subcommand that dbmutex(1) lists as dbmutex-NAME(1).
subcommands=$(sed -n 's/^dbmutex\\-\([a-z-]*\)(1)$/\1/p' "$out/man/dbmutex.1" | sed 's/\\-/-/g')
[[ -n $subcommands ]] || { say "dbmutex(1) lists no subcommand"; exit 1; }
for sub in $subcommands; do
  "$bin" man "$sub" > "$out/man/dbmutex-$sub.1"
done

"$bin" completions bash > "$out/completions/dbmutex.bash"
"$bin" completions zsh > "$out/completions/_dbmutex"
"$bin" completions fish > "$out/completions/dbmutex.fish"
"$bin" completions elvish > "$out/completions/dbmutex.elv"
"$bin" completions powershell > "$out/completions/_dbmutex.ps1"

status=0
bash -n "$out/completions/dbmutex.bash" || { say "bash rejects dbmutex.bash"; status=1; }
if command -v zsh > /dev/null; then
  zsh -n "$out/completions/_dbmutex" || { say "zsh rejects _dbmutex"; status=1; }
fi
if command -v fish > /dev/null; then
  fish --no-execute "$out/completions/dbmutex.fish" || { say "fish rejects dbmutex.fish"; status=1; }
fi
if command -v groff > /dev/null; then
  for page in "$out"/man/dbmutex*.1; do
    warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1) || status=1
    if [[ -n $warnings ]]; then
      say "groff on $page: $warnings"
      status=1
    fi
  done
else
  say "groff is not installed: the man pages were not checked"
fi
for f in "$out"/man/dbmutex*.1 "$out"/completions/*; do
  [[ -s $f ]] || { say "$f is empty"; status=1; }
done
say "$(ls "$out/man" | wc -l) man pages in $out/man, $(ls "$out/completions" | wc -l) completion scripts in $out/completions"
exit "$status"
