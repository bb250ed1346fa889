//! `safs bench`: the tables of docs/benchmarks.md, measured side by side on
//! any list of directories, in one run.
//!
//! # What a run is
//!
//! A run is *test-major*: T1 on every target, then T2 on every target, and
//! so on, so the figures compared in one row were taken minutes apart, not
//! an hour — these machines are shared and noisy. Every target gets a
//! private work directory, `<dir>/safs-bench.<pid>`, removed when the run
//! ends however it ends.
//!
//! # Phases
//!
//! Each table cell is a *phase*: a timed loop of one kind of operation over
//! prepared files. A phase that only reads is repeated (`--reps`, default 3)
//! and the best repetition is kept; a phase that changes state runs once.
//! Every repetition is recorded in `results.json`. A cold phase makes the
//! target cold before *each* repetition (see `target`). The loops are
//! compiled Rust making direct system calls (`ops`): paths are built before
//! the clock starts, and progress/interrupt checks cost one branch per
//! operation and a little more every 1024.
//!
//! # Requests per operation
//!
//! For safs targets the daemon's per-opcode counters are read over its
//! control socket just before and just after each repetition; the
//! difference divided by the operations of the phase is the "requests per
//! operation" shown beside every figure — the number that explains the
//! others. (Replies reach the kernel a moment before their request is
//! counted, so a count may miss the very last request of a loop: noise of
//! 1 in 10,000 at the sizes used.) The daemon's own time per request, by
//! opcode, is recorded beside the counts in results.json: it tells a slow
//! handler from a slow round trip.
//!
//! # Failures
//!
//! A filesystem refusing an operation (ext4 and a 4 KiB xattr) makes that
//! cell "n/a" with its errno and the run goes on ([`Fail::Na`]). Anything
//! else — a remount that fails, Ctrl-C — ends the run ([`Fail::Abort`]);
//! the results gathered so far are still written, and `--setup`'s mounts,
//! loop devices and images are torn down by their guards.

pub mod config;
mod ops;
mod peer;
mod progress;
pub mod record;
pub mod report;
mod setup;
pub mod svg;
mod t1;
mod t10;
mod t11;
mod t12;
mod t13;
mod t2;
mod t3;
pub mod t4;
mod t5;
mod t6;
mod t7;
mod t8;
mod t9;
mod target;
pub mod tree;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

pub use config::{Config, Scale, Sizes, T9_BYTES_ENV, TargetSpec, Test};
use progress::Progress;
use record::{Machine, Measurement, Rep, Results, StepTime, Unit, request_delta};
use target::{ColdEnv, Target};

/// How long a test waits for the previous one's queued object deletions
/// on a safs target with an object store (see `Target::settle_deletions`).
const SETTLE_LIMIT: Duration = Duration::from_secs(900);
/// How long a test waits for the set's PostgreSQL servers' autovacuum
/// after a checkpoint (see `Setup::settle_databases`).
const DB_SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Why a phase stopped early.
#[derive(Debug)]
pub enum Fail {
    /// The filesystem refused (an errno): the cell is "n/a", the run goes on.
    Na(String),
    /// The run cannot go on (interrupted, a remount failed, …).
    Abort(anyhow::Error),
}

impl From<anyhow::Error> for Fail {
    fn from(e: anyhow::Error) -> Self {
        Fail::Abort(e)
    }
}

/// What a timed loop reports.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    pub elapsed: Duration,
    /// Standard deviation of the per-operation times in µs, when each
    /// operation was timed on its own.
    pub sd_us: Option<f64>,
    /// The figure itself when it is not derived from the time (MB/s).
    pub value: Option<f64>,
}

impl Timed {
    pub fn of(elapsed: Duration) -> Self {
        Timed {
            elapsed,
            sd_us: None,
            value: None,
        }
    }
}

/// How one phase is run.
pub struct PhaseSpec<'s> {
    pub label: &'s str,
    /// Operations per repetition (the divisor of µs/op and requests/op).
    pub ops: u64,
    pub reps: usize,
    pub cold: bool,
    /// Before each repetition, drop only the kernel's caches: a FUSE
    /// daemon keeps its own (what a daemon-side cache is measured by).
    pub kernel_cold: bool,
}

impl<'s> PhaseSpec<'s> {
    pub fn new(label: &'s str, ops: u64, reps: usize, cold: bool) -> Self {
        PhaseSpec {
            label,
            ops,
            reps,
            cold,
            kernel_cold: false,
        }
    }

    /// The same phase with the kernel's caches dropped before each
    /// repetition (and nothing else).
    pub fn kernel_cold(self) -> Self {
        PhaseSpec {
            kernel_cold: true,
            ..self
        }
    }
}

/// What every test needs: the run's settings, progress, the interrupt
/// flag, and where warnings go.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub sizes: &'a Sizes,
    pub progress: &'a Progress,
    stop: &'a AtomicBool,
    cold_env: ColdEnv<'a>,
    warnings: RefCell<Vec<String>>,
}

impl Ctx<'_> {
    /// The safs binary the run uses.
    pub fn safs_exe(&self) -> &Path {
        self.cold_env.safs_exe
    }

    /// Called once per operation of a loop: every 1024 operations, checks
    /// for Ctrl-C and moves the progress bar.
    #[inline]
    pub fn tick(&self, i: usize) -> Result<(), Fail> {
        if i & 1023 == 0 {
            self.tick_slow(i)
        } else {
            Ok(())
        }
    }

    #[cold]
    fn tick_slow(&self, i: usize) -> Result<(), Fail> {
        self.check_stop()?;
        self.progress.set(i as u64);
        Ok(())
    }

    pub fn check_stop(&self) -> Result<(), Fail> {
        if self.stop.load(Ordering::Relaxed) {
            Err(Fail::Abort(anyhow::anyhow!("interrupted")))
        } else {
            Ok(())
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn warn(&self, w: String) {
        self.progress.note(&format!("warning: {w}"));
        self.warnings.borrow_mut().push(w);
    }

    /// Makes `t` cold; `Na` when this run cannot (not root).
    pub fn make_cold(&self, t: &Target) -> Result<(), Fail> {
        if !self.cold_env.is_root {
            return Err(Fail::Na(
                "cold phases need root (drop_caches, remount)".into(),
            ));
        }
        self.progress
            .phase(&format!("{}: making caches cold", t.label), 0);
        if let Some(w) = t.make_cold(&self.cold_env)? {
            if !self.warnings.borrow().contains(&w) {
                self.warn(w);
            }
        }
        Ok(())
    }

    /// `sync` and drop the kernel's caches, leaving every daemon running;
    /// `Na` when this run cannot (not root).
    pub fn drop_kernel_caches(&self) -> Result<(), Fail> {
        if !self.cold_env.is_root {
            return Err(Fail::Na("dropping the kernel's caches needs root".into()));
        }
        self.progress.phase("dropping the kernel's caches", 0);
        target::drop_kernel_caches()?;
        Ok(())
    }

    /// Runs one phase (all its repetitions) into `m`. Returns whether it
    /// completed; on `Na` the measurement carries the error.
    pub fn phase(
        &self,
        t: &Target,
        m: &mut Measurement,
        spec: PhaseSpec<'_>,
        mut body: impl FnMut(&Ctx<'_>) -> Result<Timed, Fail>,
    ) -> anyhow::Result<bool> {
        m.ops = spec.ops;
        for rep in 0..spec.reps {
            let mut run = || -> Result<Rep, Fail> {
                if spec.cold {
                    self.make_cold(t)?;
                } else if spec.kernel_cold {
                    self.drop_kernel_caches()?;
                }
                let label = if spec.reps > 1 {
                    format!("{} ({}/{})", spec.label, rep + 1, spec.reps)
                } else {
                    spec.label.to_string()
                };
                self.progress.phase(&label, spec.ops);
                let before = t.requests()?;
                let timed = body(self)?;
                let after = t.requests()?;
                let secs = timed.elapsed.as_secs_f64();
                let value = timed.value.unwrap_or(match m.unit {
                    Unit::UsPerOp => secs * 1e6 / spec.ops.max(1) as f64,
                    _ => secs,
                });
                let delta = before.zip(after);
                Ok(Rep {
                    secs,
                    value,
                    sd: timed.sd_us,
                    requests: delta
                        .as_ref()
                        .map(|(b, a)| request_delta(&b.counts, &a.counts)),
                    daemon_ns: delta
                        .as_ref()
                        .map(|(b, a)| request_delta(&b.nanos, &a.nanos)),
                    engine: delta
                        .as_ref()
                        .map(|(b, a)| request_delta(&b.engine, &a.engine)),
                    daemon_mem: delta.as_ref().map(|(_, a)| a.mem),
                })
            };
            match run() {
                Ok(r) => m.reps.push(r),
                Err(Fail::Na(e)) => {
                    m.error = Some(e);
                    return Ok(false);
                }
                Err(Fail::Abort(e)) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// One test on one target: where it works, and where its rows go. Every
/// table (`t1` … `t9`) is a `fn run(s: &mut Step<'_>) -> anyhow::Result<()>`
/// that makes its rows with [`Step::row`], fills them with [`Ctx::phase`]
/// (a timed loop is usually [`timed_each`]) and hands them over with
/// [`Step::done`].
pub struct Step<'a> {
    pub ctx: &'a Ctx<'a>,
    pub t: &'a Target,
    /// The test's own directory on the target (removed after the test).
    pub dir: &'a Path,
    test: Test,
    out: &'a mut Vec<Measurement>,
}

impl Step<'_> {
    /// A row of this test and target: `case`, at size `n` if the table has
    /// sizes.
    pub fn row(&self, case: &str, n: Option<u64>, unit: Unit) -> Measurement {
        Measurement::new(self.test, &self.t.label, case, n, unit)
    }

    /// A phase's progress label: "T1 safs: set cold 32 B ×10000".
    pub fn label(&self, what: &str) -> String {
        format!("{} {}: {what}", self.test, self.t.label)
    }

    /// Hands the rows over, in the order the report shows them.
    pub fn done(&mut self, rows: impl IntoIterator<Item = Measurement>) {
        self.out.extend(rows);
    }

    /// Removes a size's directory and stops if the run was interrupted:
    /// the end of each size of a table that has sizes.
    pub fn next_size(&self, d: &Path) -> anyhow::Result<()> {
        ops::remove_tree(self.ctx, d);
        self.ctx
            .check_stop()
            .map_err(|_| anyhow::anyhow!("interrupted"))
    }
}

/// A timed loop: `op` on every item, with the interrupt and progress check
/// each table loop needs; the time of the whole loop.
pub fn timed_each<T>(
    ctx: &Ctx<'_>,
    items: &[T],
    mut op: impl FnMut(usize, &T) -> Result<(), Fail>,
) -> Result<Timed, Fail> {
    let start = Instant::now();
    for (i, item) in items.iter().enumerate() {
        ctx.tick(i)?;
        op(i, item)?;
    }
    Ok(Timed::of(start.elapsed()))
}

/// Runs a test's preparation; `Na` marks every listed measurement n/a.
pub fn prepared<T>(r: Result<T, Fail>, ms: &mut [&mut Measurement]) -> anyhow::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Fail::Na(e)) => {
            for m in ms.iter_mut() {
                m.error = Some(format!("preparation failed: {e}"));
            }
            Ok(None)
        }
        Err(Fail::Abort(e)) => Err(e),
    }
}

/// Marks `m` n/a because an earlier phase it depends on failed.
pub fn skipped(m: &mut Measurement, because: &Measurement) {
    m.error = Some(format!(
        "not run: {} failed ({})",
        because.case,
        because.error.as_deref().unwrap_or("?")
    ));
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let mem_total_kib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let u = rustix::system::uname();
    Machine {
        hostname: u.nodename().to_string_lossy().into_owned(),
        kernel: u.release().to_string_lossy().into_owned(),
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total_kib,
        cpu_idle: cpu_idle(),
        load_before: loadavg(),
        load_after: [0.0; 3],
    }
}

/// "driver/governor", and for haltpoll its polling limit, e.g.
/// "haltpoll/haltpoll, polls 0 ns before halting".
fn cpu_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|v| v.trim().to_string())
    };
    let base = "/sys/devices/system/cpu/cpuidle";
    let Some(driver) = read(&format!("{base}/current_driver")) else {
        return String::new();
    };
    let governor = read(&format!("{base}/current_governor_ro"))
        .or_else(|| read(&format!("{base}/current_governor")))
        .unwrap_or_default();
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(ns) if driver == "haltpoll" => {
            format!("{driver}/{governor}, polls {ns} ns before halting")
        }
        _ => format!("{driver}/{governor}"),
    }
}

fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

/// Removes a target's work directory when the run ends, however it ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("safs bench: cannot remove {}: {e}", self.0.display());
        }
    }
}

/// Writes results.json, results.md and the charts into `out`.
fn write_outputs(out: &Path, r: &Results) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(r)?;
    std::fs::write(out.join("results.json"), json + "\n")
        .with_context(|| format!("cannot write {}", out.join("results.json").display()))?;
    std::fs::write(out.join("results.md"), report::markdown(r))?;
    if r.tests.contains(&Test::T1) {
        std::fs::write(out.join("t1.svg"), report::t1_chart(r).render())?;
    }
    if r.tests.contains(&Test::T5) {
        std::fs::write(out.join("t5.svg"), report::t5_chart(r).render())?;
    }
    Ok(())
}

/// The run's sizes: the scale's, with T9's file size from [`T9_BYTES_ENV`]
/// when set.
fn sizes(scale: Scale) -> anyhow::Result<Sizes> {
    let sizes = Sizes::of(scale);
    match std::env::var(T9_BYTES_ENV) {
        Ok(v) => Ok(sizes.with_t9_bytes(
            config::parse_bytes(&v).map_err(|e| anyhow::anyhow!("{T9_BYTES_ENV}: {e}"))?,
        )),
        Err(_) => Ok(sizes),
    }
}

/// Runs the benchmark; returns the results directory.
pub fn run(cfg: Config) -> anyhow::Result<PathBuf> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let sizes = sizes(cfg.scale)?;
    let is_root = nix::unistd::geteuid().is_root();
    if cfg.setup && !is_root {
        bail!("--setup needs root (it makes filesystems, loop devices and mounts)");
    }
    let started = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    // Ctrl-C / SIGTERM: the first sets the flag (loops stop, guards tear
    // down); a second one while the flag is set ends the process at once.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))
            .context("cannot install the signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install the signal handler")?;
    }

    let tests: Vec<Test> = cfg.only.iter().copied().collect();
    let picks: Vec<String> = cfg
        .targets
        .iter()
        .filter(|t| t.picks_setup())
        .map(|t| t.label.clone())
        .collect();
    let wanted = setup::wanted(&picks, cfg.passthrough_hp.is_some(), peer::uring_enabled());
    let mut need = if cfg.setup {
        setup::tools_for(&wanted)
    } else {
        Vec::new()
    };
    if tests.contains(&Test::T4) {
        need.push(setup::Tool::Dbench);
    }
    setup::ensure_tools(&need, is_root)?;

    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("cannot create {}", cfg.out.display()))?;
    let out = std::fs::canonicalize(&cfg.out)?;
    let safs_exe = std::env::current_exe().context("cannot find the safs executable")?;
    let mut machine = machine();

    let env = setup::Env {
        sizes: &sizes,
        safs_exe: &safs_exe,
        safs_options: &cfg.safs_options,
        workdir: &cfg.workdir,
        passthrough_hp: cfg.passthrough_hp.as_deref(),
    };
    // Declared before the targets so it is dropped (torn down) after them.
    let setup_guard = if cfg.setup {
        eprintln!(
            "safs bench: setting up {} under {}",
            wanted.join(", "),
            cfg.workdir.display()
        );
        Some(setup::Setup::create(&env, &stop, &wanted)?)
    } else {
        None
    };
    let mut specs: Vec<TargetSpec> = setup_guard
        .as_ref()
        .map(|s| s.targets())
        .unwrap_or_default();
    let skipped = setup_guard
        .as_ref()
        .map(|s| s.skipped())
        .unwrap_or_default();
    for t in cfg.targets.iter().filter(|t| !t.picks_setup()) {
        if specs.iter().any(|s| s.label == t.label) {
            bail!("target label '{}' is used twice", t.label);
        }
        specs.push(t.clone());
    }
    let targets = specs
        .iter()
        .map(|s| Target::resolve(s, &cfg.safs_options))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let pid = std::process::id();
    let mut work = Vec::new();
    let mut bases = Vec::new();
    for t in &targets {
        let base = t.dir.join(format!("safs-bench.{pid}"));
        std::fs::create_dir_all(&base)
            .with_context(|| format!("target {}: cannot create {}", t.label, base.display()))?;
        work.push(WorkDir(base.clone()));
        bases.push(base);
    }

    let progress = Progress::new((tests.len() * targets.len()) as u64);
    let ctx = Ctx {
        cfg: &cfg,
        sizes: &sizes,
        progress: &progress,
        stop: &stop,
        cold_env: ColdEnv {
            is_root,
            safs_exe: &safs_exe,
        },
        warnings: RefCell::new(Vec::new()),
    };
    if !targets.iter().any(|t| t.label == cfg.baseline) {
        ctx.warn(format!(
            "baseline '{}' is not among the targets: no ratios",
            cfg.baseline
        ));
    }
    if !is_root {
        ctx.warn("not root: cold phases are n/a".into());
    }

    let mut measurements: Vec<Measurement> = Vec::new();
    let mut steps: Vec<StepTime> = Vec::new();
    let mut failure = None;
    'tests: for &test in &tests {
        for (t, base) in targets.iter().zip(&bases) {
            progress.step(&format!("{test} on {}", t.label));
            if let Some(Err(e)) = setup_guard
                .as_ref()
                .map(|s| s.settle_databases(DB_SETTLE_LIMIT))
            {
                ctx.warn(format!(
                    "{test} on {}: cannot settle PostgreSQL: {e}",
                    t.label
                ));
            }
            let settle_secs = match t.settle_deletions(SETTLE_LIMIT) {
                Ok((secs, 0)) => secs,
                Ok((secs, left)) => {
                    ctx.warn(format!(
                        "{test} on {}: {left} object deletions still queued after {secs:.0} s \
                         (measured under them)",
                        t.label
                    ));
                    secs
                }
                Err(e) => {
                    ctx.warn(format!("{test} on {}: {e:#}", t.label));
                    0.0
                }
            };
            let step_start = Instant::now();
            let dir = base.join(test.to_string());
            let mut step = Step {
                ctx: &ctx,
                t,
                dir: &dir,
                test,
                out: &mut measurements,
            };
            let res = match test {
                Test::T1 => t1::run(&mut step),
                Test::T2 => t2::run(&mut step),
                Test::T3 => t3::run(&mut step),
                Test::T4 => t4::run(&mut step),
                Test::T5 => t5::run(&mut step),
                Test::T6 => t6::run(&mut step),
                Test::T7 => t7::run(&mut step),
                Test::T8 => t8::run(&mut step),
                Test::T9 => t9::run(&mut step),
                Test::T10 => t10::run(&mut step),
                Test::T11 => t11::run(&mut step),
                Test::T12 => t12::run(&mut step),
                Test::T13 => t13::run(&mut step),
            };
            progress.step_done();
            ops::remove_tree(&ctx, &dir);
            steps.push(StepTime {
                test,
                target: t.label.clone(),
                secs: step_start.elapsed().as_secs_f64(),
                settle_secs,
            });
            if let Err(e) = res {
                failure = Some(e.context(format!("{test} on {}", t.label)));
                break 'tests;
            }
        }
    }
    progress.finish();

    machine.load_after = loadavg();
    for m in &mut measurements {
        m.summarize();
    }
    let mut warnings = ctx.warnings.take();
    if let Some(e) = &failure {
        warnings.push(format!("run ended early: {e:#}"));
    }
    let results = Results {
        safs_version: env!("CARGO_PKG_VERSION").to_string(),
        command: cfg.command.clone(),
        scale: cfg.scale,
        sizes: sizes.clone(),
        baseline: cfg.baseline.clone(),
        reps: cfg.reps,
        started_unix,
        wall_secs: started.elapsed().as_secs_f64(),
        machine,
        targets: targets.iter().map(Target::info).collect(),
        skipped,
        tests,
        steps,
        measurements,
        warnings,
    };
    write_outputs(&out, &results)?;
    drop(work);
    drop(targets);
    drop(setup_guard);
    match failure {
        Some(e) => Err(e.context(format!("partial results written to {}", out.display()))),
        None => Ok(out),
    }
}
