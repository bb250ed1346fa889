//! Process-wide settings for the short-lived commands.

/// Restores the default action of SIGPIPE, which Rust's runtime ignores, so
/// that `safs info --stats | head` ends quietly like any Unix tool instead
/// of panicking on a closed stdout. Only for commands that own no mount:
/// the daemon must not die when a control-socket client hangs up, and
/// `safs bench` must live to tear down what `--setup` made.
pub fn default_sigpipe() {
    // SAFETY: SIG_DFL installs no handler code, so nothing can run in
    // signal context; the disposition is process-wide state only.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
