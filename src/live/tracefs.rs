//! tracefs, as the kernel-fed backends read it: where it is mounted, a tracepoint's id and
//! the offsets of its fields (from its `format` file). The perf backend opens tracepoints by
//! id and reads their raw fields at those offsets; the bpf backend checks that the offsets
//! its compiled programs assume are this kernel's. One place, so neither backend imports
//! the other.

use std::path::{Path, PathBuf};

/// Where tracefs is and the ids of the two syscall tracepoints.
#[derive(Clone, Debug)]
pub struct Tracepoints {
    pub root: PathBuf,
    pub enter: u64,
    pub exit: u64,
}

impl Tracepoints {
    /// The `events` directory (one directory per category, then per tracepoint).
    pub fn events(&self) -> PathBuf {
        self.root.join("events")
    }
}

/// Finds tracefs and the raw_syscalls tracepoint ids, or says why they cannot be used.
pub fn find_tracepoints() -> Result<Tracepoints, String> {
    let mut why = vec![];
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let root = PathBuf::from(root);
        let ev = root.join("events");
        match std::fs::metadata(&ev) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                why.push(format!("{}: {e}", ev.display()));
                continue;
            }
        }
        let id = |name: &str| syscall_tracepoint_id(&ev, name);
        match (id("sys_enter"), id("sys_exit")) {
            (Ok(enter), Ok(exit)) => return Ok(Tracepoints { root, enter, exit }),
            (Err(e), _) | (_, Err(e)) => why.push(e),
        }
    }
    if why.is_empty() {
        Err(
            "tracefs is mounted neither at /sys/kernel/tracing nor at /sys/kernel/debug/tracing \
             (as root: mount -t tracefs nodev /sys/kernel/tracing)"
                .into(),
        )
    } else {
        Err(why.join("; "))
    }
}

/// The id of `raw_syscalls:NAME` under `events`, or why it cannot be read (a missing file
/// is a kernel without syscall tracepoints, said so).
fn syscall_tracepoint_id(events: &Path, name: &str) -> Result<u64, String> {
    let p = events.join("raw_syscalls").join(name).join("id");
    let s = std::fs::read_to_string(&p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{} is missing (a kernel without syscall tracepoints, CONFIG_FTRACE_SYSCALLS)",
                p.display()
            )
        } else {
            format!("cannot read {}: {e}", p.display())
        }
    })?;
    s.trim()
        .parse()
        .map_err(|_| format!("{}: not a tracepoint id: {s:?}", p.display()))
}

/// One file of tracepoint `cat:name` (`id`, `format`), or why it cannot be read.
pub fn read_event_file(events: &Path, cat: &str, name: &str, file: &str) -> Result<String, String> {
    let p = events.join(cat).join(name).join(file);
    std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// Tracepoint `cat:name`'s id and the offset of its `field`, from its `id` and `format`.
pub fn id_and_offset(
    events: &Path,
    cat: &str,
    name: &str,
    field: &str,
) -> Result<(u64, usize), String> {
    let dir = events.join(cat).join(name);
    let id = read_event_file(events, cat, name, "id")?
        .trim()
        .parse()
        .map_err(|_| format!("{}: not a tracepoint id", dir.join("id").display()))?;
    let off = field_offset(&read_event_file(events, cat, name, "format")?, field)
        .ok_or_else(|| format!("{} has no {field} field", dir.join("format").display()))?;
    Ok((id, off as usize))
}

/// `offset` of `field` in a tracepoint's format file.
pub fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|l| {
        let decl = l.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let name = decl.trim().rsplit(' ').next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        rest.trim()
            .strip_prefix("offset:")?
            .split(';')
            .next()?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_offsets_are_read_from_tracefs_text() {
        let f = "name: sched_process_fork\nformat:\n\
                 \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                 \tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
                 \tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n\
                 \tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n";
        assert_eq!(field_offset(f, "child_pid"), Some(20));
        assert_eq!(field_offset(f, "parent_comm"), Some(8));
        assert_eq!(field_offset(f, "args"), Some(16));
        assert_eq!(field_offset(f, "child_comm"), None);
    }

    /// Against this kernel's tracefs, when there is one: the syscall tracepoints have ids,
    /// and sys_enter's `id` is where the programs read it.
    #[test]
    fn this_kernels_syscall_tracepoints_have_ids_and_offsets() {
        let tp = match find_tracepoints() {
            Ok(tp) => tp,
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("CI=true and no tracefs: {why}")
            }
            // A machine without tracefs (a container): the offsets test above still runs.
            Err(_) => return,
        };
        assert_ne!(tp.enter, tp.exit);
        let (id, off) = id_and_offset(&tp.events(), "raw_syscalls", "sys_enter", "id").unwrap();
        assert_eq!((id, off), (tp.enter, 8));
    }
}
