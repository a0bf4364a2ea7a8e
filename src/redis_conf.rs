//! The redis configuration the classifier and the findings read: the file names redis was
//! configured with (`--redis-conf`, or live, the process's own config) and the few policy
//! directives the advice depends on. Read once before the pipeline starts; no stage writes it.

/// The file names redis was configured with (from `--redis-conf` or, live, the process's
/// config), so classification need not guess.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RedisConf {
    pub dir: Option<String>,
    pub appendfilename: Option<String>,
    pub appenddirname: Option<String>,
    pub dbfilename: Option<String>,
    pub logfile: Option<String>,
    pub appendonly: Option<bool>,
    pub appendfsync: Option<String>,
    pub no_appendfsync_on_rewrite: Option<bool>,
    pub loglevel: Option<String>,
}

impl RedisConf {
    /// Parses redis.conf text (`directive value`, quotes allowed, `#` comments).
    pub fn parse(text: &str) -> Self {
        let mut c = RedisConf::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut it = line.splitn(2, char::is_whitespace);
            let key = it.next().unwrap_or("").to_ascii_lowercase();
            let val = it
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"')
                .trim_matches('\'')
                .to_string();
            c.set(&key, val);
        }
        c
    }

    /// Applies one directive (also used for `--key value` redis-server arguments).
    pub fn set(&mut self, key: &str, val: String) {
        let yes = |v: &str| v.eq_ignore_ascii_case("yes");
        match key {
            "dir" => self.dir = Some(val),
            "appendfilename" => self.appendfilename = Some(val),
            "appenddirname" => self.appenddirname = Some(val),
            "dbfilename" => self.dbfilename = Some(val),
            "logfile" if !val.is_empty() => self.logfile = Some(val),
            "appendonly" => self.appendonly = Some(yes(&val)),
            "appendfsync" => self.appendfsync = Some(val.to_ascii_lowercase()),
            "no-appendfsync-on-rewrite" => self.no_appendfsync_on_rewrite = Some(yes(&val)),
            "loglevel" => self.loglevel = Some(val.to_ascii_lowercase()),
            _ => {}
        }
    }

    /// Whether `path` is the file this directive names (by path, base name, or `dir`/name).
    pub(crate) fn names(&self, path: &str, name: &Option<String>) -> bool {
        match name {
            Some(n) if !n.is_empty() => {
                let base = basename(path);
                path == n
                    || base == basename(n)
                    || self
                        .dir
                        .as_ref()
                        .is_some_and(|d| path == format!("{d}/{n}"))
            }
            _ => false,
        }
    }
}

pub(crate) fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}
