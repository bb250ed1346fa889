//! The FUSE wire protocol: the kernel's structures, requests decoded from
//! bytes, replies encoded to bytes. No I/O here (see `transport`).
//!
//! safs speaks protocol 7.36 or later (Linux 5.17+): `request` decodes the
//! structure sizes of those versions only (INIT excepted, so that an older
//! kernel can be refused by name).

pub mod abi;
pub mod reply;
pub mod request;
