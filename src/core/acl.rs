//! POSIX ACLs in their xattr form (`system.posix_acl_access`/`_default`).
//!
//! With `FUSE_POSIX_ACL` the kernel enforces and caches ACLs and validates
//! what is set, but two jobs stay with the filesystem (`fs/fuse/acl.c`,
//! `fs/fuse/dir.c`): inheriting a parent's default ACL when an inode is
//! created (`posix_acl_create`), and keeping the access ACL in step with
//! `chmod` (`posix_acl_chmod`). The layout is the kernel's:
//! `version:u32le (2)` then entries of `tag:u16le perm:u16le id:u32le`.

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

fn parse(buf: &[u8]) -> Option<Vec<Entry>> {
    if buf.len() < 4 || (buf.len() - 4) % 8 != 0 {
        return None;
    }
    if u32::from_le_bytes(buf[..4].try_into().ok()?) != VERSION {
        return None;
    }
    Some(
        buf[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect(),
    )
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * entries.len());
    out.extend_from_slice(&VERSION.to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

/// What a new inode gets from its parent's default ACL.
#[derive(Debug, PartialEq, Eq)]
pub struct Inherited {
    /// The creation mode masked by the ACL (type and special bits kept).
    pub mode: u32,
    /// The new inode's access ACL, when the mode alone cannot express it.
    pub access: Option<Vec<u8>>,
    /// The new directory's default ACL (a copy of the parent's).
    pub default: Option<Vec<u8>>,
}

/// `posix_acl_create`: the parent's default ACL, masked by the requested
/// `mode`, becomes the new inode's access ACL. Returns `None` when the
/// default ACL does not parse (the caller then applies the umask).
pub fn inherit(parent_default: &[u8], mode: u32, is_dir: bool) -> Option<Inherited> {
    let mut acl = parse(parent_default)?;
    let mut m = mode & 0o777;
    let mut not_equiv = false;
    let mut group_obj = None;
    let mut mask_obj = None;
    for (i, e) in acl.iter_mut().enumerate() {
        match e.tag {
            USER_OBJ => {
                e.perm &= ((m >> 6) & 7) as u16;
                m &= (u32::from(e.perm) << 6) | 0o077;
            }
            USER | GROUP => not_equiv = true,
            GROUP_OBJ => group_obj = Some(i),
            OTHER => {
                e.perm &= (m & 7) as u16;
                m &= u32::from(e.perm) | 0o770;
            }
            MASK => {
                mask_obj = Some(i);
                not_equiv = true;
            }
            _ => return None,
        }
    }
    let idx = mask_obj.or(group_obj)?;
    acl[idx].perm &= ((m >> 3) & 7) as u16;
    m &= (u32::from(acl[idx].perm) << 3) | 0o707;
    Some(Inherited {
        mode: (mode & !0o777) | m,
        access: not_equiv.then(|| encode(&acl)),
        default: is_dir.then(|| parent_default.to_vec()),
    })
}

/// `posix_acl_equiv_mode`: the permission bits an access ACL implies
/// (owner from the owner entry, group from the mask or else the owning
/// group entry, other), and whether the ACL says nothing beyond them.
pub fn mode_of(access: &[u8]) -> Option<(u32, bool)> {
    let acl = parse(access)?;
    let perm = |tag| {
        acl.iter()
            .find(|e| e.tag == tag)
            .map(|e| u32::from(e.perm & 7))
    };
    let user = perm(USER_OBJ)?;
    let other = perm(OTHER)?;
    let group = perm(MASK).or(perm(GROUP_OBJ))?;
    let equivalent = acl
        .iter()
        .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER));
    Some(((user << 6) | (group << 3) | other, equivalent))
}

/// `posix_acl_chmod`: rewrites the owner, group-class and other entries of an
/// access ACL from `mode`. Returns `None` if the ACL does not parse.
pub fn chmod(access: &[u8], mode: u32) -> Option<Vec<u8>> {
    let mut acl = parse(access)?;
    let has_mask = acl.iter().any(|e| e.tag == MASK);
    for e in &mut acl {
        match e.tag {
            USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
            MASK => e.perm = ((mode >> 3) & 7) as u16,
            GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
            OTHER => e.perm = (mode & 7) as u16,
            _ => {}
        }
    }
    Some(encode(&acl))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        encode(
            &entries
                .iter()
                .map(|&(tag, perm, id)| Entry { tag, perm, id })
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn minimal_default_acl_acts_like_umask() {
        // u::rwx g::r-x o::--- : like umask 027.
        let d = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]);
        let got = inherit(&d, 0o100666, false).unwrap();
        assert_eq!(got.mode, 0o100640);
        assert_eq!(got.access, None);
        assert_eq!(got.default, None);
        let got = inherit(&d, 0o40777, true).unwrap();
        assert_eq!(got.mode, 0o40750);
        assert_eq!(got.default, Some(d));
    }

    #[test]
    fn named_entries_keep_an_access_acl_with_masked_mask() {
        let d = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ]);
        let got = inherit(&d, 0o100644, false).unwrap();
        assert_eq!(got.mode, 0o100644);
        let a = parse(&got.access.unwrap()).unwrap();
        assert_eq!(a.iter().find(|e| e.tag == MASK).unwrap().perm, 4);
        assert_eq!(a.iter().find(|e| e.tag == USER).unwrap().perm, 7);
    }

    #[test]
    fn chmod_rewrites_mask_not_group() {
        let a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 5),
            (GROUP_OBJ, 7, 0),
            (MASK, 7, 0),
            (OTHER, 7, 0),
        ]);
        let b = parse(&chmod(&a, 0o640).unwrap()).unwrap();
        let perm = |t| b.iter().find(|e| e.tag == t).unwrap().perm;
        assert_eq!(
            (perm(USER_OBJ), perm(GROUP_OBJ), perm(MASK), perm(OTHER)),
            (6, 7, 4, 0)
        );
    }

    #[test]
    fn mode_follows_the_mask() {
        let a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 7),
            (GROUP_OBJ, 0, 0),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]);
        assert_eq!(mode_of(&a), Some((0o640, false)));
        let b = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 1, 0)]);
        assert_eq!(mode_of(&b), Some((0o751, true)));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse(b"xx").is_none());
        assert!(inherit(&[2, 0, 0, 0, 1], 0o644, false).is_none());
    }
}
