//! Per-command server latency read off the loopback wire (`tcpdump`): the reference the live
//! tests hold the report's per-command p50 to. On loopback a segment is stamped once, when
//! its sender's write hands it to the device, so a request segment paired with the next
//! reply segment on its connection spans the request's arrival to the reply's write: what
//! the report times, without the client's own queueing (which a client's p50 has, and
//! which differs between a server with I/O threads and one without on a small host).

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `tcpdump` of one port on `lo`, to a file in its own temp dir.
pub struct Wire {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Wire {
    /// Starts capturing; None (a failure under CI=true) when tcpdump is missing.
    pub fn start(port: u16) -> Option<Wire> {
        if !super::have("tcpdump", "--version") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.pcap");
        let err = std::fs::File::create(dir.path().join("err")).unwrap();
        let child = Command::new("tcpdump")
            // Immediate mode: libpcap's default ring on this kernel lost 0.1-0.6% of the
            // segments of a 50-client load without counting them as dropped.
            .args(["-i", "lo", "-s", "160", "-B", "65536", "--immediate-mode"])
            .args(["--time-stamp-precision=nano", "-w"])
            .arg(&file)
            .args(["tcp", "port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("tcpdump");
        let w = Wire { child, port, dir };
        let start = Instant::now();
        while start.elapsed() < super::DEADLINE {
            if w.stderr().contains("listening on") {
                return Some(w);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("tcpdump did not start: {}", w.stderr());
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("err")).unwrap_or_default()
    }

    /// Stops the capture; each command's p50 in µs and its number of request/reply pairs.
    /// Panics if the kernel says it dropped packets.
    pub fn finish(mut self) -> HashMap<String, (f64, usize)> {
        // SAFETY: SIGINT to the tcpdump this struct started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait().unwrap();
        let err = self.stderr();
        let dropped = err
            .lines()
            .find(|l| l.contains("dropped by kernel"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok());
        assert_eq!(dropped, Some(0), "tcpdump: {err}");
        let mut pcap = Vec::new();
        std::fs::File::open(self.dir.path().join("w.pcap"))
            .unwrap()
            .read_to_end(&mut pcap)
            .unwrap();
        p50s(&pcap, self.port)
    }
}

/// Request/reply spans by command, from a nanosecond pcap of Ethernet-framed loopback.
fn p50s(pcap: &[u8], port: u16) -> HashMap<String, (f64, usize)> {
    let u32le = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
    assert_eq!(u32le(pcap), 0xA1B2_3C4D, "a nanosecond pcap");
    assert_eq!(u32le(&pcap[20..]), 1, "Ethernet framing on lo");
    // Without pipelining a connection has one request in flight: a request replaces one
    // still unanswered (its reply lost by the capture), so a lost segment costs one pair
    // and never shifts the pairs after it.
    let mut pending: HashMap<u16, (u64, String)> = HashMap::new();
    let mut spans: HashMap<String, Vec<u64>> = HashMap::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let ts = u64::from(u32le(&pcap[at..])) * 1_000_000_000 + u64::from(u32le(&pcap[at + 4..]));
        let len = u32le(&pcap[at + 8..]) as usize;
        let frame = &pcap[at + 16..(at + 16 + len).min(pcap.len())];
        at += 16 + len;
        let Some((sport, dport, payload)) = tcp_payload(frame) else {
            continue;
        };
        if dport == port {
            pending.insert(sport, (ts, command(payload)));
        } else if sport == port {
            if let Some((t0, name)) = pending.remove(&dport) {
                spans.entry(name).or_default().push(ts - t0);
            }
        }
    }
    spans
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_unstable();
            let p50 = v[v.len() / 2] as f64 / 1000.0;
            (name, (p50, v.len()))
        })
        .collect()
}

/// (source port, destination port, payload) of an IPv4 TCP segment with data.
fn tcp_payload(frame: &[u8]) -> Option<(u16, u16, &[u8])> {
    let ip = frame.get(14..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ihl = usize::from(ip[0] & 15) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let tcp = ip.get(ihl..)?;
    let doff = usize::from(tcp.get(12)? >> 4) * 4;
    if total <= ihl + doff {
        return None;
    }
    let ports = (
        u16::from_be_bytes([tcp[0], tcp[1]]),
        u16::from_be_bytes([tcp[2], tcp[3]]),
    );
    Some((ports.0, ports.1, tcp.get(doff..).unwrap_or_default()))
}

/// The command of a RESP request's first segment (`*N\r\n$L\r\nNAME`), upper case.
fn command(payload: &[u8]) -> String {
    let mut parts = payload.split(|&b| b == b'\n');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), Some(name)) if a.starts_with(b"*") && b.starts_with(b"$") => {
            String::from_utf8_lossy(name.strip_suffix(b"\r").unwrap_or(name)).to_uppercase()
        }
        _ => "?".into(),
    }
}
