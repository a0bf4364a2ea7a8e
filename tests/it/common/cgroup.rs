//! A cgroup of a live test's own (live_cgroup's CPU quota and weight, live_memory's memory
//! limit, and the tests that put a redis under them): found through /proc/self/mountinfo,
//! cgroup v1 or v2 alike, made under the controller's root and removed on drop with its
//! processes moved back to the parent. Only what every such test needs; the files a test
//! writes (quota, weight, limit) are its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A cgroup made by a test, removed (its processes moved back to the parent) on drop.
pub struct TestCgroup {
    pub dir: PathBuf,
    /// In the unified (v2) hierarchy, else in the v1 hierarchy of its controller.
    pub v2: bool,
}

/// Where controller `ctl` (`cpu`, `memory`) is: a v1 hierarchy with it among its mount
/// options, else the v2 unified one when its root offers it.
pub fn controller_mount(ctl: &str) -> Option<(PathBuf, bool)> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut v2 = None;
    for l in mi.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let Some(point) = pre.split(' ').nth(4) else {
            continue;
        };
        let mut p = post.split(' ');
        let (fstype, opts) = (p.next().unwrap_or(""), p.nth(1).unwrap_or(""));
        if fstype == "cgroup" && opts.split(',').any(|o| o == ctl) {
            return Some((PathBuf::from(point), false));
        }
        if fstype == "cgroup2" && v2.is_none() {
            let ctls = std::fs::read_to_string(Path::new(point).join("cgroup.controllers"));
            if ctls.is_ok_and(|c| c.split_whitespace().any(|x| x == ctl)) {
                v2 = Some(PathBuf::from(point));
            }
        }
    }
    v2.map(|p| (p, true))
}

impl TestCgroup {
    /// A new cgroup `name` in `ctl`'s hierarchy (an earlier run's empty one of that name
    /// removed first); None without the controller or when it cannot be made.
    pub fn make(ctl: &str, name: &str) -> Option<TestCgroup> {
        let (root, v2) = controller_mount(ctl)?;
        if v2 {
            // Children of the root get a controller only when the root hands it down.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), format!("+{ctl}"));
        }
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        Some(TestCgroup { dir, v2 })
    }

    /// Writes `v` into its file `f` (a failure is the test's: it panics naming both).
    pub fn write(&self, f: &str, v: &str) {
        std::fs::write(self.dir.join(f), v).unwrap_or_else(|e| panic!("{f} {v}: {e}"));
    }

    /// Its file `f`, empty when unreadable.
    pub fn read(&self, f: &str) -> String {
        std::fs::read_to_string(self.dir.join(f)).unwrap_or_default()
    }

    pub fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        for p in self.read("cgroup.procs").lines() {
            let _ = std::fs::write(&parent, p);
        }
        // A memory cgroup's rmdir waits for the page cache charged to it to move (v1 moves
        // it to the parent): retried for a while.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
