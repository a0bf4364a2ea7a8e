//! Developer tool, not part of the pipeline: runs the strace (or perf) line parser over
//! files and prints every line it skipped, with the reason, so that lines the parser should
//! have read stand out. `cargo run --example skipped -- [--perf] FILE...`

use stallscope::source::{perf::PerfParser, strace::StraceParser};
use std::io::BufRead;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let perf = args.first().is_some_and(|a| a == "--perf");
    if perf {
        args.remove(0);
    }
    for path in args {
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let mut r = std::io::BufReader::new(f);
        let mut sp = StraceParser::default();
        let mut pp = PerfParser::default();
        let mut out = vec![];
        let (mut lines, mut skipped, mut events) = (0u64, 0u64, 0usize);
        let mut in_flight = vec![];
        let mut buf = vec![];
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if buf.last() == Some(&b'\n') {
                buf.pop();
            }
            lines += 1;
            let skip = if perf {
                pp.feed(&buf, &mut out)
            } else {
                sp.feed(&buf, &mut out)
            }
            .skipped()
            .map(|r| r.as_str());
            if let Some(r) = skip {
                skipped += 1;
                println!(
                    "{path}:{lines}: {r}: {}",
                    String::from_utf8_lossy(&buf[..buf.len().min(160)])
                );
            }
            events += out.len();
            note_in_flight(&out, &mut in_flight);
            out.clear();
        }
        if perf {
            pp.finish(&mut out);
        } else {
            sp.finish(&mut out);
        }
        events += out.len();
        note_in_flight(&out, &mut in_flight);
        eprintln!(
            "{path}: {lines} lines, {skipped} skipped, {events} events, in flight: {in_flight:?}"
        );
    }
}

/// Calls the parser says it saw only part of: few in a sane trace, so a long list here
/// means lines were misread.
fn note_in_flight(out: &[stallscope::event::Event], acc: &mut Vec<(u64, &'static str, String)>) {
    for e in out {
        if let Some(sc) = e.syscall() {
            if let Some(f) = sc.in_flight {
                if acc.len() < 12 {
                    acc.push((e.line, sc.name, format!("{f:?}")));
                }
            }
        }
    }
}
