//! How durations and counts read to a person: the one place the report's words for time and
//! plurals are made, shared by the findings, the renderers and the live console.

/// The plural ending of a count's noun: `format!("{n} stall{}", plural(n))`.
pub fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A duration in µs the way a person reads it.
///
/// 4_827_551 reads "4.83 s", 446_945 "447 ms", 1_500 "1.5 ms", 153 "153 µs"
/// (`tests::durations_read_as_a_person_reads_them`).
pub fn human(us: i64) -> String {
    let us = us.max(0);
    if us >= 1_000_000 {
        format!("{:.2} s", us as f64 / 1e6)
    } else if us >= 10_000 {
        format!("{:.0} ms", us as f64 / 1e3)
    } else if us >= 1_000 {
        format!("{:.1} ms", us as f64 / 1e3)
    } else {
        format!("{us} µs")
    }
}

/// Text cut to `n` characters, with `…` where it was cut: a log line in a report cell.
pub fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_reads_them() {
        assert_eq!(human(4_827_551), "4.83 s");
        assert_eq!(human(446_945), "447 ms");
        assert_eq!(human(1_500), "1.5 ms");
        assert_eq!(human(153), "153 µs");
        assert_eq!(human(-5), "0 µs");
    }
}
