#!/usr/bin/env bash
# Installs what the tests need (redis-server and strace from Debian's packages; rustfmt and
# clippy for CI's checks), then runs the whole test suite. Run as root on Debian/Ubuntu, or
# with the packages already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v strace >/dev/null || need+=(strace)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
# The perf backend of `attach` reads the kernel's syscall tracepoints through tracefs.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ] && [ "$(id -u)" -eq 0 ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo test --release
