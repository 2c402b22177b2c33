//! Signed, expiring tokens for the orchestrator's own `/blob/{key}` endpoint (local-directory
//! storage): `sig = hex(BLAKE3-keyed(secret, "GET\nkey\nexp"))` for a download and
//! `hex(BLAKE3-keyed(secret, "PUT\nkey\nexp\nmax"))` for an upload of at most `max` bytes, so a
//! token names one method, one object, one expiry (and one size limit), and cannot be forged
//! without the secret kept in `data_dir`. The same secret keys the draws that place new
//! keys in sections ([`BlobSecret::placement_draw`]).

use std::path::Path;

/// Length of the server secret.
pub const SECRET_LEN: usize = 32;

/// The server's blob secret.
#[derive(Clone)]
pub struct BlobSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for BlobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlobSecret(..)")
    }
}

impl BlobSecret {
    /// A secret from raw bytes (tests).
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        Self(bytes)
    }

    /// Reads the hex secret at `path`, or creates a random one there.
    ///
    /// # Errors
    /// An I/O error, or a file that does not hold 64 hex digits.
    pub fn load_or_create(path: &Path) -> std::io::Result<Self> {
        if path.exists() {
            let text = std::fs::read_to_string(path)?;
            let bytes = hex::decode(text.trim()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{path:?}: {e}"))
            })?;
            let bytes: [u8; SECRET_LEN] = bytes.try_into().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{path:?}: expected {SECRET_LEN} bytes of hex"),
                )
            })?;
            return Ok(Self(bytes));
        }
        let bytes: [u8; SECRET_LEN] = rand::random();
        // Created owner-only from the first byte (never world-readable, even for an instant),
        // and never over an existing file.
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path)?;
        std::io::Write::write_all(&mut file, hex::encode(bytes).as_bytes())?;
        file.sync_all()?;
        Ok(Self(bytes))
    }

    fn mac(&self, method: &str, key: &str, exp_ms: u64, max_bytes: Option<u64>) -> blake3::Hash {
        let message = match max_bytes {
            Some(max) => format!("{method}\n{key}\n{exp_ms}\n{max}"),
            None => format!("{method}\n{key}\n{exp_ms}"),
        };
        blake3::keyed_hash(&self.0, message.as_bytes())
    }

    /// The draw that places a new key from `source` (an address, as the new-key limit counts
    /// it) among the sections tied for it (`repo::Placement::Draw`):
    /// `BLAKE3-keyed(secret, "PLACE\nsource")`. Nobody without the secret can tell where a
    /// key will go, and every key from one source draws the same, so fresh keys do not re-roll.
    pub fn placement_draw(&self, source: &str) -> u64 {
        let h = blake3::keyed_hash(&self.0, format!("PLACE\n{source}").as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&h.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }

    /// The token for `method` (`GET`/`PUT`) on `key` until `exp_ms`; `max_bytes` is the largest
    /// body an upload may carry (uploads must have one, downloads have none).
    pub fn sign(&self, method: &str, key: &str, exp_ms: u64, max_bytes: Option<u64>) -> String {
        self.mac(method, key, exp_ms, max_bytes)
            .to_hex()
            .to_string()
    }

    /// Whether `sig` is the token for `method` on `key` until `exp_ms` with the size limit
    /// `max_bytes`, and `exp_ms` has not passed at `now_ms`. The comparison is constant-time.
    pub fn verify(
        &self,
        method: &str,
        key: &str,
        exp_ms: u64,
        max_bytes: Option<u64>,
        sig: &str,
        now_ms: u64,
    ) -> bool {
        if now_ms > exp_ms {
            return false;
        }
        let Ok(given) = blake3::Hash::from_hex(sig) else {
            return false;
        };
        self.mac(method, key, exp_ms, max_bytes) == given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bind_method_key_and_expiry() {
        let s = BlobSecret::from_bytes([7; SECRET_LEN]);
        let t = s.sign("GET", "runs/r/a", 1000, None);
        assert_eq!(t.len(), 64);
        assert!(s.verify("GET", "runs/r/a", 1000, None, &t, 999));
        assert!(s.verify("GET", "runs/r/a", 1000, None, &t, 1000));
        assert!(
            !s.verify("GET", "runs/r/a", 1000, None, &t, 1001),
            "expired"
        );
        assert!(
            !s.verify("PUT", "runs/r/a", 1000, None, &t, 0),
            "other method"
        );
        assert!(!s.verify("GET", "runs/r/b", 1000, None, &t, 0), "other key");
        assert!(
            !s.verify("GET", "runs/r/a", 2000, None, &t, 0),
            "other expiry"
        );
        assert!(!s.verify("GET", "runs/r/a", 1000, None, "zz", 0), "not hex");
        let other = BlobSecret::from_bytes([8; SECRET_LEN]);
        assert!(
            !other.verify("GET", "runs/r/a", 1000, None, &t, 0),
            "other secret"
        );
    }

    #[test]
    fn an_upload_token_binds_its_size_limit() {
        let s = BlobSecret::from_bytes([7; SECRET_LEN]);
        let t = s.sign("PUT", "runs/r/a", 1000, Some(64));
        assert!(s.verify("PUT", "runs/r/a", 1000, Some(64), &t, 0));
        assert!(
            !s.verify("PUT", "runs/r/a", 1000, Some(65), &t, 0),
            "raised limit"
        );
        assert!(
            !s.verify("PUT", "runs/r/a", 1000, None, &t, 0),
            "limit dropped"
        );
    }

    #[test]
    fn secret_persists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob_secret");
        let a = BlobSecret::load_or_create(&path).unwrap();
        let b = BlobSecret::load_or_create(&path).unwrap();
        assert_eq!(a.sign("GET", "k", 1, None), b.sign("GET", "k", 1, None));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "only the owner may read the secret");
        }
    }

    #[cfg(unix)]
    #[test]
    fn the_secret_file_is_created_owner_only_and_never_through_a_planted_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A dangling link planted where the secret goes: the old write-then-chmod followed it
        // and wrote the secret wherever it pointed.
        let planted = dir.path().join("planted");
        let target = dir.path().join("somewhere-readable");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        assert!(BlobSecret::load_or_create(&planted).is_err());
        assert!(!target.exists(), "the secret was written through the link");

        let path = dir.path().join("blob_secret");
        let secret = BlobSecret::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
        let again = BlobSecret::load_or_create(&path).unwrap();
        assert_eq!(
            secret.sign("GET", "k", 1, None),
            again.sign("GET", "k", 1, None)
        );
    }
}
