#!/usr/bin/env python3
"""slowfs: a directory re-mounted through FUSE, with delays you choose per operation and per
file name, changed while it is mounted. The live tests put a redis-server's data directory and
log file on it to make real disk stalls of a known size (a multi-second fdatasync of the AOF, a
close() of the log file that blocks), and check stallscope's report against slowfs's own log of
every delay it injected.

    python3 scripts/slowfs.py BACKING MOUNTPOINT --control SOCKET --log DELAYS.tsv [--rules FILE]
    python3 scripts/slowfs.py set SOCKET '{"rules": [{"op": "fsync", "match": "*.aof", "ms": 3000}]}'
    fusermount -u MOUNTPOINT        # the daemon exits once unmounted

Rules (a JSON object with a "rules" list, sent on the control socket or read from --rules at
start): {"op": OP, "match": GLOB, "ms": N or [LO, HI]}. OP is one of: fsync (fsync and
fdatasync), write, read, flush (every close() of a file waits for it), release (the last close,
which the kernel does not wait for), open, create, getattr, truncate, rename, unlink, fsyncdir.
GLOB is a shell pattern on the file's base name ("*" when left out). The first rule that
matches an operation decides its delay; no match, no delay. A new rule set replaces the old one
as a whole; calls already sleeping keep the delay they were given, unless the request also
says "release": true, which ends every delay now running. A test can so hold a call for as
long as it needs (a long "ms", then a release) instead of guessing how long is enough.

Control socket: a Unix stream socket; each request is one line of JSON, each answer one line:
{"ok": true, "generation": N} once the rules are in force (so a test never races a reload), or
{"ok": false, "error": "..."}. {"get": true} returns the rules in force.

DELAYS.tsv: a header, then two lines per delayed call, tab-separated:
    seq  phase  epoch  op  tid  ms  path
phase is "begin" (written before the delay starts; ms is the delay chosen) or "end" (the real
call has returned; ms is how long the delay really lasted, shorter if it was released);
epoch is the wall clock in seconds; tid is the calling thread's kernel id (from the FUSE
request), so each delay is tied to the redis thread that waited for it; path is the file's
path inside the mount, last because it may hold any character but a newline or a tab.
"""

import argparse
import errno
import fnmatch
import json
import os
import random
import socket
import sys
import threading
import time

OPS = {
    "fsync", "write", "read", "flush", "release", "open", "create", "getattr",
    "truncate", "rename", "unlink", "fsyncdir",
}


def check_rules(obj):
    """The rule list of a request, validated, or ValueError saying what is wrong."""
    if not isinstance(obj, dict) or not isinstance(obj.get("rules"), list):
        raise ValueError('expected {"rules": [...]}')
    out = []
    for i, r in enumerate(obj["rules"]):
        if not isinstance(r, dict):
            raise ValueError("rule %d: not an object" % i)
        op = r.get("op")
        if op not in OPS:
            raise ValueError("rule %d: op %r is not one of %s" % (i, op, ", ".join(sorted(OPS))))
        pattern = r.get("match", "*")
        if not isinstance(pattern, str):
            raise ValueError("rule %d: match must be a string" % i)
        ms = r.get("ms")
        if isinstance(ms, (int, float)) and ms >= 0:
            lo = hi = float(ms)
        elif (isinstance(ms, list) and len(ms) == 2
              and all(isinstance(x, (int, float)) for x in ms) and 0 <= ms[0] <= ms[1]):
            lo, hi = float(ms[0]), float(ms[1])
        else:
            raise ValueError("rule %d: ms must be a number >= 0 or [lo, hi]" % i)
        out.append({"op": op, "match": pattern, "lo": lo, "hi": hi})
    return out


class Delays:
    """The rules in force, and the log of what they did."""

    def __init__(self, log_path, seed):
        self.lock = threading.Lock()
        self.rules = []
        self.source = {"rules": []}
        self.generation = 0
        self.seq = 0
        self.rng = random.Random(seed)
        # Delays now sleeping: seq -> the Event that ends them early.
        self.running = {}
        self.log = open(log_path, "a", buffering=1)
        if self.log.tell() == 0:
            self.log.write("seq\tphase\tepoch\top\ttid\tms\tpath\n")

    def replace(self, obj):
        rules = check_rules(obj)
        release = obj.get("release", False)
        if not isinstance(release, bool):
            raise ValueError("release must be true or false")
        with self.lock:
            self.rules = rules
            self.source = obj
            self.generation += 1
            if release:
                for wake in self.running.values():
                    wake.set()
            return self.generation

    def _write(self, seq, phase, op, tid, ms, path):
        safe = path.replace("\t", " ").replace("\n", " ")
        self.log.write("%d\t%s\t%.6f\t%s\t%d\t%.3f\t%s\n" % (seq, phase, time.time(), op, tid, ms, safe))

    def around(self, op, path, call):
        """Runs `call` after the delay the rules give (op, path), logging the delay."""
        base = os.path.basename(path)
        with self.lock:
            ms = 0.0
            for r in self.rules:
                if r["op"] == op and fnmatch.fnmatchcase(base, r["match"]):
                    ms = r["lo"] if r["lo"] == r["hi"] else self.rng.uniform(r["lo"], r["hi"])
                    break
            if ms <= 0:
                seq = None
            else:
                self.seq += 1
                seq = self.seq
                tid = fuse_get_context()[2]
                wake = self.running[seq] = threading.Event()
                self._write(seq, "begin", op, tid, ms, path)
        if seq is None:
            return call()
        # Wait outside the lock: other calls (and other delays) go on meanwhile.
        t0 = time.monotonic()
        wake.wait(ms / 1000.0)
        waited = (time.monotonic() - t0) * 1000.0
        with self.lock:
            del self.running[seq]
        try:
            return call()
        finally:
            with self.lock:
                self._write(seq, "end", op, tid, waited, path)


def serve_control(sock, delays):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=control_session, args=(conn, delays), daemon=True).start()


def control_session(conn, delays):
    with conn, conn.makefile("rwb", buffering=0) as f:
        for line in f:
            try:
                req = json.loads(line)
                if isinstance(req, dict) and req.get("get"):
                    with delays.lock:
                        ans = {"ok": True, "generation": delays.generation, "rules": delays.source}
                else:
                    ans = {"ok": True, "generation": delays.replace(req)}
            except ValueError as e:
                ans = {"ok": False, "error": str(e)}
            f.write((json.dumps(ans) + "\n").encode())


def make_fs(root, delays):
    class SlowFS(Operations):
        """Passes every call through to `root`; `delays` decides what waits first."""

        def _p(self, path):
            return os.path.join(root, path.lstrip("/"))

        def __call__(self, op, *args):
            try:
                return super().__call__(op, *args)
            except OSError as e:
                raise FuseOSError(e.errno or errno.EIO)

        # Metadata.
        def getattr(self, path, fh=None):
            st = delays.around("getattr", path,
                               lambda: os.fstat(fh) if fh is not None else os.lstat(self._p(path)))
            return {k: getattr(st, k) for k in (
                "st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
                "st_atime", "st_mtime", "st_ctime", "st_blocks")}

        def access(self, path, mode):
            if not os.access(self._p(path), mode):
                raise FuseOSError(errno.EACCES)

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._p(path))

        def readlink(self, path):
            return os.readlink(self._p(path))

        def statfs(self, path):
            s = os.statvfs(self._p(path))
            return {k: getattr(s, k) for k in (
                "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

        def chmod(self, path, mode):
            os.chmod(self._p(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._p(path), uid, gid)

        def utimens(self, path, times=None):
            os.utime(self._p(path), times)

        def mknod(self, path, mode, dev):
            os.mknod(self._p(path), mode, dev)

        def mkdir(self, path, mode):
            os.mkdir(self._p(path), mode)

        def rmdir(self, path):
            os.rmdir(self._p(path))

        def symlink(self, target, source):
            os.symlink(source, self._p(target))

        def link(self, target, source):
            os.link(self._p(source), self._p(target))

        def unlink(self, path):
            delays.around("unlink", path, lambda: os.unlink(self._p(path)))

        def rename(self, old, new):
            delays.around("rename", new, lambda: os.rename(self._p(old), self._p(new)))

        def truncate(self, path, length, fh=None):
            def go():
                if fh is not None:
                    os.ftruncate(fh, length)
                else:
                    os.truncate(self._p(path), length)
            delays.around("truncate", path, go)

        # File contents: the file handle is the backing file's own descriptor.
        def open(self, path, flags):
            return delays.around("open", path, lambda: os.open(self._p(path), flags))

        def create(self, path, mode, fi=None):
            return delays.around(
                "create", path,
                lambda: os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))

        def read(self, path, size, offset, fh):
            return delays.around("read", path, lambda: os.pread(fh, size, offset))

        def write(self, path, data, offset, fh):
            return delays.around("write", path, lambda: os.pwrite(fh, data, offset))

        def flush(self, path, fh):
            # Writes went straight to the backing file: nothing to flush but the delay.
            return delays.around("flush", path, lambda: 0)

        def release(self, path, fh):
            return delays.around("release", path, lambda: os.close(fh))

        def fsync(self, path, datasync, fh):
            return delays.around(
                "fsync", path, lambda: os.fdatasync(fh) if datasync else os.fsync(fh))

        def fsyncdir(self, path, datasync, fh):
            def go():
                d = os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(d)
                finally:
                    os.close(d)
            return delays.around("fsyncdir", path, go)

    return SlowFS()


def set_rules(sock_path, text):
    """Client: sends one rule set, prints the answer; exit 1 if it was refused."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall((json.dumps(json.loads(text)) + "\n").encode())
    ans = s.makefile("rb").readline().decode()
    sys.stdout.write(ans)
    return 0 if json.loads(ans).get("ok") else 1


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "set":
        if len(sys.argv) != 4:
            sys.exit("usage: slowfs.py set SOCKET RULES_JSON|-")
        text = sys.stdin.read() if sys.argv[3] == "-" else sys.argv[3]
        sys.exit(set_rules(sys.argv[2], text))
    ap = argparse.ArgumentParser(description="FUSE passthrough with run-time delays")
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--control", required=True, help="Unix socket to send rule sets to")
    ap.add_argument("--log", required=True, help="TSV log of every delay")
    ap.add_argument("--rules", help="JSON file with the rules to start with")
    ap.add_argument("--seed", type=int, default=1, help="seed for [lo, hi] delays")
    a = ap.parse_args()

    global FUSE, FuseOSError, Operations, fuse_get_context
    try:
        from fuse import FUSE, FuseOSError, Operations, fuse_get_context
    except (ImportError, OSError) as e:
        sys.exit("slowfs: cannot load fusepy (pip install fusepy; apt-get install fuse libfuse2): %s" % e)

    delays = Delays(a.log, a.seed)
    if a.rules:
        with open(a.rules) as f:
            try:
                delays.replace(json.load(f))
            except ValueError as e:
                sys.exit("slowfs: --rules %s: %s" % (a.rules, e))
    if os.path.exists(a.control):
        os.unlink(a.control)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(a.control)
    sock.listen(8)
    threading.Thread(target=serve_control, args=(sock, delays), daemon=True).start()
    root = os.path.realpath(a.backing)
    # Threads on (fusepy's default): one slow call must not hold up the others.
    FUSE(make_fs(root, delays), a.mountpoint, foreground=True, fsname="slowfs", subtype="slowfs")


if __name__ == "__main__":
    main()
