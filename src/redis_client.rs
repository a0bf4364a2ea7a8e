//! `--redis HOST:PORT`: what redis itself says while it is traced, the live input of the
//! redis-evidence join. One job: a background thread that asks redis, on its own
//! connection, for `LATENCY LATEST`, `INFO persistence` and `INFO stats` once a second, and
//! `SLOWLOG GET` / `LATENCY HISTORY` at the start and the end, and keeps the answers with the
//! wall-clock time they came. For `watch` (`Poller::start_signalling`) each poll also reads
//! the slow log's newest entries (`SLOWLOG GET 8`) and hands out what is new in both
//! (`Signal`): redis's own word that it stalled, which escalates the cheap tier. Four
//! commands a second at most; a connection that fails is retried every few seconds and
//! noted, and never stops the tracing.
//!
//! Only names and numbers are kept: command names from SLOWLOG, never their arguments (keys
//! and values are user data).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A RESP reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
            Reply::Simple(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
    pub fn as_text(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(v)) => v,
            _ => &[],
        }
    }
}

/// Limits on what a peer's reply may make this process hold. The five commands asked read
/// a few KB (INFO) or a few hundred items (SLOWLOG GET, LATENCY HISTORY); a peer that is not
/// redis, or a broken one, must not size an allocation with its `$n` or `*n`.
pub mod limits {
    /// Longest bulk string.
    pub const BULK_MAX: usize = 1 << 20;
    /// Longest line (a simple string, an error, a number, a length).
    pub const LINE_MAX: usize = 64 << 10;
    /// Deepest nesting of arrays (SLOWLOG GET is three deep).
    pub const DEPTH_MAX: usize = 8;
    /// Elements of all the arrays of one reply.
    pub const ITEMS_MAX: usize = 1 << 20;
    /// Bytes of one reply, lines and bulk strings together.
    pub const BYTES_MAX: usize = 16 << 20;
}

/// What is left of one reply's limits as it is read.
struct Budget {
    items: usize,
    bytes: usize,
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// Reads one RESP2 (or the RESP3 scalars redis may send) reply, within `limits`: a length
/// over them is an error before anything is allocated for it, and a bulk string is read as
/// it arrives, not into a buffer of the announced size.
pub fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut budget = Budget {
        items: limits::ITEMS_MAX,
        bytes: limits::BYTES_MAX,
    };
    read_nested(r, 0, &mut budget)
}

/// One line, without its line end, of at most `LINE_MAX` bytes.
fn read_line(r: &mut impl BufRead, budget: &mut Budget) -> std::io::Result<String> {
    let mut line = Vec::new();
    r.take(limits::LINE_MAX as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if line.len() > limits::LINE_MAX {
        return Err(invalid(format!(
            "a RESP line longer than {} bytes",
            limits::LINE_MAX
        )));
    }
    take_bytes(budget, line.len())?;
    let text = String::from_utf8_lossy(&line);
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}

fn take_bytes(budget: &mut Budget, n: usize) -> std::io::Result<()> {
    budget.bytes = budget.bytes.checked_sub(n).ok_or_else(|| {
        invalid(format!(
            "a RESP reply of more than {} bytes",
            limits::BYTES_MAX
        ))
    })?;
    Ok(())
}

fn read_nested(r: &mut impl BufRead, depth: usize, budget: &mut Budget) -> std::io::Result<Reply> {
    let text = read_line(r, budget)?;
    let bad = || {
        invalid(format!(
            "not a RESP reply: {:?}",
            text.chars().take(40).collect::<String>()
        ))
    };
    let (kind, rest) = text.split_at(1.min(text.len()));
    Ok(match kind {
        "+" => Reply::Simple(rest.into()),
        "-" => Reply::Err(rest.into()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            match usize::try_from(n) {
                Err(_) => Reply::Bulk(None),
                Ok(n) => Reply::Bulk(Some(read_bulk(r, n, budget)?)),
            }
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            match usize::try_from(n) {
                Err(_) => Reply::Array(None),
                Ok(n) => Reply::Array(Some(read_array(r, n, depth, budget)?)),
            }
        }
        _ => return Err(bad()),
    })
}

/// A bulk string of `n` bytes and its line end.
fn read_bulk(r: &mut impl BufRead, n: usize, budget: &mut Budget) -> std::io::Result<Vec<u8>> {
    if n > limits::BULK_MAX {
        return Err(invalid(format!(
            "a RESP bulk string of {n} bytes (at most {} are read)",
            limits::BULK_MAX
        )));
    }
    take_bytes(budget, n + 2)?;
    let mut b = Vec::new();
    r.take(n as u64 + 2).read_to_end(&mut b)?;
    if b.len() < n + 2 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    b.truncate(n);
    Ok(b)
}

fn read_array(
    r: &mut impl BufRead,
    n: usize,
    depth: usize,
    budget: &mut Budget,
) -> std::io::Result<Vec<Reply>> {
    if depth >= limits::DEPTH_MAX {
        return Err(invalid(format!(
            "RESP arrays nested more than {} deep",
            limits::DEPTH_MAX
        )));
    }
    budget.items = budget.items.checked_sub(n).ok_or_else(|| {
        invalid(format!(
            "a RESP reply of more than {} elements",
            limits::ITEMS_MAX
        ))
    })?;
    let mut v = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        v.push(read_nested(r, depth + 1, budget)?);
    }
    Ok(v)
}

/// One connection to redis, with short timeouts: a redis stalled for seconds (the very thing
/// being traced) makes a poll time out rather than pile up.
pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    /// A connection, authenticated with REDISCLI_AUTH when set, made from inside process
    /// `near`'s network namespace when it has its own (a container's `127.0.0.1:6379` is not
    /// the host's).
    pub fn connect_near(addr: &str, timeout: Duration, near: Option<u32>) -> std::io::Result<Conn> {
        let mut c = Self::connect_unauthenticated(addr, timeout, near)?;
        c.auth()?;
        Ok(c)
    }

    fn connect_unauthenticated(
        addr: &str,
        timeout: Duration,
        near: Option<u32>,
    ) -> std::io::Result<Conn> {
        let sa = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))?;
        let s = crate::live::container::connect_tcp(sa, timeout, near)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn auth(&mut self) -> std::io::Result<()> {
        let c = self;
        // As redis-cli does: the password comes from REDISCLI_AUTH, never the command line.
        if let Some(pw) = std::env::var_os("REDISCLI_AUTH").filter(|p| !p.is_empty()) {
            let pw = pw.to_string_lossy().into_owned();
            if let Reply::Err(e) = c.cmd(&["AUTH", &pw])? {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("AUTH with REDISCLI_AUTH refused: {e}"),
                ));
            }
        }
        Ok(())
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a.as_bytes());
            b.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&b)?;
        read_reply(&mut self.r)
    }
}

/// One `LATENCY LATEST` row or `LATENCY HISTORY` sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencySample {
    pub event: String,
    /// Epoch seconds redis stamped the event with (when it ended, to the second).
    pub ts: i64,
    pub latency_ms: i64,
}

/// A `SLOWLOG GET` entry, its arguments dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowEntry {
    pub id: i64,
    /// Epoch seconds when redis logged it (just after the command ended).
    pub ts: i64,
    pub duration_us: i64,
    pub command: String,
}

/// What a `watch` poller found new in redis's own signals since its previous poll: redis's
/// word that it stalled, whether or not a tracer saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalKind {
    /// A `LATENCY LATEST` event with a newer timestamp than at the previous poll (or an
    /// event not there before).
    Latency(LatencySample),
    /// The slow log grew: its newest entry since the previous poll that was not of the
    /// poller's own.
    Slowlog(SlowEntry),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    /// Wall clock (epoch ms) when the poll that found it had its answer.
    pub seen_ms: i64,
    pub kind: SignalKind,
}

impl Signal {
    /// Epoch ms of the end of the stall redis measured, as it stamped it (to the second).
    pub fn ended_ms(&self) -> i64 {
        match &self.kind {
            SignalKind::Latency(l) => l.ts * 1000,
            SignalKind::Slowlog(e) => e.ts * 1000,
        }
    }

    /// How long redis measured it, µs.
    pub fn duration_us(&self) -> i64 {
        match &self.kind {
            SignalKind::Latency(l) => l.latency_ms * 1000,
            SignalKind::Slowlog(e) => e.duration_us,
        }
    }
}

/// One `INFO persistence` + `INFO stats` poll: the fields that tell of stalls.
#[derive(Clone, Debug, PartialEq)]
pub struct InfoSample {
    /// Wall clock (epoch ms) when the reply had arrived, and when the poll was sent.
    pub at_ms: i64,
    pub sent_ms: i64,
    pub fields: Vec<(String, i64)>,
}

/// The INFO fields kept: the ones whose changes name a stall's cause.
pub const INFO_FIELDS: &[&str] = &[
    "aof_delayed_fsync",
    "aof_pending_bio_fsync",
    "rdb_bgsave_in_progress",
    "aof_rewrite_in_progress",
    "current_cow_size",
    "latest_fork_usec",
    "total_forks",
];

#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub addr: String,
    /// CONFIG GET latency-monitor-threshold (ms), when redis answered it.
    pub latency_threshold_ms: Option<i64>,
    pub slowlog_threshold_us: Option<i64>,
    pub latency: Vec<LatencySample>,
    pub slowlog: Vec<SlowEntry>,
    pub info: Vec<InfoSample>,
    /// Wall clock (epoch ms) of the first and last successful poll.
    pub first_ok_ms: Option<i64>,
    pub last_ok_ms: Option<i64>,
    /// Connection failures and refused commands, in words.
    pub errors: Vec<String>,
    pub polls: u64,
    /// The last round (SLOWLOG GET, LATENCY HISTORY) was read at the end.
    pub final_ok: bool,
}

pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn parse_latency(r: &Reply) -> Vec<LatencySample> {
    r.items()
        .iter()
        .filter_map(|row| {
            let it = row.items();
            Some(LatencySample {
                event: it.first()?.as_text()?,
                ts: it.get(1)?.as_int()?,
                latency_ms: it.get(2)?.as_int()?,
            })
        })
        .collect()
}

fn parse_history(event: &str, r: &Reply) -> Vec<LatencySample> {
    r.items()
        .iter()
        .filter_map(|row| {
            let it = row.items();
            Some(LatencySample {
                event: event.into(),
                ts: it.first()?.as_int()?,
                latency_ms: it.get(1)?.as_int()?,
            })
        })
        .collect()
}

fn parse_slowlog(r: &Reply) -> Vec<SlowEntry> {
    parse_slowlog_from(r).into_iter().map(|(e, _)| e).collect()
}

/// Each entry with the address of the client that sent it (redis 4+), which is only
/// compared with the poller's own and never kept.
fn parse_slowlog_from(r: &Reply) -> Vec<(SlowEntry, Option<String>)> {
    r.items()
        .iter()
        .filter_map(|e| {
            let it = e.items();
            let command = it
                .get(3)?
                .items()
                .first()
                .and_then(|a| a.as_text())
                .map(|c| c.to_ascii_uppercase())
                .unwrap_or_default();
            let entry = SlowEntry {
                id: it.first()?.as_int()?,
                ts: it.get(1)?.as_int()?,
                duration_us: it.get(2)?.as_int()?,
                // A name only: a command name is a word; anything else is not kept.
                command: if command
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'|')
                {
                    command
                } else {
                    "?".into()
                },
            };
            Some((entry, it.get(4).and_then(|a| a.as_text())))
        })
        .collect()
}

fn parse_info(text: &str, into: &mut Vec<(String, i64)>) {
    for l in text.lines() {
        if let Some((k, v)) = l.split_once(':') {
            if INFO_FIELDS.contains(&k) {
                if let Ok(v) = v.trim().parse() {
                    into.push((k.to_string(), v));
                }
            }
        }
    }
}

fn config_int(c: &mut Conn, name: &str) -> Option<i64> {
    let r = c.cmd(&["CONFIG", "GET", name]).ok()?;
    r.items().get(1)?.as_int()
}

/// The fd of process `pid` that is the server side of the connection whose client end is
/// `local` (the poller's own address), once redis has accepted it (an unaccepted
/// connection has no inode in the kernel's table yet).
pub fn server_side_fd(pid: u32, local: std::net::SocketAddr) -> Option<i32> {
    use procfs::process::{FDTarget, Process};
    let p = Process::new(pid as i32).ok()?;
    let inode = [p.tcp(), p.tcp6()]
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| e.remote_address == local && e.inode != 0)?
        .inode;
    p.fd()
        .ok()?
        .flatten()
        .find(|f| matches!(f.target, FDTarget::Socket(i) if i == inode))
        .map(|f| f.fd)
}

/// The poller's connections as the traced redis sees them, handed to the analysis so that
/// the poller's own commands are not taken for clients' (`Poller::take_own_conns`).
#[derive(Default)]
struct OwnConns {
    /// (redis-side fd, monotonic ns from when it is known) not yet taken.
    new: Vec<(i32, i64)>,
    published: u64,
    taken: u64,
}

/// The polling thread; `finish` stops it and returns what it gathered.
pub struct Poller {
    stop: Arc<AtomicBool>,
    data: Arc<Mutex<Collected>>,
    own: Arc<Mutex<OwnConns>>,
    history: Arc<History>,
    /// What a signalling poller found new (`start_signalling`).
    signals: Option<Arc<Mutex<std::collections::VecDeque<Signal>>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// `watch`: requests for a SLOWLOG/LATENCY HISTORY round (one per incident), served at
/// the next poll.
#[derive(Default)]
struct History {
    asked: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
}

/// What a `watch` incident writer holds of a poller: its data so far, and the means to ask
/// for the end-of-incident round.
#[derive(Clone)]
pub struct PollerView {
    data: Arc<Mutex<Collected>>,
    history: Arc<History>,
}

impl PollerView {
    /// Asks for a SLOWLOG GET and LATENCY HISTORY round now and waits for it (at most
    /// `limit`: a stalled or unreachable redis does not hold the report up).
    pub fn history_round(&self, limit: Duration) -> bool {
        let want = self.history.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let t = Instant::now();
        while t.elapsed() < limit {
            if self.history.done.load(Ordering::SeqCst) >= want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// What was gathered from `from_ms` (wall clock) on, sorted as `Poller::finish` gives it.
    pub fn since(&self, from_ms: i64) -> Collected {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner()).clone();
        d.info.retain(|s| s.at_ms >= from_ms);
        d.latency.retain(|l| l.ts * 1000 >= from_ms - 1000);
        d.slowlog.retain(|e| e.ts * 1000 >= from_ms - 1000);
        sort_dedup(&mut d);
        d
    }

    /// Forgets what was gathered before `from_ms`: a poller running for days keeps only the
    /// window the next incidents can reach.
    pub fn forget_before(&self, from_ms: i64) {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        d.info.retain(|s| s.at_ms >= from_ms);
        d.latency.retain(|l| l.ts * 1000 >= from_ms - 1000);
        d.slowlog.retain(|e| e.ts * 1000 >= from_ms - 1000);
        if d.latency.len() > 4096 || d.slowlog.len() > 4096 {
            sort_dedup(&mut d);
        }
    }
}

fn sort_dedup(d: &mut Collected) {
    d.latency
        .sort_by(|a, b| (a.ts, &a.event).cmp(&(b.ts, &b.event)));
    d.latency.dedup();
    d.slowlog.sort_by_key(|e| e.id);
    d.slowlog.dedup_by_key(|e| e.id);
}

/// How long the poller waits for the analysis to take a new connection's fd before it sends
/// anything on it (and for redis to accept it, to learn that fd).
const OWN_WAIT: Duration = Duration::from_secs(5);

impl Poller {
    /// Polls redis at `addr`, which is traced process `traced` when given: each connection's
    /// redis-side fd is then found and handed out (`take_own_conns`) before the first
    /// command is sent on it.
    pub fn start_for(addr: &str, interval: Duration, traced: Option<u32>) -> Poller {
        Self::spawn(addr, interval, traced, false)
    }

    /// As `start_for`, and each poll also reads the slow log's newest entries and hands out
    /// what is new in LATENCY LATEST and the slow log since the previous poll
    /// (`take_signals`): `watch`'s triggers.
    pub fn start_signalling(addr: &str, interval: Duration, traced: Option<u32>) -> Poller {
        Self::spawn(addr, interval, traced, true)
    }

    fn spawn(addr: &str, interval: Duration, traced: Option<u32>, signalling: bool) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let data = Arc::new(Mutex::new(Collected {
            addr: addr.to_string(),
            ..Default::default()
        }));
        let own = Arc::new(Mutex::new(OwnConns::default()));
        let history = Arc::new(History::default());
        let (s, d, a, o, h) = (
            stop.clone(),
            data.clone(),
            addr.to_string(),
            own.clone(),
            history.clone(),
        );
        let signals = signalling.then(Arc::default);
        let sg = signals.clone();
        let handle = std::thread::Builder::new()
            .name("redis-poller".into())
            .spawn(move || {
                let traced = traced.map(|p| (p, &*o));
                poll_loop(&a, interval, &s, &d, traced, &h, sg.as_deref())
            })
            .ok();
        Poller {
            stop,
            data,
            own,
            history,
            signals,
            handle,
        }
    }

    /// What the polls found new in redis's own signals since the last call, oldest first.
    pub fn take_signals(&self) -> Vec<Signal> {
        self.signals
            .as_ref()
            .map(|q| {
                q.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain(..)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn view(&self) -> PollerView {
        PollerView {
            data: self.data.clone(),
            history: self.history.clone(),
        }
    }

    /// The redis-side fds of connections made since the last call, with the monotonic time
    /// from which each is the poller's. Taking them lets the poller use the connection:
    /// the caller marks them in its analyzers before it reads further events.
    pub fn take_own_conns(&self) -> Vec<(i32, i64)> {
        let mut o = self.own.lock().unwrap_or_else(|e| e.into_inner());
        o.taken = o.published;
        std::mem::take(&mut o.new)
    }

    /// Stops polling without waiting for the thread (`watch` must exit within 2 s of a
    /// SIGTERM, and a stalled redis can hold a round for seconds).
    pub fn stop_detached(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take();
    }

    /// Stops polling after one last round (SLOWLOG, LATENCY HISTORY) and returns the data.
    pub fn finish(mut self) -> Collected {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner()).clone();
        sort_dedup(&mut d);
        d
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_EVERY: Duration = Duration::from_secs(3);

/// After a connect to the traced redis: finds and publishes the connection's redis-side fd,
/// then waits for it to be taken (both bounded by `OWN_WAIT`, and by a stop).
/// Tells the analysis which fd of the traced process is this connection, and waits until
/// it has taken that: true once it has. False when redis did not accept the connection in
/// time or the analysis (lagging on a loaded machine) did not take it: a command sent then
/// would be counted as a client's, so the caller drops the connection and tries again.
fn hand_over(c: &Conn, pid: u32, own: &Mutex<OwnConns>, stop: &AtomicBool, wait: Duration) -> bool {
    let Ok(local) = c.w.local_addr() else {
        return false;
    };
    let t = Instant::now();
    let fd = loop {
        if let Some(fd) = server_side_fd(pid, local) {
            break fd;
        }
        if t.elapsed() >= wait || stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let want = {
        let mut o = own.lock().unwrap_or_else(|e| e.into_inner());
        o.new.push((fd, crate::clock::now_mono()));
        o.published += 1;
        o.published
    };
    let t = Instant::now();
    while t.elapsed() < wait && !stop.load(Ordering::SeqCst) {
        if own.lock().unwrap_or_else(|e| e.into_inner()).taken >= want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// One failure more in `errors` (the same failure every few seconds is one note).
fn note(data: &Mutex<Collected>, msg: String) {
    let mut d = data.lock().unwrap_or_else(|e| e.into_inner());
    if d.errors.last() != Some(&msg) && d.errors.len() < 20 {
        d.errors.push(msg);
    }
}

/// A connection of the poller's own. To the traced redis, it is handed over to the
/// analysis before AUTH (that is a command of ours too); when stopping, the tracer is gone
/// or going, and the last round is sent whether or not it was taken.
fn connect_own(
    addr: &str,
    traced: Option<(u32, &Mutex<OwnConns>)>,
    stop: &AtomicBool,
) -> std::io::Result<Conn> {
    let mut c = Conn::connect_unauthenticated(addr, CONNECT_TIMEOUT, traced.map(|t| t.0))?;
    if let Some((pid, own)) = traced {
        if !hand_over(&c, pid, own, stop, OWN_WAIT) && !stop.load(Ordering::SeqCst) {
            return Err(std::io::Error::other(
                "the analysis did not take this connection as ours in time \
                 (a loaded machine); trying again",
            ));
        }
    }
    c.auth()?;
    Ok(c)
}

/// The first round on the first connection: the thresholds and the SLOWLOG so far.
fn first_round(c: &mut Conn, data: &Mutex<Collected>) -> std::io::Result<()> {
    let lt = config_int(c, "latency-monitor-threshold");
    let st = config_int(c, "slowlog-log-slower-than");
    let sl = parse_slowlog(&c.cmd(&["SLOWLOG", "GET", "128"])?);
    let mut d = data.lock().unwrap_or_else(|e| e.into_inner());
    d.latency_threshold_ms = lt;
    d.slowlog_threshold_us = st;
    d.slowlog.extend(sl);
    Ok(())
}

/// One poll: LATENCY LATEST and INFO, kept with the wall-clock times it was sent and
/// answered; the latency events seen are added to `seen_events`.
fn poll_round(
    c: &mut Conn,
    data: &Mutex<Collected>,
    seen_events: &mut Vec<String>,
) -> std::io::Result<Vec<LatencySample>> {
    let sent = wall_ms();
    let lat = c.cmd(&["LATENCY", "LATEST"])?;
    let pers = c.cmd(&["INFO", "persistence"])?;
    let stats = c.cmd(&["INFO", "stats"])?;
    let at = wall_ms();
    let mut fields = vec![];
    for r in [&pers, &stats] {
        if let Some(t) = r.as_text() {
            parse_info(&t, &mut fields);
        }
    }
    let lat = parse_latency(&lat);
    let mut d = data.lock().unwrap_or_else(|e| e.into_inner());
    for l in &lat {
        if !seen_events.contains(&l.event) {
            seen_events.push(l.event.clone());
        }
    }
    d.latency.extend(lat.iter().cloned());
    d.info.push(InfoSample {
        at_ms: at,
        sent_ms: sent,
        fields,
    });
    d.polls += 1;
    d.first_ok_ms.get_or_insert(sent);
    d.last_ok_ms = Some(at);
    Ok(lat)
}

/// Slow-log entries a signalling poller reads at each poll: more than its own commands of
/// one round (4, each logged where `slowlog-log-slower-than` is 0), so that a client's
/// entry among the newest is never crowded out by them.
const SLOWLOG_PEEK: &str = "8";
/// Signals waiting to be taken, at most (the oldest go first).
const SIGNALS_MAX: usize = 64;
/// Latency events followed, at most (redis has about twenty kinds).
const EVENTS_MAX: usize = 64;

/// A signalling poller's marks: each latency event's newest timestamp and the slow log's
/// newest id, from its first poll on (what came before is history, not a signal).
#[derive(Default)]
struct Marks {
    latency: std::collections::HashMap<String, i64>,
    slowlog_id: Option<i64>,
    primed: bool,
}

impl Marks {
    /// What is new since the previous poll, `lat` being this poll's LATENCY LATEST; the slow
    /// log's newest entries are read here. Entries the poller's own connection caused are
    /// left out: they are no sign of a stall.
    fn round(
        &mut self,
        c: &mut Conn,
        lat: &[LatencySample],
        data: &Mutex<Collected>,
    ) -> std::io::Result<Vec<SignalKind>> {
        let own = c.w.local_addr().ok().map(|a| a.to_string());
        let entries = parse_slowlog_from(&c.cmd(&["SLOWLOG", "GET", SLOWLOG_PEEK])?);
        let mut found = vec![];
        for l in lat {
            if self.latency.len() >= EVENTS_MAX && !self.latency.contains_key(&l.event) {
                continue;
            }
            let prev = self.latency.insert(l.event.clone(), l.ts);
            if self.primed && prev.is_none_or(|p| l.ts > p) {
                found.push(SignalKind::Latency(l.clone()));
            }
        }
        let last = self.slowlog_id;
        // A restarted redis counts its ids from 0 again: the mark follows them down.
        if let Some(newest) = entries.iter().map(|(e, _)| e.id).max() {
            self.slowlog_id = Some(newest);
        }
        let theirs: Vec<SlowEntry> = entries
            .into_iter()
            .filter(|(e, from)| last.is_some_and(|l| e.id > l) && (own.is_none() || *from != own))
            .map(|(e, _)| e)
            .collect();
        if let Some(newest) = theirs.iter().max_by_key(|e| e.id) {
            if self.primed {
                found.push(SignalKind::Slowlog(newest.clone()));
            }
        }
        data.lock()
            .unwrap_or_else(|e| e.into_inner())
            .slowlog
            .extend(theirs);
        self.primed = true;
        Ok(found)
    }
}

/// Queues what a poll found, as seen at `seen_ms`.
fn publish(out: &Mutex<std::collections::VecDeque<Signal>>, found: Vec<SignalKind>, seen_ms: i64) {
    let mut q = out.lock().unwrap_or_else(|e| e.into_inner());
    for kind in found {
        if q.len() >= SIGNALS_MAX {
            q.pop_front();
        }
        q.push_back(Signal { seen_ms, kind });
    }
}

/// Sleeps until `next`, a stop, or an asked history round, whichever comes first.
fn wait_until(next: Instant, interval: Duration, stop: &AtomicBool, history: &History) {
    let asked_more = || history.asked.load(Ordering::SeqCst) > history.done.load(Ordering::SeqCst);
    while Instant::now() < next && !stop.load(Ordering::SeqCst) && !asked_more() {
        std::thread::sleep(Duration::from_millis(20).min(interval));
    }
}

fn poll_loop(
    addr: &str,
    interval: Duration,
    stop: &AtomicBool,
    data: &Mutex<Collected>,
    traced: Option<(u32, &Mutex<OwnConns>)>,
    history: &History,
    signals: Option<&Mutex<std::collections::VecDeque<Signal>>>,
) {
    let mut conn: Option<Conn> = None;
    let mut last_try: Option<Instant> = None;
    let mut started = false;
    let mut seen_events: Vec<String> = vec![];
    let mut marks = Marks::default();
    let mut next = Instant::now();
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if conn.is_none() && last_try.is_none_or(|t| t.elapsed() >= RETRY_EVERY || stopping) {
            last_try = Some(Instant::now());
            match connect_own(addr, traced, stop) {
                Ok(c) => conn = Some(c),
                Err(e) => note(data, format!("--redis {addr}: cannot connect: {e}")),
            }
        }
        if let Some(c) = conn.as_mut() {
            let round = if started {
                Ok(())
            } else {
                first_round(c, data).map(|()| started = true)
            }
            .and_then(|()| poll_round(c, data, &mut seen_events))
            .and_then(|lat| match signals {
                Some(out) => marks
                    .round(c, &lat, data)
                    .map(|found| publish(out, found, wall_ms())),
                None => Ok(()),
            });
            if let Err(e) = round {
                note(data, format!("--redis {addr}: poll failed: {e}"));
                conn = None;
            }
        }
        if stopping {
            break;
        }
        let asked = history.asked.load(Ordering::SeqCst);
        if asked > history.done.load(Ordering::SeqCst) {
            if let Some(c) = conn.as_mut() {
                if let Err(e) = history_round(c, &seen_events, data) {
                    let msg = format!("--redis {addr}: SLOWLOG/LATENCY HISTORY read failed: {e}");
                    note(data, msg);
                    conn = None;
                }
            }
            // Served, or not to be served by this connection: the asker does not wait on.
            history.done.store(asked, Ordering::SeqCst);
        }
        next += interval;
        wait_until(next, interval, stop, history);
        if Instant::now() > next + interval {
            next = Instant::now();
        }
    }
    // The last round: what happened since the last poll, at full resolution.
    if let Some(c) = conn.as_mut() {
        if let Err(e) = history_round(c, &seen_events, data) {
            note(
                data,
                format!("--redis {addr}: final SLOWLOG/LATENCY read failed: {e}"),
            );
        }
    }
}

/// SLOWLOG GET and LATENCY HISTORY of every latency event seen: what happened since the
/// last poll at full resolution (at the end, and in `watch` once per incident).
fn history_round(
    c: &mut Conn,
    seen_events: &[String],
    data: &Mutex<Collected>,
) -> std::io::Result<()> {
    let sl = parse_slowlog(&c.cmd(&["SLOWLOG", "GET", "128"])?);
    let mut hist = vec![];
    for ev in seen_events {
        hist.extend(parse_history(ev, &c.cmd(&["LATENCY", "HISTORY", ev])?));
    }
    let mut d = data.lock().unwrap_or_else(|e| e.into_inner());
    d.slowlog.extend(sl);
    d.latency.extend(hist);
    d.final_ok = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_replies() {
        let mut r = &b"*2\r\n*4\r\n$7\r\ncommand\r\n:1796079312\r\n:301\r\n:301\r\n*4\r\n$4\r\nfork\r\n:1796079300\r\n:5\r\n:9\r\n"[..];
        let rep = read_reply(&mut r).unwrap();
        let l = parse_latency(&rep);
        assert_eq!(
            l,
            vec![
                LatencySample {
                    event: "command".into(),
                    ts: 1_796_079_312,
                    latency_ms: 301
                },
                LatencySample {
                    event: "fork".into(),
                    ts: 1_796_079_300,
                    latency_ms: 5
                },
            ]
        );
        let mut r = &b"$-1\r\n-ERR no\r\n+OK\r\n*-1\r\n"[..];
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Bulk(None));
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Err("ERR no".into()));
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Array(None));
        assert!(read_reply(&mut &b"?what\r\n"[..]).is_err());
    }

    fn err_of(bytes: &[u8]) -> String {
        match read_reply(&mut &bytes[..]) {
            Ok(r) => panic!("read {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// A peer's lengths never size an allocation past the limits: each is refused from its
    /// header, before its body (which is not even sent here) is waited for.
    #[test]
    fn hostile_lengths_are_refused_from_their_header() {
        let e = err_of(b"$9223372036854775807\r\n");
        assert!(
            e.contains("bulk string of 9223372036854775807 bytes"),
            "{e}"
        );
        let e = err_of(format!("${}\r\n", limits::BULK_MAX + 1).as_bytes());
        assert!(e.contains("at most"), "{e}");
        let e = err_of(b"*9223372036854775807\r\n");
        assert!(e.contains("elements"), "{e}");
        // Elements add up across the arrays of one reply.
        let mut many = b"*2\r\n".to_vec();
        for _ in 0..2 {
            many.extend_from_slice(format!("*{}\r\n", limits::ITEMS_MAX / 2 + 1).as_bytes());
        }
        assert!(err_of(&many).contains("elements"));
        let deep = "*1\r\n".repeat(limits::DEPTH_MAX + 1) + ":1\r\n";
        assert!(err_of(deep.as_bytes()).contains("nested"));
        let ok = "*1\r\n".repeat(limits::DEPTH_MAX - 1) + ":1\r\n";
        assert!(read_reply(&mut ok.as_bytes()).is_ok());
        let long = vec![b'+'; limits::LINE_MAX + 10];
        assert!(err_of(&long).contains("line longer"));
        // A body shorter than announced is an early end, not a buffer of zeros.
        assert!(matches!(
            read_reply(&mut &b"$10\r\nabc"[..]).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::UnexpectedEof)
        ));
        assert_eq!(
            read_reply(&mut &b"$3\r\nabc\r\n"[..]).unwrap(),
            Reply::Bulk(Some(b"abc".to_vec()))
        );
    }

    /// Through a connection: a peer that answers every command with a huge bulk length
    /// fails the command at once (no 4 GB buffer, no wait for the body).
    #[test]
    fn a_hostile_peer_fails_the_command_not_the_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 256];
            let _ = std::io::Read::read(&mut s, &mut buf);
            s.write_all(b"$4294967296\r\n").unwrap();
            // Held open: the client must not be waiting for the body.
            std::thread::sleep(Duration::from_millis(300));
        });
        let t0 = Instant::now();
        let mut c = Conn::connect_unauthenticated(&addr, Duration::from_secs(5), None).unwrap();
        let e = c.cmd(&["PING"]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        peer.join().unwrap();
    }

    #[test]
    fn slowlog_keeps_the_command_name_only() {
        // id, time, µs, [args], client, name (redis 4+)
        let mut r = &b"*1\r\n*6\r\n:7\r\n:1796079312\r\n:300125\r\n*3\r\n$3\r\nset\r\n$6\r\nsecret\r\n$5\r\nvalue\r\n$15\r\n127.0.0.1:50000\r\n$0\r\n\r\n"[..];
        let e = parse_slowlog(&read_reply(&mut r).unwrap());
        assert_eq!(
            e,
            vec![SlowEntry {
                id: 7,
                ts: 1_796_079_312,
                duration_us: 300_125,
                command: "SET".into()
            }]
        );
    }

    /// A slow log entry as redis sends it: id, time, µs, [name], client address, client name.
    fn slow_entry(id: i64, name: &str, client: &str) -> String {
        format!(
            "*6\r\n:{id}\r\n:1796079312\r\n:30000\r\n*1\r\n${}\r\n{name}\r\n${}\r\n{client}\r\n$0\r\n\r\n",
            name.len(),
            client.len()
        )
    }

    /// What a signalling poller hands out: nothing from its first poll (history), nothing
    /// for the slow log entries of its own commands, and then each latency event with a
    /// newer timestamp (or new) and the newest slow log entry of someone else.
    #[test]
    fn signals_are_what_is_new_and_not_the_pollers_own() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let peer = std::thread::spawn(move || {
            let (s, me) = l.accept().unwrap();
            let (me, other) = (me.to_string(), "10.0.0.9:4000");
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let rounds = [
                vec![slow_entry(5, "get", other)],
                vec![slow_entry(6, "info", &me), slow_entry(5, "get", other)],
                vec![
                    slow_entry(8, "debug", other),
                    slow_entry(7, "latency", &me),
                    slow_entry(6, "info", &me),
                ],
            ];
            for entries in rounds {
                let asked = read_reply(&mut r).unwrap();
                assert_eq!(asked.items()[0].as_text().as_deref(), Some("SLOWLOG"));
                w.write_all(format!("*{}\r\n{}", entries.len(), entries.concat()).as_bytes())
                    .unwrap();
            }
        });
        let mut c = Conn::connect_unauthenticated(&addr, Duration::from_secs(5), None).unwrap();
        let data = Mutex::new(Collected::default());
        let lat = |ev: &str, ts: i64| LatencySample {
            event: ev.into(),
            ts,
            latency_ms: 300,
        };
        let mut m = Marks::default();
        assert_eq!(
            m.round(&mut c, &[lat("command", 100)], &data).unwrap(),
            vec![]
        );
        assert_eq!(
            m.round(&mut c, &[lat("command", 100)], &data).unwrap(),
            vec![]
        );
        let found = m
            .round(&mut c, &[lat("command", 101), lat("fork", 50)], &data)
            .unwrap();
        assert_eq!(
            found,
            vec![
                SignalKind::Latency(lat("command", 101)),
                SignalKind::Latency(lat("fork", 50)),
                SignalKind::Slowlog(SlowEntry {
                    id: 8,
                    ts: 1_796_079_312,
                    duration_us: 30_000,
                    command: "DEBUG".into()
                }),
            ]
        );
        // Only others' entries are kept, as names.
        let kept: Vec<i64> = data.lock().unwrap().slowlog.iter().map(|e| e.id).collect();
        assert_eq!(kept, vec![8]);
        peer.join().unwrap();
    }

    #[test]
    fn info_fields_kept() {
        let mut f = vec![];
        parse_info(
            "# Persistence\r\nloading:0\r\naof_delayed_fsync:3\r\nrdb_bgsave_in_progress:1\r\n# Stats\r\nlatest_fork_usec:4810\r\nused_memory_human:1M\r\n",
            &mut f,
        );
        assert_eq!(
            f,
            vec![
                ("aof_delayed_fsync".into(), 3),
                ("rdb_bgsave_in_progress".into(), 1),
                ("latest_fork_usec".into(), 4810)
            ]
        );
    }

    /// A connection is used only once the analysis has taken it as the poller's: a command
    /// sent before would be counted as a client's.
    #[test]
    fn a_connection_is_handed_over_only_once_the_analysis_takes_it() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let me = std::process::id();
        let stop = AtomicBool::new(false);
        // This process plays the traced redis: the accepted socket is its server side.
        let c = Conn::connect_unauthenticated(&addr, CONNECT_TIMEOUT, None).unwrap();
        let (_accepted, _) = server.accept().unwrap();
        let own = Mutex::new(OwnConns::default());
        assert!(
            !hand_over(&c, me, &own, &stop, Duration::from_millis(50)),
            "nobody took it"
        );
        let published = own.lock().unwrap().new.clone();
        assert_eq!(published.len(), 1, "its fd was published");
        // A taker that takes what is published: the hand-over completes.
        let own = std::sync::Arc::new(Mutex::new(OwnConns::default()));
        let taker = {
            let own = own.clone();
            std::thread::spawn(move || loop {
                let mut o = own.lock().unwrap();
                if o.published > 0 {
                    o.taken = o.published;
                    return std::mem::take(&mut o.new);
                }
                drop(o);
                std::thread::sleep(Duration::from_millis(5));
            })
        };
        assert!(hand_over(&c, me, &own, &stop, Duration::from_secs(60)));
        assert_eq!(taker.join().unwrap()[0].0, published[0].0);
    }

    #[test]
    fn a_refused_connection_is_noted_not_fatal() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = Poller::start_for(
            &format!("127.0.0.1:{port}"),
            Duration::from_millis(50),
            None,
        );
        std::thread::sleep(Duration::from_millis(100));
        let d = p.finish();
        assert_eq!(d.polls, 0);
        assert!(
            d.errors.iter().any(|e| e.contains("cannot connect")),
            "{:?}",
            d.errors
        );
    }
}
