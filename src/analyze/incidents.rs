//! Incidents: the last step before findings are named. Stalls that overlap in time are
//! merged into one incident, what clients saw as one freeze, with the distinct commands and
//! connections its stalls held. Pure: stalls in (sorted by start), incidents out.

use super::holds::Held;
use super::stalls::Cand;
use crate::event::Nanos;
use crate::report::{self, Stall};
use rustc_hash::FxHashSet as HashSet;

/// Overlapping stalls merged: what clients saw as one freeze.
pub(super) fn incidents(
    stalls: &[(Cand, Held, Stall)],
    clock: &crate::source::Clock,
    first: Nanos,
) -> Vec<report::Incident> {
    // Each incident with the distinct commands and connections its stalls held.
    type Open = (
        report::Incident,
        HashSet<u64>,
        HashSet<(crate::fdtable::ProcKey, i32)>,
    );
    let mut out: Vec<Open> = vec![];
    for (i, (c, h, s)) in stalls.iter().enumerate() {
        let (start, end) = (c.start, c.start + c.dur);
        let merge = out
            .last()
            .is_some_and(|(inc, _, _)| start < first + inc.end_at_us * 1000);
        if !merge {
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
        inc.worst_wait_us = match (inc.worst_wait_us, s.worst_wait_us) {
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
