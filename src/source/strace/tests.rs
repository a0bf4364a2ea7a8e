//! Table-driven tests of the strace line parser: every line shape of the captures README,
//! DESIGN.md and issues 2/7, verbatim where a capture has it, each with the exact events.

use super::body::*;
use super::*;
use crate::event::{Data, DurSource, Event, EventKind, Extra, InFlight, Ret, Syscall};

const US: i64 = 1_000;
const MS: i64 = 1_000_000;
const S: i64 = 1_000_000_000;
const DAY: i64 = 86_400 * S;

/// ns since midnight of `HH:MM:SS` + `us` microseconds.
fn tod(h: i64, m: i64, s: i64, us: i64) -> i64 {
    (h * 3600 + m * 60 + s) * S + us * US
}

/// Builder for an expected syscall event.
struct X(Event);

fn call(tid: Tid, ts: i64, line: u64, name: &'static str) -> X {
    X(Event {
        tid,
        ts,
        line,
        kind: EventKind::Syscall(Syscall::new(name)),
    })
}

impl X {
    fn sc(&mut self) -> &mut Syscall {
        match &mut self.0.kind {
            EventKind::Syscall(s) => s,
            _ => unreachable!(),
        }
    }
    fn fd(mut self, fd: i32) -> Self {
        self.sc().fd = Some(fd);
        self
    }
    fn fd_path(mut self, p: &str) -> Self {
        self.sc().fd_path = Some(p.into());
        self
    }
    fn ret(mut self, r: Ret) -> Self {
        self.sc().ret = r;
        self
    }
    fn val(self, v: i64) -> Self {
        self.ret(Ret::Val(v))
    }
    fn ret_path(mut self, p: &str) -> Self {
        self.sc().ret_path = Some(p.into());
        self
    }
    fn dur(mut self, d: i64, src: DurSource) -> Self {
        self.sc().dur = Some(d);
        self.sc().dur_src = src;
        self
    }
    fn measured(self, d: i64) -> Self {
        self.dur(d, DurSource::Measured)
    }
    fn in_flight(mut self, f: InFlight) -> Self {
        self.sc().in_flight = Some(f);
        self
    }
    fn extra(mut self, e: Extra) -> Self {
        self.sc().extra = e;
        self
    }
    fn path(self, p: &str) -> Self {
        self.extra(Extra::Path(p.into()))
    }
    fn data(self, b: &[u8], truncated: bool) -> Self {
        self.extra(Extra::Data(Data::new(b, truncated)))
    }
    fn start_line(mut self, l: u64) -> Self {
        self.sc().start_line = Some(l);
        self
    }
}

fn ev(tid: Tid, ts: i64, line: u64, kind: EventKind) -> Event {
    Event {
        tid,
        ts,
        line,
        kind,
    }
}

/// Feeds lines to a fresh parser, then finishes it; returns the events and the skip reasons.
fn run_lines(lines: &[&[u8]]) -> (Vec<Event>, Vec<(u64, SkipReason)>) {
    let mut p = StraceParser::default();
    let mut out = vec![];
    let mut skips = vec![];
    for (i, l) in lines.iter().enumerate() {
        if let LineOutcome::Skipped(r) = p.feed(l, &mut out) {
            skips.push((i as u64 + 1, r));
        }
    }
    p.finish(&mut out);
    (out, skips)
}

fn run(lines: &[&str]) -> Vec<Event> {
    let b: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    let (out, skips) = run_lines(&b);
    assert!(skips.is_empty(), "unexpected skips {skips:?} in {lines:?}");
    out
}

/// One line, one event: the table of single-line shapes.
#[test]
fn single_line_shapes() {
    let table: Vec<(&str, Event)> = vec![
        // -f to stderr: `[pid N]`, -tt, -T.
        (
            "[pid  7313] 22:37:40.811837 fdatasync(7) = 0 <0.000311>",
            call(7313, tod(22, 37, 40, 811_837), 1, "fdatasync").fd(7).val(0).measured(311 * US).0,
        ),
        // -r: right-aligned time since the previous line, no pid.
        (
            r#"     0.000151 write(8, "$901\r\n# Persistence\r\nloading:0\r\n"..., 909) = 909 <0.000067>"#,
            call(0, 151 * US, 1, "write")
                .fd(8)
                .data(b"$901\r\n# Persistence\r\nloading:0\r\n", true)
                .val(909)
                .measured(67 * US)
                .0,
        ),
        // -ttt.
        (
            "1796078610.545264 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7fae39d06510) = 13504 <0.017751>",
            call(0, 1_796_078_610_545_264_000, 1, "clone")
                .extra(Extra::Clone { thread: false })
                .val(13504)
                .measured(17_751 * US)
                .0,
        ),
        // -tt without -T: aligned result column, no duration.
        ("22:37:51.226702 fdatasync(7)            = 0", call(0, tod(22, 37, 51, 226_702), 1, "fdatasync").fd(7).val(0).0),
        // -y on the fd.
        (
            r#"[pid  8169] 22:38:11.273154 write(11<WORKDIR/redis.log>, "8169:M 30 Nov 2026 22:38:11.272 "..., 59) = 59 <0.000031>"#,
            call(8169, tod(22, 38, 11, 273_154), 1, "write")
                .fd(11)
                .fd_path("WORKDIR/redis.log")
                .data(b"8169:M 30 Nov 2026 22:38:11.272 ", true)
                .val(59)
                .measured(31 * US)
                .0,
        ),
        // -y on AT_FDCWD and on the returned fd.
        (
            r#"[pid  8169] 22:38:10.102487 openat(AT_FDCWD<WORKDIR>, "/proc/self/stat", O_RDONLY) = 8</proc/8169/stat> <0.000036>"#,
            call(8169, tod(22, 38, 10, 102_487), 1, "openat")
                .path("/proc/self/stat")
                .val(8)
                .ret_path("/proc/8169/stat")
                .measured(36 * US)
                .0,
        ),
        // -yy: `->` inside the annotation; bare pid column (-o FILE -f).
        (
            r#"11461 22:41:05.800513 read(8<TCP:[127.0.0.1:6394->127.0.0.1:50418]>, "*2\r\n$4\r\nINFO\r\n$11\r\npersistence\r\n", 20474) = 32 <0.000028>"#,
            call(11461, tod(22, 41, 5, 800_513), 1, "read")
                .fd(8)
                .fd_path("TCP:[127.0.0.1:6394->127.0.0.1:50418]")
                .data(b"*2\r\n$4\r\nINFO\r\n$11\r\npersistence\r\n", false)
                .val(32)
                .measured(28 * US)
                .0,
        ),
        // An errno.
        (
            "1796078608.540434 accept4(6, 0x7ffd77cb23d0, [128], SOCK_CLOEXEC|SOCK_NONBLOCK) = -1 EAGAIN (Resource temporarily unavailable) <0.000014>",
            call(0, 1_796_078_608_540_434_000, 1, "accept4").fd(6).ret(Ret::Err("EAGAIN")).measured(14 * US).0,
        ),
        // -t: whole seconds, bare pid, aligned hex result.
        (
            "46099 15:53:49 brk(NULL)                = 0x5607bac04000",
            call(46099, tod(15, 53, 49, 0), 1, "brk").val(0x5607bac04000).0,
        ),
        // --timestamps=unix,s / unix,ms / unix,ns, and -T at ns precision.
        ("1796078610 fdatasync(7) = 0 <0.000311>", call(0, 1_796_078_610 * S, 1, "fdatasync").fd(7).val(0).measured(311 * US).0),
        (
            "1796078610.545 fdatasync(7) = 0 <0.000311>",
            call(0, 1_796_078_610 * S + 545 * MS, 1, "fdatasync").fd(7).val(0).measured(311 * US).0,
        ),
        (
            "1796078610.545264123 fdatasync(7) = 0 <0.000311123>",
            call(0, 1_796_078_610_545_264_123, 1, "fdatasync").fd(7).val(0).measured(311_123).0,
        ),
        // -T with fewer digits, and several seconds.
        ("[pid  8176] 22:38:19.531396 fsync(6) = 0 <9.5>", call(8176, tod(22, 38, 19, 531_396), 1, "fsync").fd(6).val(0).measured(9_500 * MS).0),
        // -tt -r combined: the relative part is ignored, the time of day is the clock.
        (
            "20:37:49.050065 (+     0.000012) semop(9928704, [{sem_num=0, sem_op=-1, sem_flg=SEM_UNDO}], 1) = 0 <5.030807>",
            call(0, tod(20, 37, 49, 50_065), 1, "semop").val(0).measured(5_030_807 * US).0,
        ),
        // No timestamps at all.
        ("getpid()                                = 19349", call(0, 0, 1, "getpid").val(19349).0),
        // A path that was deleted.
        (
            r#"write(7</var/lib/redis/appendonly.aof (deleted)>, "*1\r\n", 4) = 4"#,
            call(0, 0, 1, "write").fd(7).fd_path("/var/lib/redis/appendonly.aof (deleted)").data(b"*1\r\n", false).val(4).0,
        ),
        // `= ?`
        ("exit_group(0)                           = ?", call(0, 0, 1, "exit_group").0),
        ("26695 _exit(0)                          = ?", call(26695, 0, 1, "_exit").0),
        // ERESTARTSYS (`= ?` plus an errno-like name).
        (
            "[pid  9386] 22:38:55.152372 futex(0x55, FUTEX_WAIT_PRIVATE, 0, NULL) = ? ERESTARTSYS (To be restarted if SA_RESTART is set) <2.208605>",
            call(9386, tod(22, 38, 55, 152_372), 1, "futex").ret(Ret::Err("ERESTARTSYS")).measured(2_208_605 * US).0,
        ),
        // (INJECTED) after the errno text.
        (
            r#"chdir(".")  = -1 ENOENT (No such file or directory) (INJECTED)"#,
            call(0, 0, 1, "chdir").path(".").ret(Ret::Err("ENOENT")).0,
        ),
        (
            "exit_group(42)                          = -1 ENOSYS (Function not implemented) (INJECTED)",
            call(0, 0, 1, "exit_group").ret(Ret::Err("ENOSYS")).0,
        ),
        // wait4 status with `&&` and `==`.
        (
            "9380  22:38:57.215446 wait4(-1, [{WIFEXITED(s) && WEXITSTATUS(s) == 0}], WNOHANG, NULL) = 9569 <0.000049>",
            call(9380, tod(22, 38, 57, 215_446), 1, "wait4").val(9569).measured(49 * US).0,
        ),
        // A string that contains `) = `.
        (
            r#"write(1, "f(x) = 5\n", 9) = 9 <0.000010>"#,
            call(0, 0, 1, "write").fd(1).data(b"f(x) = 5\n", false).val(9).measured(10 * US).0,
        ),
        // `) = ` inside a string and an aligned result column after it.
        (
            r#"write(1, "f(x) = 5\n", 9)            = 9"#,
            call(0, 0, 1, "write").fd(1).data(b"f(x) = 5\n", false).val(9).0,
        ),
        // 32-bit _llseek (leading underscore), result column aligned.
        ("31442 _llseek(3, 0, [3564], SEEK_CUR)   = 0", call(31442, 0, 1, "_llseek").fd(3).val(0).0),
        // --secontext after the pid and after an fd annotation.
        (
            r#"151020 [unconfined_t] 14:37:21.990449 connect(3<UNIX-STREAM:[524197]> [unconfined_t], {sa_family=AF_UNIX, sun_path="/run/dbus/system_bus_socket" [system_dbusd_var_run_t]}, 30) = 0 <0.000033>"#,
            call(151020, tod(14, 37, 21, 990_449), 1, "connect").fd(3).fd_path("UNIX-STREAM:[524197]").val(0).measured(33 * US).0,
        ),
        // -yy on a returned socket fd.
        (
            "accept4(3<socket:[15157]>, {sa_family=AF_INET, sin_port=htons(62958), sin_addr=inet_addr(\"1.2.3.4\")}, [16], SOCK_CLOEXEC) = 29<socket:[91704707]>",
            call(0, 0, 1, "accept4").fd(3).fd_path("socket:[15157]").val(29).ret_path("socket:[91704707]").0,
        ),
        // pipe and dup2 arguments the fd table needs.
        ("pipe([0, 1]) = 0", call(0, 0, 1, "pipe").extra(Extra::FdPair(0, 1)).val(0).0),
        ("dup2(5, 1) = 1", call(0, 0, 1, "dup2").fd(5).extra(Extra::NewFd(1)).val(1).0),
        (
            r#"rename("temp-8335.rdb", "dump.rdb") = 0 <0.000040>"#,
            call(0, 0, 1, "rename").extra(Extra::Rename("temp-8335.rdb".into(), "dump.rdb".into())).val(0).measured(40 * US).0,
        ),
    ];
    for (line, want) in table {
        let got = run(&[line]);
        assert_eq!(got, vec![want], "line: {line}");
    }
}

/// Raw non-UTF-8 bytes (and in a path annotation) are read as bytes, never rejected.
#[test]
fn non_utf8_bytes() {
    let (got, skips) = run_lines(&[
        b"[pid  7313] 22:37:40.811837 write(7</tmp/\xff>, \"\xff\xfe\\x00\", 3) = 3 <0.000010>",
    ]);
    assert!(skips.is_empty());
    assert_eq!(
        got,
        vec![
            call(7313, tod(22, 37, 40, 811_837), 1, "write")
                .fd(7)
                .fd_path("/tmp/\u{fffd}")
                .data(&[0xff, 0xfe, 0], false)
                .val(3)
                .measured(10 * US)
                .0
        ]
    );
}

#[test]
fn signals_exits_and_strace_messages() {
    let table: Vec<(&str, Event)> = vec![
        (
            "9380  22:38:57.152385 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED, si_pid=9569, si_uid=0, si_status=0, si_utime=98 /* 0.98 s */, si_stime=20 /* 0.20 s */} ---",
            ev(9380, tod(22, 38, 57, 152_385), 1, EventKind::Signal { name: "SIGCHLD", si_pid: Some(9569) }),
        ),
        (
            "--- SIGUSR1 {si_signo=SIGUSR1, si_code=SI_KERNEL} ---",
            ev(0, 0, 1, EventKind::Signal { name: "SIGUSR1", si_pid: None }),
        ),
        (
            "9569  22:38:57.152275 +++ exited with 0 +++",
            ev(9569, tod(22, 38, 57, 152_275), 1, EventKind::Exit { code: Some(0), signal: None }),
        ),
        (
            "10031 21:14:55.795950 +++ killed by SIGTERM +++",
            ev(10031, tod(21, 14, 55, 795_950), 1, EventKind::Exit { code: None, signal: Some("SIGTERM") }),
        ),
        ("+++ killed by SIGSEGV (core dumped) +++", ev(0, 0, 1, EventKind::Exit { code: None, signal: Some("SIGSEGV") })),
        ("strace: Process 8169 attached with 5 threads", ev(8169, 0, 1, EventKind::Attach { threads: Some(5) })),
        ("strace: Process 8335 attached", ev(8335, 0, 1, EventKind::Attach { threads: None })),
        ("strace: Process 7317 detached", ev(7317, 0, 1, EventKind::Detach)),
    ];
    for (line, want) in table {
        assert_eq!(run(&[line]), vec![want], "line: {line}");
    }
}

#[test]
fn noise_lines_are_used_without_events() {
    for line in [
        " > /usr/lib64/libc.so.6(_exit+0x1d) [0xdb44d] ../sysdeps/unix/sysv/linux/_exit.c:30",
        " | 00000  61 62 63 64 65 66 67 68  69 6a 6b 6c 6d 6e 6f 70  abcdefghijklmnop |",
        "strace: System call limit has been reached, detaching tracees",
        "  ______________________________________________         ____",
        " /                                              \\       /    \\",
        "                                                         [  ]",
    ] {
        assert_eq!(run(&[line]), vec![], "line: {line}");
    }
}

#[test]
fn garbage_is_skipped_with_a_reason() {
    let (out, skips) = run_lines(&[
        b"this line is not valid strace output and should be skipped",
        b"",
        b"27369 <... no really why am I doin this",
        b"1796078610.545264 write(1, \"x\", 1) = banana",
    ]);
    assert_eq!(out, vec![]);
    assert_eq!(
        skips,
        vec![
            (1, SkipReason::NoSyscall),
            (2, SkipReason::Empty),
            (3, SkipReason::ResumedWithoutName),
            (4, SkipReason::BadReturn),
        ]
    );
}

/// `-o FILE -f` pair: fd/args from the first half, result and duration from the second.
#[test]
fn unfinished_and_resumed_are_stitched() {
    let got = run(&[
        "9380  22:38:54.938004 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD <unfinished ...>",
        "9380  22:38:54.942997 <... clone resumed>, child_tidptr=0x7fbbb94d6510) = 9569 <0.004986>",
    ]);
    assert_eq!(
        got,
        vec![
            call(9380, tod(22, 38, 54, 938_004), 2, "clone")
                .extra(Extra::Clone { thread: false })
                .val(9569)
                .measured(4_986 * US)
                .start_line(1)
                .0
        ]
    );
}

/// Two threads interleaved on the same fd (everysec-dd-yy lines 131-136), -yy.
#[test]
fn pairs_are_stitched_per_thread() {
    let got = run(&[
        r#"11461 22:41:06.814855 write(9<TCP:[127.0.0.1:6394->127.0.0.1:36610]>, "+OK\r\n", 5 <unfinished ...>"#,
        "11467 22:41:06.814891 fdatasync(7</var/lib/redis-lab/s5/everysec-dd-yy/appendonlydir/appendonly.aof.1.incr.aof> <unfinished ...>",
        "11461 22:41:06.815026 <... write resumed>) = 5 <0.000152>",
        "11461 22:41:06.815047 epoll_wait(5<anon_inode:[eventpoll]>,  <unfinished ...>",
        "11467 22:41:06.815345 <... fdatasync resumed>) = 0 <0.000423>",
    ]);
    assert_eq!(
        got,
        vec![
            call(11461, tod(22, 41, 6, 814_855), 3, "write")
                .fd(9)
                .fd_path("TCP:[127.0.0.1:6394->127.0.0.1:36610]")
                .data(b"+OK\r\n", false)
                .val(5)
                .measured(152 * US)
                .start_line(1)
                .0,
            call(11467, tod(22, 41, 6, 814_891), 5, "fdatasync")
                .fd(7)
                .fd_path(
                    "/var/lib/redis-lab/s5/everysec-dd-yy/appendonlydir/appendonly.aof.1.incr.aof"
                )
                .val(0)
                .measured(423 * US)
                .start_line(2)
                .0,
            // Never resumed: in flight at the end, known part up to the last event.
            call(11461, tod(22, 41, 6, 815_047), 4, "epoll_wait")
                .fd(5)
                .fd_path("anon_inode:[eventpoll]")
                .dur(
                    tod(22, 41, 6, 815_345) - tod(22, 41, 6, 815_047),
                    DurSource::Paired
                )
                .in_flight(InFlight::AtEnd)
                .start_line(4)
                .0,
        ]
    );
}

/// Without -T a pair still has a duration: entry line to resumed line.
#[test]
fn pair_without_dur_is_timed_from_its_halves() {
    let got = run(&[
        "[pid  8169] 22:38:13.918972 wait4(-1,  <unfinished ...>",
        "[pid  8169] 22:38:13.921731 <... wait4 resumed>0x7ffd6cafbe94, WNOHANG, NULL) = 0",
    ]);
    assert_eq!(
        got,
        vec![
            call(8169, tod(22, 38, 13, 918_972), 2, "wait4")
                .val(0)
                .dur(2_759 * US, DurSource::Paired)
                .start_line(1)
                .0
        ]
    );
}

/// Aligned resumed half with a blank before `)` and a comment after the result.
#[test]
fn aligned_resumed_half() {
    let got = run(&[
        "[pid  1905] select(0, NULL, NULL, NULL, {0, 198904} <unfinished ...>",
        "[pid 23966] ftruncate(28, 25165824)     = 0",
        "[pid  1905] <... select resumed> )      = 0 (Timeout)",
    ]);
    assert_eq!(
        got,
        vec![
            call(23966, 0, 2, "ftruncate").fd(28).val(0).0,
            call(1905, 0, 3, "select")
                .val(0)
                .dur(0, DurSource::Paired)
                .start_line(1)
                .0,
        ]
    );
}

/// README lines: "Process N attached" spliced into the parent's clone line, finished by a
/// bare ` <unfinished ...>` line; the resumed half comes later.
#[test]
fn attach_message_spliced_then_bare_unfinished() {
    let got = run(&[
        "[pid  8169] 22:38:13.774789 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDstrace: Process 8335 attached",
        " <unfinished ...>",
        "[pid  8335] 22:38:13.787511 set_robust_list(0x7f3723efe520, 24 <unfinished ...>",
        "[pid  8169] 22:38:13.787530 <... clone resumed>, child_tidptr=0x7f3723efe510) = 8335 <0.012726>",
    ]);
    assert_eq!(
        got,
        vec![
            ev(
                8335,
                tod(22, 38, 13, 774_789),
                1,
                EventKind::Attach { threads: None }
            ),
            call(8169, tod(22, 38, 13, 774_789), 4, "clone")
                .extra(Extra::Clone { thread: false })
                .val(8335)
                .measured(12_726 * US)
                .start_line(1)
                .0,
            call(8335, tod(22, 38, 13, 787_511), 3, "set_robust_list")
                .dur(19 * US, DurSource::Paired)
                .in_flight(InFlight::AtEnd)
                .start_line(3)
                .0,
        ]
    );
}

/// The trial-run variant: the split clone line is finished by the rest of the call.
#[test]
fn attach_message_spliced_then_bare_rest_of_call() {
    let got = run(&[
        "[pid  7040] 22:30:00.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDstrace: Process 7049 attached",
        ", child_tidptr=0x7f604bcf2510) = 7049 <0.006527>",
        "[pid  7049] 22:30:00.106000 set_robust_list(0x7f604bcf2520, 24) = 0 <0.000010>",
    ]);
    assert_eq!(
        got,
        vec![
            ev(
                7049,
                tod(22, 30, 0, 100_000),
                1,
                EventKind::Attach { threads: None }
            ),
            call(7040, tod(22, 30, 0, 100_000), 2, "clone")
                .extra(Extra::Clone { thread: false })
                .val(7049)
                .measured(6_527 * US)
                .0,
            call(7049, tod(22, 30, 0, 106_000), 3, "set_robust_list")
                .val(0)
                .measured(10 * US)
                .0,
        ]
    );
}

/// Detach on SIGINT: the message is spliced into the open line, then ` <detached ...>`.
#[test]
fn detach_message_spliced_then_detached_marker() {
    let got = run(&[
        "[pid  8169] 22:38:25.561000 getpid() = 8169 <0.000005>",
        "[pid  8169] 22:38:25.561404 epoll_wait(5<anon_inode:[eventpoll]>, strace: Process 8169 detached",
        " <detached ...>",
    ]);
    assert_eq!(
        got,
        vec![
            call(8169, tod(22, 38, 25, 561_000), 1, "getpid")
                .val(8169)
                .measured(5 * US)
                .0,
            ev(8169, tod(22, 38, 25, 561_404), 2, EventKind::Detach),
            call(8169, tod(22, 38, 25, 561_404), 3, "epoll_wait")
                .fd(5)
                .fd_path("anon_inode:[eventpoll]")
                .in_flight(InFlight::AtEnd)
                .dur(0, DurSource::Paired)
                .start_line(2)
                .0,
        ]
    );
}

/// A split line whose end never comes is kept as a call in flight, and a second split line
/// does not lose the first.
#[test]
fn two_splits_in_a_row_lose_nothing() {
    let got = run(&[
        "[pid  1] 10:00:00.000000 clone(flags=SIGCHLDstrace: Process 2 attached",
        "[pid  1] 10:00:00.000100 clone(flags=SIGCHLDstrace: Process 3 attached",
        " <unfinished ...>",
    ]);
    let names: Vec<_> = got
        .iter()
        .map(|e| match &e.kind {
            EventKind::Syscall(s) => (e.line, s.name, s.in_flight),
            EventKind::Attach { .. } => (e.line, "attach", None),
            _ => (e.line, "?", None),
        })
        .collect();
    assert_eq!(
        names,
        vec![
            (1, "attach", None),
            (2, "attach", None),
            // The first split line never ended: in flight, emitted when the thread's next
            // call shows it was over.
            (1, "clone", Some(InFlight::AtEnd)),
            (2, "clone", Some(InFlight::AtEnd)),
        ]
    );
}

/// README lines 11-12: a thread blocked when strace attached starts with restart_syscall.
#[test]
fn restart_syscall_is_in_flight_at_start() {
    let got = run(&[
        "[pid  8176] 22:38:10.039239 restart_syscall(<... resuming interrupted read ...> <unfinished ...>",
        "[pid  8176] 22:38:19.531396 <... restart_syscall resumed>) = -1 ETIMEDOUT (Connection timed out) <9.492123>",
    ]);
    assert_eq!(
        got,
        vec![
            call(8176, tod(22, 38, 10, 39_239), 2, "restart_syscall")
                .extra(Extra::Resumes("read"))
                .ret(Ret::Err("ETIMEDOUT"))
                .measured(9_492_123 * US)
                .in_flight(InFlight::AtStart)
                .start_line(1)
                .0
        ]
    );
}

/// A resumed half with no entry half: the call was running when tracing began. With -T it
/// is placed at resumed time minus its duration.
#[test]
fn resumed_without_entry_is_in_flight_at_start() {
    let got = run(&["[pid  7313] 22:37:41.094130 <... write resumed>) = 915 <0.000032>"]);
    assert_eq!(
        got,
        vec![
            call(7313, tod(22, 37, 41, 94_098), 1, "write")
                .val(915)
                .measured(32 * US)
                .in_flight(InFlight::AtStart)
                .0
        ]
    );
    // Without -T: known to run at least from the start of the trace.
    let got = run(&[
        "230473 02:47:48 getpid() = 230473",
        "230473 02:47:49 <... futex resumed>)    = ? <unavailable>",
    ]);
    assert_eq!(
        got,
        vec![
            call(230473, tod(2, 47, 48, 0), 1, "getpid").val(230473).0,
            call(230473, tod(2, 47, 48, 0), 2, "futex")
                .dur(S, DurSource::Paired)
                .in_flight(InFlight::AtStart)
                .0,
        ]
    );
}

/// `<... x resumed> ... <unfinished ...>`: resumed and interrupted again.
#[test]
fn resumed_then_unfinished_again() {
    let got = run(&[
        "1700000052.321000 epoll_wait(4, <unfinished ...>",
        "1700000052.321500 <... epoll_wait resumed> {}, 64, 100 <unfinished ...>",
        "1700000052.322000 <... epoll_wait resumed> {}, 64, 100) = 1",
    ]);
    assert_eq!(
        got,
        vec![
            call(0, 1_700_000_052_321_000_000, 3, "epoll_wait")
                .fd(4)
                .val(1)
                .dur(MS, DurSource::Paired)
                .start_line(1)
                .0
        ]
    );
}

/// `exit_group(0) <unfinished ...>` then `+++ exited`: the call ends with the process.
#[test]
fn exit_ends_a_pending_exit_group() {
    let got = run(&[
        "9569  22:38:57.152000 exit_group(0) <unfinished ...>",
        "9569  22:38:57.152275 +++ exited with 0 +++",
    ]);
    assert_eq!(
        got,
        vec![
            call(9569, tod(22, 38, 57, 152_000), 2, "exit_group")
                .dur(275 * US, DurSource::Paired)
                .start_line(1)
                .0,
            ev(
                9569,
                tod(22, 38, 57, 152_275),
                2,
                EventKind::Exit {
                    code: Some(0),
                    signal: None
                }
            ),
        ]
    );
}

/// Under -f, lines come in the order strace handled them, not by time: each event keeps
/// its own printed time.
#[test]
fn out_of_order_lines_keep_their_times() {
    let got = run(&[
        "[pid  7313] 22:37:41.094130 getpid() = 7313 <0.000003>",
        "[pid  7320] 22:37:41.094120 futex(0x7fb99d016678, FUTEX_WAKE_PRIVATE, 1) = 0 <0.000087>",
    ]);
    assert_eq!(got[0].ts, tod(22, 37, 41, 94_130));
    assert_eq!(got[1].ts, tod(22, 37, 41, 94_120));
}

#[test]
fn midnight_rollover_under_tt_and_t() {
    let got = run(&[
        "23:59:59.900000 fdatasync(7) = 0 <0.000100>",
        "00:00:00.100000 fdatasync(7) = 0 <0.000100>",
        // printed late, from before midnight
        "23:59:59.950000 getpid() = 1 <0.000001>",
        "00:00:01.000000 getpid() = 1 <0.000001>",
    ]);
    let ts: Vec<i64> = got.iter().map(|e| e.ts).collect();
    assert_eq!(
        ts,
        vec![
            tod(23, 59, 59, 900_000),
            DAY + 100 * MS,
            tod(23, 59, 59, 950_000),
            DAY + S
        ]
    );
    let got = run(&["23:59:59 fdatasync(7) = 0", "00:00:02 fdatasync(7) = 0"]);
    assert_eq!(
        got.iter().map(|e| e.ts).collect::<Vec<_>>(),
        vec![tod(23, 59, 59, 0), DAY + 2 * S]
    );
}

#[test]
fn relative_times_accumulate() {
    let got = run(&[
        "     0.000000 epoll_wait(5, [], 10128, 81) = 0 <0.081163>",
        "     0.081200 getpid() = 7 <0.000003>",
        "     0.000151 close(8) = 0 <0.000057>",
    ]);
    assert_eq!(
        got.iter().map(|e| e.ts).collect::<Vec<_>>(),
        vec![0, 81_200 * US, 81_351 * US]
    );
}

/// A cut-off last line (strace killed mid-write): kept as a call in flight at the end.
#[test]
fn cut_off_last_line_is_in_flight_at_end() {
    let (got, skips) = run_lines(&[
        b"[pid  7313] 22:37:40.811000 getpid() = 7313 <0.000003>",
        b"[pid  7313] 22:37:40.811837 write(8, \"$4\\r\\ngo",
    ]);
    assert!(skips.is_empty());
    assert_eq!(
        got[1],
        call(7313, tod(22, 37, 40, 811_837), 2, "write")
            .fd(8)
            .data(b"$4\r\ngo", false)
            .in_flight(InFlight::AtEnd)
            .dur(0, DurSource::Paired)
            .start_line(2)
            .0
    );
    // Cut inside the timestamp or the name: nothing to read.
    let (got, skips) = run_lines(&[b"[pid  7313] 22:37:4"]);
    assert_eq!(got, vec![]);
    assert_eq!(skips.len(), 1);
}

/// Lines with a different timestamp format than the trace's are skipped, not misplaced.
#[test]
fn mixed_timestamp_formats_are_skipped() {
    let (got, skips) = run_lines(&[
        b"1000 1700000052.321000 openat(AT_FDCWD, \"/etc/passwd\", O_RDONLY) = 3",
        b"1000 14:32:01 read(3, \"root:x:0:0\"..., 1024) = 312",
        b"1000 1700000052.321100 write(1, \"hi\", 2) = 2",
    ]);
    assert_eq!(got.len(), 2);
    assert_eq!(skips, vec![(2, SkipReason::BadTimestamp)]);
}

#[test]
fn parse_prefix_shapes() {
    type Case<'a> = (&'a str, Option<Tid>, Option<i64>, TimeFmt, &'a str);
    let cases: Vec<Case> = vec![
        (
            "[pid  7313] 22:37:40.811837 x()",
            Some(7313),
            Some(tod(22, 37, 40, 811_837)),
            TimeFmt::TimeOfDayFrac,
            "x()",
        ),
        (
            "9380  22:38:54.938004 x()",
            Some(9380),
            Some(tod(22, 38, 54, 938_004)),
            TimeFmt::TimeOfDayFrac,
            "x()",
        ),
        (
            "     0.000151 x()",
            None,
            Some(151 * US),
            TimeFmt::Relative,
            "x()",
        ),
        (
            "9380       0.000151 x()",
            Some(9380),
            Some(151 * US),
            TimeFmt::Relative,
            "x()",
        ),
        (
            "1796078610.545264 x()",
            None,
            Some(1_796_078_610_545_264_000),
            TimeFmt::Epoch,
            "x()",
        ),
        (
            "1796078610 x()",
            None,
            Some(1_796_078_610 * S),
            TimeFmt::Epoch,
            "x()",
        ),
        (
            "22:37:51 x()",
            None,
            Some(tod(22, 37, 51, 0)),
            TimeFmt::TimeOfDay,
            "x()",
        ),
        ("x()", None, None, TimeFmt::None, "x()"),
        ("4194304 x()", Some(4_194_304), None, TimeFmt::None, "x()"),
    ];
    for (line, pid, time, fmt, body) in cases {
        let (p, b) = parse_prefix(line.as_bytes());
        assert_eq!(
            (p.pid, p.time, p.fmt, b),
            (pid, time, fmt, body.as_bytes()),
            "line: {line}"
        );
    }
}

#[test]
fn describe_state_after_lines() {
    let mut p = StraceParser::default();
    let mut out = vec![];
    p.feed(b"11461 22:41:05.800513 read(8<TCP:[127.0.0.1:6394->127.0.0.1:50418]>, \"\", 1) = 0 <0.000028>", &mut out);
    assert!(p.shape.pid_column && p.shape.dur && p.shape.annotation && p.shape.yy);
    assert_eq!(p.clock.fmt, TimeFmt::TimeOfDayFrac);
}

/// Every line of every capture and peer trace, plus edge shapes: wherever the fast path
/// accepts a body, the general parser reads the same call from it; and every string in
/// them, kept as printed, decodes as the eager decoder would.
#[test]
fn fast_path_agrees_with_the_general_parser() {
    use std::io::Read;
    let mut lines: Vec<Vec<u8>> = [
        "read(3, \"a) = 1 <0.000001>\", 10) = 10 <0.000002>",
        "read(3, \"a\\\") = 1\", 10) = 10",
        "write(1, \"x\"..., 9) = -1 EAGAIN (Resource temporarily unavailable) <0.000009>",
        "close(3) = -1 EBADF (Bad file descriptor = 3)",
        "select(4, [3], NULL, NULL, NULL) = 1 (in [3])",
        "mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, 3, 0) = 0x7f0000000000 <0.000010>",
        "openat(AT_FDCWD, \"/x\", O_RDONLY) = 3</x> <0.000010>",
        "fdatasync(7)            = 0",
        "fdatasync(7) = 0 <12.000010>",
        "fdatasync(7) = 0 <0.000010000>",
        "fdatasync(7) = 0\t<0.000010>",
        "fdatasync(7) = 99999999999999999999999",
        "fdatasync(7) = -5 <0.000010>",
        "exit_group(0) = ?",
        "f() = 0",
        "f(= 0",
        "f) = 0",
        "x(1) = 0 ENOENT (a) <0.000001>",
        "x(1) = -1  ENOENT (a) <0.000001>",
        "x(1) = -1 eNOENT (a)",
    ]
    .iter()
    .map(|l| l.as_bytes().to_vec())
    .collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    for dir in [root.join("fixtures")] {
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push(p);
                }
            }
        }
    }
    assert!(files.len() > 10, "the fixtures are where they should be");
    for f in files {
        let raw = std::fs::read(&f).unwrap();
        let text = if f.extension().is_some_and(|e| e == "gz") {
            let mut out = vec![];
            if flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_end(&mut out)
                .is_err()
            {
                continue;
            }
            out
        } else {
            raw
        };
        lines.extend(text.split(|b| *b == b'\n').map(|l| l.to_vec()));
    }
    let mut accepted = 0;
    for line in &lines {
        // Every string argument decodes lazily to what the eager decoder gives.
        for q in memchr::memchr_iter(b'"', line) {
            assert!(
                lazy_data_agrees(&line[q + 1..]),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let (_, body) = parse_prefix(line);
        if let Some(fast) = fast_call(body) {
            accepted += 1;
            assert_eq!(
                Ok(fast),
                parse_body(body),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }
    assert!(
        accepted > 10_000,
        "the fast path takes the common lines ({accepted})"
    );
}

/// Ten-digit epoch seconds past what ns can hold (found by fuzzing): no overflow, the line
/// goes to the general path, which refuses the time.
#[test]
fn epoch_seconds_past_the_ns_range_do_not_overflow() {
    let (p, _) = parse_prefix(b"9716078611.649905 read(3, \"\", 1) = 0");
    assert_eq!(p.time, None);
    let (p, _) = parse_prefix(b"9223372035.000001 read(3, \"\", 1) = 0");
    assert_eq!(p.time, Some(9_223_372_035_000_001_000));
}

/// `-Y` names the thread beside its pid (`[pid N<comm>]` on stderr, `N<comm>` with -o), once
/// per thread as an event before its first call and again if the name changes; `-n`
/// (`[ 202]`) and `-i` (`[00007f4b6d52af16]`) between the time and the call are skipped.
/// Lines from strace 6.1 on redis-server 7.0.
#[test]
fn comm_syscall_number_and_instruction_pointer_columns() {
    let out = run(&[
        "[pid 28473<bio_aof_fsync>] 04:52:04.985231 [ 202] [00007f4b6d52af16] fdatasync(7) = 0 <0.000311>",
        "[pid 28473<bio_aof_fsync>] 04:52:05.985231 [ 202] [00007f4b6d52af16] fdatasync(7) = 0 <0.000200>",
        "28471<redis-server> 04:52:06.000001 [00007f4b6d508f36] epoll_wait(5, [], 10128, 91) = 0 <0.091215>",
        "28471<redis-serv>er> 04:52:07.000001 [ 232] getpid() = 28471 <0.000003>",
    ]);
    let names: Vec<(Tid, &str)> = out
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ThreadName(n) => Some((e.tid, &n[..])),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        [
            (28473, "bio_aof_fsync"),
            (28471, "redis-server"),
            (28471, "redis-serv>er")
        ]
    );
    let calls: Vec<(Tid, i64, &str, Option<i64>)> = out
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Syscall(sc) => Some((e.tid, e.ts, sc.name, sc.dur)),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [
            (28473, tod(4, 52, 4, 985_231), "fdatasync", Some(311 * US)),
            (28473, tod(4, 52, 5, 985_231), "fdatasync", Some(200 * US)),
            (28471, tod(4, 52, 6, 1), "epoll_wait", Some(91_215 * US)),
            (28471, tod(4, 52, 7, 1), "getpid", Some(3 * US)),
        ]
    );
    // A bracket that is neither (a secontext, text) is left alone.
    let (_, body) = parse_prefix(b"04:52:07.000001 [not-hex] getpid() = 1");
    assert!(body.starts_with(b"[not-hex]"));
}

/// `strace -C` prints its count table after the trace: read as noise, not skipped lines.
/// Lines from strace 6.1.
#[test]
fn count_table_after_the_trace_is_noise() {
    let lines: &[&[u8]] = &[
        b"28471 04:55:11.056073 close(8)          = 0 <0.000008>",
        b"% time     seconds  usecs/call     calls    errors syscall",
        b"------ ----------- ----------- --------- --------- ----------------",
        b" 45.52    0.009211          12       752           write",
        b"  0.10    0.000021           2         8         3 accept4",
        b"------ ----------- ----------- --------- --------- ----------------",
        b"100.00    0.020237          10      1952         3 total",
    ];
    let (out, skips) = run_lines(lines);
    assert!(skips.is_empty(), "{skips:?}");
    assert_eq!(out.len(), 1);
    // A line that only looks numeric is still skipped.
    let (_, skips) = run_lines(&[
        b"28471 04:55:11.056073 close(8) = 0 <0.000008>",
        b" 45.52 oops",
    ]);
    assert_eq!(skips.len(), 1);
}

/// strace 4.x prints its own messages without the `strace: ` prefix; they are the same
/// attach and detach, not skipped lines. Until a second tracee exists strace leaves the
/// `[pid N]` column out: those lines are the attached pid's, not a thread 0's.
#[test]
fn strace4_messages_and_the_attached_pid() {
    let (got, skips) = run_lines(&[
        b"Process 4321 attached - interrupt to quit",
        b"read(3, \"x\", 1) = 1",
        b"Process 4321 detached",
    ]);
    assert!(skips.is_empty(), "{skips:?}");
    let kinds: Vec<(Tid, &str)> = got
        .iter()
        .map(|e| {
            let k = match &e.kind {
                EventKind::Attach { .. } => "attach",
                EventKind::Detach => "detach",
                EventKind::Syscall(sc) => sc.name,
                _ => "other",
            };
            (e.tid, k)
        })
        .collect();
    assert_eq!(kinds, [(4321, "attach"), (4321, "read"), (4321, "detach")]);
    let got = run(&[
        "strace: Process 4321 attached",
        "10:00:00.000100 epoll_wait(5, [], 128, 100) = 0",
        "10:00:00.000200 clone(child_stack=NULL, flags=CLONE_VM|CLONE_THREAD) = 4322",
        "[pid  4322] 10:00:00.000300 futex(0x1, FUTEX_WAIT, 0, NULL) = 0",
        "[pid  4321] 10:00:00.000400 getpid() = 4321",
    ]);
    let tids: Vec<Tid> = got.iter().map(|e| e.tid).collect();
    assert_eq!(tids, [4321, 4321, 4321, 4322, 4321]);
    // An attach message printed into a line is the new child's: it names no default.
    let got = run(&[
        "read(3, \"x\", 1) = 1",
        "clone(child_stack=NULL, flags=SIGCHLDstrace: Process 7049 attached",
        ", child_tidptr=0x7f60) = 7049",
    ]);
    assert_eq!(got[0].tid, 0);
    assert_eq!(got.last().unwrap().tid, 0);
}

/// strace 4.x's `Process N attached` (no prefix) spliced into a clone line, the rest of the
/// call on the next line: stitched back, the child tid from the clone's return.
#[test]
fn strace4_attach_message_spliced_into_clone() {
    let got = run(&[
        "[pid  7040] 22:30:00.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDProcess 7049 attached",
        ", child_tidptr=0x7f604bcf2510) = 7049 <0.006527>",
    ]);
    assert_eq!(
        got,
        vec![
            ev(
                7049,
                tod(22, 30, 0, 100_000),
                1,
                EventKind::Attach { threads: None }
            ),
            call(7040, tod(22, 30, 0, 100_000), 2, "clone")
                .extra(Extra::Clone { thread: false })
                .val(7049)
                .measured(6_527 * US)
                .0,
        ]
    );
}

/// `restart_syscall(<... resuming interrupted nanosleep ...>)` carries the wait it resumes.
#[test]
fn restart_syscall_names_the_call_it_resumes() {
    let got = run(&["restart_syscall(<... resuming interrupted clock_nanosleep ...>) = 0"]);
    assert_eq!(
        got[0],
        call(0, 0, 1, "restart_syscall")
            .extra(Extra::Resumes("clock_nanosleep"))
            .val(0)
            .in_flight(InFlight::AtStart)
            .0
    );
}

/// The traced program's own output printed into its `write(1, ...` line (strace and the
/// program share a terminal): the `) = N` on the next line closes that write, which is
/// neither a call in flight nor a skipped line.
#[test]
fn program_output_spliced_into_a_write_is_stitched() {
    let (got, skips) = run_lines(&[
        b"10:00:00.000100 write(1, \"hello world\\n\", 12hello world",
        b") = 12 <0.000020>",
        b"10:00:00.000300 getpid() = 77 <0.000002>",
    ]);
    assert!(skips.is_empty(), "{skips:?}");
    assert_eq!(got.len(), 2);
    let w = got[0].syscall().unwrap();
    assert_eq!(
        (w.name, w.fd, w.ret, w.in_flight),
        ("write", Some(1), Ret::Val(12), None)
    );
    assert_eq!((w.dur, w.dur_src), (Some(20 * US), DurSource::Measured));
    assert_eq!(w.data().unwrap().head().bytes(), b"hello world\n");
    // Without its end the line is still a call in flight, and the next line is read.
    let (got, skips) = run_lines(&[
        b"10:00:00.000100 write(1, \"hello\\n\", 6hello",
        b"10:00:00.000300 getpid() = 77 <0.000002>",
    ]);
    assert!(skips.is_empty(), "{skips:?}");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].syscall().unwrap().name, "getpid");
    assert_eq!(got[1].syscall().unwrap().in_flight, Some(InFlight::AtEnd));
}

/// Hex fds (`accept4(0x6, ...)`, from non-Linux shims) are read as numbers, never as the
/// `0` of `0x`.
#[test]
fn hex_fds_are_numbers() {
    let got = run(&[
        "accept4(0x6, NULL, NULL, SOCK_CLOEXEC) = 0x9",
        "close(0x1f) = 0",
        "pipe2([0x3, 0x4], O_CLOEXEC) = 0",
    ]);
    assert_eq!(got[0].syscall().unwrap().fd, Some(6));
    assert_eq!(got[0].syscall().unwrap().ret, Ret::Val(9));
    assert_eq!(got[1].syscall().unwrap().fd, Some(31));
    assert_eq!(got[2].syscall().unwrap().extra, Extra::FdPair(3, 4));
}
