//! Property test of the line parsers on real capture lines (`fixtures/lines/sample.strace`)
//! that are cut, spliced and corrupted: random cuts, byte flips, "strace: Process N attached"
//! inserted mid-line, lines duplicated, removed, split and joined, invalid UTF-8. The parsers
//! must not panic and must account for every line they are given (used + skipped = lines).

use proptest::prelude::*;
use stallscope::event::EventKind;
use stallscope::source::{perf::PerfParser, strace::LineOutcome, strace::StraceParser};

const SAMPLE: &[u8] = include_bytes!("../../fixtures/lines/sample.strace");

fn sample_lines() -> Vec<Vec<u8>> {
    SAMPLE
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| l.to_vec())
        .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    Cut {
        line: usize,
        at: usize,
    },
    Flip {
        line: usize,
        at: usize,
        byte: u8,
    },
    SpliceMessage {
        line: usize,
        at: usize,
        pid: u32,
        attached: bool,
    },
    Duplicate {
        line: usize,
    },
    Remove {
        line: usize,
    },
    Split {
        line: usize,
        at: usize,
    },
    Join {
        line: usize,
    },
    InvalidUtf8 {
        line: usize,
        at: usize,
    },
    Swap {
        line: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let ix = any::<usize>();
    prop_oneof![
        (ix, ix).prop_map(|(line, at)| Mutation::Cut { line, at }),
        (ix, ix, any::<u8>()).prop_map(|(line, at, byte)| Mutation::Flip { line, at, byte }),
        (ix, ix, any::<u32>(), any::<bool>()).prop_map(|(line, at, pid, attached)| {
            Mutation::SpliceMessage {
                line,
                at,
                pid,
                attached,
            }
        }),
        ix.prop_map(|line| Mutation::Duplicate { line }),
        ix.prop_map(|line| Mutation::Remove { line }),
        (ix, ix).prop_map(|(line, at)| Mutation::Split { line, at }),
        ix.prop_map(|line| Mutation::Join { line }),
        (ix, ix).prop_map(|(line, at)| Mutation::InvalidUtf8 { line, at }),
        ix.prop_map(|line| Mutation::Swap { line }),
    ]
}

fn apply(lines: &mut Vec<Vec<u8>>, m: &Mutation) {
    if lines.is_empty() {
        return;
    }
    let n = lines.len();
    let pick = |l: usize| l % n;
    match *m {
        Mutation::Cut { line, at } => {
            let l = &mut lines[pick(line)];
            let at = at % (l.len() + 1);
            l.truncate(at);
        }
        Mutation::Flip { line, at, byte } => {
            let l = &mut lines[pick(line)];
            if !l.is_empty() {
                let at = at % l.len();
                l[at] = if byte == b'\n' { b'\r' } else { byte };
            }
        }
        Mutation::SpliceMessage {
            line,
            at,
            pid,
            attached,
        } => {
            // What strace does on stderr: its message lands in an open line, whose rest
            // follows on the next line.
            let i = pick(line);
            let l = lines[i].clone();
            let at = at % (l.len() + 1);
            let mut head = l[..at].to_vec();
            head.extend_from_slice(
                format!(
                    "strace: Process {pid} {}",
                    if attached { "attached" } else { "detached" }
                )
                .as_bytes(),
            );
            let mut rest = b" ".to_vec();
            rest.extend_from_slice(&l[at..]);
            lines[i] = head;
            lines.insert(i + 1, rest);
        }
        Mutation::Duplicate { line } => {
            let i = pick(line);
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        Mutation::Remove { line } => {
            lines.remove(pick(line));
        }
        Mutation::Split { line, at } => {
            let i = pick(line);
            let at = at % (lines[i].len() + 1);
            let rest = lines[i].split_off(at);
            lines.insert(i + 1, rest);
        }
        Mutation::Join { line } => {
            let i = pick(line);
            if i + 1 < lines.len() {
                let next = lines.remove(i + 1);
                lines[i].extend_from_slice(&next);
            }
        }
        Mutation::InvalidUtf8 { line, at } => {
            let l = &mut lines[pick(line)];
            let at = at % (l.len() + 1);
            l.splice(at..at, [0xff, 0xc3, 0x28, 0xe2, 0x82]);
        }
        Mutation::Swap { line } => {
            let i = pick(line);
            if i + 1 < lines.len() {
                lines.swap(i, i + 1);
            }
        }
    }
}

/// Feeds every line; returns (used, skipped, events).
fn feed_strace(lines: &[Vec<u8>]) -> (u64, u64, Vec<stallscope::event::Event>) {
    let mut p = StraceParser::default();
    let mut out = vec![];
    let (mut used, mut skipped) = (0, 0);
    for l in lines {
        match p.feed(l, &mut out) {
            LineOutcome::Used => used += 1,
            LineOutcome::Skipped(_) => skipped += 1,
        }
    }
    p.finish(&mut out);
    assert_eq!(p.line, lines.len() as u64);
    (used, skipped, out)
}

#[test]
fn unmutated_sample_is_read_whole() {
    let lines = sample_lines();
    // One parser per capture (each has its own timestamp format): nothing skipped.
    let mut sections = 0;
    for sec in SAMPLE
        .split(|b| *b == b'\n')
        .collect::<Vec<_>>()
        .split(|l| l.is_empty())
    {
        let sec: Vec<Vec<u8>> = sec.iter().map(|l| l.to_vec()).collect();
        if sec.is_empty() {
            continue;
        }
        sections += 1;
        let (used, skipped, _) = feed_strace(&sec);
        assert_eq!((used, skipped), (sec.len() as u64, 0), "section {sections}");
    }
    assert_eq!(sections, 7);
    // All of it through one parser: lines in another timestamp format than the first are
    // skipped (not misplaced), and still counted.
    let (used, skipped, out) = feed_strace(&lines);
    assert_eq!(used + skipped, lines.len() as u64);
    assert!(used > lines.len() as u64 / 2);
    // Each syscall event names a line it came from; the splices produce attach/detach events.
    assert!(out
        .iter()
        .all(|e| e.line >= 1 && e.line <= lines.len() as u64));
    assert!(out
        .iter()
        .any(|e| matches!(e.kind, EventKind::Attach { .. })));
    assert!(out.iter().any(|e| matches!(e.kind, EventKind::Detach)));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn corrupted_lines_are_all_accounted_for(muts in prop::collection::vec(mutation(), 1..40)) {
        let mut lines = sample_lines();
        for m in &muts {
            apply(&mut lines, m);
        }
        let n = lines.len() as u64;
        let (used, skipped, out) = feed_strace(&lines);
        prop_assert_eq!(used + skipped, n);
        for e in &out {
            prop_assert!(e.line >= 1 && e.line <= n, "event line {} outside 1..={}", e.line, n);
            if let Some(sc) = e.syscall() {
                prop_assert!(sc.dur.is_none_or(|d| d >= 0), "negative duration {:?}", e);
            }
        }
        // The perf parser on the same bytes: no panic, every line counted.
        let mut pp = PerfParser::default();
        let mut pout = vec![];
        let mut counted = 0u64;
        for l in &lines {
            let _ = pp.feed(l, &mut pout);
            counted += 1;
        }
        pp.finish(&mut pout);
        prop_assert_eq!(pp.line, counted);
    }
}
