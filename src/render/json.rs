//! JSON renderer: the report as REPORT.md's `stallscope/1` object, for scripts and tests.

use crate::report::Report;
use std::io::{self, Write};

/// Generic over the writer: through `&mut dyn Write` every one of serde_json's small
/// writes (a key, a quote, a comma) was a virtual call into `BufWriter::write_all`, about a
/// third of the JSON's cost on a report of thousands of stalls; a concrete `BufWriter`
/// inlines its copy into the buffer.
pub fn render<W: Write + ?Sized>(report: &Report, w: &mut W) -> io::Result<()> {
    pretty(&mut *w, report).map_err(io_error)?;
    writeln!(w)
}

/// `serde_json::to_writer_pretty`, byte for byte, through `Pretty`.
fn pretty<W: Write + ?Sized, T: serde::Serialize + ?Sized>(
    w: &mut W,
    value: &T,
) -> serde_json::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(w, Pretty::default());
    value.serialize(&mut ser)
}

/// serde_json's `PrettyFormatter` with its two-space indent, in fewer writes: it writes a
/// line's break, then its indent two spaces per level and per write, and a key's closing
/// quote and the `: ` after it as two more, each a call into the writer with a copy of one
/// or two bytes. A report of 5,000 stalls is 205,000 lines; here a line's break and indent
/// are one write, and a key's end one more, which took a good part of the JSON's
/// instructions away (bench/PROFILE.md, fourteenth round), in the serial tail of a run, when
/// the parser's core has nothing left to do. Every key, of whatever type, is written between `begin_string` and
/// `end_string` (serde_json's `MapKeySerializer`), which is what lets a key's quotes be
/// written with the indent before it and the `: ` after it.
#[derive(Default)]
struct Pretty {
    level: usize,
    has_value: bool,
    /// Inside an object key: its opening quote was written with the indent, and its closing
    /// one goes out with the `: `.
    in_key: bool,
}

/// `,` then a line break, then the indent of the deepest level written at once; deeper
/// levels (not in a report) take more writes.
const BREAK: &[u8] = b",\n                                                                ";

impl Pretty {
    /// A line break (after a comma unless `first`) and the indent of the current level.
    #[inline]
    fn line<W: Write + ?Sized>(&self, w: &mut W, first: bool) -> io::Result<()> {
        let from = usize::from(first);
        let mut spaces = 2 * self.level;
        let room = BREAK.len() - 2;
        let n = spaces.min(room);
        w.write_all(&BREAK[from..2 + n])?;
        spaces -= n;
        while spaces > 0 {
            let n = spaces.min(room);
            w.write_all(&BREAK[2..2 + n])?;
            spaces -= n;
        }
        Ok(())
    }

    #[inline]
    fn open<W: Write + ?Sized>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    #[inline]
    fn close<W: Write + ?Sized>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.line(w, true)?;
        }
        w.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for Pretty {
    #[inline]
    fn begin_array<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }
    #[inline]
    fn end_array<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }
    #[inline]
    fn begin_array_value<W: Write + ?Sized>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.line(w, first)
    }
    #[inline]
    fn end_array_value<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        self.end_object_value(w)
    }
    #[inline]
    fn begin_object<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }
    #[inline]
    fn end_object<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }
    #[inline]
    fn begin_object_key<W: Write + ?Sized>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.line(w, first)?;
        self.in_key = true;
        w.write_all(b"\"")
    }
    #[inline]
    fn begin_string<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        if self.in_key {
            Ok(())
        } else {
            w.write_all(b"\"")
        }
    }
    #[inline]
    fn end_string<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        if self.in_key {
            self.in_key = false;
            w.write_all(b"\": ")
        } else {
            w.write_all(b"\"")
        }
    }
    #[inline]
    fn begin_object_value<W: Write + ?Sized>(&mut self, _: &mut W) -> io::Result<()> {
        Ok(())
    }
    #[inline]
    fn end_object_value<W: Write + ?Sized>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// serde_json's error as an I/O error of the same kind: a reader that went away (`| head`)
/// stays a broken pipe, which the program ends on quietly, not an error of kind `Other`.
fn io_error(e: serde_json::Error) -> io::Error {
    match e.io_error_kind() {
        Some(kind) => io::Error::new(kind, e),
        None => io::Error::other(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours<T: serde::Serialize>(v: &T) -> String {
        let mut out = Vec::new();
        pretty(&mut out, v).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Byte for byte what serde_json's own pretty printer writes: empty and nested arrays
    /// and objects, keys that need escapes, keys that are numbers, and a nesting deeper
    /// than one write of indent covers.
    #[test]
    fn writes_what_serde_json_pretty_writes() {
        let mut deep = serde_json::json!({"leaf": [1, {"x": null}], "empty": {}});
        for i in 0..40 {
            deep = serde_json::json!({ format!("k{i}"): deep, "n": i, "a": [] });
        }
        let values = [
            serde_json::json!(null),
            serde_json::json!([]),
            serde_json::json!({}),
            serde_json::json!([[], {}, [[]], {"a": {}}]),
            serde_json::json!({"q\"uote\\d": "line\nbreak\t\u{1}", "": [1.5, -2, true, "é"]}),
            deep,
        ];
        for v in &values {
            assert_eq!(ours(v), serde_json::to_string_pretty(v).unwrap(), "{v}");
        }
        let by_number: std::collections::BTreeMap<i64, Vec<u8>> =
            [(-3, vec![]), (7, vec![1, 2])].into_iter().collect();
        assert_eq!(
            ours(&by_number),
            serde_json::to_string_pretty(&by_number).unwrap()
        );
    }
}
