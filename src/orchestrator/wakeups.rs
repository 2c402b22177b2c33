//! Wakeups for `/api/work` requests held open while their miner has nothing to do.
//!
//! A waiting request is woken only by what can give its miner work, so a busy network does not
//! wake every idle miner on every result:
//! - a backward is routed to one miner (the one that computed the forward): that miner is woken;
//!   so is a miner whose result freed room in its in-flight allowance (a backward, or the
//!   tail's work) while a poll it sent during the computation waits after a look that found
//!   no room ([`Ticket::looking`]): it looks again with the room;
//! - a forward or evaluation opened to a section, or room for new samples at the head (a sample
//!   completed or dropped): one waiting miner of that section that has forward room is woken
//!   (a stored permit wakes the next one to wait, so an event between a look and a wait is not
//!   lost); a miner that then takes as much as its allowance lets it (its in-flight cap, or its
//!   share of a synchronous step) passes the wakeup on to one more of its section, since what
//!   it left is for another;
//! - rarer events whose consequences are not worked out here (a refusal, a release, a missed
//!   deadline, evaluations opened, the phase changed) wake every waiting request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::repo_types::Routed;

/// Where waiting `/api/work` requests are woken (see the module documentation).
#[derive(Debug)]
pub struct Wakeups {
    /// One per section: forwards opened there, or head room (section 0).
    sections: Vec<Notify>,
    /// One per miner that has waited: backwards routed to it, room freed for it.
    miners: Mutex<HashMap<String, Arc<MinerSlot>>>,
    /// Bumped by events that wake everyone.
    everyone: watch::Sender<u64>,
}

/// A miner's own wakeups.
#[derive(Debug, Default)]
struct MinerSlot {
    notify: Notify,
    /// A request of this miner is looking, or waits after a look that found no forward room.
    roomless: AtomicBool,
}

/// What a waiting request is interested in.
#[derive(Debug, Clone, Copy)]
pub struct Interest {
    /// The miner's section.
    pub section: usize,
    /// Whether it could take a forward (or start a sample) if one appeared.
    pub forwards: bool,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// Something this miner may be able to take appeared: look again.
    Look,
    /// The wait ran out (or the server is shutting down).
    TimedOut,
}

impl Wakeups {
    /// Wakeups for a run of `sections` sections.
    pub fn new(sections: usize) -> Self {
        Self {
            sections: (0..sections.max(1)).map(|_| Notify::new()).collect(),
            miners: Mutex::new(HashMap::new()),
            everyone: watch::Sender::new(0),
        }
    }

    /// Wakes whoever `routed` gave work to.
    pub fn routed(&self, routed: &Routed) {
        match routed {
            Routed::Opened {
                prefer: Some(miner),
                ..
            } => self.miner(miner),
            Routed::Opened { section, .. } => self.section(*section),
            Routed::Backward { miner } => self.miner(miner),
            Routed::Finished => self.section(0),
        }
    }

    /// Wakes one waiting miner of `section` with forward room (or the next one to wait).
    pub fn section(&self, section: usize) {
        if let Some(notify) = self.sections.get(section) {
            notify.notify_one();
        }
    }

    /// Wakes `hotkey`'s waiting request (or its next one), if it ever waited.
    pub fn miner(&self, hotkey: &str) {
        let slot = self.lock().get(hotkey).cloned();
        if let Some(slot) = slot {
            slot.notify.notify_one();
        }
    }

    /// A result of `hotkey` freed room in its in-flight allowance: wakes its request if one is
    /// looking or waits without room (a poll sent while it computed), so it looks again.
    pub fn room_freed(&self, hotkey: &str) {
        let slot = self.lock().get(hotkey).cloned();
        if let Some(slot) = slot.filter(|s| s.roomless.load(Ordering::SeqCst)) {
            slot.notify.notify_one();
        }
    }

    /// Wakes every waiting request.
    pub fn everyone(&self) {
        self.everyone
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// A ticket to wait on, taken before looking for work so nothing that happens between the
    /// look and the wait is missed.
    pub fn ticket(&self, hotkey: &str) -> Ticket {
        let own = Arc::clone(self.lock().entry(hotkey.to_string()).or_default());
        Ticket {
            own,
            everyone: self.everyone.subscribe(),
        }
    }

    /// Waits on `ticket` for what `interest` cares about, at most `left`.
    pub async fn wait(&self, ticket: &mut Ticket, interest: Interest, left: Duration) -> Woken {
        let section = async {
            match self.sections.get(interest.section) {
                Some(notify) if interest.forwards => notify.notified().await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = ticket.own.notify.notified() => Woken::Look,
            () = section => Woken::Look,
            changed = ticket.everyone.changed() => match changed {
                Ok(()) => Woken::Look,
                Err(_) => Woken::TimedOut,
            },
            () = tokio::time::sleep(left) => Woken::TimedOut,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<MinerSlot>>> {
        self.miners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A waiting request's hold on its wakeups ([`Wakeups::ticket`]).
#[derive(Debug)]
pub struct Ticket {
    own: Arc<MinerSlot>,
    everyone: watch::Receiver<u64>,
}

impl Ticket {
    /// Called before a look: until [`Self::looked`] says the look found forward room, room
    /// freed by this miner's results wakes the request ([`Wakeups::room_freed`]), so a result
    /// accepted between the look and the wait is not missed.
    pub fn looking(&self) {
        self.own.roomless.store(true, Ordering::SeqCst);
    }

    /// Called after a look, with whether the miner had forward room.
    pub fn looked(&self, forward_room: bool) {
        self.own.roomless.store(!forward_room, Ordering::SeqCst);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.own.roomless.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(30);

    fn interest(section: usize, forwards: bool) -> Interest {
        Interest { section, forwards }
    }

    #[tokio::test]
    async fn a_backward_wakes_only_its_miner() {
        let w = Wakeups::new(3);
        let mut alice = w.ticket("alice");
        let mut bob = w.ticket("bob");
        w.routed(&Routed::Backward {
            miner: "alice".into(),
        });
        assert_eq!(
            w.wait(&mut alice, interest(1, true), LONG).await,
            Woken::Look
        );
        assert_eq!(
            w.wait(&mut bob, interest(1, true), SHORT).await,
            Woken::TimedOut
        );
    }

    #[tokio::test]
    async fn an_opened_forward_wakes_one_miner_of_its_section_with_room() {
        let w = Arc::new(Wakeups::new(3));
        let mut full = w.ticket("full");
        let mut other_section = w.ticket("other");
        // A forward opened before anyone waits is kept for the next waiter with room.
        w.routed(&Routed::Opened {
            section: 1,
            prefer: None,
        });
        assert_eq!(
            w.wait(&mut full, interest(1, false), SHORT).await,
            Woken::TimedOut
        );
        assert_eq!(
            w.wait(&mut other_section, interest(2, true), SHORT).await,
            Woken::TimedOut
        );
        let mut a = w.ticket("a");
        assert_eq!(w.wait(&mut a, interest(1, true), LONG).await, Woken::Look);
        // Two waiters, one forward: exactly one wakes.
        let waiters: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let w = Arc::clone(&w);
                tokio::spawn(async move {
                    let mut t = w.ticket(name);
                    w.wait(&mut t, interest(1, true), Duration::from_millis(500))
                        .await
                })
            })
            .collect();
        tokio::time::sleep(SHORT).await;
        w.routed(&Routed::Opened {
            section: 1,
            prefer: None,
        });
        let mut woken = Vec::new();
        for waiter in waiters {
            woken.push(waiter.await.unwrap());
        }
        woken.sort_by_key(|w| *w == Woken::TimedOut);
        assert_eq!(woken, [Woken::Look, Woken::TimedOut]);
    }

    #[tokio::test]
    async fn a_forward_offered_to_its_lane_wakes_that_miner_not_the_section() {
        let w = Wakeups::new(3);
        let mut partner = w.ticket("partner");
        let mut other = w.ticket("other");
        w.routed(&Routed::Opened {
            section: 1,
            prefer: Some("partner".into()),
        });
        assert_eq!(
            w.wait(&mut other, interest(1, true), SHORT).await,
            Woken::TimedOut
        );
        assert_eq!(
            w.wait(&mut partner, interest(1, true), LONG).await,
            Woken::Look
        );
    }

    #[tokio::test]
    async fn freed_room_wakes_only_a_request_that_looked_without_room() {
        let w = Wakeups::new(2);
        // A poll that found room is not woken when a result frees more.
        let mut roomy = w.ticket("roomy");
        roomy.looking();
        roomy.looked(true);
        w.room_freed("roomy");
        assert_eq!(
            w.wait(&mut roomy, interest(1, true), SHORT).await,
            Woken::TimedOut
        );
        // One that found none is woken, also when the result came between look and wait.
        let mut full = w.ticket("full");
        full.looking();
        w.room_freed("full");
        full.looked(false);
        assert_eq!(
            w.wait(&mut full, interest(1, false), LONG).await,
            Woken::Look
        );
        // Once the request has ended, freed room wakes nothing.
        drop(full);
        w.room_freed("full");
        let mut next = w.ticket("full");
        assert_eq!(
            w.wait(&mut next, interest(1, false), SHORT).await,
            Woken::TimedOut
        );
    }

    #[tokio::test]
    async fn a_finished_sample_wakes_the_head_and_everyone_wakes_all() {
        let w = Wakeups::new(2);
        let mut head = w.ticket("head");
        w.routed(&Routed::Finished);
        assert_eq!(
            w.wait(&mut head, interest(0, true), LONG).await,
            Woken::Look
        );
        let mut a = w.ticket("a");
        let mut b = w.ticket("b");
        w.everyone();
        assert_eq!(w.wait(&mut a, interest(1, false), LONG).await, Woken::Look);
        assert_eq!(w.wait(&mut b, interest(0, false), LONG).await, Woken::Look);
    }
}
