//! Idle time: how long each thread waited for work (the event loop in epoll_wait, bio
//! threads on their futex). Waits are counted whatever the thread's role is so far and
//! reported by its final role: a main thread is known as such only at its first epoll_wait.

use super::call::{is_idle, Facts, PerThread, ResolvedCall, Waits};
use super::roles::Role;
use super::world::World;
use crate::report;
use std::collections::BTreeMap;

#[derive(Default)]
pub(crate) struct Idle {
    /// Per thread: (name, calls, total ns) per wait name. A thread waits in one or two
    /// calls: a short list found by the name's address beats a map of strings.
    per: PerThread<Vec<(&'static str, u64, i64)>>,
}

impl Idle {
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) {
        let f = cx.facts;
        // An exit is not a stall either, but no wait for work: it has no place in idle time;
        // nor has a wait for a lock or a reply (`Waits`).
        if (cx.idle || f.is_wait()) && !f.has(Facts::EXIT) && cx.waits == Waits::AsNamed {
            let name = cx.sc.name;
            let waits = self.per.at(cx.thread);
            let i = match waits
                .iter()
                .position(|w| std::ptr::eq(w.0, name) || w.0 == name)
            {
                Some(i) => i,
                None => {
                    waits.push((name, 0, 0));
                    waits.len() - 1
                }
            };
            let e = &mut waits[i];
            e.1 += 1;
            e.2 += cx.dur;
        }
    }

    /// Idle waits by final role, the main thread's first.
    pub(crate) fn report(&self, world: &World) -> Vec<report::IdleStats> {
        let mut idle: BTreeMap<(Role, &'static str), (u64, i64)> = BTreeMap::new();
        for (t, role) in world.roles() {
            let Some(waits) = self.per.get(t) else {
                continue;
            };
            for (name, n, d) in waits.iter().filter(|(name, ..)| is_idle(name, role)) {
                let e = idle.entry((role, name)).or_default();
                e.0 += n;
                e.1 += d;
            }
        }
        idle.into_iter()
            .map(|((role, syscall), (calls, total))| report::IdleStats {
                role,
                syscall: syscall.to_string(),
                calls,
                total_us: total / 1000,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};

    #[test]
    fn waits_are_kept_whatever_the_role_so_far() {
        let mut i = Idle::default();
        // A futex in a thread first taken for main is still a wait: kept.
        let f = event(1, 0, 5_000, "futex");
        i.on_call(&call(&f, Role::Main, None));
        let x = event(1, 0, 5_000, "exit_group");
        i.on_call(&call(&x, Role::Main, None));
        let r = event(1, 0, 5_000, "read");
        i.on_call(&call(&r, Role::Main, None));
        let kept = i.per.get(crate::analyze::call::ThreadIdx(1)).unwrap();
        assert_eq!(kept.iter().map(|w| w.0).collect::<Vec<_>>(), vec!["futex"]);
    }
}
