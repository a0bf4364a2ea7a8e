//! `watch --pid`'s restart following: a pid names one process, and the redis that replaces
//! it after a restart has another. What stays the same across the restart is what clients
//! and init systems use to find redis: the TCP address it listens on and the pidfile its
//! config names. This module records those at attach and, once the process is gone, finds
//! the process that has them now.

use crate::event::Tid;
use procfs::process::{FDTarget, Process};
use std::collections::HashSet;

/// What identifies the watched redis beyond its pid.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Identity {
    /// `comm` of the process (a replacement must have the same).
    pub comm: String,
    /// Listening TCP addresses (`127.0.0.1:6379`, `[::1]:6379`).
    pub listen: Vec<String>,
    /// The config's `pidfile`, absolute (redis writes it after startup).
    pub pidfile: Option<String>,
}

/// Listening TCP addresses of process `pid`: its socket fds that are listeners in its
/// network namespace's tables.
pub(crate) fn listening(pid: Tid) -> Vec<String> {
    let Ok(p) = Process::new(pid as i32) else {
        return vec![];
    };
    let inodes: HashSet<u64> = match p.fd() {
        Ok(fds) => fds
            .flatten()
            .filter_map(|f| match f.target {
                FDTarget::Socket(ino) => Some(ino),
                _ => None,
            })
            .collect(),
        Err(_) => return vec![],
    };
    let mut out = vec![];
    for entries in [p.tcp(), p.tcp6()] {
        for e in entries.into_iter().flatten() {
            if e.state == procfs::net::TcpState::Listen && inodes.contains(&e.inode) {
                out.push(e.local_address.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `listening`, read again a few times while it finds nothing: a live redis serving TCP
/// was once seen with none under load (the one read of /proc/PID/net/tcp came back empty),
/// and an empty identity makes `--pid` give up at the first restart.
fn listening_settled(pid: Tid) -> Vec<String> {
    let mut out = listening(pid);
    for _ in 0..3 {
        if !out.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        out = listening(pid);
    }
    out
}

/// The `pidfile` directive of a redis.conf text (the last one wins, as in redis), made
/// absolute against the process's working directory.
fn pidfile_of(conf_text: &str, cwd: Option<&str>) -> Option<String> {
    let v = conf_text
        .lines()
        .filter_map(|l| {
            let mut it = l.trim().splitn(2, char::is_whitespace);
            (it.next()? == "pidfile").then(|| it.next().unwrap_or("").trim().trim_matches('"'))
        })
        .next_back()
        .filter(|v| !v.is_empty())?;
    Some(if v.starts_with('/') {
        v.to_string()
    } else {
        format!("{}/{v}", cwd.unwrap_or("."))
    })
}

impl Identity {
    /// Reads it from the running process (`conf_text`: its config as gathered at attach).
    pub(crate) fn of(pid: Tid, conf_text: &str, cwd: Option<&str>) -> Identity {
        Identity {
            comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default(),
            listen: listening_settled(pid),
            pidfile: pidfile_of(conf_text, cwd),
        }
    }

    /// Whether there is anything to follow the process by.
    pub(crate) fn followable(&self) -> bool {
        !self.listen.is_empty() || self.pidfile.is_some()
    }

    /// "listening on 127.0.0.1:6379, pidfile /run/redis.pid"
    pub(crate) fn describe(&self) -> String {
        let mut parts = vec![];
        if !self.listen.is_empty() {
            parts.push(format!("listening on {}", self.listen.join(", ")));
        }
        if let Some(p) = &self.pidfile {
            parts.push(format!("pidfile {p}"));
        }
        parts.join(", ")
    }

    fn same_comm(&self, pid: Tid) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| self.comm.is_empty() || c.trim_end() == self.comm)
    }

    /// The process that now has this identity, other than `gone`: the pidfile's pid when it
    /// is a live process of the same name, else the one process of that name that listens
    /// on one of the same addresses.
    pub(crate) fn find(&self, gone: Tid) -> Option<Tid> {
        let ok = |p: Tid| p != gone && self.same_comm(p) && crate::live::check_target(p).is_ok();
        if let Some(pf) = &self.pidfile {
            let pid = std::fs::read_to_string(pf)
                .ok()
                .and_then(|t| t.trim().parse::<Tid>().ok());
            // A pidfile left behind by the old process names it, or a recycled pid: the
            // listener check below settles which when there are addresses to check.
            if let Some(p) = pid.filter(|p| ok(*p)) {
                if self.listen.is_empty() || self.shares_listener(p) {
                    return Some(p);
                }
            }
        }
        if self.listen.is_empty() {
            return None;
        }
        let name = if self.comm.is_empty() {
            "redis-server"
        } else {
            &self.comm
        };
        crate::live::find_by_name(name)
            .into_iter()
            .map(|(p, _)| p)
            .find(|p| ok(*p) && self.shares_listener(*p))
    }

    fn shares_listener(&self, pid: Tid) -> bool {
        listening(pid).iter().any(|a| self.listen.contains(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfile_is_the_last_directive_made_absolute() {
        let t = "port 6379\npidfile /var/run/a.pid\n# pidfile /x\npidfile \"r.pid\"\n";
        assert_eq!(pidfile_of(t, Some("/data")).as_deref(), Some("/data/r.pid"));
        assert_eq!(pidfile_of("port 1\n", None), None);
        assert_eq!(
            pidfile_of("pidfile /run/redis.pid", None).as_deref(),
            Some("/run/redis.pid")
        );
    }

    #[test]
    fn a_listener_of_this_process_is_found_and_followed() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let me = std::process::id();
        let id = Identity::of(me, "", None);
        assert!(id.listen.contains(&addr), "{:?} vs {addr}", id.listen);
        assert!(id.followable());
        assert!(id.describe().contains(&addr));
        // The process itself is `gone`: nothing else listens there.
        assert_eq!(id.find(me), None);
    }
}
