//! Progress on a terminal: one bar for the run (test × target steps), one
//! for the phase under way. Hidden when stdout is not a terminal; then one
//! plain line per step goes to stderr so a log still shows where a run is.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    multi: MultiProgress,
    overall: ProgressBar,
    phase: ProgressBar,
    visible: bool,
}

impl Progress {
    pub fn new(steps: u64) -> Self {
        let visible = std::io::stdout().is_terminal();
        let target = if visible {
            ProgressDrawTarget::stdout_with_hz(8)
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let overall = multi.add(ProgressBar::new(steps));
        overall.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        let phase = multi.add(ProgressBar::new(0));
        phase.set_style(
            ProgressStyle::with_template("           {spinner} {msg} {pos}/{len}")
                .expect("static template"),
        );
        if visible {
            phase.enable_steady_tick(Duration::from_millis(250));
        }
        Progress {
            multi,
            overall,
            phase,
            visible,
        }
    }

    /// A new test × target step begins.
    pub fn step(&self, what: &str) {
        self.overall.set_message(what.to_string());
        if !self.visible {
            eprintln!("safs bench: {what}");
        }
    }

    pub fn step_done(&self) {
        self.overall.inc(1);
    }

    /// A phase with `len` operations begins.
    pub fn phase(&self, msg: &str, len: u64) {
        self.phase.set_message(msg.to_string());
        self.phase.set_length(len);
        self.phase.set_position(0);
    }

    pub fn set(&self, pos: u64) {
        self.phase.set_position(pos);
    }

    /// A line that stays (above the bars on a terminal, stderr otherwise).
    pub fn note(&self, line: &str) {
        if self.visible {
            let _ = self.multi.println(line);
        } else {
            eprintln!("safs bench: {line}");
        }
    }

    pub fn finish(&self) {
        self.phase.finish_and_clear();
        self.overall.finish_and_clear();
    }
}
