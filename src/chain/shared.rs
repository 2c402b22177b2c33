//! A chain that several threads share: what the orchestrator's metagraph refresh and a
//! validator's weights need, from async code, through `tokio::task::spawn_blocking`.
//!
//! [`SharedChain`] is any [`Chain`] that is `Send + Sync` behind an `Arc` (tests pass the FAKE
//! chain, [`super::fake::FakeSubtensor`], this way). [`ChainThread`] makes one of any chain,
//! `Send` or not, such as the `Box<dyn Chain>` of [`chain_for`]: the chain lives on a thread
//! of its own and every call goes to it over a channel and waits for the answer. Calls are
//! blocking either way.

use std::fmt;
use std::sync::Arc;
use std::sync::mpsc;

use super::{
    Chain, ChainError, ChainRegistration, Metagraph, Network, Registrant, WeightSubmission,
    WeightsPolicy, chain_for,
};
use crate::wallet::{Hotkey, Ss58Address};

/// A chain shared between threads.
pub type SharedChain = Arc<dyn Chain + Send + Sync>;

/// The chain of `network`, on a thread of its own ([`ChainThread`]).
pub fn shared_chain_for(network: Network) -> SharedChain {
    Arc::new(ChainThread::spawn(move || chain_for(network)))
}

type Job = Box<dyn FnOnce(&dyn Chain) + Send>;

/// A chain owned by a thread of its own; calls wait for that thread's answer.
pub struct ChainThread {
    network: Network,
    jobs: mpsc::Sender<Job>,
}

impl fmt::Debug for ChainThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainThread")
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl ChainThread {
    /// Starts a thread that builds its chain with `make` and answers calls until this value
    /// is dropped.
    pub fn spawn(make: impl FnOnce() -> Box<dyn Chain> + Send + 'static) -> ChainThread {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (told, network) = mpsc::channel();
        let started = std::thread::Builder::new()
            .name("iota-chain".into())
            .spawn(move || {
                let chain = make();
                let _ = told.send(chain.network());
                for job in queue {
                    job(chain.as_ref());
                }
            });
        let network = match started {
            Ok(_) => network.recv().unwrap_or_default(),
            Err(_) => Network::Local,
        };
        ChainThread { network, jobs }
    }

    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Chain) -> R + Send + 'static,
    ) -> Result<R, ChainError> {
        let (answer, answered) = mpsc::channel();
        let gone = || ChainError::Endpoint {
            endpoint: self.network.to_string(),
            reason: "the chain client's thread has stopped".into(),
        };
        self.jobs
            .send(Box::new(move |chain| {
                let _ = answer.send(f(chain));
            }))
            .map_err(|_| gone())?;
        answered.recv().map_err(|_| gone())
    }
}

impl Chain for ChainThread {
    fn network(&self) -> Network {
        self.network.clone()
    }

    fn register(&self, who: &Registrant, netuid: u16) -> Result<ChainRegistration, ChainError> {
        let who = who.clone();
        self.call(move |c| c.register(&who, netuid))?
    }

    fn genesis_hash(&self) -> Result<[u8; 32], ChainError> {
        self.call(|c| c.genesis_hash())?
    }

    fn metagraph(&self, netuid: u16) -> Result<Metagraph, ChainError> {
        self.call(move |c| c.metagraph(netuid))?
    }

    fn burn_cost(&self, netuid: u16) -> Result<u64, ChainError> {
        self.call(move |c| c.burn_cost(netuid))?
    }

    fn burned_register(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<u16, ChainError> {
        let (coldkey, hotkey) = (coldkey.clone(), hotkey.clone());
        self.call(move |c| c.burned_register(&coldkey, &hotkey, netuid))?
    }

    fn weights_policy(&self, netuid: u16) -> Result<WeightsPolicy, ChainError> {
        self.call(move |c| c.weights_policy(netuid))?
    }

    fn weights(&self, netuid: u16, uid: u16) -> Result<Vec<(u16, u16)>, ChainError> {
        self.call(move |c| c.weights(netuid, uid))?
    }

    fn weight_commits(
        &self,
        netuid: u16,
        hotkey: &[u8; 32],
    ) -> Result<Vec<([u8; 32], u64)>, ChainError> {
        let hotkey = *hotkey;
        self.call(move |c| c.weight_commits(netuid, &hotkey))?
    }

    fn submit_weights(
        &self,
        signer: &Hotkey,
        netuid: u16,
        submission: &WeightSubmission,
    ) -> Result<u64, ChainError> {
        let (signer, submission) = (signer.clone(), submission.clone());
        self.call(move |c| c.submit_weights(&signer, netuid, &submission))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::fake::{FakeSubnetConfig, FakeSubtensor};

    #[test]
    fn a_chain_on_its_own_thread_answers_like_the_chain_itself_on_the_fake_chain() {
        let thread = ChainThread::spawn(|| {
            let fake = FakeSubtensor::new();
            fake.add_subnet(
                2,
                FakeSubnetConfig {
                    tempo: 10,
                    commit_reveal: false,
                    reveal_period_epochs: 1,
                    weights_rate_limit: 5,
                    version_key: 0,
                },
            );
            let alice = Hotkey::from_uri("//Alice").unwrap();
            fake.register_hotkey(2, &alice.public_key(), true).unwrap();
            Box::new(fake)
        });
        let shared: SharedChain = Arc::new(thread);
        let metagraph = shared.metagraph(2).unwrap();
        assert_eq!(metagraph.neurons.len(), 1);
        let alice = Hotkey::from_uri("//Alice").unwrap();
        let set = WeightSubmission::Set {
            uids: vec![0],
            values: vec![65535],
            version_key: 0,
        };
        let block = shared.submit_weights(&alice, 2, &set).unwrap();
        assert_eq!(block, metagraph.block);
        assert!(matches!(
            shared.metagraph(3),
            Err(ChainError::NoSubnet { netuid: 3 })
        ));
        let local = shared_chain_for(Network::Local);
        assert_eq!(local.network(), Network::Local);
    }
}
