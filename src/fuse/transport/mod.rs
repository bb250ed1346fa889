//! Moving requests and replies between the kernel and the daemon: the
//! mount, `/dev/fuse`, and FUSE over io_uring. No protocol decoding beyond
//! the request header here (see `proto`).
