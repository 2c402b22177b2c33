//! Signed requests: how a miner or validator proves that an HTTP request (its method, path and
//! body) comes from its hotkey, for one orchestrator, recently.
//!
//! Pure functions over bytes: the HTTP layer copies the four headers in and out.
//!
//! # Format
//!
//! ```text
//! message   = METHOD " " path "." hex(sha256(body)) "." timestamp_ms "." signed_for
//!             e.g. "POST /api/work.e3b0c442...b855.1767225600000.local-tiny"
//!             (METHOD upper case as sent; path is the request target's path and query as sent,
//!             starting with "/"; lowercase hex, 64 digits; timestamp in decimal milliseconds
//!             since the Unix epoch,
//!             canonical: ASCII digits only, no sign, no leading zero, no whitespace;
//!             signed_for is the orchestrator's SS58 address or the run name)
//! signature = sr25519(hotkey, context b"substrate", message)
//!
//! X-Iota-Signature:  0x + 128 hex digits (the 64-byte signature)
//! X-Iota-Timestamp:  timestamp_ms
//! X-Iota-Hotkey:     the signer's SS58 address (prefix 42)
//! X-Iota-Signed-For: signed_for
//! ```
//!
//! The verifier rebuilds the message from the method, path and body it received and the
//! `signed_for` it expects, so a request signed for another orchestrator or run, or for another
//! endpoint (a signed heartbeat body presented to `/api/submit`), never verifies here. Timestamps
//! are milliseconds on both sides (the reference compared milliseconds with seconds).
//! Replays within the freshness window are the server's to refuse, keyed by [`signature_id`].

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::keys::{Hotkey, Sr25519Signature, strip_0x, verify};
use super::ss58::Ss58Address;

/// Header carrying the `0x`-hex signature.
pub const HEADER_SIGNATURE: &str = "X-Iota-Signature";
/// Header carrying the signing time in milliseconds since the Unix epoch.
pub const HEADER_TIMESTAMP: &str = "X-Iota-Timestamp";
/// Header carrying the signer's SS58 address.
pub const HEADER_HOTKEY: &str = "X-Iota-Hotkey";
/// Header carrying who the request is for (orchestrator address or run name).
pub const HEADER_SIGNED_FOR: &str = "X-Iota-Signed-For";

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SignatureError {
    /// A header is missing or cannot be parsed.
    #[error("malformed {header} header: {reason}")]
    Malformed {
        /// The header's name.
        header: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The timestamp is further than `max_age_ms` from the server's clock, either way.
    #[error(
        "stale request: signed at {timestamp_ms} ms, server time {now_ms} ms, \
         allowed skew {max_age_ms} ms (check the clock; timestamps are milliseconds)"
    )]
    Stale {
        /// The request's timestamp.
        timestamp_ms: u64,
        /// The verifier's clock.
        now_ms: u64,
        /// The allowed difference.
        max_age_ms: u64,
    },
    /// The request was signed for another orchestrator or run.
    #[error("request signed for {got:?}, but this server is {expected:?}")]
    WrongRecipient {
        /// What this server expects.
        expected: String,
        /// What the request names.
        got: String,
    },
    /// The signature does not match the method, path, body, timestamp, target and hotkey.
    #[error(
        "bad signature: it does not match the method, path, body, timestamp, target and hotkey"
    )]
    BadSignature,
}

/// The four authentication headers of a signed request, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders {
    /// `X-Iota-Signature`: `0x`-hex sr25519 signature.
    pub signature: String,
    /// `X-Iota-Timestamp`: decimal milliseconds since the Unix epoch.
    pub timestamp_ms: String,
    /// `X-Iota-Hotkey`: the signer's SS58 address.
    pub hotkey: String,
    /// `X-Iota-Signed-For`: orchestrator address or run name.
    pub signed_for: String,
}

impl SignedHeaders {
    /// `(name, value)` pairs ready to add to an HTTP request.
    pub fn to_pairs(&self) -> [(&'static str, &str); 4] {
        [
            (HEADER_SIGNATURE, self.signature.as_str()),
            (HEADER_TIMESTAMP, self.timestamp_ms.as_str()),
            (HEADER_HOTKEY, self.hotkey.as_str()),
            (HEADER_SIGNED_FOR, self.signed_for.as_str()),
        ]
    }

    /// Collects the headers through `get(name)` (e.g. a lookup in an HTTP header map).
    ///
    /// # Errors
    /// [`SignatureError::Malformed`] naming the first missing header.
    pub fn from_lookup<'a>(
        mut get: impl FnMut(&'static str) -> Option<&'a str>,
    ) -> Result<SignedHeaders, SignatureError> {
        let mut take = |header: &'static str| {
            get(header)
                .map(str::to_string)
                .ok_or(SignatureError::Malformed {
                    header,
                    reason: "missing".to_string(),
                })
        };
        Ok(SignedHeaders {
            signature: take(HEADER_SIGNATURE)?,
            timestamp_ms: take(HEADER_TIMESTAMP)?,
            hotkey: take(HEADER_HOTKEY)?,
            signed_for: take(HEADER_SIGNED_FOR)?,
        })
    }
}

/// What a signature says about the HTTP request itself: its method and its path (with the
/// query, as sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLine<'a> {
    /// `GET`, `POST`, ... (upper case).
    pub method: &'a str,
    /// The request target's path and query, starting with `/`.
    pub path: &'a str,
}

impl<'a> RequestLine<'a> {
    /// A `POST` to `path`.
    pub fn post(path: &'a str) -> Self {
        Self {
            method: "POST",
            path,
        }
    }
}

/// The exact bytes that are signed (see the module's `# Format`).
pub fn signing_message(
    line: RequestLine<'_>,
    body: &[u8],
    timestamp_ms: u64,
    signed_for: &str,
) -> String {
    format!(
        "{} {}.{}.{}.{}",
        line.method,
        line.path,
        hex::encode(Sha256::digest(body)),
        timestamp_ms,
        signed_for
    )
}

/// Signs a request (`line` and `body`) for `signed_for` at `timestamp_ms` with `key`.
pub fn sign_request(
    key: &Hotkey,
    line: RequestLine<'_>,
    body: &[u8],
    timestamp_ms: u64,
    signed_for: &str,
) -> SignedHeaders {
    let signature = key.sign(signing_message(line, body, timestamp_ms, signed_for).as_bytes());
    SignedHeaders {
        signature: signature.to_hex(),
        timestamp_ms: timestamp_ms.to_string(),
        hotkey: key.address().to_string(),
        signed_for: signed_for.to_string(),
    }
}

/// Verifies a signed request and returns the signer's address.
///
/// The request must be signed for `signed_for` (this server), its timestamp must lie within
/// `max_age_ms` of `now_ms` in either direction, and the signature must cover `line` (the
/// method and path the server received) and `body`.
/// Replay detection is the caller's job: after success, refuse a [`signature_id`] seen within
/// the last `2 * max_age_ms`.
///
/// # Errors
/// [`SignatureError::Malformed`] for an unparsable header, [`SignatureError::WrongRecipient`],
/// [`SignatureError::Stale`], or [`SignatureError::BadSignature`].
pub fn verify_request(
    headers: &SignedHeaders,
    line: RequestLine<'_>,
    body: &[u8],
    now_ms: u64,
    max_age_ms: u64,
    signed_for: &str,
) -> Result<Ss58Address, SignatureError> {
    let hotkey: Ss58Address =
        headers
            .hotkey
            .trim()
            .parse()
            .map_err(|e: super::ss58::Ss58Error| SignatureError::Malformed {
                header: HEADER_HOTKEY,
                reason: e.to_string(),
            })?;
    let timestamp_ms =
        canonical_timestamp(&headers.timestamp_ms).ok_or_else(|| SignatureError::Malformed {
            header: HEADER_TIMESTAMP,
            reason: format!(
                "{:?} is not a whole number of milliseconds in canonical form (decimal digits, \
                 no sign, no leading zero, no spaces)",
                headers.timestamp_ms
            ),
        })?;
    let signature = Sr25519Signature::from_hex(&headers.signature).ok_or_else(|| {
        SignatureError::Malformed {
            header: HEADER_SIGNATURE,
            reason: "expected 0x followed by 128 hex digits".to_string(),
        }
    })?;
    if headers.signed_for != signed_for {
        return Err(SignatureError::WrongRecipient {
            expected: signed_for.to_string(),
            got: headers.signed_for.clone(),
        });
    }
    if timestamp_ms.abs_diff(now_ms) > max_age_ms {
        return Err(SignatureError::Stale {
            timestamp_ms,
            now_ms,
            max_age_ms,
        });
    }
    let message = signing_message(line, body, timestamp_ms, signed_for);
    if verify(hotkey.public_key(), message.as_bytes(), &signature) {
        Ok(hotkey)
    } else {
        Err(SignatureError::BadSignature)
    }
}

/// The timestamp `text` spells, if it is spelled the one canonical way: `0`, or ASCII digits
/// without a leading zero, fitting a `u64`. Every other spelling (`+1`, `01`, ` 1`) is refused,
/// so one signature cannot be presented as several different requests.
pub fn canonical_timestamp(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !canonical {
        return None;
    }
    text.parse().ok()
}

/// A stable key for a replay cache: the same for a byte-identical replay however its headers
/// are spelled (case of hex, `0x`, whitespace), different for every fresh signature, since
/// sr25519 signatures are randomised.
///
/// Format: lowercase hex of `sha256(hotkey "\n" timestamp "\n" signature hex)`.
pub fn signature_id(headers: &SignedHeaders) -> String {
    let normalized = format!(
        "{}\n{}\n{}",
        headers.hotkey.trim(),
        // The number, not its spelling (`u64::from_str` also reads `+5` and `005` as 5).
        headers.timestamp_ms.trim().parse::<u64>().map_or_else(
            |_| headers.timestamp_ms.trim().to_string(),
            |t| t.to_string()
        ),
        strip_0x(headers.signature.trim()).to_ascii_lowercase()
    );
    hex::encode(Sha256::digest(normalized.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORCH: &str = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty";
    const NOW: u64 = 1_767_225_600_000;
    const MAX_AGE: u64 = 30_000;
    const L: RequestLine<'static> = RequestLine {
        method: "POST",
        path: "/api/work",
    };

    fn alice() -> Hotkey {
        Hotkey::from_uri("//Alice").unwrap()
    }

    #[test]
    fn message_layout_is_as_documented() {
        // sha256("") is the well-known e3b0c442...b855.
        assert_eq!(
            signing_message(RequestLine::post("/api/register"), b"", 1234, "run-1"),
            "POST /api/register.\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.1234.run-1"
        );
    }

    #[test]
    fn a_signature_is_bound_to_its_method_and_path() {
        let headers = sign_request(&alice(), L, b"{}", NOW, ORCH);
        assert!(verify_request(&headers, L, b"{}", NOW, MAX_AGE, ORCH).is_ok());
        for other in [
            RequestLine::post("/api/heartbeat"),
            RequestLine::post("/api/work?x=1"),
            RequestLine {
                method: "PUT",
                path: "/api/work",
            },
        ] {
            assert_eq!(
                verify_request(&headers, other, b"{}", NOW, MAX_AGE, ORCH),
                Err(SignatureError::BadSignature),
                "{other:?}"
            );
        }
    }

    #[test]
    fn round_trip_verifies_and_names_the_signer() {
        let key = alice();
        let body = br#"{"section":1}"#;
        let headers = sign_request(&key, L, body, NOW, ORCH);
        assert_eq!(headers.hotkey, key.address().as_str());
        assert_eq!(headers.timestamp_ms, NOW.to_string());
        assert!(headers.signature.starts_with("0x") && headers.signature.len() == 130);
        let who = verify_request(&headers, L, body, NOW + 1_000, MAX_AGE, ORCH).unwrap();
        assert_eq!(&who, key.address());

        let pairs = headers.to_pairs();
        let back = SignedHeaders::from_lookup(|name| {
            pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        })
        .unwrap();
        assert_eq!(back, headers);
    }

    #[test]
    fn tampering_is_detected() {
        let body = b"payload bytes".to_vec();
        let headers = sign_request(&alice(), L, &body, NOW, ORCH);

        let mut bad_body = body.clone();
        bad_body[0] ^= 1;
        assert_eq!(
            verify_request(&headers, L, &bad_body, NOW, MAX_AGE, ORCH),
            Err(SignatureError::BadSignature)
        );

        for at in [2, 40, 129] {
            let mut sig = headers.clone();
            let mut chars: Vec<char> = sig.signature.chars().collect();
            chars[at] = if chars[at] == '0' { '1' } else { '0' };
            sig.signature = chars.into_iter().collect();
            assert_eq!(
                verify_request(&sig, L, &body, NOW, MAX_AGE, ORCH),
                Err(SignatureError::BadSignature),
                "signature char {at}"
            );
        }

        let mut ts = headers.clone();
        ts.timestamp_ms = (NOW + 1).to_string();
        assert_eq!(
            verify_request(&ts, L, &body, NOW, MAX_AGE, ORCH),
            Err(SignatureError::BadSignature)
        );

        // Another hotkey's address in place of the signer's.
        let mut who = headers.clone();
        who.hotkey = ORCH.to_string();
        assert_eq!(
            verify_request(&who, L, &body, NOW, MAX_AGE, ORCH),
            Err(SignatureError::BadSignature)
        );
    }

    #[test]
    fn wrong_recipient_is_refused() {
        let headers = sign_request(&alice(), L, b"x", NOW, "run-a");
        assert_eq!(
            verify_request(&headers, L, b"x", NOW, MAX_AGE, "run-b"),
            Err(SignatureError::WrongRecipient {
                expected: "run-b".into(),
                got: "run-a".into()
            })
        );
        // Rewriting the header to match does not help: the signature covers it.
        let mut forged = headers.clone();
        forged.signed_for = "run-b".into();
        assert_eq!(
            verify_request(&forged, L, b"x", NOW, MAX_AGE, "run-b"),
            Err(SignatureError::BadSignature)
        );
    }

    #[test]
    fn stale_and_future_timestamps_are_refused() {
        let key = alice();
        let at_edge = sign_request(&key, L, b"x", NOW - MAX_AGE, ORCH);
        assert!(verify_request(&at_edge, L, b"x", NOW, MAX_AGE, ORCH).is_ok());
        let old = sign_request(&key, L, b"x", NOW - MAX_AGE - 1, ORCH);
        assert_eq!(
            verify_request(&old, L, b"x", NOW, MAX_AGE, ORCH),
            Err(SignatureError::Stale {
                timestamp_ms: NOW - MAX_AGE - 1,
                now_ms: NOW,
                max_age_ms: MAX_AGE
            })
        );
        let future = sign_request(&key, L, b"x", NOW + MAX_AGE + 1, ORCH);
        assert!(matches!(
            verify_request(&future, L, b"x", NOW, MAX_AGE, ORCH),
            Err(SignatureError::Stale { .. })
        ));
        // A timestamp in seconds instead of milliseconds is stale, not accepted.
        let seconds = sign_request(&key, L, b"x", NOW / 1000, ORCH);
        assert!(matches!(
            verify_request(&seconds, L, b"x", NOW, MAX_AGE, ORCH),
            Err(SignatureError::Stale { .. })
        ));
    }

    #[test]
    fn malformed_headers_are_named() {
        let good = sign_request(&alice(), L, b"x", NOW, ORCH);
        let cases = [
            (HEADER_HOTKEY, {
                let mut h = good.clone();
                h.hotkey = "5Grwva".into();
                h
            }),
            (HEADER_TIMESTAMP, {
                let mut h = good.clone();
                h.timestamp_ms = "12.5".into();
                h
            }),
            (HEADER_SIGNATURE, {
                let mut h = good.clone();
                h.signature = "0xzz".into();
                h
            }),
        ];
        for (expected, headers) in cases {
            match verify_request(&headers, L, b"x", NOW, MAX_AGE, ORCH) {
                Err(SignatureError::Malformed { header, .. }) => assert_eq!(header, expected),
                other => panic!("{expected}: expected Malformed, got {other:?}"),
            }
        }
        let missing = SignedHeaders::from_lookup(|name| (name != HEADER_TIMESTAMP).then_some("v"));
        assert!(matches!(
            missing,
            Err(SignatureError::Malformed {
                header: HEADER_TIMESTAMP,
                ..
            })
        ));
    }

    #[test]
    fn signature_id_is_stable_and_distinct() {
        let key = alice();
        let a = sign_request(&key, L, b"x", NOW, ORCH);
        let b = sign_request(&key, L, b"x", NOW, ORCH);
        // Same request signed twice: randomised signatures, different ids.
        assert_ne!(signature_id(&a), signature_id(&b));
        // A replay with the hex re-spelled maps to the same id.
        let mut respelled = a.clone();
        respelled.signature = format!(" 0X{} ", a.signature[2..].to_uppercase());
        assert_eq!(signature_id(&respelled), signature_id(&a));
        assert!(verify_request(&respelled, L, b"x", NOW, MAX_AGE, ORCH).is_ok());
        assert_eq!(signature_id(&a).len(), 64);
    }

    /// The replay bypass found from outside: the same signature with its timestamp spelled
    /// `0<ts>`, `+<ts>` or `00<ts>` used to verify as a new request. Only the canonical
    /// spelling verifies now, and every spelling maps to one replay id.
    #[test]
    fn respelled_timestamps_are_refused_and_share_the_replay_id() {
        let key = alice();
        let a = sign_request(&key, L, b"x", NOW, ORCH);
        assert!(verify_request(&a, L, b"x", NOW, MAX_AGE, ORCH).is_ok());
        for spelled in [
            format!("0{NOW}"),
            format!("+{NOW}"),
            format!("00{NOW}"),
            format!(" {NOW}"),
            format!("{NOW} "),
            format!("{NOW}.0"),
            String::new(),
        ] {
            let mut h = a.clone();
            h.timestamp_ms = spelled.clone();
            assert!(
                matches!(
                    verify_request(&h, L, b"x", NOW, MAX_AGE, ORCH),
                    Err(SignatureError::Malformed {
                        header: HEADER_TIMESTAMP,
                        ..
                    })
                ),
                "{spelled:?} was not refused"
            );
        }
        for spelled in [format!("0{NOW}"), format!(" {NOW} ")] {
            let mut h = a.clone();
            h.timestamp_ms = spelled;
            assert_eq!(signature_id(&h), signature_id(&a));
        }
        assert_eq!(canonical_timestamp("0"), Some(0));
        assert_eq!(canonical_timestamp("10"), Some(10));
        assert_eq!(canonical_timestamp("010"), None);
        assert_eq!(canonical_timestamp("99999999999999999999999"), None);
    }
}
