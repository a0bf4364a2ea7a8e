// SPDX-License-Identifier: GPL-2.0
//
// stallscope's kernel side for `attach --backend bpf`: every syscall of the traced process
// (its threads, and its forked children unless told not to) paired in the kernel into one
// record, with the first bytes of read and write buffers, sent to stallscope through one BPF
// ring buffer. Nothing here stops or slows the traced process beyond the programs' own run
// time; records that do not fit in the ring are counted, never silently dropped.
//
// GPL because bpf_probe_read_user (the client's request bytes) is a GPL-only helper.
//
// Built by scripts/build-bpf.sh into bpf/stallscope.bpf.o, which is committed and embedded
// in the binary; .ci/run rebuilds it and checks that it matches byte for byte.
//
// Tracepoint layouts: raw_syscalls' fields have sat at the same offsets since they exist;
// sched_process_fork's child_pid moved (6.x made the comms __data_loc), so its offset is a
// constant the loader sets from /sys/kernel/tracing/events/sched/sched_process_fork/format.

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#define DATA_MAX 64
#define NR_MAX 1024
#define CLONE_THREAD 0x00010000

// What every program returns: a tracepoint program returning 0 makes the kernel drop the
// event for every perf user of the same tracepoint (perf stat, perf trace, stallscope's own
// perf backend would go blind while this one runs); 1 lets it through to them.
#define KEEP 1

// Set by the loader before the programs load (they are read-only after that).
volatile const __u32 follow_forks = 1;
volatile const __u32 fork_child_pid_off = 20;
// The ring's size in bytes (the loader sets it with the ring's max_entries).
volatile const __u64 ring_bytes = 16 << 20;
// For measurement only (STALLSCOPE_BPF_MEASURE=filter, src/live/bpf/mod.rs): the programs of
// the traced process's syscalls and receives return right after the process filter, so a
// benchmark sees what running them for every task costs on its own. The verifier removes
// the branch when it is 0, as the loader leaves it.
volatile const __u32 measure_filter_only = 0;

// What a syscall number needs beyond its arguments (filled by the loader from its syscall
// table, so that the numbers of any architecture work).
enum nr_kind {
	NR_PLAIN = 0,
	NR_READ = 1,   // first bytes of args[1], as many as the call returned
	NR_WRITE = 2,  // first bytes of args[1], as many as args[2] says
	NR_CLONE = 3,  // flags in args[0]
	NR_CLONE3 = 4, // flags in the struct clone_args that args[0] points to
};

enum rec_kind {
	REC_CALL = 1,       // entry and exit of one call
	REC_ENTER_ONLY = 2, // a call that did not return (exit, exit_group, the task ended)
	REC_EXIT_ONLY = 3,  // a call whose entry was not seen (running at attach; a clone's child)
	REC_FORK = 4,       // nr: the new task's id; ret: 1 thread, 0 process, -1 unknown
	REC_TASK_EXIT = 5,  // a traced task ended
};

// The scheduler's own per-task counters, read through CO-RE (the loader relocates these
// fields against the running kernel's BTF): time on a CPU (updated at each tick and switch,
// so up to a tick stale for a running task), time waiting on a runqueue, page faults.
struct sched_entity {
	unsigned long long sum_exec_runtime;
} __attribute__((preserve_access_index));
struct sched_info {
	unsigned long long run_delay;
} __attribute__((preserve_access_index));
struct task_struct {
	unsigned long min_flt;
	unsigned long maj_flt;
	struct sched_entity se;
	struct sched_info sched_info;
} __attribute__((preserve_access_index));

// The registers the BTF-typed syscall tracepoints hand over (their classic twins copy the
// number and arguments out of them into a trace record first, for every program).
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long di, si, dx, r10, r8, r9, orig_ax;
} __attribute__((preserve_access_index));
#define REGS_NR(r) ((__s64)(r)->orig_ax)
#define REGS_ARGS(r, a) \
	do { \
		a[0] = (r)->di; a[1] = (r)->si; a[2] = (r)->dx; \
		a[3] = (r)->r10; a[4] = (r)->r8; a[5] = (r)->r9; \
	} while (0)
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
	__u64 regs[31];
	__u64 orig_x0;
	__s32 syscallno;
} __attribute__((preserve_access_index));
#define REGS_NR(r) ((__s64)(r)->syscallno)
#define REGS_ARGS(r, a) \
	do { \
		a[0] = (r)->orig_x0; a[1] = (r)->regs[1]; a[2] = (r)->regs[2]; \
		a[3] = (r)->regs[3]; a[4] = (r)->regs[4]; a[5] = (r)->regs[5]; \
	} while (0)
#endif

// on_cpu_ns, runnable_ns, minor_faults, major_faults of the current task, cumulative, the
// ns it waited for a CPU while its cgroup was throttled (the Throttling section below), and
// the ns it spent reclaiming memory (the Reclaim section).
struct sched_snap {
	__u64 v[6];
};

static __always_inline __u64 cg_throttled_ns(__u32 tid);
static __always_inline __u64 reclaim_ns(__u32 tid);
static __always_inline void reclaim_forget(__u32 tid);
static __always_inline void throttle_forget(__u32 tid);

struct entry {
	__u64 ts;
	__s64 nr;
	__u64 args[6];
	struct sched_snap sched;
	// The arrival of the data a receive inside this call took (take_stamp), 0 if none: it
	// goes to user space in the call's own record instead of a record of its own.
	__u64 arrival_first;
	__u64 arrival_at;
};

struct rec {
	__u32 kind;
	__u32 tid;
	__u32 tgid;
	__u32 data_len;
	__s64 nr;
	__s64 ret;
	__u64 enter_ns;
	__u64 exit_ns;
	__u64 args[6];
	struct sched_snap sched_enter;
	struct sched_snap sched_exit;
	__u64 arrival_first; // as in struct entry (REC_CALL only; 0 otherwise)
	__u64 arrival_at;
};

struct rec_data {
	struct rec r;
	__u8 data[DATA_MAX];
};

// The processes traced: the attached one and, when following forks, its children.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} tgids SEC(".maps");

// The attached process, asked first (an array lookup the verifier inlines: no call), and
// whether any child was added to `tgids`: most syscalls on the machine are not the traced
// process's, and every one of them runs sys_enter and sys_exit. The loader fills it (and
// `tgids`) when tracing starts.
struct target {
	__u32 tgid;
	__u32 children;
};
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct target);
} target SEC(".maps");

// Calls in progress, by thread.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct entry);
} inflight SEC(".maps");
// A thread's entry stays in `inflight` from its first call until the thread ends (deleted
// by process_exit) and is rewritten in place: `ts` 0 means no call in progress. An update and
// a delete per call (a bucket lock and a free list each) were a third of the programs' time.


struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NR_MAX);
	__type(key, __u32);
	__type(value, __u32);
} nr_kinds SEC(".maps");

// Records the ring had no room for (one per call, fork or exit).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

struct enter_ctx {
	__u64 common;
	__s64 id;
	__u64 args[6];
};

struct exit_ctx {
	__u64 common;
	__s64 id;
	__s64 ret;
};

static __always_inline void snap(struct sched_snap *s, __u32 tid)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	s->v[0] = BPF_CORE_READ(t, se.sum_exec_runtime);
	s->v[1] = BPF_CORE_READ(t, sched_info.run_delay);
	s->v[2] = BPF_CORE_READ(t, min_flt);
	s->v[3] = BPF_CORE_READ(t, maj_flt);
	s->v[4] = cg_throttled_ns(tid);
	s->v[5] = reclaim_ns(tid);
}

// The same counters read with plain loads through the task's BTF pointer (tp_btf programs:
// four loads instead of four bpf_probe_read_kernel calls). `bt` is null in the classic
// programs, where the helper reads stay (kernels before bpf_get_current_task_btf).
static __always_inline void snap_of(struct sched_snap *s, struct task_struct *bt, __u32 tid)
{
	if (!bt) {
		snap(s, tid);
		return;
	}
	s->v[0] = bt->se.sum_exec_runtime;
	s->v[1] = bt->sched_info.run_delay;
	s->v[2] = bt->min_flt;
	s->v[3] = bt->maj_flt;
	s->v[4] = cg_throttled_ns(tid);
	s->v[5] = reclaim_ns(tid);
}

// Is tgid traced? The attached process first; the map of forked children only once one
// was added.
static __always_inline int traced(__u32 tgid)
{
	__u32 zero = 0;
	struct target *t = bpf_map_lookup_elem(&target, &zero);
	if (!t)
		return 0;
	if (t->tgid == tgid)
		return 1;
	if (!t->children)
		return 0;
	return bpf_map_lookup_elem(&tgids, &tgid) != 0;
}

static __always_inline void count_drop(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&drops, &zero);
	if (n)
		*n += 1;
}

// Wake the reader only when a quarter of the ring is used: a wakeup per record would cost
// redis more than the record itself; the reader also polls on a short timer.
static __always_inline void submit(void *r)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(r, avail > ring_bytes / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

static __always_inline __u32 nr_kind(__s64 nr)
{
	if (nr < 0 || nr >= NR_MAX)
		return NR_PLAIN;
	__u32 i = nr;
	__u32 *k = bpf_map_lookup_elem(&nr_kinds, &i);
	return k ? *k : NR_PLAIN;
}

static __always_inline void emit_enter_only_of(struct entry *e, __u32 tid, __u32 tgid, __u64 now,
					      struct task_struct *bt)
{
	struct rec *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_drop();
		return;
	}
	r->kind = REC_ENTER_ONLY;
	r->tid = tid;
	r->tgid = tgid;
	r->data_len = 0;
	r->nr = e->nr;
	r->ret = 0;
	r->enter_ns = e->ts;
	r->exit_ns = now;
	for (int i = 0; i < 6; i++)
		r->args[i] = e->args[i];
	r->sched_enter = e->sched;
	snap_of(&r->sched_exit, bt, tid);
	r->arrival_first = 0;
	r->arrival_at = 0;
	submit(r);
}

static __always_inline void emit_enter_only(struct entry *e, __u32 tid, __u32 tgid, __u64 now)
{
	emit_enter_only_of(e, tid, tgid, now, 0);
}

// A call's entry: kept in `inflight` until its exit. `e` holds its number and arguments.
// Both program flavours (classic and tp_btf) share this and on_exit; `bt` is the current
// task's BTF pointer in the tp_btf ones, null in the classic ones.
static __always_inline void on_enter(struct entry *e, __u32 tid, __u32 tgid,
				     struct task_struct *bt)
{
	__u64 now = bpf_ktime_get_ns();
	struct entry *slot = bpf_map_lookup_elem(&inflight, &tid);
	if (slot && slot->ts)
		emit_enter_only_of(slot, tid, tgid, now, bt);
	e->ts = now;
	snap_of(&e->sched, bt, tid);
	if (slot)
		*slot = *e;
	else
		bpf_map_update_elem(&inflight, &tid, e, BPF_ANY);
}

static __always_inline void on_exit(__s64 nr, __s64 ret, __u32 tid, __u32 tgid,
				    struct task_struct *bt)
{
	__u64 now = bpf_ktime_get_ns();
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	if (e && !e->ts)
		e = 0;
	if (e && e->nr != nr) {
		// Not the call that entered (cannot happen with both tracepoints attached; kept
		// so that a surprise shows as two half-known calls, not a wrong pair).
		emit_enter_only_of(e, tid, tgid, now, bt);
		e->ts = 0;
		e = 0;
	}
	if (!e) {
		struct rec *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			count_drop();
			return;
		}
		r->kind = REC_EXIT_ONLY;
		r->tid = tid;
		r->tgid = tgid;
		r->data_len = 0;
		r->nr = nr;
		r->ret = ret;
		r->enter_ns = 0;
		r->exit_ns = now;
		for (int i = 0; i < 6; i++)
			r->args[i] = 0;
		__builtin_memset(&r->sched_enter, 0, sizeof(r->sched_enter));
		snap_of(&r->sched_exit, bt, tid);
		r->arrival_first = 0;
		r->arrival_at = 0;
		submit(r);
		return;
	}
	__u32 kind = nr_kind(nr);
	__u64 avail = 0;
	if (kind == NR_READ && ret > 0)
		avail = ret;
	else if (kind == NR_WRITE)
		avail = e->args[2];
	struct rec *r;
	if (avail > 0) {
		struct rec_data *d = bpf_ringbuf_reserve(&events, sizeof(*d), 0);
		if (!d) {
			count_drop();
			e->ts = 0;
			return;
		}
		__u32 len = avail > DATA_MAX ? DATA_MAX : avail;
		if (bpf_probe_read_user(d->data, len, (void *)e->args[1]) != 0)
			len = 0;
		d->r.data_len = len;
		r = &d->r;
	} else {
		r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			count_drop();
			e->ts = 0;
			return;
		}
		r->data_len = 0;
	}
	r->kind = REC_CALL;
	r->tid = tid;
	r->tgid = tgid;
	r->nr = nr;
	r->ret = ret;
	r->enter_ns = e->ts;
	r->exit_ns = now;
	for (int i = 0; i < 6; i++)
		r->args[i] = e->args[i];
	r->sched_enter = e->sched;
	snap_of(&r->sched_exit, bt, tid);
	r->arrival_first = e->arrival_first;
	r->arrival_at = e->arrival_at;
	submit(r);
	e->ts = 0;
}

// The classic tracepoint programs: every kernel that has BPF ring buffers runs these.
SEC("tracepoint/raw_syscalls/sys_enter")
int sys_enter(struct enter_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return KEEP;
	struct entry e = { .nr = ctx->id };
	for (int i = 0; i < 6; i++)
		e.args[i] = ctx->args[i];
	on_enter(&e, tid, tgid, 0);
	return KEEP;
}

SEC("tracepoint/raw_syscalls/sys_exit")
int sys_exit(struct exit_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return KEEP;
	on_exit(ctx->id, ctx->ret, tid, tgid, 0);
	return KEEP;
}

#ifdef REGS_NR
// The same on the BTF-typed raw tracepoints, which the loader prefers when the kernel has
// BTF: no trace record is filled for them (the classic ones pay for that on every syscall
// of every process), and the task's counters are plain loads. Arguments: the registers and
// the number at entry, the registers and the result at exit.
SEC("tp_btf/sys_enter")
int btf_sys_enter(__u64 *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	struct entry e = { .nr = (__s64)ctx[1] };
	REGS_ARGS(regs, e.args);
	on_enter(&e, tid, tgid, bpf_get_current_task_btf());
	return 0;
}

SEC("tp_btf/sys_exit")
int btf_sys_exit(__u64 *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	on_exit(REGS_NR(regs), (__s64)ctx[1], tid, tgid, bpf_get_current_task_btf());
	return 0;
}
#endif

SEC("tracepoint/sched/sched_process_fork")
int process_fork(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid))
		return KEEP;
	__s32 child = 0;
	bpf_probe_read_kernel(&child, sizeof(child), (char *)ctx + fork_child_pid_off);
	// The parent is inside clone/clone3: its flags say thread or process.
	__s64 thread = -1;
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	if (e && e->ts) {
		__u32 kind = nr_kind(e->nr);
		if (kind == NR_CLONE) {
			thread = (e->args[0] & CLONE_THREAD) != 0;
		} else if (kind == NR_CLONE3) {
			__u64 flags = 0;
			if (bpf_probe_read_user(&flags, sizeof(flags), (void *)e->args[0]) == 0)
				thread = (flags & CLONE_THREAD) != 0;
		} else {
			thread = 0; // fork, vfork
		}
	}
	if (thread != 1 && follow_forks && child > 0) {
		__u32 c = child, one = 1, zero = 0;
		bpf_map_update_elem(&tgids, &c, &one, BPF_ANY);
		struct target *t = bpf_map_lookup_elem(&target, &zero);
		if (t)
			t->children = 1;
	}
	struct rec *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_drop();
		return KEEP;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->kind = REC_FORK;
	r->tid = tid;
	r->tgid = tgid;
	r->nr = child;
	r->ret = thread;
	r->exit_ns = bpf_ktime_get_ns();
	submit(r);
	return KEEP;
}

SEC("tracepoint/sched/sched_process_exit")
int process_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid))
		return KEEP;
	__u64 now = bpf_ktime_get_ns();
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	if (e) {
		if (e->ts)
			emit_enter_only(e, tid, tgid, now);
		bpf_map_delete_elem(&inflight, &tid);
	}
	reclaim_forget(tid);
	throttle_forget(tid);
	struct rec *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (r) {
		__builtin_memset(r, 0, sizeof(*r));
		r->kind = REC_TASK_EXIT;
		r->tid = tid;
		r->tgid = tgid;
		r->exit_ns = now;
		submit(r);
	} else {
		count_drop();
	}
	// A traced child's last thread: its id may be reused by an unrelated process.
	if (tid == tgid) {
		bpf_map_delete_elem(&tgids, &tgid);
		__u32 zero = 0;
		struct target *t = bpf_map_lookup_elem(&target, &zero);
		if (t && t->tgid == tgid)
			t->tgid = 0;
	}
	return KEEP;
}

// Never loaded, except to prove that a program the kernel refuses is reported with the
// verifier's own words (STALLSCOPE_BPF_TEST_REFUSE=1): it reads a hash map's value without
// checking that the lookup found one, which every verifier rejects. (A hash map: recent
// verifiers know that an array lookup with a constant in-range key cannot fail. A section
// of its own: aya takes one program per section.)
SEC("tracepoint/raw_syscalls/refused")
int refused_by_verifier(struct enter_ctx *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	return e->nr != 0;
}

// ---- Arrivals: when a request reached redis's socket ----
//
// Per-command latency as a client sees it starts when the request is in the socket, not when
// redis's read began: in between are the wakeup of redis's event loop, a wait for a CPU, the
// wait's return. `sock:sk_data_ready` fires when data is queued on a socket (in the sender's
// context on loopback, in a softirq otherwise: never redis's own task, so no tgid filter
// there): it stamps the socket with the earliest arrival not yet read (later data-ready
// events only move its `last`: a read that finds several arrivals is dated by the first). The
// traced process's receive (`sock:sock_recv_length`, at the end of its recvmsg, inside its
// read syscall) takes the stamp and puts it in the read's in-flight entry, so that it goes
// out in the read's own record (a receive in a call not seen to enter, running at the attach,
// sends a REC_ARRIVAL record instead, which reaches the ring before the read's). TCP only: TCP sockets are unstamped when they
// are destroyed (`tcp:tcp_destroy_sock`), so a socket reused at the same address never
// inherits an old stamp; other families have no such hook and are left alone.
//
// A read that leaves data in the socket (a pipelined burst larger than redis's buffer, or data
// that came while the read ran) leaves a stamp for it: the same one if the socket saw one
// arrival since it was stamped (the rest came with it), else the latest arrival (the rest came
// no later: a lower bound of its wait, never a wait it did not have).

#define REC_ARRIVAL 16
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define MSG_PEEK 2

// The receive queue's length, through CO-RE: whether a read left data in the socket; the
// family and protocol (the tp_btf programs read them from the socket, the classic ones from
// the trace record).
struct sk_buff_head {
	__u32 qlen;
} __attribute__((preserve_access_index));
struct sock_common {
	unsigned short skc_family;
	__u16 skc_num; // the local port, host order (inside anonymous unions in the kernel)
} __attribute__((preserve_access_index));
struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
	struct sk_buff_head sk_receive_queue;
} __attribute__((preserve_access_index));

struct arrival {
	__u64 first; // when the earliest data not yet read was queued
	__u64 last;  // the latest data-ready since
};

// Tracepoint field offsets, set by the loader from the format files.
volatile const __u32 ready_sk_off = 8;
volatile const __u32 ready_family_off = 16;
volatile const __u32 ready_protocol_off = 18;
volatile const __u32 recv_sk_off = 8;
volatile const __u32 recv_ret_off = 20;
volatile const __u32 recv_flags_off = 24;
volatile const __u32 destroy_sk_off = 8;

// By socket address. LRU: sockets of other processes are stamped too (the data-ready
// context cannot tell whose they are) and are never read by a traced task; the oldest
// go first.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct arrival);
} arrival_stamps SEC(".maps");

struct arrival_rec {
	__u32 kind;
	__u32 tid;
	__u32 tgid;
	__s32 len; // what the receive returned
	__u64 sk;
	__u64 first; // the stamp
	__u64 at;    // when the receive ended
};

static __always_inline __u64 field_u64(void *ctx, __u32 off)
{
	__u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)ctx + off);
	return v;
}

static __always_inline __u32 field_u16(void *ctx, __u32 off)
{
	__u16 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)ctx + off);
	return v;
}

static __always_inline __s32 field_s32(void *ctx, __u32 off)
{
	__s32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)ctx + off);
	return v;
}

// The traced process's listening TCP ports at the attach (the loader fills them from
// /proc/PID/net/tcp{,6} and the process's socket fds); `listen_count` past LISTEN_MAX (more
// ports, or /proc unreadable) means unknown, and then nothing is skipped.
#define LISTEN_MAX 8
volatile const __u16 listen_ports[LISTEN_MAX] = {};
volatile const __u32 listen_count = LISTEN_MAX + 1;

// Is this data-ready the traced process's own send to a peer on this host? On loopback the
// receiver's data-ready runs in the sender's task, so every reply redis writes to a local
// client readies the client's socket in redis's own thread: half of all data-ready runs
// under a local benchmark, stamping sockets no traced task ever reads. Skipped when the
// current task is the attached process and the socket's local port is none of its listening
// ports. The data of redis's own sockets is readied in the sender's task (a local client's)
// or in a softirq; a softirq that happens to run in redis's thread for a socket redis
// itself opened (a replica's link to its master, the cluster bus) is the one arrival this
// can miss; accepted sockets, whose local port is a listening one, are never skipped.
static __always_inline int sent_by_target(__u16 port)
{
	if (listen_count > LISTEN_MAX)
		return 0;
	__u32 zero = 0;
	struct target *t = bpf_map_lookup_elem(&target, &zero);
	if (!t || t->tgid != (__u32)(bpf_get_current_pid_tgid() >> 32))
		return 0;
	for (int i = 0; i < LISTEN_MAX; i++)
		if (i < listen_count && listen_ports[i] == port)
			return 0;
	return 1;
}

// Data was queued on socket `sk` at `now`. A socket's entry stays until the socket is
// destroyed (or the LRU evicts it): a read that takes the stamp empties it (`first` 0)
// instead of deleting it, so a busy connection costs a lookup per request, not an insert and
// a delete.
static __always_inline void stamp(__u64 sk, __u64 now)
{
	struct arrival *a = bpf_map_lookup_elem(&arrival_stamps, &sk);
	if (a) {
		if (!a->first)
			a->first = now;
		a->last = now;
		return;
	}
	struct arrival n = { .first = now, .last = now };
	bpf_map_update_elem(&arrival_stamps, &sk, &n, BPF_NOEXIST);
}

// A traced task's receive of `ret` bytes from `sk` ended, `qlen` skbs left in its queue: the
// stamp goes to user space (REC_ARRIVAL) and what stays is the stamp of the data left.
static __always_inline void take_stamp(__u64 sk, __s32 ret, __u32 qlen, __u32 tid, __u32 tgid)
{
	struct arrival *a = bpf_map_lookup_elem(&arrival_stamps, &sk);
	if (!a || !a->first)
		return;
	__u64 first = a->first;
	if (qlen > 0) {
		if (a->last != a->first)
			a->first = a->last;
	} else {
		a->first = 0;
	}
	__u64 at = bpf_ktime_get_ns();
	// Inside a call the programs saw enter (always, but for a call running at the attach):
	// the stamp rides in that call's record.
	struct entry *e = bpf_map_lookup_elem(&inflight, &tid);
	if (e && e->ts) {
		e->arrival_first = first;
		e->arrival_at = at;
		return;
	}
	struct arrival_rec *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_drop();
		return;
	}
	r->kind = REC_ARRIVAL;
	r->tid = tid;
	r->tgid = tgid;
	r->len = ret;
	r->sk = sk;
	r->first = first;
	r->at = at;
	submit(r);
}

SEC("tracepoint/sock/sk_data_ready")
int arrival_ready(void *ctx)
{
	__u32 family = field_u16(ctx, ready_family_off);
	if ((family != AF_INET && family != AF_INET6) ||
	    field_u16(ctx, ready_protocol_off) != IPPROTO_TCP)
		return KEEP;
	__u64 sk = field_u64(ctx, ready_sk_off);
	__u64 now = bpf_ktime_get_ns();
	stamp(sk, now);
	return KEEP;
}

SEC("tracepoint/sock/sock_recv_length")
int arrival_recv(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return KEEP;
	__s32 ret = field_s32(ctx, recv_ret_off);
	if (ret <= 0 || (field_s32(ctx, recv_flags_off) & MSG_PEEK))
		return KEEP;
	__u64 sk = field_u64(ctx, recv_sk_off);
	take_stamp(sk, ret, BPF_CORE_READ((struct sock *)sk, sk_receive_queue.qlen), tid, tgid);
	return KEEP;
}

SEC("tracepoint/tcp/tcp_destroy_sock")
int arrival_destroy(void *ctx)
{
	__u64 sk = field_u64(ctx, destroy_sk_off);
	bpf_map_delete_elem(&arrival_stamps, &sk);
	return KEEP;
}

// The same on the BTF-typed raw tracepoints (the loader prefers them, as for the syscall
// programs): no trace record is filled for them, and the socket's family, protocol and queue
// length are plain loads instead of three helper calls.
SEC("tp_btf/sk_data_ready")
int btf_arrival_ready(__u64 *ctx)
{
	struct sock *sk = (struct sock *)ctx[0];
	__u32 family = sk->__sk_common.skc_family;
	if ((family != AF_INET && family != AF_INET6) || sk->sk_protocol != IPPROTO_TCP)
		return 0;
	if (sent_by_target(sk->__sk_common.skc_num))
		return 0;
	stamp((__u64)sk, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sock_recv_length")
int btf_arrival_recv(__u64 *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid) || measure_filter_only)
		return 0;
	struct sock *sk = (struct sock *)ctx[0];
	__s32 ret = (__s32)ctx[1];
	if (ret <= 0 || ((__s32)ctx[2] & MSG_PEEK))
		return 0;
	take_stamp((__u64)sk, ret, sk->sk_receive_queue.qlen, tid, tgid);
	return 0;
}

SEC("tp_btf/tcp_destroy_sock")
int btf_arrival_destroy(__u64 *ctx)
{
	__u64 sk = ctx[0];
	bpf_map_delete_elem(&arrival_stamps, &sk);
	return 0;
}

// ---- The cheap tier: `watch`'s default mode ----
//
// No syscall tracepoint: attaching any program to one puts every thread of the host on the
// slow syscall path (../shared/DESIGN.md, "The cost of staying attached"). What runs instead
// costs per context switch of the host (sched_switch, a tgid compare for other tasks) and
// per sample (a cpu-clock event on each CPU, every sampling period, kept when it finds the
// watched main thread running), and sends a record only for what is over the threshold:
//
// - CHEAP_BLOCKED: a watched thread switched out blocked (not preempted) and switched back
//   in at least the threshold later. The syscall it blocked in and its first arguments come
//   from its saved user registers at the switch-out (a thread blocks only inside a syscall,
//   a page fault or a signal stop; `in_syscall` says whether orig_ax held a number). Waits
//   for work (epoll_wait, futex...) are skipped in the kernel: `cheap_idle_nr`, filled by
//   the loader from the syscall table.
// - CHEAP_GAP: the main thread made no read or write (the kernel's per-task syscr and
//   syscw, which every read-like and write-like call counts, client I/O included) for at
//   least the threshold while it was on a CPU or waiting for one: checked at each sample and
//   each switch. Its start is the first check that saw the counts at their final value, its
//   end the first that saw them move (or the thread block): each known to a sampling period
//   of the thread's CPU time (or to its switch).
// A close() that blocks in its flush has taken its fd out of the table already: nothing here
// names its file (fentry on filp_flush would, but tracing programs other than tp_btf are
// refused here: bench/bpf_fentry_probe.result.txt); user space names it when it can.

#define CHEAP_BLOCKED 1
#define CHEAP_GAP 2

volatile const __u64 cheap_threshold_ns = 10000000;

struct task_io_accounting___cheap {
	__u64 syscr;
	__u64 syscw;
} __attribute__((preserve_access_index));
struct task_struct___cheap {
	int pid;
	int tgid;
	struct task_io_accounting___cheap ioac;
	unsigned long min_flt;
	unsigned long maj_flt;
	struct sched_entity se;
	struct sched_info sched_info;
} __attribute__((preserve_access_index));

// The watched processes (one watcher, every redis of a host), by tgid: each with its main
// thread (user space adds and removes them), and their forked children (a BGSAVE or AOF
// rewrite child: `cheap_fork` adds them with their parent as `owner` and no main thread,
// `cheap_exit` removes them), whose blocked calls are watched as the parent's threads' are.
// Every context switch of the host asks whether its two tasks are watched: a bit per tgid
// modulo 4096 (`cheap_tgid_bits`, user space's processes) or a count of children there
// (`cheap_child_slots`, the kernel's), in arrays the verifier inlines, answers no for nearly
// all of them before the hash is asked.
struct cheap_target {
	__u32 owner;    // the watched process this one is, or is a child of
	__u32 main_tid; // 0 for a child
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct cheap_target);
} cheap_target SEC(".maps");

#define CHEAP_BITS_WORDS 64
#define CHEAP_SLOTS (CHEAP_BITS_WORDS * 64)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CHEAP_BITS_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} cheap_tgid_bits SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CHEAP_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} cheap_child_slots SEC(".maps");

struct cheap_thread {
	__u64 off_ts;   // switched out blocked at (0: not blocked)
	__s64 nr;       // the syscall it blocked in (-1: not in one)
	__u64 args[3];
	__u32 state;    // prev_state at the switch-out
	__u32 samples;  // checks since progress (the main thread)
	__u64 progress_ts; // the main thread: the first check that saw its read/write counts
	__u64 io;          // at their present value, and that value
	struct sched_snap at_progress;
	struct sched_snap at_off; // its counters at the blocked switch-out
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct cheap_thread);
} cheap_threads SEC(".maps");

struct cheap_rec {
	__u32 kind;
	__u32 tid;
	__s64 nr;
	__u64 args[3];
	__u64 start;
	__u64 end;
	__u32 state;
	__u32 samples;
	struct sched_snap before;
	struct sched_snap after;
	__u32 tgid;  // the process the thread is of: a watched one, or a forked child of it
	__u32 owner; // the watched process (the child's parent)
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} cheap_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cheap_drops SEC(".maps");

// Syscall numbers that are a wait for work, never a stall when blocked in: in any thread
// (the event loop's wait), or outside the main thread (a background thread's wait for a job).
#define CHEAP_IDLE_ANY 1
#define CHEAP_IDLE_BG 2
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NR_MAX);
	__type(key, __u32);
	__type(value, __u32);
} cheap_idle_nr SEC(".maps");

static __always_inline struct cheap_target *cheap_watched(__u32 tgid)
{
	__u32 word = (tgid >> 6) & (CHEAP_BITS_WORDS - 1);
	__u64 *bits = bpf_map_lookup_elem(&cheap_tgid_bits, &word);
	if (!bits)
		return 0;
	if (!(*bits & (1ULL << (tgid & 63)))) {
		__u32 slot = tgid & (CHEAP_SLOTS - 1);
		__u32 *kids = bpf_map_lookup_elem(&cheap_child_slots, &slot);
		if (!kids || !*kids)
			return 0;
	}
	return bpf_map_lookup_elem(&cheap_target, &tgid);
}

static __always_inline void cheap_snap(struct sched_snap *s, struct task_struct___cheap *t)
{
	s->v[0] = t->se.sum_exec_runtime;
	s->v[1] = t->sched_info.run_delay;
	s->v[2] = t->min_flt;
	s->v[3] = t->maj_flt;
	s->v[4] = 0; // the full tier's throttled time: not measured here
	// The time it spent reclaiming memory, a reclaim in progress included (the Reclaim
	// section's programs, which the cheap tier attaches too).
	s->v[5] = reclaim_ns(t->pid);
}

static __always_inline struct cheap_thread *cheap_thread_of(__u32 tid)
{
	struct cheap_thread *th = bpf_map_lookup_elem(&cheap_threads, &tid);
	if (th)
		return th;
	struct cheap_thread n = { .nr = -1 };
	bpf_map_update_elem(&cheap_threads, &tid, &n, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cheap_threads, &tid);
}

static __always_inline void cheap_count_drop(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&cheap_drops, &zero);
	if (n)
		*n += 1;
}

// The main thread's gap from `th->progress_ts` to `now`, sent if over the threshold.
static __always_inline void cheap_gap(struct cheap_thread *th, __u32 tid, __u64 now,
				      struct task_struct___cheap *t)
{
	if (!th->progress_ts || now - th->progress_ts < cheap_threshold_ns)
		return;
	struct cheap_rec *r = bpf_ringbuf_reserve(&cheap_events, sizeof(*r), 0);
	if (!r) {
		cheap_count_drop();
		return;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->kind = CHEAP_GAP;
	r->tid = tid;
	r->tgid = t->tgid;
	r->owner = t->tgid; // only a watched process's main thread has gaps
	r->nr = -1;
	r->start = th->progress_ts;
	r->end = now;
	r->samples = th->samples;
	r->before = th->at_progress;
	cheap_snap(&r->after, t);
	bpf_ringbuf_submit(r, 0);
}

// How a check of the main thread comes.
#define CHECK_RUNS 0  // a sample, or a preemption: it is on a CPU or waiting for one
#define CHECK_BLOCKS 1 // it blocks: a stretch on the CPU ends, and no gap runs while it waits
#define CHECK_WAKES 2  // it runs again after blocking: a new stretch starts

// A check of the main thread's read/write counts: moved means it served (the gap, if the
// stretch since the last move was one, ended).
static __always_inline void cheap_check(struct cheap_thread *th, __u32 tid, __u64 now,
					struct task_struct___cheap *t, int how)
{
	__u64 io = t->ioac.syscr + t->ioac.syscw;
	if (how == CHECK_RUNS && io == th->io) {
		th->samples += 1;
		return;
	}
	if (how != CHECK_WAKES)
		cheap_gap(th, tid, now, t);
	th->io = io;
	th->progress_ts = how == CHECK_BLOCKS ? 0 : now;
	th->samples = 0;
	cheap_snap(&th->at_progress, t);
}

static __always_inline void cheap_switched_out(struct task_struct___cheap *t, __u32 main_tid,
					       __u64 preempt, __u32 state, __u64 now,
					       struct task_struct *bt)
{
	__u32 tid = t->pid;
	struct cheap_thread *th = cheap_thread_of(tid);
	if (!th)
		return;
	int blocked = !preempt && state != 0;
	if (tid == main_tid)
		cheap_check(th, tid, now, t, blocked ? CHECK_BLOCKS : CHECK_RUNS);
	if (!blocked)
		return;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bt);
	__s64 nr = -1;
	if (regs)
		nr = REGS_NR(regs);
	if (nr >= 0 && nr < NR_MAX) {
		__u32 i = nr;
		__u32 *idle = bpf_map_lookup_elem(&cheap_idle_nr, &i);
		if (idle && (*idle == CHEAP_IDLE_ANY || (*idle == CHEAP_IDLE_BG && tid != main_tid)))
			return;
	}
	th->off_ts = now;
	cheap_snap(&th->at_off, t);
	th->nr = nr;
	th->state = state;
	if (regs) {
		__u64 a[6];
		REGS_ARGS(regs, a);
		th->args[0] = a[0];
		th->args[1] = a[1];
		th->args[2] = a[2];
	}
}

static __always_inline void cheap_switched_in(struct task_struct___cheap *t, __u32 main_tid,
					      __u32 owner, __u64 now)
{
	__u32 tid = t->pid;
	struct cheap_thread *th = bpf_map_lookup_elem(&cheap_threads, &tid);
	if (!th)
		return;
	if (tid == main_tid && !th->progress_ts)
		cheap_check(th, tid, now, t, CHECK_WAKES);
	__u64 off = th->off_ts;
	th->off_ts = 0;
	if (!off || now - off < cheap_threshold_ns)
		return;
	struct cheap_rec *r = bpf_ringbuf_reserve(&cheap_events, sizeof(*r), 0);
	if (!r) {
		cheap_count_drop();
		return;
	}
	r->kind = CHEAP_BLOCKED;
	r->tid = tid;
	r->tgid = t->tgid;
	r->owner = owner;
	r->nr = th->nr;
	for (int i = 0; i < 3; i++)
		r->args[i] = th->args[i];
	r->start = off;
	r->end = now;
	r->state = th->state;
	r->samples = 0;
	r->before = th->at_off;
	cheap_snap(&r->after, t);
	bpf_ringbuf_submit(r, 0);
}

#ifdef REGS_NR
SEC("tp_btf/sched_switch")
int cheap_switch(__u64 *ctx)
{
	struct task_struct___cheap *prev = (void *)ctx[1], *next = (void *)ctx[2];
	// Each side tested on its own: `!wo && !wi` compiles to an OR of the two pointers,
	// which the verifier refuses.
	__u64 now = 0;
	struct cheap_target *wo = cheap_watched(prev->tgid);
	if (wo) {
		now = bpf_ktime_get_ns();
		cheap_switched_out(prev, wo->main_tid, ctx[0], (__u32)ctx[3], now,
				   (struct task_struct *)ctx[1]);
	}
	struct cheap_target *wi = cheap_watched(next->tgid);
	if (wi) {
		if (!now)
			now = bpf_ktime_get_ns();
		cheap_switched_in(next, wi->main_tid, wi->owner, now);
	}
	return 0;
}

// A process forked by a watched one (not a thread: those share its tgid) is watched from
// now on, as its parent's child (a child's own forks are not followed). The loader attaches
// this only when forks are followed.
SEC("tp_btf/sched_process_fork")
int cheap_fork(__u64 *ctx)
{
	struct task_struct___cheap *parent = (void *)ctx[0], *child = (void *)ctx[1];
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	if (ptgid == ctgid)
		return 0;
	struct cheap_target *w = cheap_watched(ptgid);
	if (!w || w->owner != ptgid)
		return 0;
	struct cheap_target c = { .owner = ptgid, .main_tid = 0 };
	if (bpf_map_update_elem(&cheap_target, &ctgid, &c, BPF_NOEXIST))
		return 0;
	__u32 slot = ctgid & (CHEAP_SLOTS - 1);
	__u32 *kids = bpf_map_lookup_elem(&cheap_child_slots, &slot);
	if (kids)
		__sync_fetch_and_add(kids, 1);
	return 0;
}

// A watched thread exits: its state goes (the map would otherwise fill with the threads of
// children long gone, one BGSAVE after another), and a child that exits whole is let go.
SEC("tp_btf/sched_process_exit")
int cheap_exit(__u64 *ctx)
{
	struct task_struct___cheap *p = (void *)ctx[0];
	__u32 tgid = p->tgid, tid = p->pid;
	struct cheap_target *w = cheap_watched(tgid);
	if (!w)
		return 0;
	bpf_map_delete_elem(&cheap_threads, &tid);
	reclaim_forget(tid);
	if (tid != tgid || w->main_tid)
		return 0;
	if (bpf_map_delete_elem(&cheap_target, &tgid))
		return 0;
	__u32 slot = tgid & (CHEAP_SLOTS - 1);
	__u32 *kids = bpf_map_lookup_elem(&cheap_child_slots, &slot);
	if (kids && *kids)
		__sync_fetch_and_add(kids, -1);
	return 0;
}
#endif

// A sample: of each CPU's time (a cpu-clock event per CPU), kept when it finds the main
// thread running; or of the main thread's own (task-clock, for measurement).
SEC("perf_event")
int cheap_sample(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct cheap_target *w = cheap_watched(id >> 32);
	if (!w)
		return 0;
	__u32 tid = (__u32)id;
	if (tid != w->main_tid)
		return 0;
	struct cheap_thread *th = cheap_thread_of(tid);
	if (!th)
		return 0;
	struct task_struct___cheap *t = (void *)bpf_get_current_task_btf();
	cheap_check(th, tid, bpf_ktime_get_ns(), t, CHECK_RUNS);
	return 0;
}

// ---- Throttling: the time a traced thread waited for a CPU because its cgroup's CPU quota
// was spent ----
//
// A thread stopped by its cgroup's quota is still runnable, so the scheduler's run_delay counts
// that wait with any other wait for a CPU. The programs here split it: when a traced thread
// begins to wait (switched out while runnable, or woken), they note its group runqueue and
// how much throttled time that runqueue had; when the thread is switched in again, the part of
// its wait during which that runqueue was throttled is added to the thread's `total`, which
// `snap` puts into each call's counters (v[4]). The runqueue's own clock of throttled time
// (`throttled_clock_self`, `throttled_clock_self_time`, kernels 6.8 and later, those behind
// cpu.stat.local) makes the split exact, a throttle that begins or ends during the wait
// included; on an older kernel a wait that began while the runqueue was throttled counts
// whole (its tail after the unthrottle, until the thread is picked, is counted too).
// sched_switch and sched_wakeup carry no per-syscall flag: the cost follows context switches.

struct rq___cg {
	__u64 clock;
} __attribute__((preserve_access_index));
struct cfs_rq___cg {
	int throttle_count;
	__u64 throttled_clock_self;
	__u64 throttled_clock_self_time;
	struct rq___cg *rq;
} __attribute__((preserve_access_index));
struct sched_entity___cg {
	struct cfs_rq___cg *cfs_rq;
} __attribute__((preserve_access_index));
struct task_struct___cg {
	unsigned int flags;
	int pid;
	int tgid;
	struct sched_entity___cg se;
} __attribute__((preserve_access_index));

// Set (exit_signals) before sched_process_exit fires, where a thread's state is deleted.
#define PF_EXITING 0x00000004

struct throttle_state {
	__u64 since;  // when the thread began to wait (0: it is not waiting)
	__u64 cfs_rq; // its group runqueue then
	__u64 self0;  // that runqueue's throttled_clock_self_time then
	__u64 pre;    // how long the runqueue had been throttled by then (or 1: throttled, no clock)
	__u64 total;  // ns waited while the group was throttled, cumulative
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct throttle_state);
} throttle SEC(".maps");

// Whether any traced thread was ever throttled: until then `snap` skips the lookup (a hash
// lookup per call entry and exit for nothing, on every host without a quota).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} throttle_seen SEC(".maps");

static __always_inline __u64 cg_throttled_ns(__u32 tid)
{
	__u32 zero = 0;
	__u32 *seen = bpf_map_lookup_elem(&throttle_seen, &zero);
	if (!seen || !*seen)
		return 0;
	struct throttle_state *s = bpf_map_lookup_elem(&throttle, &tid);
	return s ? s->total : 0;
}

// A traced thread ended (process_exit): its state goes. On a kernel with the runqueue's
// throttle clock every traced thread that ever waits has an entry, and a host whose redis
// forks a child per save (each with its threads) would otherwise fill the map's 16384
// entries, after which no new thread's throttled time is measured; a reused tid would also
// start from a dead thread's total.
static __always_inline void throttle_forget(__u32 tid)
{
	bpf_map_delete_elem(&throttle, &tid);
}

// How long `c` has been throttled in all, by its own clock (ns; 0 without the clock).
static __always_inline __u64 cg_throttled_so_far(struct cfs_rq___cg *c)
{
	__u64 done = BPF_CORE_READ(c, throttled_clock_self_time);
	__u64 start = BPF_CORE_READ(c, throttled_clock_self);
	if (start) {
		__u64 now = BPF_CORE_READ(c, rq, clock);
		if (now > start)
			done += now - start;
	}
	return done;
}

// A traced thread begins to wait for a CPU.
static __always_inline void cg_wait_begins(struct task_struct___cg *t, __u32 tid, __u64 now)
{
	// An exiting thread can still be preempted or woken after process_exit deleted its
	// state: an entry made then would stay for good. No traced thread has tid 0 (a read
	// of a task being torn down gave one, on a quiet host: a key nothing deletes).
	if (!tid || (BPF_CORE_READ(t, flags) & PF_EXITING))
		return;
	struct cfs_rq___cg *c = BPF_CORE_READ(t, se.cfs_rq);
	if (!c)
		return;
	struct throttle_state *s = bpf_map_lookup_elem(&throttle, &tid);
	__u64 pre;
	if (bpf_core_field_exists(c->throttled_clock_self_time)) {
		pre = cg_throttled_so_far(c);
	} else {
		// No clock: only a wait that begins throttled counts (whole).
		if (!BPF_CORE_READ(c, throttle_count)) {
			if (s)
				s->since = 0;
			return;
		}
		pre = 1;
	}
	if (!s) {
		struct throttle_state n = { .since = now, .cfs_rq = (__u64)c, .pre = pre };
		bpf_map_update_elem(&throttle, &tid, &n, BPF_NOEXIST);
		return;
	}
	s->since = now;
	s->cfs_rq = (__u64)c;
	s->pre = pre;
}

// A traced thread is switched in: its wait ends.
static __always_inline void cg_wait_ends(__u32 tid, __u64 now)
{
	struct throttle_state *s = bpf_map_lookup_elem(&throttle, &tid);
	if (!s || !s->since)
		return;
	__u64 waited = now > s->since ? now - s->since : 0;
	struct cfs_rq___cg *c = (struct cfs_rq___cg *)s->cfs_rq;
	__u64 part;
	if (bpf_core_field_exists(c->throttled_clock_self_time)) {
		__u64 so_far = cg_throttled_so_far(c);
		part = so_far > s->pre ? so_far - s->pre : 0;
	} else {
		part = waited;
	}
	if (part > waited)
		part = waited;
	s->since = 0;
	if (!part)
		return;
	s->total += part;
	__u32 zero = 0;
	__u32 *seen = bpf_map_lookup_elem(&throttle_seen, &zero);
	if (seen && !*seen)
		*seen = 1;
}

#define TASK_RUNNING 0

SEC("tp_btf/sched_switch")
int btf_throttle_switch(__u64 *ctx)
{
	struct task_struct___cg *prev = (struct task_struct___cg *)ctx[1];
	struct task_struct___cg *next = (struct task_struct___cg *)ctx[2];
	__u64 now = 0;
	if (traced(BPF_CORE_READ(next, tgid))) {
		now = bpf_ktime_get_ns();
		cg_wait_ends(BPF_CORE_READ(next, pid), now);
	}
	// Switched out while still runnable (preempted, or stopped by the quota).
	if ((__u32)ctx[3] == TASK_RUNNING && traced(BPF_CORE_READ(prev, tgid))) {
		if (!now)
			now = bpf_ktime_get_ns();
		cg_wait_begins(prev, BPF_CORE_READ(prev, pid), now);
	}
	return 0;
}

SEC("tp_btf/sched_wakeup")
int btf_throttle_wakeup(__u64 *ctx)
{
	struct task_struct___cg *p = (struct task_struct___cg *)ctx[0];
	if (!traced(BPF_CORE_READ(p, tgid)))
		return 0;
	cg_wait_begins(p, BPF_CORE_READ(p, pid), bpf_ktime_get_ns());
	return 0;
}

// ---- Reclaim: the time a traced thread spent reclaiming memory itself ----
//
// A thread that allocates (a page fault, the page cache a write() fills) past its cgroup's
// memory limit reclaims memory before it goes on (try_to_free_mem_cgroup_pages: vmscan's
// mm_vmscan_memcg_reclaim_begin/end, cgroup v1 limit_in_bytes and v2 memory.max and
// memory.high alike), and one that finds the host short of free memory reclaims directly
// (mm_vmscan_direct_reclaim_begin/end). Both pairs fire in the reclaiming task's own context
// around the whole reclaim, the waits for writeback inside it included, so the time between
// them is exact; `snap` puts each thread's total into its counters (v[5]), and so does the
// cheap tier's `cheap_snap` for the threads it watches (both tiers attach these programs;
// each load of the object has its own maps, and its own set of threads in them). One
// program per edge: `reclaim_begin` is attached to both begin tracepoints, `reclaim_end` to
// both ends (their records are not read: only which task fires them, and when). A begin
// inside another (a soft-limit reclaim inside a direct one) counts once. Not counted: v2's
// penalty sleep past memory.high (a sleep on the way back to user space, after the reclaim)
// and kswapd's reclaim (another task's time).

struct reclaim_state {
	__u64 since; // when the outermost reclaim began (0: not reclaiming)
	__u64 depth;
	__u64 total; // ns spent reclaiming, cumulative
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct reclaim_state);
} reclaim SEC(".maps");

// Whether any traced thread ever reclaimed: until then `snap` skips the lookup.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} reclaim_seen SEC(".maps");

// The ns thread `tid` spent reclaiming so far, a reclaim in progress included: a cheap-tier
// record can begin or end inside one (a thread blocked on writeback within a reclaim is
// switched out and in before the reclaim ends).
static __always_inline __u64 reclaim_ns(__u32 tid)
{
	__u32 zero = 0;
	__u32 *seen = bpf_map_lookup_elem(&reclaim_seen, &zero);
	if (!seen || !*seen)
		return 0;
	struct reclaim_state *s = bpf_map_lookup_elem(&reclaim, &tid);
	if (!s)
		return 0;
	__u64 total = s->total;
	if (s->depth) {
		__u64 now = bpf_ktime_get_ns();
		if (now > s->since)
			total += now - s->since;
	}
	return total;
}

// A traced thread ended: its tid may be reused by a task that is not traced.
static __always_inline void reclaim_forget(__u32 tid)
{
	__u32 zero = 0;
	__u32 *seen = bpf_map_lookup_elem(&reclaim_seen, &zero);
	if (seen && *seen)
		bpf_map_delete_elem(&reclaim, &tid);
}

// Is the process traced by the full tier, or watched by the cheap tier (a watched process or
// a child of one)? Whichever tier loaded this object fills its own filter; the other's is
// empty and answers no at its first (inlined) lookup.
static __always_inline int reclaim_watched(__u32 tgid)
{
	if (traced(tgid))
		return 1;
	return cheap_watched(tgid) != 0;
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin")
int reclaim_begin(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!reclaim_watched(id >> 32))
		return KEEP;
	__u32 tid = (__u32)id;
	__u64 now = bpf_ktime_get_ns();
	struct reclaim_state *s = bpf_map_lookup_elem(&reclaim, &tid);
	if (!s) {
		// Not for a thread past its exit program (as for the throttle state): the entry
		// would stay for good.
		struct task_struct___cg *t = (struct task_struct___cg *)bpf_get_current_task();
		if (BPF_CORE_READ(t, flags) & PF_EXITING)
			return KEEP;
		struct reclaim_state n = { .since = now, .depth = 1 };
		bpf_map_update_elem(&reclaim, &tid, &n, BPF_NOEXIST);
		__u32 zero = 0;
		__u32 *seen = bpf_map_lookup_elem(&reclaim_seen, &zero);
		if (seen && !*seen)
			*seen = 1;
		return KEEP;
	}
	if (!s->depth)
		s->since = now;
	s->depth += 1;
	return KEEP;
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_end")
int reclaim_end(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!reclaim_watched(id >> 32))
		return KEEP;
	__u32 tid = (__u32)id;
	struct reclaim_state *s = bpf_map_lookup_elem(&reclaim, &tid);
	// An end whose begin came before the attach is not counted: its start is unknown.
	if (!s || !s->depth)
		return KEEP;
	s->depth -= 1;
	if (s->depth)
		return KEEP;
	__u64 now = bpf_ktime_get_ns();
	if (now > s->since)
		s->total += now - s->since;
	s->since = 0;
	return KEEP;
}
