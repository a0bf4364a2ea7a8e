//! The `--threads FILE` input: thread names by tid, read before the pipeline starts so that
//! roles come from names when the trace has none (`ps -L`, `top -H`, /proc comm, or the file
//! `attach --record` writes). One job: text in, tid -> name out.

use crate::event::Tid;
use rustc_hash::FxHashMap as HashMap;

/// Reads a thread-name file. Accepted shapes, mixed freely with blank and `# comment` lines:
/// - `TID NAME` lines (what `stallscope attach --record` writes beside a recording);
/// - `ps` or `top -H` output with its header: the tid is the `LWP`, `TID` or `SPID` column
///   (else `PID`, which is the tid in `top -H`), the name is everything from the `CMD`,
///   `COMMAND` or `COMM` column on, so `ps -L -p PID`, `ps -T -p PID` and
///   `ps -L -o tid,comm -p PID` all read right;
/// - `grep . /proc/PID/task/*/comm`: `/proc/PID/task/TID/comm:NAME`.
pub fn parse_thread_names(text: &str) -> HashMap<Tid, String> {
    let mut m = HashMap::default();
    // (tid column, name column) from the last header line seen.
    let mut columns: Option<(usize, usize)> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if let Some((tid, name)) = proc_comm_line(l) {
            m.insert(tid, name.to_string());
            continue;
        }
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols[0].parse::<Tid>().is_err() {
            columns = header_columns(&cols).or(columns);
            continue;
        }
        let headerless_pid_tid = cols.len() >= 3 && cols[1].parse::<Tid>().is_ok();
        let (tid_col, name_col) =
            columns.unwrap_or(if headerless_pid_tid { (1, 2) } else { (0, 1) });
        let tid = cols.get(tid_col).and_then(|c| c.parse::<Tid>().ok());
        if let (Some(tid), Some(_)) = (tid, cols.get(name_col)) {
            m.insert(tid, cols[name_col..].join(" "));
        }
    }
    m
}

fn header_columns(cols: &[&str]) -> Option<(usize, usize)> {
    let find = |names: &[&str]| {
        cols.iter()
            .position(|c| names.iter().any(|n| c.eq_ignore_ascii_case(n)))
    };
    let tid = find(&["LWP", "TID", "SPID"]).or_else(|| find(&["PID"]))?;
    let name = find(&["CMD", "COMMAND", "COMM"])?;
    Some((tid, name))
}

/// `/proc/PID/task/TID/comm:NAME`, as `grep . /proc/PID/task/*/comm` prints it.
fn proc_comm_line(l: &str) -> Option<(Tid, &str)> {
    let (path, name) = l.split_once("/comm:")?;
    let tid = path.rsplit_once("/task/")?.1.parse().ok()?;
    Some((tid, name.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_name_file_formats() {
        let m = parse_thread_names("# header\n7313 redis-server\n7317 bio_close_file\n");
        assert_eq!(m.get(&7317).map(String::as_str), Some("bio_close_file"));
        let m = parse_thread_names("  PID   TID COMMAND\n 7313  7318 bio_aof_fsync\n");
        assert_eq!(m.get(&7318).map(String::as_str), Some("bio_aof_fsync"));
    }

    /// The shapes an engineer pastes from a shell: `ps -L`, `ps -T` (time and tty columns
    /// between the tid and the name), `top -H` (preamble, PID is the tid) and the comm files.
    #[test]
    fn thread_names_from_ps_top_and_proc_comm() {
        let name = |m: &HashMap<Tid, String>, t: Tid| m.get(&t).cloned();
        let ps_l = "  PID   LWP TTY          TIME CMD\n\
                     7313  7313 ?        00:00:01 redis-server\n\
                     7313  7318 ?        00:00:00 bio_aof_fsync\n";
        let m = parse_thread_names(ps_l);
        assert_eq!(name(&m, 7318).as_deref(), Some("bio_aof_fsync"));
        assert_eq!(name(&m, 7313).as_deref(), Some("redis-server"));
        assert_eq!(m.len(), 2);
        let ps_t =
            "  PID  SPID TTY          TIME CMD\n 7313  7317 ?        00:00:00 bio_close_file\n";
        let m = parse_thread_names(ps_t);
        assert_eq!(name(&m, 7317).as_deref(), Some("bio_close_file"));
        let top = "top - 04:10:01 up 1 day,  1 user,  load average: 0.10, 0.20, 0.30\n\
                   Threads:   5 total,   0 running,   5 sleeping\n\
                   \n\
                       PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND\n\
                      7319 redis     20   0  123456  45678   1234 S   0.0   0.1   0:00.00 bio_lazy_free\n";
        let m = parse_thread_names(top);
        assert_eq!(name(&m, 7319).as_deref(), Some("bio_lazy_free"));
        assert_eq!(m.len(), 1);
        let comm =
            "/proc/7313/task/7313/comm:redis-server\n/proc/7313/task/7318/comm:bio_aof_fsync\n";
        let m = parse_thread_names(comm);
        assert_eq!(name(&m, 7318).as_deref(), Some("bio_aof_fsync"));
        assert_eq!(m.len(), 2);
    }
}
