//! The key schema. All integers are big-endian so keys sort numerically.
//!
//! | key                               | value (kind)        | what                                   |
//! |-----------------------------------|---------------------|----------------------------------------|
//! | `V`                               | Superblock          | uuid, format version, inline budget    |
//! | `N`                               | Counters            | next inode number, inodes in use       |
//! | `T` dir:u64 session:u64          | DirShare            | one session's share of a directory's statistics, on volumes several daemons serve (see `format::shares`) |
//! | `R` session:u64                   | Session             | one daemon's block of inode numbers and the inodes it made or freed since its count was last folded into `N` (see `format::superblock`) |
//! | `I` ino:u64                       | Inode               | attributes + inline SA xattr area      |
//! | `S` ino:u64 [page:u8]             | Spill               | packed xattrs that missed the inline area, in pages (page 0 without the byte; ≤ 64 KiB in all, see `format::spill`) |
//! | `X` ino:u64 name                  | Overflow            | one xattr value that fits neither      |
//! | `D` parent:u64 name               | Dirent              | name → (ino, type, cookie): lookup     |
//! | `C` parent:u64 cookie:u64         | DirIndex            | cookie → (name, ino, type): readdir    |
//! | `L` ino:u64                       | Symlink             | symlink target                         |
//! | `O` ino:u64                       | Marker              | unlinked while open: reclaim at mount (on PostgreSQL volumes it names the session holding it open) |
//! | `K`                               | KeyRecord           | encrypted volumes: the master key, wrapped by the passphrase (in the clear, as is `V`) |
//! | `M`                               | MountState          | clean or mounted: after an unclean stop, sizes are reconciled from backing files and stray backing files removed |
//! | `W` ino:u64                       | Marker              | retired (open-for-writing marker of early builds); deleted when found |
//! | `U`                               | DataStore           | volumes with contents in an object store: its URL (in the clear) |
//! | `B` ino:u64 block:u32             | BlockRef            | one block of a file's contents in the object store (see `format::blocks`) |
//! | `Q` ino:u64 block:u32 gen:u64     | Marker              | an object no record names any more: deleted from the store once this is durable |
//!
//! Lookup is one point read of `D`; readdir is one range scan of `C` in
//! cookie order, so a cookie handed to the kernel stays valid while the
//! directory changes (btrfs DIR_ITEM + DIR_INDEX). Names are ≤ 255 bytes, so
//! every key stays well under LMDB's 511-byte limit.

pub const SUPERBLOCK: &[u8] = b"V";
pub const COUNTERS: &[u8] = b"N";
pub const MOUNT_STATE: &[u8] = b"M";
/// The wrapped key of an encrypted volume (see `core::crypto`).
pub const KEY_RECORD: &[u8] = b"K";
/// Where the contents are, on volumes formatted with `--data`.
pub const DATA_STORE: &[u8] = b"U";

pub const P_INODE: u8 = b'I';
pub const P_SPILL: u8 = b'S';
pub const P_OVERFLOW: u8 = b'X';
pub const P_DIRENT: u8 = b'D';
pub const P_DIRINDEX: u8 = b'C';
pub const P_SYMLINK: u8 = b'L';
pub const P_ORPHAN: u8 = b'O';
pub const P_WRITING: u8 = b'W';
pub const P_BLOCK: u8 = b'B';
pub const P_DOOMED: u8 = b'Q';
pub const P_SESSION: u8 = b'R';
pub const P_SHARE: u8 = b'T';

/// `prefix ‖ ino`.
pub fn ino_key(prefix: u8, ino: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&ino.to_be_bytes());
    k
}

pub fn inode(ino: u64) -> [u8; 9] {
    ino_key(P_INODE, ino)
}

pub fn spill(ino: u64) -> [u8; 9] {
    ino_key(P_SPILL, ino)
}

/// Page `page` of the spill tier of `ino`: page 0 is the spill record of
/// volumes made before pages, `S ino`; the others carry their number.
pub fn spill_page(ino: u64, page: usize) -> Vec<u8> {
    let mut k = spill(ino).to_vec();
    if page > 0 {
        k.push(page as u8);
    }
    k
}

/// The page number of a spill key (`None`: not a spill key's shape).
pub fn spill_page_of(key: &[u8]) -> Option<usize> {
    match key.len() {
        9 => Some(0),
        10 if key[9] > 0 => Some(usize::from(key[9])),
        _ => None,
    }
}

pub fn symlink(ino: u64) -> [u8; 9] {
    ino_key(P_SYMLINK, ino)
}

/// Session `session`'s share of directory `dir`'s statistics.
pub fn dir_share(dir: u64, session: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..9].copy_from_slice(&ino_key(P_SHARE, dir));
    k[9..].copy_from_slice(&session.to_be_bytes());
    k
}

/// The session of a `T` key.
pub fn share_session(key: &[u8]) -> Option<u64> {
    key.get(9..17)
        .filter(|_| key.len() == 17)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

/// The counters of session `id` (0 on volumes one daemon serves).
pub fn session(id: u64) -> [u8; 9] {
    ino_key(P_SESSION, id)
}

pub fn orphan(ino: u64) -> [u8; 9] {
    ino_key(P_ORPHAN, ino)
}

pub fn writing(ino: u64) -> [u8; 9] {
    ino_key(P_WRITING, ino)
}

/// Block `block` of file `ino` in the object store.
pub fn block(ino: u64, block: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[..9].copy_from_slice(&ino_key(P_BLOCK, ino));
    k[9..].copy_from_slice(&block.to_be_bytes());
    k
}

/// An object to delete: version `gen` of block `block` of file `ino`.
pub fn doomed(ino: u64, block: u32, generation: u64) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[..9].copy_from_slice(&ino_key(P_DOOMED, ino));
    k[9..13].copy_from_slice(&block.to_be_bytes());
    k[13..].copy_from_slice(&generation.to_be_bytes());
    k
}

/// The block number of a `B` or `Q` key.
/// The `Q` record that queues every block of a freed file `ino`: the
/// deleter reads its block records, deletes their objects and then them
/// (a remove then costs no read of the map). Sorts after the file's
/// per-object `Q` records.
pub fn doomed_file(ino: u64) -> [u8; 21] {
    doomed(ino, u32::MAX, u64::MAX)
}

/// Whether `key` is a [`doomed_file`] record.
pub fn is_doomed_file(key: &[u8]) -> bool {
    key.len() == 21 && key[0] == P_DOOMED && key[9..] == [0xff; 12]
}

pub fn key_block(key: &[u8]) -> Option<u32> {
    key.get(9..13)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
}

/// The generation of a `Q` key.
pub fn key_gen(key: &[u8]) -> Option<u64> {
    key.get(13..21)
        .filter(|_| key.len() == 21)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

fn ino_name(prefix: u8, ino: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.extend_from_slice(&ino_key(prefix, ino));
    k.extend_from_slice(name);
    k
}

pub fn overflow(ino: u64, name: &[u8]) -> Vec<u8> {
    ino_name(P_OVERFLOW, ino, name)
}

pub fn dirent(parent: u64, name: &[u8]) -> Vec<u8> {
    ino_name(P_DIRENT, parent, name)
}

pub fn dir_index(parent: u64, cookie: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..9].copy_from_slice(&ino_key(P_DIRINDEX, parent));
    k[9..].copy_from_slice(&cookie.to_be_bytes());
    k
}

/// The half-open key range `[prefix‖ino, prefix‖ino+1)` holding every key of
/// one inode under `prefix`.
pub fn ino_range(prefix: u8, ino: u64) -> (Vec<u8>, Vec<u8>) {
    let start = ino_key(prefix, ino).to_vec();
    let end = match ino.checked_add(1) {
        Some(next) => ino_key(prefix, next).to_vec(),
        None => vec![prefix + 1],
    };
    (start, end)
}

/// The range of all keys starting with `prefix`.
pub fn prefix_range(prefix: u8) -> (Vec<u8>, Vec<u8>) {
    (vec![prefix], vec![prefix + 1])
}

/// Reads the inode number out of a `prefix ‖ ino ‖ …` key.
pub fn key_ino(key: &[u8]) -> Option<u64> {
    key.get(1..9)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

/// The name part of a `D` or `X` key.
pub fn key_name(key: &[u8]) -> &[u8] {
    key.get(9..).unwrap_or(&[])
}

/// The cookie of a `C` key.
pub fn key_cookie(key: &[u8]) -> Option<u64> {
    key.get(9..17)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ino_keys_sort_numerically(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(a.cmp(&b), inode(a).cmp(&inode(b)));
            prop_assert_eq!(a.cmp(&b), dir_index(7, a).cmp(&dir_index(7, b)));
        }

        #[test]
        fn ranges_hold_their_keys(ino in any::<u64>(), name in proptest::collection::vec(any::<u8>(), 0..255)) {
            let (s, e) = ino_range(P_OVERFLOW, ino);
            let k = overflow(ino, &name);
            prop_assert!(s <= k && k < e);
            prop_assert_eq!(key_ino(&k), Some(ino));
            prop_assert_eq!(key_name(&k), &name[..]);
        }
    }
}
