//! Shapes from traces people paste publicly (issue 39), each from hand-written lines in
//! fixtures/wild/ (README there): what the report must not claim from them (a busy disk from
//! a filtered fsync trace, two classes for one fd lifetime, a socket taken for the AOF, a
//! trace called filtered without evidence), and what it must read (an outgoing connection
//! from its connect, comms with spaces in a whole-machine perf trace). Then properties over
//! every trace in fixtures/: no socket is ever the AOF, and no finding without the evidence
//! its cause needs (`EVIDENCE`, one entry for every finding). The third, no fd lifetime
//! with two classes, is read inside the analysis (`analyze::world`'s tests): a report
//! does not say where a lifetime ends.

use assert_cmd::Command;
use serde_json::Value;
use std::path::Path;

fn analyze(path: &Path) -> Value {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .arg("analyze")
        .arg(path)
        .args(["--format", "json", "--date", "2026-11-30Z"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn wild(name: &str) -> Value {
    analyze(&Path::new("fixtures/wild").join(name))
}

fn finding_ids(r: &Value) -> Vec<String> {
    r["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn finding<'a>(r: &'a Value, id: &str) -> Option<&'a Value> {
    r["findings"]
        .as_array()?
        .iter()
        .find(|f| f["id"].as_str() == Some(id))
}

/// (fd, class) of every FILES row.
fn rows(r: &Value) -> Vec<(i64, String)> {
    r["fds"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["fd"].as_i64().unwrap_or(-1),
                        f["class"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `strace -p PID -T -e trace=fdatasync` of `appendfsync always`: steady fsyncs of one fd
/// in the thread that owns the pid, and nothing else. No other writer is in it, so no busy
/// disk; the stall says what the trace can and cannot show.
#[test]
fn a_filtered_fsync_trace_claims_no_busy_disk() {
    let r = wild("fsync-filtered-always.strace");
    let ids = finding_ids(&r);
    assert!(!ids.contains(&"disk-contention".to_string()), "{ids:?}");
    assert!(ids.contains(&"slow-file-io".to_string()), "{ids:?}");
    let cause = r["stalls"][0]["cause"].as_str().unwrap_or("");
    assert!(cause.contains("appendfsync always"), "{cause}");
    assert!(cause.contains("no other writer"), "{cause}");
    // One kind of call: the filter is evidence enough to say so.
    let ev = finding(&r, "filtered-trace").expect("filtered-trace")["evidence"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(ev.contains("-e trace"), "{ev}");
}

/// fd 7 is fsynced before the RESP write that shows it is the AOF: its lifetime is the AOF
/// from its first call, one FILES row, one cause for identical calls.
#[test]
fn one_fd_lifetime_has_one_class() {
    let r = wild("fd-classed-late.strace");
    let fd7: Vec<_> = rows(&r).into_iter().filter(|(fd, _)| *fd == 7).collect();
    assert_eq!(fd7, vec![(7, "aof".to_string())]);
    let ids = finding_ids(&r);
    assert!(ids.contains(&"aof-fsync-always".to_string()), "{ids:?}");
    assert!(!ids.contains(&"disk-contention".to_string()), "{ids:?}");
    assert!(!ids.contains(&"slow-file-io".to_string()), "{ids:?}");
}

/// RESP written with sendto, on a socket made in the trace, or on an fd of unknown origin
/// with nothing else to go on: none of them is the AOF.
#[test]
fn resp_on_a_socket_or_an_fd_of_unknown_origin_is_not_the_aof() {
    let r = wild("resp-on-sockets.strace");
    let rows = rows(&r);
    assert!(!rows.is_empty());
    for (fd, class) in &rows {
        assert_ne!(class, "aof", "fd {fd}: {rows:?}");
    }
}

/// A connect classes its socket from the call itself (its own stall and the setsockopt
/// before it), one row per class, nothing left as "unknown".
#[test]
fn a_connect_classes_its_socket_from_the_call_itself() {
    let r = wild("connect-classed.strace");
    let fd4: Vec<_> = rows(&r).into_iter().filter(|(fd, _)| *fd == 4).collect();
    // Two sockets in turn on fd 4, each connected: two connections, two rows, one class.
    assert_eq!(
        fd4,
        vec![(4, "outgoing".to_string()), (4, "outgoing".to_string())]
    );
    let cause = r["stalls"][0]["cause"].as_str().unwrap_or("");
    assert!(cause.contains("connect()"), "{cause}");
    assert!(!cause.contains("unknown"), "{cause}");
}

/// `perf trace -a`: `Web Content/219299` and `kworker/u8:2/77` are comms, their lines calls.
#[test]
fn whole_machine_perf_comms_with_spaces_are_read() {
    let r = wild("whole-machine-comms.perf.txt");
    assert_eq!(
        r["summary"]["syscalls"].as_u64(),
        Some(40),
        "{}",
        r["summary"]
    );
    assert_eq!(
        r["summary"]["threads"].as_u64(),
        Some(4),
        "{}",
        r["summary"]
    );
    // A perf trace is never strace's -e trace=.
    if let Some(f) = finding(&r, "filtered-trace") {
        let ev = f["evidence"].as_str().unwrap_or("");
        assert!(!ev.contains("-e trace"), "{ev}");
    }
}

/// A trace of many kinds of call and no event loop was not filtered: it is not called so.
#[test]
fn an_unfiltered_trace_is_not_called_filtered() {
    let r = wild("no-loop-unfiltered.strace");
    let ev = finding(&r, "filtered-trace").expect("no event loop: gaps are not reported")
        ["evidence"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(!ev.contains("-e trace"), "{ev}");
    // `/etc/hosts` is read: a file, not a directory.
    let hosts: Vec<_> = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str() == Some("/etc/hosts"))
        .map(|f| f["class"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(hosts, vec!["other".to_string()]);
}

/// The thread that owns the pid sleeps in `select` with no fd sets while another thread
/// runs the event loop: it is not the main thread, and its sleep holds no client.
#[test]
fn the_pid_thread_beside_an_event_loop_is_not_main() {
    let r = wild("pid-thread-sleeps-beside-loop.strace");
    let ids = finding_ids(&r);
    assert!(!ids.contains(&"command".to_string()), "{ids:?}");
    for f in r["findings"].as_array().unwrap() {
        assert_ne!(f["severity"].as_str(), Some("critical"), "{f}");
    }
    let main: Vec<_> = r["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"].as_str() == Some("main"))
        .map(|t| t["tid"].as_u64())
        .collect();
    assert_eq!(main, vec![Some(9001)], "{}", r["threads"]);
}

/// A thread-per-connection server's acceptor parked 2 s in accept() waits for work: no
/// stall, whether its accept returned or was still waiting when the trace ended.
#[test]
fn a_thread_parked_in_accept_is_no_stall() {
    let r = wild("accept-parked.strace");
    assert_eq!(r["summary"]["stalls"].as_u64(), Some(0), "{}", r["stalls"]);
    assert!(!finding_ids(&r).contains(&"unexplained".to_string()));
}

/// A `-y` path of a socket.
fn socket_path(p: &str) -> bool {
    ["TCP", "UDP", "UNIX", "socket:", "NETLINK"]
        .iter()
        .any(|k| p.starts_with(k))
        || p.contains("->")
}

/// A check of the report (and of the finding itself) for what a finding needs.
type Needs = fn(&Value, &Value) -> bool;

/// What each finding needs in the report before it may be made, for every finding there
/// is: a finding naming a file's class needs a row of that class (or a call on it), one
/// naming a child needs a phase or a second process, a busy disk another writer, a slow
/// command redis's main thread, a lack of CPU or memory the scheduler's figures, a
/// filtered trace a strace of few kinds of call (or the evidence it names). The findings
/// that claim no cause (unexplained, gaps-unmeasurable, the backend's and watch's own)
/// need nothing. A finding not listed fails: a new one must say what it needs.
const EVIDENCE: &[(&str, Needs)] = &[
    ("aof-fsync-always", |r, _| {
        has_class(r, "aof") && has_call(r, &["fsync", "fdatasync"])
    }),
    ("aof-fsync-background", |r, _| {
        has_class(r, "aof") && threads(r) > 1
    }),
    ("aof-write-pending-fsync", |r, _| {
        has_class(r, "aof") && threads(r) > 1
    }),
    ("aof-write-active-child", |r, _| {
        has_class(r, "aof") && has_phase(r)
    }),
    ("aof-write-alone", |r, _| has_class(r, "aof")),
    ("log-file-blocking", |r, _| has_class(r, "log")),
    ("fork", |r, _| {
        has_call(r, &["fork", "vfork", "clone", "clone3"])
    }),
    ("cow-page-faults", |r, _| has_phase(r)),
    ("child-cow-report", |r, _| has_child(r)),
    ("child-disk-io", |r, _| has_child(r)),
    ("disk-contention", |r, _| has_child(r) || threads(r) > 1),
    ("slow-file-io", |r, _| {
        r["fds"].as_array().is_some_and(|a| {
            a.iter().any(|f| {
                !matches!(
                    f["class"].as_str(),
                    Some(
                        "client"
                            | "listener"
                            | "replica"
                            | "outgoing"
                            | "pipe"
                            | "epoll"
                            | "unknown"
                    )
                )
            })
        })
    }),
    // A slow command holds every client only in redis's main thread.
    ("command", |r, _| has_role(r, "main")),
    ("io-threads", |r, _| has_role(r, "io_thread")),
    ("awaits-reply", |r, _| {
        has_class(r, "outgoing") || has_class(r, "replica")
    }),
    ("lock-wait", |r, _| has_call(r, &["futex"])),
    // Off its CPU, or redis's own work between commands: only where redis's client-facing
    // threads are.
    ("off-cpu", |r, _| {
        has_role(r, "main") || has_role(r, "io_thread")
    }),
    ("own-work", |r, _| has_role(r, "main")),
    // A lack of CPU, a CPU quota or memory is read from the scheduler's figures.
    ("cpu-starvation", |r, _| has_sched(r)),
    ("cpu-throttled", |r, _| has_sched(r)),
    ("memory-reclaim", |r, _| has_sched(r)),
    // `-e trace=` is a strace option; "looks filtered" on few kinds of call alone.
    ("filtered-trace", |r, f| {
        let ev = format!("{} {}", f["title"], f["evidence"]);
        (!ev.contains("-e trace") || r["source"]["kind"] != "perf")
            && (!ev.contains("looks filtered")
                || r["syscalls"].as_array().is_some_and(|a| a.len() <= 4))
    }),
    ("unexplained", |_, _| true),
    ("gaps-unmeasurable", |_, _| true),
    ("backend-limits", |_, _| true),
    ("tracer-overhead", |_, _| true),
    ("watch-incident", |_, _| true),
];

fn has_role(r: &Value, role: &str) -> bool {
    r["threads"]
        .as_array()
        .is_some_and(|a| a.iter().any(|t| t["role"] == role))
}

/// Some stall carries the scheduler's split of its time (a live tracer, a recording).
fn has_sched(r: &Value) -> bool {
    r["stalls"]
        .as_array()
        .is_some_and(|a| a.iter().any(|s| !s["sched"].is_null()))
}

fn has_class(r: &Value, class: &str) -> bool {
    rows(r).iter().any(|(_, c)| c == class)
}

fn has_call(r: &Value, names: &[&str]) -> bool {
    r["syscalls"].as_array().is_some_and(|a| {
        a.iter()
            .any(|s| names.contains(&s["name"].as_str().unwrap_or("")))
    })
}

fn has_phase(r: &Value) -> bool {
    r["phases"].as_array().is_some_and(|a| !a.is_empty())
}

/// A background child ran: a phase, or a second process in the trace.
fn has_child(r: &Value) -> bool {
    has_phase(r) || r["summary"]["processes"].as_u64().unwrap_or(0) > 1
}

fn threads(r: &Value) -> u64 {
    r["summary"]["threads"].as_u64().unwrap_or(0)
}

/// Over every fixture and peer trace: no FILES row of a socket is the AOF (or any disk
/// file), and every finding has the evidence its cause needs.
#[test]
fn no_socket_is_the_aof_and_no_finding_lacks_its_evidence() {
    let all = crate::evidence_props::traces();
    assert!(all.len() > 40, "{} traces", all.len());
    for t in all {
        let r = analyze(&t);
        if r.is_null() {
            continue;
        }
        for f in r["fds"].as_array().into_iter().flatten() {
            let path = f["path"].as_str().unwrap_or("");
            let class = f["class"].as_str().unwrap_or("");
            if socket_path(path) {
                assert!(
                    matches!(
                        class,
                        "client" | "listener" | "replica" | "outgoing" | "unknown"
                    ),
                    "{}: {path} is {class}",
                    t.display()
                );
            }
        }
        for f in r["findings"].as_array().into_iter().flatten() {
            let id = f["id"].as_str().unwrap_or("");
            let Some((_, needs)) = EVIDENCE.iter().find(|(i, _)| *i == id) else {
                panic!("{}: {id}: no evidence listed for it", t.display());
            };
            assert!(needs(&r, f), "{}: {id} without its evidence", t.display());
        }
    }
}

/// A connect names its peer and its error: a refused TCP connect, a slow unix-socket one, a
/// timed-out IPv6 one, each on fd 5 after the last was closed. Each socket has a row of its
/// own (by peer), and none is called a replication link for being connected.
#[test]
fn a_stall_on_connect_names_the_peer_and_the_error() {
    let r = wild("connect-peers.strace");
    let causes: Vec<&str> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cause"].as_str().unwrap_or(""))
        .collect();
    let has = |want: &[&str]| causes.iter().any(|c| want.iter().all(|w| c.contains(w)));
    assert!(
        has(&["connect()", "10.1.2.3:6380", "ECONNREFUSED"]),
        "{causes:?}"
    );
    assert!(
        has(&["connect()", "/var/run/redis/redis.sock"]),
        "{causes:?}"
    );
    assert!(has(&["connect()", "[::1]:6379", "ETIMEDOUT"]), "{causes:?}");
    assert!(
        !causes.iter().any(|c| c.contains("replication")),
        "{causes:?}"
    );
    let paths: Vec<&str> = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["fd"].as_i64() == Some(5))
        .map(|f| f["path"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        paths.len(),
        3,
        "one row per socket on the reused fd: {paths:?}"
    );
}

/// `[...]` on a line of its own is an elision (lines left out by whoever pasted the trace):
/// no gap spans it. A call line whose end a paste ate (`write(8, "+OK\r\n", 5 <0.000010>`)
/// returned (it has a duration): damaged, not a call still running at the end.
#[test]
fn an_elision_and_a_damaged_line_are_no_stalls() {
    let r = wild("elided-and-damaged.strace");
    assert_eq!(r["summary"]["stalls"].as_u64(), Some(0), "{}", r["stalls"]);
    let skipped: Vec<(u64, String)> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["line"].as_u64().unwrap_or(0),
                s["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        skipped
            .iter()
            .any(|(l, why)| *l == 5 && why.contains("left out")),
        "{skipped:?}"
    );
    assert!(
        skipped
            .iter()
            .any(|(l, why)| *l == 11 && why.contains("damaged")),
        "{skipped:?}"
    );
    // Only the last line (epoll_wait, cut by the end of the trace) is still running.
    assert_eq!(r["summary"]["in_flight_at_end"].as_u64(), Some(1));
}

/// A hang: the main thread and 7301 wait in `futex(..., FUTEX_WAIT_PRIVATE, 2, NULL)`
/// (glibc's contended-mutex value): waits for a lock, not for work; 7302's value-0 wait
/// (a condition variable) is one. strace attached 4 threads, 3 made a call: 1 is silent.
#[test]
fn a_contended_futex_is_a_lock_wait_and_silent_threads_are_named() {
    let r = wild("futex-hang.strace");
    let lock_tids: Vec<u64> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["cause"].as_str().unwrap_or("").contains("lock"))
        .filter_map(|s| s["tid"].as_u64())
        .collect();
    assert!(lock_tids.contains(&7300), "{}", r["stalls"]);
    assert!(lock_tids.contains(&7301), "{}", r["stalls"]);
    let parked: Vec<u64> = r["parked_at_end"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["tid"].as_u64())
        .collect();
    assert_eq!(parked, vec![7302], "{}", r["parked_at_end"]);
    assert_eq!(r["summary"]["silent_threads"].as_u64(), Some(1));
}

/// A runtime's helper thread (8201: futex wakes, madvise, sched_yield, nanosleep) serves
/// no one: its gaps are its own work, no stall. A worker that reads jobs and writes
/// results (8202) serves: its gap stays a stall.
#[test]
fn a_runtime_helper_s_gaps_are_no_stalls() {
    let r = wild("runtime-helper-gaps.strace");
    let tids: Vec<u64> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["tid"].as_u64())
        .collect();
    assert!(!tids.contains(&8201), "{}", r["stalls"]);
    assert!(tids.contains(&8202), "{}", r["stalls"]);
}

/// A client with no event loop sends a request on the connection it made and waits 3 s in
/// poll() for the answer, then 2 s in read() after another: both are stalls on the reply,
/// not idle waits; the quick round trips before are not.
#[test]
fn a_request_then_a_wait_is_a_stall_on_the_reply() {
    let r = wild("request-then-poll.strace");
    let stalls = r["stalls"].as_array().unwrap();
    let calls: Vec<&str> = stalls
        .iter()
        .map(|s| s["syscall"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(stalls.len(), 2, "{calls:?} {}", r["stalls"]);
    assert!(
        calls.contains(&"poll") && calls.contains(&"read"),
        "{calls:?}"
    );
    for s in stalls {
        assert!(
            s["cause"].as_str().unwrap_or("").contains("reply"),
            "{}",
            s["cause"]
        );
    }
    assert!(finding_ids(&r).contains(&"awaits-reply".to_string()));
}

/// perf trace prints a futex as `op: WAIT_PRIVATE, val: 2`: a lock wait too, so not in the
/// IDLE table of waits for work (`JS Watchdog/947933` in the whole-machine trace).
#[test]
fn a_perf_contended_futex_is_no_wait_for_work() {
    let r = wild("whole-machine-comms.perf.txt");
    let idle: Vec<&str> = r["idle"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["syscall"].as_str())
        .collect();
    assert!(!idle.contains(&"futex"), "{idle:?}");
}

/// `perf trace -a`: many programs. redis's threads (by their names) are redis's, its main
/// thread the one named so; another program's event loop (gnome-shell's) is never main, its
/// waits (a 300 ms recvmsg, Web Content's gaps) are not redis's stalls, and each program has
/// its own fds. A call wrapped onto two lines is joined; a call line whose end is missing and
/// a stray result line are counted as skipped, not dropped unsaid.
#[test]
fn a_whole_machine_perf_trace_groups_threads_by_program() {
    let r = wild("whole-machine-programs.perf.txt");
    let role = |tid: u64| {
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"].as_u64() == Some(tid))
            .map(|t| {
                (
                    t["role"].as_str().unwrap_or("").to_string(),
                    t["why"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_default()
    };
    assert_eq!(role(4242).0, "main", "{}", r["threads"]);
    assert_eq!(role(4243).0, "bio_close_file", "{}", r["threads"]);
    for tid in [1731, 219299, 219311] {
        let (role, why) = role(tid);
        assert_eq!(role, "other", "{tid}: {why}");
        assert!(why.contains("another program"), "{tid}: {why}");
    }
    let programs: Vec<&str> = r["summary"]["other_programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(programs, ["gnome-shell", "Web Content", "JS Watchdog"]);
    for s in r["stalls"].as_array().unwrap() {
        assert_eq!(s["tid"].as_u64(), Some(4242), "{s}");
    }
    // Each program's fd 12 is its own.
    let fd12: Vec<u64> = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["fd"].as_i64() == Some(12))
        .filter_map(|f| f["pid"].as_u64())
        .collect();
    assert_eq!(fd12.len(), 2, "{}", r["fds"]);
    assert!(fd12.contains(&1731) && fd12.contains(&219299), "{fd12:?}");
    // 26 lines: one event wrapped onto two, one damaged, one stray, one callchain frame.
    assert_eq!(
        r["summary"]["syscalls"].as_u64(),
        Some(22),
        "{}",
        r["summary"]
    );
    let skipped: Vec<(u64, String)> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["line"].as_u64().unwrap_or(0),
                s["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(
        skipped[0].0 == 21 && skipped[0].1.contains("damaged"),
        "{skipped:?}"
    );
    assert_eq!(skipped[1].0, 25, "{skipped:?}");
}

/// A connect refused, the socket closed, a new socket on the same fd connected to the same
/// peer: two connections, two FILES rows; nothing of the second is added to the first (the
/// refused one keeps its 150 ms, the second its own calls).
#[test]
fn a_reconnect_to_the_same_peer_is_a_row_of_its_own() {
    let r = wild("reconnect-same-peer.strace");
    let fd5: Vec<(u64, i64)> = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["fd"].as_i64() == Some(5))
        .map(|f| {
            (
                f["calls"].as_u64().unwrap_or(0),
                f["max_us"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(fd5.len(), 2, "{}", r["fds"]);
    assert!(fd5.contains(&(2, 150_000)), "{fd5:?}");
    assert!(
        fd5.iter().any(|(calls, max)| *calls == 5 && *max < 1000),
        "{fd5:?}"
    );
}

/// A connect makes an outgoing connection: a client's link to its server is `outgoing`;
/// only the one PSYNC/REPLCONF is sent on is the replication link, `replica`, from its
/// connect on (one row, one class).
#[test]
fn only_a_link_that_replicates_is_a_replica() {
    let r = wild("outgoing-and-replication.strace");
    let mut got = rows(&r);
    got.sort();
    assert_eq!(
        got,
        vec![(5, "outgoing".to_string()), (6, "replica".to_string())],
        "{}",
        r["fds"]
    );
}

/// `perf trace -a` names no process: two `redis-benchmar` threads are two processes as far
/// as the trace shows (fd 3 a socket in one, a file in the other), never one; a second
/// `redis-server` is another server, its helper `bio_aof/5255` (the nearest server below
/// its tid) with it: its slow write and fsync are not the reported redis's stalls, its fd
/// 7 (a socket) not the reported one's fd 7 (the AOF).
#[test]
fn same_comm_threads_of_a_whole_machine_trace_are_not_one_process() {
    let r = wild("whole-machine-same-comm.perf.txt");
    let thread = |tid: u64| {
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"].as_u64() == Some(tid))
            .map(|t| {
                (
                    t["role"].as_str().unwrap_or("").to_string(),
                    t["why"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_default()
    };
    assert_eq!(thread(4242).0, "main", "{}", r["threads"]);
    assert_eq!(thread(4245).0, "bio_aof", "{}", r["threads"]);
    for tid in [5252, 5255] {
        let (role, why) = thread(tid);
        assert_ne!(role, "main", "{tid}: {why}");
        assert!(why.contains("another server process"), "{tid}: {why}");
    }
    let stalls = r["stalls"].as_array().unwrap();
    assert!(!stalls.is_empty(), "{}", r["summary"]);
    for s in stalls {
        assert_eq!(s["tid"].as_u64(), Some(4242), "{s}");
    }
    let of_fd = |fd: i64| -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = r["fds"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["fd"].as_i64() == Some(fd))
            .map(|f| {
                (
                    f["pid"].as_u64().unwrap_or(0),
                    f["class"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let fd3 = of_fd(3);
    assert_eq!(
        fd3.iter().map(|f| f.0).collect::<Vec<_>>(),
        [9840, 9850],
        "{fd3:?}"
    );
    assert_ne!(fd3[0].1, fd3[1].1, "{fd3:?}");
    let fd7 = of_fd(7);
    assert_eq!(fd7.len(), 2, "{fd7:?}");
    assert_eq!(fd7[0], (4242, "aof".to_string()), "{fd7:?}");
    assert_eq!(fd7[1].0, 5252, "{fd7:?}");
    assert_ne!(fd7[1].1, "aof", "{fd7:?}");
    assert_eq!(
        r["summary"]["processes"].as_u64(),
        Some(4),
        "{}",
        r["summary"]
    );
    let programs: Vec<&str> = r["summary"]["other_programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(programs, ["redis-server", "redis-benchmar"]);
}

/// A runtime's helper serves no one, but its gap is a stall when another thread waited
/// through it: 8300 waits 600 ms in `futex(0xc000050150, FUTEX_WAIT_PRIVATE, 0, NULL)`
/// until the wake 8301 makes at the end of its 600 ms gap (the waiter's resumed line
/// comes after the wake). 8302's 500 ms gap ends in a wake of a futex no traced thread
/// waited on: its own work, no stall.
#[test]
fn a_runtime_helper_s_gap_that_a_thread_waited_through_is_a_stall() {
    let r = wild("runtime-helper-waited.strace");
    let gaps: Vec<u64> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "gap")
        .filter_map(|s| s["tid"].as_u64())
        .collect();
    assert!(gaps.contains(&8301), "{}", r["stalls"]);
    assert!(!gaps.contains(&8302), "{}", r["stalls"]);
}
