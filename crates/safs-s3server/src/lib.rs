//! A private S3 server in a directory: a one-node Ceph cluster — one
//! monitor, one OSD on `memstore`, radosgw on 127.0.0.1 — with
//! authentication off inside the cluster, pools of one replica, and one S3
//! user whose keys are made up here. Stopped by the PIDs its daemons
//! wrote, and removed, when dropped. What safs's tests and `safs bench`
//! use for a real object store that touches nothing else on the machine.
//!
//! The programs are Debian's (`apt-get install --no-install-recommends
//! ceph-mon ceph-osd radosgw ceph-common`), buckets are made with `s3cmd`
//! (as a user would). Two settings matter on this machine: radosgw talks
//! to the monitor in `crc` mode (it would insist on a secure connection
//! and time out), and its beast frontend sets `tcp_nodelay` (a 4 KiB GET
//! takes 44 ms instead of 2.6 without it).
//!
//! A test run can share one server: [`TempRgw::from_env`] finds the one a
//! test script started (`safs-s3server start DIR`, which prints the
//! variables to export).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The S3 user's keys (the server is private: fixed keys are enough).
pub const ACCESS_KEY: &str = "SAFSTESTACCESSKEY";
pub const SECRET_KEY: &str = "safs-test-secret-key-0123456789";

/// Environment variables naming a running server (see [`TempRgw::from_env`]).
pub const ENV_ENDPOINT: &str = "SAFS_TEST_S3_ENDPOINT";
pub const ENV_DIR: &str = "SAFS_TEST_S3_DIR";

/// How long the daemons get to come up, and to go.
const START_WAIT: Duration = Duration::from_secs(60);
const STOP_WAIT: Duration = Duration::from_secs(20);

pub struct TempRgw {
    dir: PathBuf,
    endpoint: String,
    /// Started here (stopped and removed when dropped), or found running.
    owned: bool,
}

impl TempRgw {
    /// Creates and starts a cluster in `dir/ceph` (`dir` must exist).
    pub fn start(dir: &Path) -> Result<TempRgw, String> {
        for prog in [
            "ceph-mon",
            "ceph-osd",
            "radosgw",
            "radosgw-admin",
            "monmaptool",
            "s3cmd",
        ] {
            which(prog)?;
        }
        let dir = dir.join("ceph");
        for sub in ["mon", "osd/osd.0", "run", "log", "rgw"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mon_port = free_port(&[])?;
        let rgw_port = free_port(&[mon_port])?;
        let fsid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
            .map_err(|e| format!("a cluster id: {e}"))?;
        let fsid = fsid.trim();
        let d = dir.display();
        let conf = format!(
            "[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon max pg per osd = 1000
mon data avail warn = 1
osd crush chooseleaf type = 0
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
mon data = {d}/mon/$name
osd data = {d}/osd/$name
osd objectstore = memstore
memstore device bytes = 8589934592
keyring = {d}/keyring
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw data = {d}/rgw
"
        );
        std::fs::write(dir.join("ceph.conf"), conf).map_err(|e| e.to_string())?;
        let rgw = TempRgw {
            endpoint: format!("http://127.0.0.1:{rgw_port}"),
            dir,
            owned: true,
        };
        // From here on a failure stops what was started (Drop).
        rgw.bring_up(fsid, mon_port)?;
        Ok(rgw)
    }

    /// The server a test script started for the whole run, if any
    /// ([`ENV_ENDPOINT`], [`ENV_DIR`]); it is left running when dropped.
    pub fn from_env() -> Option<TempRgw> {
        let endpoint = std::env::var(ENV_ENDPOINT).ok()?;
        let dir = PathBuf::from(std::env::var_os(ENV_DIR)?);
        Some(TempRgw {
            dir,
            endpoint,
            owned: false,
        })
    }

    /// [`TempRgw::from_env`], else a new server in `dir`.
    pub fn shared_or_start(dir: &Path) -> Result<TempRgw, String> {
        match TempRgw::from_env() {
            Some(s) => Ok(s),
            None => TempRgw::start(dir),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The directory holding the cluster (its `ceph.conf`, logs, pids).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Shell `export` lines naming this server for [`TempRgw::from_env`]
    /// and for S3 clients (`AWS_*`).
    pub fn exports(&self) -> String {
        format!(
            "export {ENV_ENDPOINT}={}\nexport {ENV_DIR}={}\n",
            self.endpoint,
            self.dir.display()
        )
    }

    /// Shell `export` lines for an S3 client of this server: its keys,
    /// endpoint and a region.
    pub fn aws_exports(&self) -> String {
        format!(
            "export AWS_ACCESS_KEY_ID={ACCESS_KEY}\nexport AWS_SECRET_ACCESS_KEY={SECRET_KEY}\n\
             export AWS_ENDPOINT_URL={}\nexport AWS_REGION=us-east-1\n",
            self.endpoint
        )
    }

    /// Makes bucket `name` (as a user would, with s3cmd).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        let host = self.endpoint.trim_start_matches("http://");
        run(Command::new("s3cmd").args([
            "--no-ssl",
            &format!("--host={host}"),
            "--host-bucket=",
            &format!("--access_key={ACCESS_KEY}"),
            &format!("--secret_key={SECRET_KEY}"),
            "--config=/dev/null",
            "mb",
            &format!("s3://{name}"),
        ]))
        .map(drop)
    }

    /// Stops radosgw alone: the store becomes unreachable (fault tests).
    pub fn stop_gateway(&self) -> Result<(), String> {
        self.stop_daemon("client.rgw")
    }

    /// Starts radosgw again after [`TempRgw::stop_gateway`].
    pub fn start_gateway(&self) -> Result<(), String> {
        run(Command::new("radosgw").args(["-c", &self.conf(), "-n", "client.rgw"]))?;
        self.wait_for_gateway()
    }

    fn conf(&self) -> String {
        self.dir.join("ceph.conf").display().to_string()
    }

    fn bring_up(&self, fsid: &str, mon_port: u16) -> Result<(), String> {
        let conf = self.conf();
        let keyring = self.dir.join("keyring").display().to_string();
        let monmap = self.dir.join("monmap").display().to_string();
        run(Command::new("ceph-authtool").args([
            "--create-keyring",
            &keyring,
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        ]))?;
        run(Command::new("monmaptool").args([
            "--create",
            "--addv",
            "a",
            &format!("[v2:127.0.0.1:{mon_port}]"),
            "--fsid",
            fsid,
            &monmap,
        ]))?;
        run(Command::new("ceph-mon").args([
            "-c",
            &conf,
            "--mkfs",
            "-i",
            "a",
            "--monmap",
            &monmap,
            "--keyring",
            &keyring,
        ]))?;
        run(Command::new("ceph-mon").args(["-c", &conf, "-i", "a"]))?;
        run(Command::new("ceph").args(["-c", &conf, "osd", "create"]))?;
        run(Command::new("ceph-osd").args(["-c", &conf, "-i", "0", "--mkfs"]))?;
        run(Command::new("ceph-osd").args(["-c", &conf, "-i", "0"]))?;
        run(Command::new("radosgw").args(["-c", &conf, "-n", "client.rgw"]))?;
        self.wait_for_gateway()?;
        run(Command::new("radosgw-admin").args([
            "-c",
            &conf,
            "user",
            "create",
            "--uid=safs",
            "--display-name=safs tests",
            &format!("--access-key={ACCESS_KEY}"),
            &format!("--secret-key={SECRET_KEY}"),
        ]))?;
        Ok(())
    }

    /// Waits until radosgw answers HTTP.
    fn wait_for_gateway(&self) -> Result<(), String> {
        let addr = self.endpoint.trim_start_matches("http://").to_string();
        let start = Instant::now();
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n");
                let mut head = [0u8; 12];
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_exact(&mut head).is_ok()
                    && head.starts_with(b"HTTP/")
                {
                    return Ok(());
                }
            }
            if start.elapsed() > START_WAIT {
                // The log goes with the caller's directory: its end here.
                let log = self.dir.join("log/client.rgw.log");
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                return Err(format!(
                    "radosgw did not answer on {addr} within {START_WAIT:?}; the end of {}:\n{tail}",
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM to the daemon named `name` (by its pid file), then SIGKILL
    /// if it has not gone within [`STOP_WAIT`].
    fn stop_daemon(&self, name: &str) -> Result<(), String> {
        let pidfile = self.dir.join(format!("run/{name}.pid"));
        let Ok(text) = std::fs::read_to_string(&pidfile) else {
            return Ok(());
        };
        let pid = text
            .trim()
            .parse::<i32>()
            .map_err(|e| format!("{}: {e}", pidfile.display()))?;
        let pid = nix::unistd::Pid::from_raw(pid);
        use nix::sys::signal::{Signal, kill};
        if kill(pid, Signal::SIGTERM).is_err() {
            let _ = std::fs::remove_file(&pidfile);
            return Ok(());
        }
        let start = Instant::now();
        while kill(pid, None).is_ok() {
            if start.elapsed() > STOP_WAIT {
                let _ = kill(pid, Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(&pidfile);
        Ok(())
    }

    /// Stops every daemon of the cluster in `dir` (a server started by
    /// another process: `safs-s3server stop`).
    pub fn stop_in(dir: &Path) -> Result<(), String> {
        let rgw = TempRgw {
            dir: dir.to_path_buf(),
            endpoint: String::new(),
            owned: true,
        };
        rgw.stop_all();
        Ok(())
    }

    fn stop_all(&self) {
        for name in ["client.rgw", "osd.0", "mon.a"] {
            if let Err(e) = self.stop_daemon(name) {
                eprintln!("stopping {name} of the private Ceph cluster: {e}");
            }
        }
    }
}

impl Drop for TempRgw {
    fn drop(&mut self) {
        if self.owned {
            self.stop_all();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A TCP port free on 127.0.0.1 now.
/// A port nothing listens on, below the kernel's ephemeral range: a port
/// from that range (what binding port 0 hands out) is free only until the
/// next outgoing connection takes it as its local port, and tests that run
/// beside a server starting make thousands (a radosgw that lost its port
/// that way never answered). Ceph's daemons bind 6800-7300.
fn free_port(taken: &[u16]) -> Result<u16, String> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (20000u16, ephemeral.max(20001));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    let span = u32::from(high - low);
    for i in 0..200u32 {
        let port = low + (seed.wrapping_add(i.wrapping_mul(7919)) % span) as u16;
        if !taken.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free port in {low}-{high}"))
}

fn which(prog: &str) -> Result<(), String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()));
    if found {
        Ok(())
    } else {
        Err(format!(
            "{prog} is missing: apt-get install -y --no-install-recommends \
             ceph-mon ceph-osd radosgw ceph-common s3cmd"
        ))
    }
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{desc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{desc} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}
