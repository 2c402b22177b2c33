//! Where weight vectors go. A chain (Bittensor's `set_weights`, say) is a separate concern:
//! the validator only needs "publish this vector and tell me whether it arrived", so that is
//! the trait, and its only implementation today is the orchestrator's local metagraph
//! (`POST /api/weights`). A receipt names where the vector went; nothing here reports a vector
//! as set on a chain, because none is.

use crate::api::WeightSubmission;
use crate::api::client::{ApiClient, ClientError};

/// What a destination said about a published vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// Where the vector went, in words (e.g. "the local metagraph at http://...").
    pub destination: String,
    /// Whether the destination accepted it.
    pub accepted: bool,
    /// Why not, when refused.
    pub reason: Option<String>,
}

/// A place weight vectors are published to.
pub trait WeightsChain {
    /// Where this publishes, in words.
    fn destination(&self) -> String;

    /// Publishes `weights` (signed by the validator's hotkey).
    ///
    /// # Errors
    /// The destination could not be reached; a refusal is a [`Receipt`] with
    /// `accepted: false`, not an error.
    fn publish(
        &self,
        weights: &WeightSubmission,
    ) -> impl std::future::Future<Output = Result<Receipt, ClientError>> + Send;
}

/// The orchestrator's local metagraph: `POST /api/weights`, signed by the client's hotkey.
#[derive(Debug, Clone)]
pub struct LocalMetagraph {
    client: ApiClient,
}

impl LocalMetagraph {
    /// Publishes through `client` (which must hold the validator's hotkey).
    pub fn new(client: ApiClient) -> Self {
        Self { client }
    }
}

impl WeightsChain for LocalMetagraph {
    fn destination(&self) -> String {
        format!(
            "the local metagraph of run {} at {} (not a chain)",
            self.client.run(),
            self.client.base()
        )
    }

    async fn publish(&self, weights: &WeightSubmission) -> Result<Receipt, ClientError> {
        let resp = self.client.publish_weights(weights).await?;
        Ok(Receipt {
            destination: self.destination(),
            accepted: resp.accepted,
            reason: resp.reason,
        })
    }
}
