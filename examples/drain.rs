//! Developer benchmark, not part of the pipeline: drains `source::Inputs` over the given
//! files (or stdin) and prints event and line counts, so the parser's cost can be timed
//! apart from the analysis. `cargo run --release --example drain -- FILE...`

use stallscope::source::{InputFormat, Inputs};

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        args.push("-".into());
    }
    let mut inp = Inputs::open(&args, InputFormat::Auto, false)?;
    let (mut events, mut with_dur) = (0u64, 0u64);
    while let Some(e) = inp.next_event()? {
        events += 1;
        if e.syscall().is_some_and(|s| s.dur.is_some()) {
            with_dur += 1;
        }
    }
    let c = inp.counters();
    println!(
        "{events} events ({with_dur} with a duration), {} lines, {} skipped",
        c.lines, c.skips.total
    );
    Ok(())
}
