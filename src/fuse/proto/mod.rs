//! The FUSE wire protocol: the kernel's structures, requests decoded from
//! bytes, replies encoded to bytes. No I/O here (see `transport`).
