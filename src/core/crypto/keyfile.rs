//! The key record `K`: the volume's master key, wrapped by a key derived
//! from the passphrase. One record, so changing the passphrase is one
//! atomic commit.
//!
//! ```text
//! offset size  field
//!      0    1  version (1)
//!      1    4  Argon2id memory, KiB (u32 BE)
//!      5    4  Argon2id passes
//!      9    4  Argon2id lanes
//!     13   16  salt (random)
//!     29   12  nonce (random)
//!     41   48  master key (32 B) sealed with AES-256-GCM under the derived
//!              key, associated data "safs volume key v1" ‖ volume uuid
//!     89    4  CRC-32C of bytes 0..89 (damage is told from a wrong
//!              passphrase)
//! ```

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use argon2::{Algorithm, Argon2, Params, Version};
use zeroize::Zeroizing;

use super::{CryptoError, random};

const VERSION: u8 = 1;
const LEN: usize = 93;
const AAD_LABEL: &[u8] = b"safs volume key v1";

/// Argon2id's cost, stored with the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    pub m_kib: u32,
    pub t: u32,
    pub p: u32,
}

impl KdfParams {
    /// Cheap parameters, for tests only.
    pub const TESTING: KdfParams = KdfParams {
        m_kib: 8 * 1024,
        t: 1,
        p: 1,
    };

    fn derive(
        &self,
        passphrase: &[u8],
        salt: &[u8; 16],
    ) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
        let params = Params::new(self.m_kib, self.t, self.p, Some(32))
            .map_err(|e| CryptoError::Kdf(e.to_string()))?;
        let mut out = Zeroizing::new([0u8; 32]);
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password_into(passphrase, salt, out.as_mut())
            .map_err(|e| CryptoError::Kdf(e.to_string()))?;
        Ok(out)
    }
}

/// Parameters that take about `target` to derive a key on this machine:
/// 64 MiB of memory, one lane, as many passes as fit (1 to 32). Timed as a
/// derivation is run at unlock (fresh memory each time): one pass and three
/// passes, the difference giving a pass's cost and the rest the set-up.
pub fn tune_kdf(target: std::time::Duration) -> KdfParams {
    let probe = KdfParams {
        m_kib: 64 * 1024,
        t: 1,
        p: 1,
    };
    let time = |t: u32| {
        let start = std::time::Instant::now();
        let _ = KdfParams { t, ..probe }.derive(b"tuning", &[0u8; 16]);
        start.elapsed().as_secs_f64()
    };
    time(1); // the process's first big allocation costs more than any later
    let one = time(1);
    let three = time(3);
    let per_pass = ((three - one) / 2.0).max(1e-3);
    let setup = (one - per_pass).max(0.0);
    let t = ((target.as_secs_f64() - setup) / per_pass)
        .round()
        .clamp(1.0, 32.0) as u32;
    KdfParams { t, ..probe }
}

/// The decoded `K` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub kdf: KdfParams,
    salt: [u8; 16],
    nonce: [u8; 12],
    wrapped: [u8; 48],
}

impl KeyRecord {
    /// Wraps `master` for volume `uuid` under `passphrase`.
    pub fn wrap(
        master: &[u8; 32],
        passphrase: &[u8],
        kdf: KdfParams,
        uuid: &[u8; 16],
    ) -> Result<KeyRecord, CryptoError> {
        let mut salt = [0u8; 16];
        let mut nonce = [0u8; 12];
        random(&mut salt)?;
        random(&mut nonce)?;
        let kek = kdf.derive(passphrase, &salt)?;
        let aad = [AAD_LABEL, uuid.as_slice()].concat();
        let ct = Aes256Gcm::new(kek.as_ref().into())
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: master,
                    aad: &aad,
                },
            )
            .map_err(|_| CryptoError::BadKeyRecord("cannot seal"))?;
        let wrapped: [u8; 48] = ct
            .try_into()
            .map_err(|_| CryptoError::BadKeyRecord("sealed key of the wrong size"))?;
        Ok(KeyRecord {
            kdf,
            salt,
            nonce,
            wrapped,
        })
    }

    /// The master key, if `passphrase` is the volume's.
    pub fn unwrap(
        &self,
        passphrase: &[u8],
        uuid: &[u8; 16],
    ) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
        let kek = self.kdf.derive(passphrase, &self.salt)?;
        let aad = [AAD_LABEL, uuid.as_slice()].concat();
        let plain = Zeroizing::new(
            Aes256Gcm::new(kek.as_ref().into())
                .decrypt(
                    Nonce::from_slice(&self.nonce),
                    Payload {
                        msg: &self.wrapped,
                        aad: &aad,
                    },
                )
                .map_err(|_| CryptoError::WrongPassphrase)?,
        );
        let mut master = Zeroizing::new([0u8; 32]);
        master.copy_from_slice(&plain);
        Ok(master)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.push(VERSION);
        b.extend_from_slice(&self.kdf.m_kib.to_be_bytes());
        b.extend_from_slice(&self.kdf.t.to_be_bytes());
        b.extend_from_slice(&self.kdf.p.to_be_bytes());
        b.extend_from_slice(&self.salt);
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.wrapped);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<KeyRecord, CryptoError> {
        if b.len() != LEN {
            return Err(CryptoError::BadKeyRecord("wrong length"));
        }
        let crc = u32::from_be_bytes(b[89..93].try_into().expect("4 bytes"));
        if crc32c::crc32c(&b[..89]) != crc {
            return Err(CryptoError::BadKeyRecord("checksum mismatch"));
        }
        if b[0] != VERSION {
            return Err(CryptoError::BadKeyRecord("unknown version"));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(KeyRecord {
            kdf: KdfParams {
                m_kib: u32_at(1),
                t: u32_at(5),
                p: u32_at(9),
            },
            salt: b[13..29].try_into().expect("16 bytes"),
            nonce: b[29..41].try_into().expect("12 bytes"),
            wrapped: b[41..89].try_into().expect("48 bytes"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_unwrap_and_refuse() {
        let master = [5u8; 32];
        let uuid = [1u8; 16];
        let rec = KeyRecord::wrap(&master, b"correct horse", KdfParams::TESTING, &uuid).unwrap();
        let bytes = rec.encode();
        assert_eq!(bytes.len(), LEN);
        let back = KeyRecord::decode(&bytes).unwrap();
        assert_eq!(back, rec);
        assert_eq!(*back.unwrap(b"correct horse", &uuid).unwrap(), master);
        assert!(matches!(
            back.unwrap(b"wrong", &uuid),
            Err(CryptoError::WrongPassphrase)
        ));
        assert!(matches!(
            back.unwrap(b"correct horse", &[2u8; 16]),
            Err(CryptoError::WrongPassphrase)
        ));
        let mut damaged = bytes.clone();
        damaged[50] ^= 1;
        assert!(matches!(
            KeyRecord::decode(&damaged),
            Err(CryptoError::BadKeyRecord(_))
        ));
        assert!(!bytes.windows(32).any(|w| w == master), "no plain key");
    }
}
