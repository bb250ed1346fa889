//! What the transport tests need of the wire format to play the daemon by
//! hand: opcodes and INIT flags (from `proto::abi`, in the widths the
//! hand-built structs use) and little readers of native-endian fields.

use crate::fuse::proto::abi;

pub const OP_LOOKUP: u32 = abi::FUSE_LOOKUP;
pub const OP_FORGET: u32 = abi::FUSE_FORGET;
pub const OP_GETATTR: u32 = abi::FUSE_GETATTR;
pub const OP_INIT: u32 = abi::FUSE_INIT;
pub const OP_INTERRUPT: u32 = abi::FUSE_INTERRUPT;
pub const OP_BATCH_FORGET: u32 = abi::FUSE_BATCH_FORGET;

/// INIT flags in `fuse_init_out.flags` (the low 32 bits).
pub const FUSE_MAX_PAGES: u32 = abi::FUSE_MAX_PAGES as u32;
pub const FUSE_INIT_EXT: u32 = abi::FUSE_INIT_EXT as u32;
/// INIT flags in `fuse_init_out.flags2` (the high 32 bits).
pub const FUSE_PASSTHROUGH_2: u32 = (abi::FUSE_PASSTHROUGH >> 32) as u32;
pub const FUSE_OVER_IO_URING_2: u32 = (abi::FUSE_OVER_IO_URING >> 32) as u32;

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}
