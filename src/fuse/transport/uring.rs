//! FUSE over io_uring (Linux >= 6.14, `FUSE_OVER_IO_URING`): one queue per
//! CPU, each a ring of 128-byte SQEs whose entries the kernel fills with
//! requests and the daemon answers with COMMIT_AND_FETCH.

/// Where the reply to one request that came over io_uring goes.
pub struct Slot {}

impl Slot {
    /// Writes the reply (`error`: 0 or a negative errno) into the ring
    /// entry and hands the entry back to the kernel.
    pub(super) fn send(self, unique: u64, error: i32, body: &[&[u8]]) {
        let _ = (unique, error, body);
        todo!("io_uring reply")
    }
}
