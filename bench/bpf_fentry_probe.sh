#!/usr/bin/env bash
# Can this kernel run BPF trampoline programs (fentry/fexit) on the syscall dispatcher
# x64_sys_call, which would replace the raw_syscalls tracepoints of `attach --backend bpf`
# (issue 14: while any syscall tracepoint is enabled every task takes the syscall slow path
# and runs the programs; a trampoline on x64_sys_call would cost other tasks only the
# trampoline and the process filter)? Builds a minimal fentry+fexit pair (they count the
# calls of one process and keep the last call's number, arguments and result) and a
# tp_btf program as the control, loads each with bpftool and prints the kernel's verdict:
# the load error and the verifier's log when it refuses.
#
#   bench/bpf_fentry_probe.sh [FUNCTION]    (default x64_sys_call)
#
# Needs root, clang, bpftool.
set -euo pipefail
fn=${1:-x64_sys_call}
for t in clang bpftool; do command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 2; }; done
dir=$(mktemp -d)
pins=/sys/fs/bpf/stallscope-probe-$$
trap 'rm -rf "$pins" "$dir"' EXIT
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
echo "# kernel $(uname -r); $fn in /proc/kallsyms: $(grep -c " [tT] $fn\$" /proc/kallsyms); /sys/kernel/btf/vmlinux: $([ -e /sys/kernel/btf/vmlinux ] && echo yes || echo no)"
for sec in "tp_btf/sys_enter" "fentry/$fn" "fexit/$fn"; do
  ret=0
  [ "${sec%%/*}" = fexit ] && ret="ctx[2]" # the result: only fexit has it
  cat >"$dir/p.bpf.c" <<C
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
struct pt_regs { unsigned long di, si, dx, r10, r8, r9; } __attribute__((preserve_access_index));
struct last { __u64 calls, nr, ret, args[6]; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct last); } out SEC(".maps");
volatile const __u32 tgid = 0;
SEC("$sec")
int probe(__u64 *ctx)
{
	__u32 zero = 0;
	struct last *l = bpf_map_lookup_elem(&out, &zero);
	if (!l || (bpf_get_current_pid_tgid() >> 32) != tgid)
		return 0;
	struct pt_regs *r = (struct pt_regs *)ctx[0];
	l->calls++;
	l->nr = ctx[1];
	l->ret = $ret;
	l->args[0] = r->di; l->args[1] = r->si; l->args[2] = r->dx;
	l->args[3] = r->r10; l->args[4] = r->r8; l->args[5] = r->r9;
	return 0;
}
C
  clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -I/usr/include/"$(uname -m)"-linux-gnu -c "$dir/p.bpf.c" -o "$dir/p.bpf.o"
  rm -rf "$pins"
  if out=$(bpftool -d prog loadall "$dir/p.bpf.o" "$pins" 2>&1); then
    echo "$sec: loaded"
  else
    echo "$sec: refused: $(grep -e 'load failed' -e 'failed to load' <<<"$out" | head -1)"
    log=$(sed -n '/-- BEGIN PROG LOAD LOG --/,/-- END PROG LOAD LOG --/p' <<<"$out" | sed '1d;$d')
    echo "  verifier log, last lines: ${log:+$(tail -3 <<<"$log" | tr '\n' ' ')}${log:-(empty: refused before the verifier ran)}"
  fi
done
