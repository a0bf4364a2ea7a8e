//! Incidents: the last step before findings are named. Stalls that overlap in time are
//! merged into one incident, what clients saw as one freeze, with the distinct commands and
//! connections its stalls held. Pure: stalls in (sorted by start), incidents out.

use super::kept::Rows;
use crate::event::Nanos;
use crate::report::{self, Stall};
use rustc_hash::FxHashSet as HashSet;

/// Overlapping stalls merged: what clients saw as one freeze. `merge`: whether stalls'
/// times are precise enough to tell that they overlap (not under strace -t): when not, each
/// stall is an incident of its own.
pub(super) fn incidents(
    rows: &Rows,
    clock: &crate::source::Clock,
    first: Nanos,
    merge: bool,
) -> Vec<report::Incident> {
    // Each incident with the distinct commands and connections its stalls held.
    type Open = (
        report::Incident,
        HashSet<u64>,
        HashSet<(crate::fdtable::ProcKey, i32)>,
    );
    let mut out: Vec<Open> = vec![];
    let all = rows.cands.iter().zip(&rows.held).zip(&rows.stalls);
    for (i, ((c, h), s)) in all.enumerate() {
        let (start, end) = (c.start, c.start + c.dur);
        let overlaps = merge
            && out
                .last()
                .is_some_and(|(inc, _, _)| start < first + inc.end_at_us * 1000);
        if !overlaps {
            out.push((
                report::Incident {
                    start_at_us: (start - first) / 1000,
                    end_at_us: (end - first) / 1000,
                    ts: clock.format(start),
                    duration_us: 0,
                    stalls: vec![],
                    waiting_commands: 0,
                    waiting_clients: 0,
                    worst_wait_us: None,
                    finding: None,
                },
                HashSet::default(),
                HashSet::default(),
            ));
        }
        let (inc, held, clients) = out.last_mut().expect("pushed above");
        inc.end_at_us = inc.end_at_us.max((end - first) / 1000);
        inc.stalls.push(i);
        held.extend(h.seqs.iter().copied());
        clients.extend(h.clients.iter().copied());
        inc.worst_wait_us = match (inc.worst_wait_us, s.waiting.worst_us) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    out.into_iter()
        .map(|(mut inc, held, clients)| {
            inc.duration_us = inc.end_at_us - inc.start_at_us;
            inc.waiting_commands = held.len() as u64;
            inc.waiting_clients = clients.len() as u64;
            inc
        })
        .collect()
}

/// Each incident is named by the first finding among its stalls.
pub(super) fn name_findings(incidents: &mut [report::Incident], stalls: &[Stall]) {
    for inc in incidents {
        inc.finding = inc.stalls.iter().filter_map(|i| stalls[*i].finding).next();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::holds::Held;
    use crate::analyze::stalls::{Cand, DurFacts};
    use crate::fdtable::ProcKey;
    use crate::report::{Bound, DurationKnown, FindingId, StallKind};

    const MS: Nanos = 1_000_000;

    fn stall(
        start: Nanos,
        dur: Nanos,
        worst_wait_us: Option<i64>,
        finding: Option<FindingId>,
    ) -> (Cand, Stall) {
        let c = Cand {
            tid: 100,
            proc: ProcKey::Root,
            kind: StallKind::SlowSyscall,
            syscall: Some("write"),
            fd: Some(7),
            file: None,
            start,
            dur,
            line: None,
            dur_facts: DurFacts {
                bound: Bound::Exact,
                known: DurationKnown::Measured,
                in_flight: None,
                ..Default::default()
            },
            phase: None,
            events_lost: false,
            id: 1,
            sched: None,
            through: Default::default(),
        };
        let s = Stall {
            target: crate::report::FdRef {
                fd: Some(7),
                ..Default::default()
            },
            finding,
            waiting: crate::report::Waiting {
                worst_us: worst_wait_us,
                ..Default::default()
            },
            ..Stall::sample(start / 1000, dur / 1000)
        };
        (c, s)
    }

    fn held(seqs: &[u64], fds: &[i32]) -> Held {
        let mut h = Held::default();
        h.seqs = seqs.to_vec();
        h.clients = fds.iter().map(|fd| (ProcKey::Root, *fd)).collect();
        h
    }

    /// Two overlapping stalls are one freeze: their union, the commands and clients either
    /// held counted once, the worst wait of both, named by the first finding among them; a
    /// later stall is an incident of its own.
    #[test]
    fn overlapping_stalls_are_one_incident() {
        let first = 1_000 * MS;
        let rows: Vec<(Cand, Held, Stall)> = [
            (
                stall(first, 50 * MS, Some(40_000), None),
                held(&[1, 2], &[9]),
            ),
            (
                stall(
                    first + 30 * MS,
                    50 * MS,
                    Some(70_000),
                    Some(FindingId::AofFsyncAlways),
                ),
                held(&[2, 3], &[9, 10]),
            ),
            (
                stall(first + 200 * MS, 10 * MS, None, Some(FindingId::Fork)),
                held(&[], &[]),
            ),
        ]
        .into_iter()
        .map(|((c, s), h)| (c, h, s))
        .collect();
        let rows = Rows {
            cands: rows.iter().map(|(c, _, _)| c).collect(),
            held: rows.iter().map(|(_, h, _)| h.clone()).collect(),
            stalls: rows.iter().map(|(_, _, s)| s.clone()).collect(),
        };
        let mut inc = incidents(&rows, &crate::source::Clock::none(), first, true);
        // Times too coarse to tell overlap: each stall its own incident.
        let apart = incidents(&rows, &crate::source::Clock::none(), first, false);
        let spans: Vec<_> = apart.iter().map(|i| i.stalls.clone()).collect();
        assert_eq!(spans, vec![vec![0], vec![1], vec![2]]);
        let stalls = rows.stalls;
        name_findings(&mut inc, &stalls);
        let got: Vec<_> = inc
            .iter()
            .map(|i| {
                (
                    i.start_at_us,
                    i.end_at_us,
                    i.duration_us,
                    i.stalls.clone(),
                    i.waiting_commands,
                    i.waiting_clients,
                    i.worst_wait_us,
                    i.finding,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    0,
                    80_000,
                    80_000,
                    vec![0, 1],
                    3,
                    2,
                    Some(70_000),
                    Some(FindingId::AofFsyncAlways)
                ),
                (
                    200_000,
                    210_000,
                    10_000,
                    vec![2],
                    0,
                    0,
                    None,
                    Some(FindingId::Fork)
                ),
            ]
        );
    }
}
