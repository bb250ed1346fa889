//! Core errors: POSIX outcomes as variants, corruption and I/O kept whole.

use thiserror::Error;

use crate::format::FormatError;
use crate::meta::MetaError;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoreError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("no such attribute")]
    NoData,
    #[error("result does not fit the buffer")]
    Range,
    #[error("value too large")]
    TooBig,
    #[error("no space left on device")]
    NoSpace,
    #[error("operation not permitted")]
    Perm,
    #[error("permission denied")]
    Access,
    #[error("invalid argument")]
    Invalid,
    #[error("operation not supported")]
    NotSupported,
    #[error("bad file handle")]
    BadHandle,
    /// What the kernel cached is stale: it looks the path up again and
    /// retries (ESTALE makes the VFS redo an open with revalidation).
    #[error("stale cached entry")]
    Stale,
    #[error("read-only file system")]
    ReadOnly,
    #[error("too many links")]
    TooManyLinks,
    /// A directory's quota (`safs.quota.*`) would be passed.
    #[error("disk quota exceeded")]
    Quota,
    /// A record failed its checksum or did not decode: never served.
    #[error("corrupt record {key}: {source}")]
    Corrupt { key: String, source: FormatError },
    #[error("metadata engine: {0}")]
    Meta(MetaError),
    /// An encrypted volume opened without its keys, or the reverse.
    #[error("{0}")]
    Keys(&'static str),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The object store holding the contents failed (see `remote`).
    #[error("object store: {0}")]
    Store(crate::objstore::StoreError),
}

impl From<MetaError> for CoreError {
    fn from(e: MetaError) -> Self {
        match e {
            MetaError::NoSpace => CoreError::NoSpace,
            other => CoreError::Meta(other),
        }
    }
}

impl CoreError {
    /// Builds the corruption error for the record under `key`, logging it
    /// once here so every corrupt read leaves a line naming the record.
    pub fn corrupt(key: &[u8], source: FormatError) -> Self {
        let key = describe_key(key);
        tracing::error!(%key, %source, "corrupt metadata record");
        CoreError::Corrupt { key, source }
    }

    /// The errno this error stands for.
    pub fn errno(&self) -> i32 {
        use CoreError::*;
        match self {
            NotFound => libc::ENOENT,
            Exists => libc::EEXIST,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            NotEmpty => libc::ENOTEMPTY,
            NameTooLong => libc::ENAMETOOLONG,
            NoData => libc::ENODATA,
            Range => libc::ERANGE,
            TooBig => libc::E2BIG,
            NoSpace => libc::ENOSPC,
            Perm => libc::EPERM,
            Access => libc::EACCES,
            Invalid => libc::EINVAL,
            NotSupported => libc::EOPNOTSUPP,
            BadHandle => libc::EBADF,
            Stale => libc::ESTALE,
            ReadOnly => libc::EROFS,
            TooManyLinks => libc::EMLINK,
            Quota => libc::EDQUOT,
            Corrupt { .. } | Meta(_) => libc::EIO,
            Keys(_) => libc::EINVAL,
            Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Store(_) => libc::EIO,
        }
    }
}

/// A readable rendering of a key for logs: prefix letter, inode, rest.
pub fn describe_key(key: &[u8]) -> String {
    match (key.first(), crate::format::keys::key_ino(key)) {
        (Some(p), Some(ino)) => {
            let rest = &key[9..];
            if rest.is_empty() {
                format!("{}{}", *p as char, ino)
            } else if *p == crate::format::keys::P_SPILL && rest.len() == 1 {
                format!("S{ino} page {}", rest[0])
            } else {
                format!("{}{}/{}", *p as char, ino, String::from_utf8_lossy(rest))
            }
        }
        _ => String::from_utf8_lossy(key).into_owned(),
    }
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
