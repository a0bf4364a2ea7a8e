#!/usr/bin/env bash
# Rebuilds bpf/stallscope.bpf.o (the kernel programs of `attach --backend bpf`, embedded in
# the binary) from bpf/stallscope.bpf.c with Debian's clang and libbpf headers
# (apt-get install clang llvm libbpf-dev). The default `cargo build` never needs this: the
# object is committed. Run it after editing the C source and commit both.
#   scripts/build-bpf.sh            rebuild bpf/stallscope.bpf.o
#   scripts/build-bpf.sh --check    rebuild into a temp file and fail unless it matches
# The build is reproducible: no debug info (only BTF, which the loader needs), paths
# relative to the repository, so the same clang gives the same bytes anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
src=bpf/stallscope.bpf.c
obj=bpf/stallscope.bpf.o
out=$obj
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp --suffix=.bpf.o)
  trap 'rm -f "$out"' EXIT
fi
clang=${CLANG:-clang}
strip=${LLVM_STRIP:-llvm-strip}
arch=$(uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
"$clang" -O2 -g -target bpf -D__TARGET_ARCH_"$arch" \
  -fdebug-prefix-map="$PWD"=. -fno-ident \
  -I/usr/include/"$(uname -m)"-linux-gnu \
  -c "$src" -o "$out"
# DWARF goes (paths, compiler version); .BTF and .BTF.ext stay (map definitions, CO-RE).
"$strip" -g "$out"
if [ "${1:-}" = "--check" ]; then
  if ! cmp -s "$out" "$obj"; then
    echo "scripts/build-bpf.sh: $obj does not match what $src builds to with $("$clang" --version | head -1); rebuild it with scripts/build-bpf.sh and commit it" >&2
    exit 1
  fi
  echo "$obj matches $src"
fi
