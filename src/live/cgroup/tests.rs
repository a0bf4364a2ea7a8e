use super::*;

/// A fake /proc and cgroupfs under a temporary directory.
struct Tree(tempfile::TempDir);

impl Tree {
    fn new() -> Self {
        Tree(tempfile::tempdir().unwrap())
    }
    fn put(&self, rel: &str, text: &str) -> &Self {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }
    fn root(&self) -> &Path {
        self.0.path()
    }
}

const PSI: &str = "some avg10=1.00 avg60=0.50 avg300=0.10 total=1500\n\
                   full avg10=0.00 avg60=0.00 avg300=0.00 total=700\n";

/// A v2 host (cgroup2 mounted somewhere else than /sys/fs/cgroup): limits, throttling,
/// memory events and pressure from the process's own cgroup.
#[test]
fn reads_a_v2_cgroup_where_mountinfo_says_it_is() {
    let t = Tree::new();
    let cg = "cg2/system.slice/docker-abc.scope";
    t.put("proc/42/cgroup", "0::/system.slice/docker-abc.scope\n")
        .put(
            "proc/self/mountinfo",
            "22 1 0:20 / / rw - ext4 /dev/sda rw\n\
             30 22 0:26 / /cg2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .put(&format!("{cg}/cpu.max"), "30000 100000\n")
        .put(&format!("{cg}/cpu.max.burst"), "0\n")
        .put(
            &format!("{cg}/cpu.stat"),
            "usage_usec 5000\nnr_periods 40\nnr_throttled 9\nthrottled_usec 610000\n",
        )
        .put(&format!("{cg}/memory.max"), "max\n")
        .put(&format!("{cg}/memory.high"), "268435456\n")
        .put(
            &format!("{cg}/memory.events"),
            "low 0\nhigh 17\nmax 2\noom 0\noom_kill 0\n",
        )
        .put(
            &format!("{cg}/memory.stat"),
            "anon 1000\nfile 2000\npgsteal_direct 55\n",
        )
        .put(&format!("{cg}/memory.current"), "3500\n")
        .put(&format!("{cg}/cpu.pressure"), PSI)
        .put(&format!("{cg}/io.pressure"), PSI)
        .put(&format!("{cg}/memory.pressure"), PSI)
        .put(
            "proc/pressure/cpu",
            "some avg10=0 avg60=0 avg300=0 total=9\n",
        )
        .put("proc/pressure/io", PSI)
        .put("proc/pressure/memory", PSI);
    let c = Cgroup::of(t.root(), 42).expect("found");
    assert_eq!(c.version, CgroupVersion::V2);
    assert_eq!(c.path, "/system.slice/docker-abc.scope");
    assert!(!c.is_root());
    let l = c.limits();
    assert_eq!(l.quota(), Some((30_000, 100_000)));
    assert_eq!(l.cpu_burst_us, Some(0));
    assert_eq!(l.memory_max_bytes, None);
    assert_eq!(l.memory_limit(), Some(("memory.high", 268_435_456)));
    let r = c.read();
    assert_eq!((r.nr_periods, r.nr_throttled), (40, 9));
    assert_eq!(r.throttled_ns, 610_000_000);
    assert_eq!((r.mem_high, r.mem_max, r.mem_oom), (17, 2, 0));
    assert_eq!((r.anon, r.file, r.usage), (1000, 2000, 3500));
    assert_eq!(r.direct_reclaimed_pages, 55);
    assert_eq!((r.psi.cpu_some, r.psi.io_full), (1500, 700));
    assert_eq!((r.host_psi.cpu_some, r.host_psi.mem_full), (9, 700));
}

/// v1 controllers on their own mounts (this machine's layout, with cpu and cpuacct joined as
/// many distributions do), the memory controller in another cgroup than the CPU's.
#[test]
fn reads_v1_controllers_from_their_own_mounts() {
    let t = Tree::new();
    t.put(
        "proc/7/cgroup",
        "5:memory:/box/mem\n4:cpu,cpuacct:/box\n0::/\n",
    )
    .put(
        "proc/self/mountinfo",
        "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
         32 31 0:29 / /sys/fs/cgroup/cpu\\040acct rw - cgroup cgroup rw,cpu,cpuacct\n\
         35 31 0:32 / /mem rw - cgroup cgroup rw,memory\n\
         41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
    )
    .put("sys/fs/cgroup/cpu acct/box/cpu.cfs_quota_us", "30000\n")
    .put("sys/fs/cgroup/cpu acct/box/cpu.cfs_period_us", "100000\n")
    .put(
        "sys/fs/cgroup/cpu acct/box/cpu.stat",
        "nr_periods 12\nnr_throttled 5\nthrottled_time 340000000\n",
    )
    .put("mem/box/mem/memory.limit_in_bytes", "9223372036854771712\n")
    .put("mem/box/mem/memory.failcnt", "3\n")
    .put(
        "mem/box/mem/memory.stat",
        "cache 10\nrss 20\ntotal_cache 110\ntotal_rss 120\n",
    )
    .put("mem/box/mem/memory.usage_in_bytes", "230\n");
    let c = Cgroup::of(t.root(), 7).expect("found");
    assert_eq!(c.version, CgroupVersion::V1);
    assert_eq!(c.path, "/box");
    assert_eq!(c.memory_path.as_deref(), Some("/box/mem"));
    assert!(!c.has_psi());
    let l = c.limits();
    assert_eq!(l.quota(), Some((30_000, 100_000)));
    assert_eq!(
        l.memory_limit_in_bytes, None,
        "v1's no-limit value is no limit"
    );
    let r = c.read();
    assert_eq!(
        (r.nr_periods, r.nr_throttled, r.throttled_ns),
        (12, 5, 340_000_000)
    );
    assert_eq!(r.failcnt, 3);
    assert_eq!((r.anon, r.file, r.usage), (120, 110, 230));
    assert_eq!(r.host_psi, Psi::default(), "no /proc/pressure here");
}

/// v1 with no quota (-1) and a memory limit; a process in the root cgroup of every
/// controller is root.
#[test]
fn v1_without_a_quota_and_the_root_cgroup() {
    let t = Tree::new();
    let mounts = "32 31 0:29 / /c rw - cgroup cgroup rw,cpu\n\
                  35 31 0:32 / /m rw - cgroup cgroup rw,memory\n";
    t.put("proc/1/cgroup", "2:cpu:/\n1:memory:/lim\n")
        .put("proc/2/cgroup", "2:cpu:/\n1:memory:/\n")
        .put("proc/self/mountinfo", mounts)
        .put("c/cpu.cfs_quota_us", "-1\n")
        .put("c/cpu.cfs_period_us", "100000\n")
        .put("m/lim/memory.limit_in_bytes", "1073741824\n");
    let c = Cgroup::of(t.root(), 1).unwrap();
    assert!(!c.is_root());
    let l = c.limits();
    assert_eq!(l.cpu_quota_us, None);
    assert_eq!(l.quota(), None);
    assert_eq!(
        l.memory_limit(),
        Some(("memory.limit_in_bytes", 1_073_741_824))
    );
    let root = Cgroup::of(t.root(), 2).unwrap();
    assert!(root.is_root());
    assert!(!root.limits().any());
}

/// A cgroup namespace or bind mount of a sub-tree: the mount's root is cut from the path.
#[test]
fn a_mount_of_a_subtree_is_joined_below_its_root() {
    let t = Tree::new();
    t.put("proc/9/cgroup", "0::/kubepods/pod1/ctr\n")
        .put(
            "proc/self/mountinfo",
            "30 22 0:26 /kubepods /cg rw - cgroup2 cgroup2 rw\n",
        )
        .put("cg/pod1/ctr/cpu.max", "max 100000\n");
    let c = Cgroup::of(t.root(), 9).unwrap();
    let l = c.limits();
    assert_eq!((l.cpu_quota_us, l.cpu_period_us), (None, Some(100_000)));
}

#[test]
fn no_cgroup_file_or_no_mount_is_none() {
    let t = Tree::new();
    assert!(Cgroup::of(t.root(), 3).is_none());
    t.put("proc/3/cgroup", "0::/x\n").put(
        "proc/self/mountinfo",
        "22 1 0:20 / / rw - ext4 /dev/sda rw\n",
    );
    assert!(Cgroup::of(t.root(), 3).is_none());
}
