//! Helpers shared by the picture renderers (SVG, HTML): escaping untrusted trace text into
//! markup, short human durations, the file-class palette and axis ticks. Everything here is
//! pure; the renderers in this folder own the layout.

use crate::report::{FileClass, PhaseKind};
use std::borrow::Cow;
use std::fmt::Write as _;

/// Escapes text for XML/HTML element content and quoted attribute values.
///
/// Paths and thread names come from the trace, so they may hold anything: markup
/// characters are escaped and characters XML 1.0 forbids (control bytes, lone surrogates
/// cannot occur in `str`, U+FFFE/U+FFFF) become U+FFFD, so the output always parses.
pub fn esc(s: &str) -> Cow<'_, str> {
    let needs = s
        .chars()
        .any(|c| matches!(c, '&' | '<' | '>' | '"' | '\'') || !xml_char(c));
    if !needs {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if !xml_char(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// A duration in µs as people read it: "87 µs", "446.9 ms", "4.83 s".
pub fn dur(us: i64) -> String {
    let a = us.unsigned_abs() as f64;
    let sign = if us < 0 { "-" } else { "" };
    if a < 1_000.0 {
        format!("{sign}{} µs", a as u64)
    } else if a < 1_000_000.0 {
        let ms = a / 1_000.0;
        if ms < 10.0 {
            format!("{sign}{ms:.2} ms")
        } else {
            format!("{sign}{ms:.1} ms")
        }
    } else {
        let s = a / 1_000_000.0;
        if s < 100.0 {
            format!("{sign}{s:.2} s")
        } else {
            format!("{sign}{s:.0} s")
        }
    }
}

/// An offset from the first event: "+1.234567 s".
pub fn offset(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "+" };
    let a = us.unsigned_abs();
    format!("{sign}{}.{:06} s", a / 1_000_000, a % 1_000_000)
}

/// Thousands separators for counts.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Colour of a file class. The classes that explain redis stalls (AOF, log, RDB) get the
/// strongest, most distinct hues; the rest share quieter ones. Unknown classes are grey.
pub fn class_color(class: Option<FileClass>) -> &'static str {
    match class.unwrap_or(FileClass::Unknown) {
        FileClass::Aof => "#d62728",
        FileClass::AofManifest => "#e377c2",
        FileClass::AofRewriteTemp => "#9467bd",
        FileClass::Rdb => "#1f77b4",
        FileClass::RdbTemp => "#17becf",
        FileClass::Log => "#ff7f0e",
        FileClass::Client => "#2ca02c",
        FileClass::Listener => "#98df8a",
        FileClass::Replica => "#bcbd22",
        FileClass::Outgoing => "#dbdb8d",
        FileClass::Pipe => "#8c564b",
        FileClass::Epoll => "#c49c94",
        FileClass::Dir => "#393b79",
        FileClass::Proc => "#ad494a",
        FileClass::AnonInode => "#7b4173",
        FileClass::Other => "#636363",
        FileClass::Unknown => "#9a9a9a",
    }
}

/// Background-phase fill colour and label.
pub fn phase_style(kind: PhaseKind) -> (&'static str, &'static str) {
    match kind {
        PhaseKind::Bgsave => ("#f2c14e", "BGSAVE"),
        PhaseKind::AofRewrite => ("#7fb3d5", "AOF rewrite"),
        PhaseKind::Child => ("#c8c8c8", "child"),
    }
}

/// "Nice" linear ticks (1, 2, 5 × 10^k) covering `[lo, hi]`, about `want` of them.
pub fn nice_ticks(lo: f64, hi: f64, want: usize) -> (Vec<f64>, f64) {
    if !lo.is_finite() || !hi.is_finite() || hi <= lo {
        return (vec![lo], 1.0);
    }
    let raw = (hi - lo) / want.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut ticks = Vec::new();
    let mut i = 0;
    loop {
        let t = first + i as f64 * step;
        if t > hi + step * 1e-9 || i > 1000 {
            break;
        }
        ticks.push(t);
        i += 1;
    }
    (ticks, step)
}

/// Formats a tick value with as many decimals as its step needs.
pub fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil().clamp(0.0, 6.0) as usize
    };
    let mut s = String::new();
    let _ = write!(s, "{v:.decimals$}");
    if s == "-0" {
        s = "0".into();
    }
    s
}

/// A decade of µs as an axis label: 1 µs, 10 µs, ..., 1 ms, ..., 1 s, 10 s.
pub fn decade_label(exp: i32) -> String {
    match exp {
        e if e < 0 => format!("{} µs", 10f64.powi(e)),
        0 => "1 µs".into(),
        1 => "10 µs".into(),
        2 => "100 µs".into(),
        3 => "1 ms".into(),
        4 => "10 ms".into(),
        5 => "100 ms".into(),
        6 => "1 s".into(),
        7 => "10 s".into(),
        8 => "100 s".into(),
        e => format!("1e{} s", e - 6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn esc_escapes_markup_and_replaces_forbidden_chars() {
        assert_eq!(esc("plain /data/a.aof"), "plain /data/a.aof");
        assert_eq!(esc("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(esc("x\u{1}y\u{FFFE}"), "x\u{FFFD}y\u{FFFD}");
        assert_eq!(esc("tab\tok"), "tab\tok");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(dur(87), "87 µs");
        assert_eq!(dur(1_500), "1.50 ms");
        assert_eq!(dur(446_900), "446.9 ms");
        assert_eq!(dur(4_830_000), "4.83 s");
        assert_eq!(offset(1_234_567), "+1.234567 s");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(12), "12");
    }

    #[test]
    fn nice_ticks_cover_range_with_round_steps() {
        let (t, step) = nice_ticks(0.0, 4.3, 10);
        assert_eq!(step, 0.5);
        assert_eq!(t.first().copied(), Some(0.0));
        assert!((t.last().copied().unwrap_or(0.0) - 4.0).abs() < 1e-9);
        assert_eq!(tick_label(2.5, step), "2.5");
        let (t, step) = nice_ticks(0.0, 100.0, 5);
        assert_eq!(step, 20.0);
        assert_eq!(t.len(), 6);
        assert_eq!(decade_label(3), "1 ms");
        assert_eq!(decade_label(6), "1 s");
    }
}
