#!/usr/bin/env bash
# How long `cargo test` takes to build, before and after a change of test layout or profile:
# each commit is checked out into a fresh worktree with an empty target directory (the
# crates.io sources are already downloaded), and its test command is timed without running
# the tests (`--no-run`), which is what the integration-binary count and the profile move.
#   bench/test_build.sh OLD_COMMIT "OLD_CARGO_ARGS" NEW_COMMIT "NEW_CARGO_ARGS"
# e.g. bench/test_build.sh 003be8f "--release" HEAD "--profile testing"
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 OLD_COMMIT OLD_ARGS NEW_COMMIT NEW_ARGS" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'git worktree remove --force "$dir/old" 2>/dev/null; git worktree remove --force "$dir/new" 2>/dev/null; rm -rf "$dir"' EXIT
for side in old new; do
  if [ $side = old ]; then c=$1; a=$2; else c=$3; a=$4; fi
  git worktree add -q --detach "$dir/$side" "$c"
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  (cd "$dir/$side" && cargo test $a --no-run 2>"$dir/$side.log")
  end=$(date +%s.%N)
  bins=$(grep -c 'Executable' "$dir/$side.log" || true)
  echo "$side $c ($a): $(echo "$end - $start" | bc) s to build the tests, $bins test executables, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
