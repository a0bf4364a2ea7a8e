//! Roles: what each thread is to redis (main event loop, a bio thread, an io thread, a
//! forked child). The evidence a thread gives, call by call, is counted here; `decide` is the
//! pure rule that turns evidence, name and process facts into a role and the reason for it,
//! in order of trust: process, name, pid, behaviour (README: how thread roles are inferred).

pub use crate::report::Role;

impl Role {
    pub(crate) fn from_name(name: &str) -> Option<Role> {
        let n = name.trim();
        Some(match n {
            _ if n.starts_with("bio_aof") => Role::BioAof,
            _ if n.starts_with("bio_close_file") => Role::BioCloseFile,
            _ if n.starts_with("bio_lazy_free") => Role::BioLazyFree,
            // valkey 8/9's bio threads beside redis's three.
            _ if n.starts_with("bio_rdb_save") => Role::BioRdbSave,
            _ if n.starts_with("bio_tls_reload") => Role::BioTlsReload,
            _ if n.starts_with("jemalloc_bg_thd") => Role::JemallocBg,
            _ if n.starts_with("io_thd") => Role::IoThread,
            // Valkey, the redis fork, names its processes the same way; a comm is cut at
            // 15 bytes (`redis-rdb-bgsav`).
            _ if n
                .strip_prefix("redis-")
                .or(n.strip_prefix("valkey-"))
                .is_some_and(|r| {
                    ["rdb-bg", "aof-rew", "rdb-to"]
                        .iter()
                        .any(|c| r.starts_with(c))
                }) =>
            {
                Role::Child
            }
            _ if n.starts_with("redis-server")
                || n.starts_with("redis-check")
                || n.starts_with("valkey-server") =>
            {
                Role::Main
            }
            _ => Role::Other,
        })
    }
}

/// Why a thread has its role: its name, or a behaviour rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    Name,
    Rule(&'static str),
}

/// The behaviour counts that decide a thread's role.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct RoleEvidence {
    pub(crate) epoll: u64,
    pub(crate) aof_sync: u64,
    pub(crate) file_close: u64,
    pub(crate) client_io: u64,
    /// select/poll waits (an event loop only where no thread of the process waits in epoll).
    pub(crate) poll: u64,
    /// Received, sent or accepted on a socket, a pipe or an fd of unknown kind: the thread
    /// serves someone (client I/O counts too). A thread that never does serves no one: a
    /// language runtime's helper (GC, JIT, timers), whose gaps are its own work.
    pub(crate) serves: bool,
}

impl RoleEvidence {
    /// What `decide` reads of the counts: which kinds were seen, and whether file closes
    /// keep up with AOF fsyncs.
    #[cfg(test)]
    fn shape(&self) -> [bool; 5] {
        [
            self.epoll > 0,
            self.aof_sync > 0,
            self.file_close > 0,
            self.client_io > 0,
            self.file_close >= self.aof_sync,
        ]
    }

    /// Counts one call; true when that changed what `decide` reads, i.e. the role may have
    /// changed (the caller bumps the role epoch). Most calls change nothing: roles are
    /// decided again only when they can differ.
    #[inline]
    pub(crate) fn count(
        &mut self,
        facts: super::call::Facts,
        class: Option<crate::fdtable::FileClass>,
    ) -> bool {
        use super::call::Facts as F;
        use crate::fdtable::FileClass;
        // Each arm says whether `shape` changed without computing it twice: a count going
        // from 0 to 1, or `file_close >= aof_sync` flipping.
        if facts.has(F::EPOLL) {
            self.epoll += 1;
            self.epoll == 1
        } else if facts.has(F::POLL) {
            // Whether any thread waits for work at all is read by the first-thread rule.
            self.poll += 1;
            self.poll == 1
        } else if facts.has(F::FSYNC) && class.is_some_and(|c| c.is_aof()) {
            self.aof_sync += 1;
            self.aof_sync == 1 || self.file_close == self.aof_sync - 1
        } else if facts.has(F::CLOSE) && class.is_some_and(|c| c.is_disk_file()) {
            self.file_close += 1;
            self.file_close == 1 || self.file_close == self.aof_sync
        } else if facts.has(F::CLIENT_RW) && class == Some(FileClass::Client) {
            self.client_io += 1;
            self.serves = true;
            self.client_io == 1
        } else {
            // Not read by `decide`: no change of role.
            if facts.has(F::RECV | F::SEND | F::ACCEPT) && !class.is_some_and(|c| c.is_disk_file())
            {
                self.serves = true;
            }
            false
        }
    }
}

/// What `decide` knows about a thread beside its evidence.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Situation<'a> {
    pub(crate) name: Option<&'a str>,
    /// Its process was forked by the traced one.
    pub(crate) is_child: bool,
    /// The traced process's pid is known and this is its first thread (tid == pid).
    pub(crate) is_root_tid: bool,
    /// The pid is not known, this is the lowest tid of the traced process (of more than one
    /// thread: being alone says nothing), and no thread anywhere waits in an event loop
    /// (epoll, or select/poll).
    pub(crate) first_without_loop: bool,
    /// Another thread of the process is its main thread (tid == pid, named so, or it waited
    /// in epoll too with a lower tid): one main per process.
    pub(crate) other_main: bool,
    /// Another thread of the process waits in epoll, redis's event loop: only beside one is
    /// "outside the event loop" a role (a lone thread of any program closes files).
    pub(crate) loop_beside: bool,
}

/// A thread's role and the evidence for it, in order of trust: process, name, pid,
/// behaviour.
pub(crate) fn decide(ev: &RoleEvidence, s: Situation<'_>) -> (Role, Why) {
    if s.is_child {
        return (Role::Child, Why::Rule("forked child process"));
    }
    if let Some(n) = s.name {
        if let Some(r) = Role::from_name(n) {
            if r != Role::Other || !n.is_empty() {
                return (r, Why::Name);
            }
        }
    }
    // The thread that owns the pid is redis's main thread, unless another thread of the
    // process runs the event loop and it does not (a program whose first thread only
    // starts the others, sleeps or waits to join them).
    if s.is_root_tid && (ev.epoll > 0 || !s.loop_beside) {
        return (Role::Main, Why::Rule("tid == pid"));
    }
    // redis 8's io threads run event loops of their own: a second epoll thread is not main.
    if ev.epoll > 0 && !s.other_main {
        return (Role::Main, Why::Rule("runs the event loop (epoll_wait)"));
    }
    // No event loop in the trace (a filtered trace, a redis still starting or crashing):
    // the main thread is the process's first, whatever files it closes.
    if s.first_without_loop {
        return (
            Role::Main,
            Why::Rule("first thread of the process, and no thread runs the event loop"),
        );
    }
    // bio_close_file fsyncs a file only right before closing it (the old AOF after a
    // rewrite); the AOF fsync thread fsyncs the live AOF over and over and closes
    // rarely (redis 7.2 gives it the old AOF's close too).
    if s.loop_beside && ev.file_close > 0 && ev.file_close >= ev.aof_sync {
        return (
            Role::BioCloseFile,
            Why::Rule("closes files outside the event loop"),
        );
    }
    if ev.aof_sync > 0 {
        return (
            Role::BioAof,
            Why::Rule("fsyncs the AOF outside the event loop"),
        );
    }
    if ev.client_io > 0 {
        return (
            Role::IoThread,
            Why::Rule("reads/writes client sockets outside the event loop"),
        );
    }
    (Role::Other, Why::Rule("no redis-specific behaviour seen"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` says true exactly when what `decide` reads changed.
    #[test]
    fn count_reports_every_change_of_shape() {
        use crate::analyze::call::Facts as F;
        use crate::fdtable::FileClass;
        let calls = [
            (F(F::FSYNC), Some(FileClass::Aof)),
            (F(F::CLOSE), Some(FileClass::Rdb)),
            (F(F::EPOLL), None),
            (F(F::CLIENT_RW), Some(FileClass::Client)),
            (F(F::POLL), None),
            (F(0), None),
        ];
        let mut e = RoleEvidence::default();
        let mut x: u32 = 7;
        for _ in 0..2000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let (f, c) = calls[(x >> 16) as usize % calls.len()];
            let before = (e.shape(), e.poll > 0);
            let said = e.count(f, c);
            assert_eq!(said, (e.shape(), e.poll > 0) != before, "{e:?}");
        }
    }

    fn ev(epoll: u64, aof_sync: u64, file_close: u64, client_io: u64) -> RoleEvidence {
        RoleEvidence {
            epoll,
            aof_sync,
            file_close,
            client_io,
            poll: 0,
            serves: client_io > 0,
        }
    }

    #[test]
    fn decide_truth_table() {
        let none = Situation::default();
        let cases: &[(RoleEvidence, Situation, Role)] = &[
            (ev(0, 0, 0, 0), none, Role::Other),
            (ev(1, 0, 0, 0), none, Role::Main),
            (ev(0, 3, 1, 0), none, Role::BioAof),
            (
                ev(0, 1, 1, 0),
                Situation {
                    loop_beside: true,
                    ..none
                },
                Role::BioCloseFile,
            ),
            // Closing files is no role without an event loop beside it; an AOF fsync is.
            (ev(0, 0, 3, 0), none, Role::Other),
            (ev(0, 1, 1, 0), none, Role::BioAof),
            (ev(0, 0, 0, 5), none, Role::IoThread),
            // The process decides before the name, the name before behaviour.
            (
                ev(1, 0, 0, 0),
                Situation {
                    is_child: true,
                    ..none
                },
                Role::Child,
            ),
            (
                ev(1, 0, 0, 0),
                Situation {
                    name: Some("bio_aof_fsync"),
                    ..none
                },
                Role::BioAof,
            ),
            (
                ev(0, 0, 0, 0),
                Situation {
                    is_root_tid: true,
                    ..none
                },
                Role::Main,
            ),
            (
                ev(0, 0, 1, 0),
                Situation {
                    first_without_loop: true,
                    ..none
                },
                Role::Main,
            ),
            // One main per process: a second epoll thread with client I/O is an io thread.
            (
                ev(1, 0, 0, 5),
                Situation {
                    other_main: true,
                    ..none
                },
                Role::IoThread,
            ),
            // An empty name says nothing.
            (
                ev(0, 0, 0, 5),
                Situation {
                    name: Some(""),
                    ..none
                },
                Role::IoThread,
            ),
        ];
        for (i, (e, s, want)) in cases.iter().enumerate() {
            assert_eq!(decide(e, *s).0, *want, "case {i}");
        }
    }

    #[test]
    fn names_of_redis_and_valkey_threads() {
        for (n, r) in [
            ("redis-server", Role::Main),
            ("valkey-server", Role::Main),
            ("redis-rdb-bgsav", Role::Child),
            ("valkey-aof-rewrite", Role::Child),
            ("bio_close_file", Role::BioCloseFile),
            ("io_thd_3", Role::IoThread),
            ("bio_rdb_save", Role::BioRdbSave),
            ("bio_tls_reload", Role::BioTlsReload),
            ("jemalloc_bg_thd", Role::JemallocBg),
            ("node", Role::Other),
        ] {
            assert_eq!(Role::from_name(n), Some(r), "{n}");
        }
    }

    #[test]
    fn evidence_reports_only_changes_that_can_change_a_role() {
        use crate::fdtable::FileClass;
        let mut e = RoleEvidence::default();
        assert!(!e.count(crate::syscalls::info("getpid").facts, None));
        // A first close of a disk file is news; later calls of any kind are not, while the
        // counts keep their shape (this used to bump the role epoch on every call).
        assert!(e.count(crate::syscalls::info("close").facts, Some(FileClass::Log)));
        assert!(!e.count(crate::syscalls::info("getpid").facts, None));
        assert!(!e.count(crate::syscalls::info("write").facts, Some(FileClass::Log)));
        assert!(!e.count(crate::syscalls::info("close").facts, Some(FileClass::Log)));
        // fsyncs overtaking closes turn bio_close_file into bio_aof: that is news again.
        assert!(e.count(
            crate::syscalls::info("fdatasync").facts,
            Some(FileClass::Aof)
        ));
        assert!(!e.count(
            crate::syscalls::info("fdatasync").facts,
            Some(FileClass::Aof)
        ));
        assert!(e.count(
            crate::syscalls::info("fdatasync").facts,
            Some(FileClass::Aof)
        ));
        assert_eq!(decide(&e, Situation::default()).0, Role::BioAof);
        assert!(e.count(crate::syscalls::info("epoll_wait").facts, None));
        assert!(!e.count(crate::syscalls::info("epoll_wait").facts, None));
    }

    /// Issue 39: the pid's thread that never waits in epoll beside a thread that does is
    /// not the main thread (it starts the others and sleeps, or waits to join them).
    #[test]
    fn the_pid_thread_beside_an_event_loop_is_main_only_if_it_runs_one() {
        let idle = RoleEvidence::default();
        let looping = RoleEvidence {
            epoll: 3,
            ..Default::default()
        };
        let s = Situation {
            is_root_tid: true,
            loop_beside: true,
            ..Default::default()
        };
        assert_ne!(decide(&idle, s).0, Role::Main);
        assert_eq!(decide(&looping, s).0, Role::Main);
        let alone = Situation {
            loop_beside: false,
            ..s
        };
        assert_eq!(decide(&idle, alone).0, Role::Main);
    }
}
