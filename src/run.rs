//! Glue between the command line and the pipeline: builds sources, the analyzer and the
//! renderer for a subcommand, and returns the number of stalls (for the exit status).

use crate::analyze::{self, Analyzer, Options, RedisConf};
use crate::cli::{AnalyzeArgs, ColorChoice, Format, OutputArgs};
use crate::report::Report;
use crate::source::{self, Inputs};
use anyhow::{Context, Result};
use std::io::{IsTerminal, Write};

/// Analyzer options from the output flags shared by `analyze` and `attach`.
pub fn options(out: &OutputArgs) -> Result<Options> {
    let mut o = Options {
        threshold_ns: out.threshold,
        top: out.top.max(1),
        ..Default::default()
    };
    if out.html.is_some() || out.svg.is_some() || out.export_trace.is_some() {
        // Context for plots and the trace export: calls a tenth of the threshold or longer.
        o.timeline_floor_ns = Some((out.threshold / 10).max(100_000));
    }
    if let Some(f) = &out.threads {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("--threads {f}: cannot read it"))?;
        o.thread_names = analyze::parse_thread_names(&text);
        if o.thread_names.is_empty() {
            anyhow::bail!("--threads {f}: no `TID NAME` lines in it");
        }
    }
    if let Some(f) = &out.redis_conf {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("--redis-conf {f}: cannot read it"))?;
        o.redis_conf = Some(RedisConf::parse(&text));
    }
    Ok(o)
}

pub fn use_color(c: ColorChoice) -> bool {
    match c {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::io::stdout().is_terminal()
        }
    }
}

/// Writes the report in the chosen format to stdout.
pub fn emit(report: &Report, out: &OutputArgs) -> Result<()> {
    write_files(report, out)?;
    let stdout = std::io::stdout();
    // stdout is line-buffered underneath: an 8 KiB buffer became two writes per 8 KiB of
    // a multi-megabyte report, which the run waits for at its end.
    let mut w = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    match out.format {
        Format::Json => crate::render::json::render(report, &mut w)?,
        Format::Table => crate::render::table::render(report, &mut w, use_color(out.color))?,
    }
    w.flush()?;
    Ok(())
}

/// `--html`, `--svg`, `--export-trace`: each written whole to a temporary name and renamed,
/// so a failed run never leaves half a report where the old one was.
pub fn write_files(report: &Report, out: &OutputArgs) -> Result<()> {
    type Renderer = fn(&Report, &mut dyn Write) -> std::io::Result<()>;
    let files: [(&str, &Option<String>, Renderer); 3] = [
        ("--html", &out.html, crate::render::html::render),
        ("--svg", &out.svg, crate::render::svg::render),
        (
            "--export-trace",
            &out.export_trace,
            crate::render::trace_export::render,
        ),
    ];
    for (flag, path, render) in files {
        let Some(path) = path else { continue };
        let tmp = format!("{path}.stallscope-tmp");
        let write = || -> std::io::Result<()> {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            render(report, &mut w)?;
            w.flush()?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(anyhow::Error::new(e).context(format!("{flag} {path}: cannot write it")));
        }
    }
    Ok(())
}

/// `stallscope completions SHELL`
pub fn completions(cmd: clap::Command, shell: crate::docs::CompletionShell) -> Result<()> {
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    crate::docs::completions(cmd, shell, &mut w)?;
    w.flush()?;
    Ok(())
}

/// `stallscope man [--dir DIR]`
pub fn man(cmd: clap::Command, dir: Option<&std::path::Path>) -> Result<()> {
    match dir {
        Some(d) => {
            let files = crate::docs::man_pages(cmd, d)
                .with_context(|| format!("--dir {}: cannot write man pages", d.display()))?;
            for f in files {
                println!("{}", d.join(f).display());
            }
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = stdout.lock();
            crate::docs::man(cmd, &mut w)?;
            w.flush()?;
        }
    }
    Ok(())
}

pub fn analyze(args: &AnalyzeArgs) -> Result<u64> {
    let report = report_of(args)?;
    match emit(&report, &args.out) {
        // A reader that stopped reading (`| head`) saw what it wanted: the exit status
        // still says whether there were stalls.
        Err(e) if is_broken_pipe(&e) => {}
        r => r?,
    }
    let stalls = report.summary.stalls;
    // The process ends here (`main`): freeing the report's thousands of strings one by one
    // was a visible part of a run's instructions (bench/PROFILE.md, eighth round), and the
    // exit frees them at once.
    std::mem::forget(report);
    Ok(stalls)
}

/// The report of `analyze`: the traces read, with a recording's sidecars and redis's log.
/// A recording's thread names and redis config, unless the command line gave its own.
fn names_and_conf_of(
    rec: &crate::recording::Recording,
    args: &AnalyzeArgs,
    opts: &mut analyze::Options,
) {
    if args.out.threads.is_none() {
        if let Some(text) = &rec.threads {
            opts.thread_names = analyze::parse_thread_names(text);
        }
    }
    if args.out.redis_conf.is_none() {
        if let Some(text) = &rec.conf {
            opts.redis_conf = Some(RedisConf::parse(text));
        }
    }
}

pub(crate) fn report_of(args: &AnalyzeArgs) -> Result<Report> {
    let mut opts = options(&args.out)?;
    // `stallscope attach --record FILE` (and a watch incident's `.strace`) leaves what strace
    // text cannot hold beside the recording: thread names, the redis config the live
    // analysis used, where records were lost, the scheduler's split, the reads' arrivals.
    let mut rec = match args.files.as_slice() {
        [one] => crate::recording::Recording::open(one).map_err(anyhow::Error::msg)?,
        _ => Default::default(),
    };
    names_and_conf_of(&rec, args, &mut opts);
    let dated = !rec.arrivals.is_empty();
    opts.root_pid = args.pid;
    // Progress on stderr for big files read from a terminal session (silent otherwise).
    let total: u64 = args
        .files
        .iter()
        .filter(|f| f.as_str() != "-")
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let mut progress = crate::progress::Progress::for_files(total);
    let counter = progress.is_active().then(source::ByteCounter::default);
    let inputs = Inputs::open_counted(
        &args.files,
        args.input_format.into(),
        args.strict,
        counter.clone(),
    )?;
    // strace stops every call; a recording of another backend says it did not (`.sched`).
    opts.stamped_at_stops =
        inputs.info().kind == crate::report::SourceKind::Strace && rec.stops_tracee != Some(false);
    let conf = opts.redis_conf.clone();
    let mut an = Analyzer::new(opts);
    let mut n = 0usize;
    // Most traces have no sidecar: their batches go straight to the analyzer, with no
    // per-event test of the lost marks and the two maps (~20 Ir per event).
    let plain = rec.is_plain();
    let inputs = pipelined(inputs, |batch| {
        if plain {
            an.push_all(batch);
        } else {
            for ev in batch {
                let (dropped, restored) = rec.restore(ev);
                if dropped > 0 {
                    an.add_lost_events(dropped);
                }
                an.push(restored.as_ref().unwrap_or(ev));
            }
        }
        // Progress every 4096 events, as a batch crosses a multiple of it.
        let before = n;
        n += batch.len();
        if before / 4096 != n / 4096 {
            if let Some(c) = &counter {
                progress.update(c.load(std::sync::atomic::Ordering::Relaxed));
            }
        }
    })?;
    progress.finish();
    let dropped = rec.lost_after_end();
    if dropped > 0 {
        an.add_lost_events(dropped);
    }
    let counters = inputs.counters();
    // perf trace's own `LOST N events!` lines (the timeline already breaks at each).
    if counters.lost_events > 0 {
        an.add_lost_events(counters.lost_events);
    }
    let mut info = inputs.info();
    // Every line skipped, or none made an event: whatever this is, it is not a trace (of
    // the format it was read as).
    if counters.lines > 0 && (counters.lines == counters.skips.total || counters.events == 0) {
        let label = info
            .files
            .first()
            .cloned()
            .unwrap_or_else(|| "<stdin>".into());
        return Err(source::no_events_error(
            &label,
            &counters,
            args.input_format.into(),
        ));
    }
    info.pid = args.pid;
    info.clock.date = args.date;
    let mut report = an.finish_at_exit(info, counters);
    if dated {
        report.summary.command_start = Some(crate::report::CommandStart::Arrival);
    }
    join_redis_log(&mut report, args, conf.as_ref(), rec.container.take())?;
    Ok(report)
}

/// Offline: redis's own log, named with `--redis-log` or found beside the trace, joined
/// onto the stalls (`redis_evidence`).
/// `container`: a recording's, as the live report named it: its pids map the log's (pid 1)
/// to the trace's.
fn join_redis_log(
    report: &mut Report,
    args: &AnalyzeArgs,
    conf: Option<&RedisConf>,
    container: Option<crate::report::Container>,
) -> Result<()> {
    report.live.container = container;
    let log = match &args.out.redis_log {
        Some(p) => Some(crate::evidence::LogSource {
            path: p.clone(),
            found: crate::report::LogFound::Flag,
            explicit: true,
        }),
        None => crate::evidence::find_log(&args.files, conf, report),
    };
    crate::evidence::apply(
        report,
        crate::evidence::Inputs {
            log,
            date_given: args.date.is_some(),
            ..Default::default()
        },
    )
}

/// Parses on a second thread while the analyzer consumes on this one: the two stages cost
/// about the same, and a machine running redis has at least two cores. Events travel in
/// batches so the queue costs nothing per event; a batch (about 150 KB) is small enough to
/// still be in cache when the other stage reads it (larger batches were slower once the
/// queue woke the analyzer rarely, and no faster before that, for more memory:
/// bench/PROFILE.md, ninth and twelfth rounds), and the bounded queue keeps memory flat.
/// Sixteen batches in flight (2.4 MB at most; a waiting analyzer lets eight pile up) let the
/// parser run ahead through a scheduler slice when gunzip is a third busy thread: a gzipped
/// run was slower with four (ninth round).
fn pipelined(mut inputs: Inputs, mut sink: impl FnMut(&[crate::event::Event])) -> Result<Inputs> {
    const BATCH: usize = 512;
    const DEPTH: usize = 16;
    // The analyzer keeps up with the parser, so it often finds the queue empty: it sleeps
    // until half the queue is full, and the parser wakes it once per eight batches instead
    // of for nearly each (`handoff`; 4 was as good on -ttt, slower on gzip: bench/PROFILE.md,
    // twelfth round).
    const WAKE_AT: usize = 8;
    // With each batch, whether any of its events owns heap memory (a path, a thread name).
    let (tx, rx) = crate::handoff::bounded::<(Vec<crate::event::Event>, bool)>(DEPTH, WAKE_AT);
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<crate::event::Event>>();
    // A lone input on two cores: while it waits for events, this thread reads ahead of the
    // parser (maps the next window, gunzips, or reads the pipe), which a third thread would
    // do on a core the other two need.
    let reading = inputs.reading_help();
    let producer = std::thread::spawn(move || -> Result<Inputs> {
        loop {
            let mut batch = back_rx
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(BATCH));
            let more = inputs.next_batch(&mut batch, BATCH)?;
            // Asked here, while the batch is still in this core's cache: on the analyzer's
            // thread the drop visited every event again when it need not (bench/PROFILE.md,
            // eleventh round).
            let owns = batch.iter().any(crate::event::Event::owns_heap);
            if !batch.is_empty() && tx.send((batch, owns)).is_err() {
                break;
            }
            if !more {
                break;
            }
        }
        Ok(inputs)
    });
    while let Some((mut batch, owns)) =
        rx.recv_helping(|| reading.as_ref().is_some_and(|r| r.help()))
    {
        sink(&batch);
        // Dropped here, while the analyzer has just read them: on the parser's thread the
        // drop loop read every event back from the other core's cache (the largest part of
        // that thread's samples in a two-file merge: bench/PROFILE.md, ninth round).
        if owns {
            batch.clear();
        } else {
            // SAFETY: no event of the batch owns anything (`Event::owns_heap`), so dropping
            // them would free nothing: forgetting them is the same as dropping them.
            unsafe { batch.set_len(0) };
        }
        let _ = back_tx.send(batch);
    }
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("the parser thread panicked"))?
}

/// A closed stdout (`| head`) ends the program quietly, as ripgrep does.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
