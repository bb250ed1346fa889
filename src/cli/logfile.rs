//! The daemon's log file, which must never take the daemon down.
//!
//! The log lives in the volume's directory, so it fills up with the disk
//! under the volume — exactly when safs has most to say. tracing's writer
//! would then report the failure on stderr, which a daemon points at this
//! same file, and a failed `eprint!` panics. Lines that cannot be written
//! are dropped and counted instead, and the next line that can be written
//! says how many were lost.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use parking_lot::Mutex;
use tracing_subscriber::fmt::MakeWriter;

pub struct LogFile {
    inner: Mutex<Inner>,
}

struct Inner {
    file: File,
    /// Lines dropped since the last one written.
    lost: u64,
}

impl LogFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(LogFile {
            inner: Mutex::new(Inner { file, lost: 0 }),
        })
    }
}

/// One line, handed to the file whole when the event is complete (tracing
/// formats an event into one buffer and writes it with one `write_all`).
pub struct Line<'a>(&'a LogFile);

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.0.inner.lock();
        if inner.lost > 0 {
            let note = format!("[{} log lines lost: the disk was full]\n", inner.lost);
            if inner.file.write_all(note.as_bytes()).is_err() {
                inner.lost += 1;
                return Ok(buf.len());
            }
            inner.lost = 0;
        }
        if inner.file.write_all(buf).is_err() {
            inner.lost += 1;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogFile {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_that_cannot_be_written_are_counted_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("safs.log");
        let log = LogFile::open(&path).unwrap();
        log.make_writer().write_all(b"first\n").unwrap();
        // A file that refuses every write, as a full disk does.
        log.inner.lock().file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        for _ in 0..3 {
            log.make_writer().write_all(b"dropped\n").unwrap();
        }
        log.inner.lock().file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        log.make_writer().write_all(b"after\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "first\n[3 log lines lost: the disk was full]\nafter\n"
        );
    }
}
