//! A private PostgreSQL cluster in a directory: `initdb`, then a server
//! listening only on a Unix socket in that directory (no TCP), run as the
//! `postgres` user when started by root (the server refuses root), stopped
//! and removed when dropped. What safs's tests and `safs bench --setup`
//! use for a real PostgreSQL that touches nothing else on the machine (a
//! crate of its own so that the bench, which depends on safs-control alone,
//! shares it).
//!
//! The binaries are Debian's (`apt-get install postgresql`): `initdb` on
//! the PATH, else the newest `/usr/lib/postgresql/<version>/bin`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub struct TempCluster {
    /// The cluster's data directory; its socket is there too.
    data: PathBuf,
    bin: PathBuf,
    /// The user the server runs as when we are root.
    owner: Option<nix::unistd::User>,
}

/// The directory holding the server's programs (`initdb`, `pg_ctl`,
/// `createdb`, `postgres`): where an `initdb` on the PATH really is (a
/// symlink in /usr/local/bin, say, names only itself).
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let real = std::fs::canonicalize(dir.join("initdb")).ok();
            if let Some(bin) = real.as_deref().and_then(Path::parent)
                && bin.join("pg_ctl").is_file()
                && bin.join("createdb").is_file()
            {
                return Ok(bin.to_path_buf());
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| no_postgres())?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).ok_or_else(no_postgres)
}

fn no_postgres() -> String {
    "PostgreSQL's server binaries (initdb, pg_ctl) are missing: apt-get install -y postgresql"
        .into()
}

impl TempCluster {
    /// Creates and starts a cluster in `dir/pg` (`dir` must exist).
    pub fn start(dir: &Path) -> Result<TempCluster, String> {
        let bin = bin_dir()?;
        let owner = if nix::unistd::geteuid().is_root() {
            Some(
                nix::unistd::User::from_name("postgres")
                    .ok()
                    .flatten()
                    .ok_or(
                        "no 'postgres' user to run the server as (the postgresql package makes it)",
                    )?,
            )
        } else {
            None
        };
        // The server user must reach its directory: `dir` may be a 0700
        // temporary directory of root's.
        if owner.is_some() {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let data = dir.join("pg");
        std::fs::create_dir(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        if let Some(u) = &owner {
            nix::unistd::chown(&data, Some(u.uid), Some(u.gid))
                .map_err(|e| format!("chown {}: {e}", data.display()))?;
        }
        let c = TempCluster { data, bin, owner };
        c.run(
            "initdb",
            &[
                "-D",
                c.path(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
        )?;
        let conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nmax_connections = 100\n\
             shared_buffers = 64MB\n",
            c.path()
        );
        let conf_path = c.data.join("postgresql.auto.conf");
        let mut auto = std::fs::read_to_string(&conf_path).unwrap_or_default();
        auto.push_str(&conf);
        std::fs::write(&conf_path, auto).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        c.pg_ctl_start()?;
        Ok(c)
    }

    fn path(&self) -> &str {
        self.data.to_str().unwrap_or_default()
    }

    /// A connection string for `dbname` as the superuser `postgres`.
    pub fn conninfo(&self, dbname: &str) -> String {
        format!("host={} user=postgres dbname={dbname}", self.path())
    }

    /// Creates the database `name`.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        self.run("createdb", &["-h", self.path(), "-U", "postgres", name])
            .map(|_| ())
    }

    /// The server's version, e.g. "PostgreSQL 15.18".
    pub fn version(&self) -> String {
        self.run("postgres", &["--version"])
            .map(|o| {
                let v = String::from_utf8_lossy(&o.stdout);
                let v = v.trim().trim_start_matches("postgres (PostgreSQL) ");
                format!("PostgreSQL {v}")
            })
            .unwrap_or_else(|_| "PostgreSQL".into())
    }

    /// Lets the server finish what earlier work left it: a checkpoint (its
    /// dirty pages written now, not in the middle of what is measured
    /// next), then up to `limit` for autovacuum's workers to finish.
    /// Returns how long it took.
    pub fn settle(&self, limit: std::time::Duration) -> Result<std::time::Duration, String> {
        let start = std::time::Instant::now();
        let sql = |q: &str| -> Result<String, String> {
            let o = self.run(
                "psql",
                &[
                    "-h",
                    self.path(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-XAtqc",
                    q,
                ],
            )?;
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        sql("CHECKPOINT")?;
        while start.elapsed() < limit {
            let busy = sql(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'",
            )?;
            if busy == "0" {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        Ok(start.elapsed())
    }

    /// Stops the server at once (`-m immediate`: as a crash) and starts it
    /// again.
    pub fn restart(&self) -> Result<(), String> {
        self.stop("immediate")?;
        self.pg_ctl_start()
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let log = self.data.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.path(),
                "-l",
                log.to_str().unwrap_or_default(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .map(|_| ())
    }

    fn stop(&self, mode: &str) -> Result<(), String> {
        self.run("pg_ctl", &["-D", self.path(), "-m", mode, "-w", "stop"])
            .map(|_| ())
    }

    /// Runs one of the server's programs as the server's user.
    fn run(&self, prog: &str, args: &[&str]) -> Result<Output, String> {
        let exe = self.bin.join(prog);
        let mut cmd = match &self.owner {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", &u.name, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd
            .args(args)
            .current_dir(&self.data)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{prog} {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(out)
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop("immediate") {
            eprintln!("stopping the private PostgreSQL cluster: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
