//! A JSON-RPC 2.0 client for a subtensor node, over plain HTTP POST.
//!
//! Substrate nodes answer JSON-RPC over HTTP and WebSocket on the same port, so a `ws://` or
//! `wss://` endpoint is reached as `http://` or `https://` at the same host and port: iota
//! needs no subscription, only requests and answers, and polls for new blocks instead of
//! subscribing to them.
//!
//! The [`super::super::Chain`] trait is synchronous, so this client is too: it owns a small
//! current-thread tokio runtime and blocks on each request. Calling it from inside an async
//! task would block that task's executor thread (and tokio panics when a runtime is blocked on
//! or dropped there): async callers must create, call and drop it inside
//! `tokio::task::spawn_blocking`.
//!
//! Every failure is [`ChainError::Endpoint`], one line: nothing listening, a non-JSON answer, or
//! the node's own error object.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::chain::{ChainError, Network};

/// Bittensor mainnet's public entry point, as the Bittensor SDK names it
/// (`bittensor/core/settings.py`, `FINNEY_ENTRYPOINT`, in `bittensor` 10.5.0 on PyPI).
pub const FINNEY_ENDPOINT: &str = "wss://entrypoint-finney.opentensor.ai:443";

/// Bittensor testnet's public entry point (the same file, `FINNEY_TEST_ENTRYPOINT`).
pub const TEST_ENDPOINT: &str = "wss://test.finney.opentensor.ai:443";

/// How long one request may take before the node counts as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint of `network` as given or as the SDK names it; `None` for [`Network::Local`].
pub fn endpoint_of(network: &Network) -> Option<String> {
    match network {
        Network::Local => None,
        Network::Finney => Some(FINNEY_ENDPOINT.into()),
        Network::Test => Some(TEST_ENDPOINT.into()),
        Network::Url(url) => Some(url.clone()),
    }
}

/// `endpoint` with `ws://` mapped to `http://` and `wss://` to `https://` (same host, port and
/// path); HTTP URLs are kept.
///
/// # Errors
/// A URL of another scheme, or one that does not parse.
pub fn http_url(endpoint: &str) -> Result<reqwest::Url, String> {
    let trimmed = endpoint.trim();
    let mapped = if let Some(rest) = trimmed.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = trimmed.strip_prefix("ws://") {
        format!("http://{rest}")
    } else if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_owned()
    } else {
        return Err("expected a ws://, wss://, http:// or https:// URL".into());
    };
    reqwest::Url::parse(&mapped).map_err(|e| format!("not a URL ({e})"))
}

/// A block header, as far as iota reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The block number.
    pub number: u64,
    /// The parent block's hash.
    pub parent_hash: [u8; 32],
}

/// `state_getRuntimeVersion`, as far as iota reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRuntimeVersion {
    /// `specName`.
    pub spec_name: String,
    /// `specVersion`.
    pub spec_version: u32,
    /// `transactionVersion`.
    pub transaction_version: u32,
}

/// A blocking JSON-RPC client for one node.
#[derive(Debug)]
pub struct RpcClient {
    endpoint: String,
    url: reqwest::Url,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    next_id: AtomicU64,
}

impl RpcClient {
    /// A client for `endpoint` (`ws://`, `wss://`, `http://` or `https://`). Connects lazily:
    /// nothing is sent until the first request.
    ///
    /// # Errors
    /// [`ChainError::Endpoint`] for a URL that is not one of those.
    pub fn new(endpoint: &str) -> Result<RpcClient, ChainError> {
        let failed = |reason: String| ChainError::Endpoint {
            endpoint: endpoint.to_owned(),
            reason,
        };
        let url = http_url(endpoint).map_err(failed)?;
        let http = crate::storage::trust::client_builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| failed(format!("cannot build an HTTP client: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| failed(format!("cannot start an async runtime: {e}")))?;
        Ok(RpcClient {
            endpoint: endpoint.to_owned(),
            url,
            http,
            runtime,
            next_id: AtomicU64::new(1),
        })
    }

    /// The endpoint as given.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn failed(&self, reason: impl Into<String>) -> ChainError {
        ChainError::Endpoint {
            endpoint: self.endpoint.clone(),
            reason: reason.into(),
        }
    }

    /// Sends `method(params)` and returns its `result`.
    ///
    /// # Errors
    /// [`ChainError::Endpoint`]: unreachable, not JSON-RPC, or the node's error object.
    pub fn call(&self, method: &str, params: Value) -> Result<Value, ChainError> {
        self.request(method, params)?
            .map_err(|refusal| self.failed(format!("{method}: {refusal}")))
    }

    /// Sends `method(params)`: the outer error is the transport (nothing listening, not
    /// JSON-RPC), the inner one the node's own error object, in one line.
    fn request(&self, method: &str, params: Value) -> Result<Result<Value, String>, ChainError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body = serde_json::to_vec(&request).map_err(|e| self.failed(e.to_string()))?;
        let (status, bytes) = self.runtime.block_on(async {
            let response = self
                .http
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| self.failed(format!("{method}: {}", error_chain(&e))))?;
            let status = response.status();
            let bytes = response
                .bytes()
                .await
                .map_err(|e| self.failed(format!("{method}: {}", error_chain(&e))))?;
            Ok::<_, ChainError>((status, bytes))
        })?;
        let parsed: Value = serde_json::from_slice(&bytes).map_err(|_| {
            self.failed(format!(
                "{method}: HTTP {status} with an answer that is not JSON (is this a subtensor node's RPC port?)"
            ))
        })?;
        if let Some(error) = parsed.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message");
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let data = match error.get("data") {
                Some(Value::String(s)) => format!(" ({s})"),
                Some(other) => format!(" ({other})"),
                None => String::new(),
            };
            return Ok(Err(one_line(&format!(
                "the node answered error {code}: {message}{data}"
            ))));
        }
        match parsed.get("result") {
            Some(result) => Ok(Ok(result.clone())),
            None => Err(self.failed(format!(
                "{method}: HTTP {status} with JSON that is not a JSON-RPC answer"
            ))),
        }
    }

    fn hex_result(&self, method: &str, value: &Value) -> Result<Vec<u8>, ChainError> {
        value
            .as_str()
            .and_then(|s| s.strip_prefix("0x"))
            .and_then(|s| hex::decode(s).ok())
            .ok_or_else(|| self.failed(format!("{method}: expected 0x-prefixed hex, got {value}")))
    }

    fn hash_result(&self, method: &str, value: &Value) -> Result<[u8; 32], ChainError> {
        let bytes = self.hex_result(method, value)?;
        <[u8; 32]>::try_from(bytes.as_slice())
            .map_err(|_| self.failed(format!("{method}: expected a 32-byte hash, got {value}")))
    }

    /// `state_getMetadata`: the runtime's metadata, as served (`meta`-prefixed).
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn metadata(&self) -> Result<Vec<u8>, ChainError> {
        let result = self.call("state_getMetadata", json!([]))?;
        self.hex_result("state_getMetadata", &result)
    }

    /// `state_getRuntimeVersion` at the best block.
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn runtime_version(&self) -> Result<NodeRuntimeVersion, ChainError> {
        let result = self.call("state_getRuntimeVersion", json!([]))?;
        let number = |key: &str| {
            result
                .get(key)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.failed(format!("state_getRuntimeVersion: no `{key}`")))
        };
        Ok(NodeRuntimeVersion {
            spec_name: result
                .get("specName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            spec_version: number("specVersion")?,
            transaction_version: number("transactionVersion")?,
        })
    }

    /// `chain_getBlockHash`: the hash of block `number`, or of the best block for `None`.
    ///
    /// # Errors
    /// As [`RpcClient::call`]; a block the node does not have is an error too.
    pub fn block_hash(&self, number: Option<u64>) -> Result<[u8; 32], ChainError> {
        let params = match number {
            Some(n) => json!([n]),
            None => json!([]),
        };
        let result = self.call("chain_getBlockHash", params)?;
        if result.is_null() {
            return Err(self.failed(format!(
                "chain_getBlockHash: the node has no block {}",
                number.map_or("(best)".into(), |n| n.to_string())
            )));
        }
        self.hash_result("chain_getBlockHash", &result)
    }

    /// `chain_getHeader` of block `hash`, or of the best block for `None`.
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn header(&self, hash: Option<&[u8; 32]>) -> Result<Header, ChainError> {
        let params = match hash {
            Some(h) => json!([hex0x(h)]),
            None => json!([]),
        };
        let result = self.call("chain_getHeader", params)?;
        self.parse_header("chain_getHeader", &result)
    }

    fn parse_header(&self, method: &str, header: &Value) -> Result<Header, ChainError> {
        let number = header
            .get("number")
            .and_then(Value::as_str)
            .and_then(|s| s.strip_prefix("0x"))
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or_else(|| self.failed(format!("{method}: a header without a hex `number`")))?;
        let parent_hash = self.hash_result(
            method,
            header
                .get("parentHash")
                .ok_or_else(|| self.failed(format!("{method}: a header without `parentHash`")))?,
        )?;
        Ok(Header {
            number,
            parent_hash,
        })
    }

    /// `chain_getBlock`: block `hash`'s header and its extrinsics' bytes, in order.
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn block(&self, hash: &[u8; 32]) -> Result<(Header, Vec<Vec<u8>>), ChainError> {
        let result = self.call("chain_getBlock", json!([hex0x(hash)]))?;
        let block = result
            .get("block")
            .ok_or_else(|| self.failed("chain_getBlock: no such block"))?;
        let header = self.parse_header(
            "chain_getBlock",
            block
                .get("header")
                .ok_or_else(|| self.failed("chain_getBlock: a block without a header"))?,
        )?;
        let extrinsics = block
            .get("extrinsics")
            .and_then(Value::as_array)
            .ok_or_else(|| self.failed("chain_getBlock: a block without `extrinsics`"))?
            .iter()
            .map(|x| self.hex_result("chain_getBlock", x))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((header, extrinsics))
    }

    /// `state_getStorage` of `key` at block `at` (the best block for `None`); `None` when the
    /// key holds nothing.
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn storage(
        &self,
        key: &[u8],
        at: Option<&[u8; 32]>,
    ) -> Result<Option<Vec<u8>>, ChainError> {
        let params = match at {
            Some(h) => json!([hex0x(key), hex0x(h)]),
            None => json!([hex0x(key)]),
        };
        let result = self.call("state_getStorage", params)?;
        if result.is_null() {
            return Ok(None);
        }
        self.hex_result("state_getStorage", &result).map(Some)
    }

    /// `state_call`: runtime API `method` (`Api_method`) on SCALE `input`, at `at` or the best
    /// block; returns the SCALE output.
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn state_call(
        &self,
        method: &str,
        input: &[u8],
        at: Option<&[u8; 32]>,
    ) -> Result<Vec<u8>, ChainError> {
        let params = match at {
            Some(h) => json!([method, hex0x(input), hex0x(h)]),
            None => json!([method, hex0x(input)]),
        };
        let result = self.call("state_call", params)?;
        self.hex_result("state_call", &result)
    }

    /// `system_accountNextIndex`: the nonce the next extrinsic of `ss58` must carry (the
    /// node counts those in its pool too).
    ///
    /// # Errors
    /// As [`RpcClient::call`].
    pub fn account_next_index(&self, ss58: &str) -> Result<u64, ChainError> {
        let result = self.call("system_accountNextIndex", json!([ss58]))?;
        result.as_u64().ok_or_else(|| {
            self.failed(format!(
                "system_accountNextIndex: expected a number, got {result}"
            ))
        })
    }

    /// `author_submitExtrinsic`: hands `extrinsic` to the node's pool; returns its hash, or the
    /// node's refusal in one line (a bad nonce, too little to pay the fee, a custom validity
    /// error).
    ///
    /// # Errors
    /// [`ChainError::Endpoint`] when the node cannot be reached or does not answer JSON-RPC.
    pub fn submit_extrinsic(
        &self,
        extrinsic: &[u8],
    ) -> Result<Result<[u8; 32], String>, ChainError> {
        match self.request("author_submitExtrinsic", json!([hex0x(extrinsic)]))? {
            Ok(result) => self.hash_result("author_submitExtrinsic", &result).map(Ok),
            Err(refusal) => Ok(Err(refusal)),
        }
    }
}

/// `0x` and lowercase hex.
pub fn hex0x(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

/// An error and its sources on one line (`a: b: c`).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let next = inner.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = inner.source();
    }
    one_line(&text)
}

/// `text` with its line breaks folded into spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_endpoints_map_to_http_on_the_same_port() {
        assert_eq!(
            http_url(FINNEY_ENDPOINT).unwrap().as_str(),
            "https://entrypoint-finney.opentensor.ai/"
        );
        assert_eq!(
            http_url("ws://127.0.0.1:9944").unwrap().as_str(),
            "http://127.0.0.1:9944/"
        );
        assert_eq!(
            http_url("http://node:9933/rpc").unwrap().as_str(),
            "http://node:9933/rpc"
        );
        assert!(http_url("ftp://x").is_err());
        assert_eq!(
            endpoint_of(&Network::Test).as_deref(),
            Some("wss://test.finney.opentensor.ai:443")
        );
        assert_eq!(endpoint_of(&Network::Local), None);
    }

    #[test]
    fn nothing_listening_is_one_line() {
        // Port 9 (discard) on loopback: nothing listens there in a test sandbox.
        let client = RpcClient::new("ws://127.0.0.1:9").unwrap();
        let err = client.runtime_version().unwrap_err().to_string();
        assert!(
            err.starts_with("cannot reach the subtensor node at ws://127.0.0.1:9"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
