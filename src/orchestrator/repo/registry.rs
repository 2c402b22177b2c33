//! Miners: registration (where a new hotkey goes, a returning hotkey keeps its section),
//! liveness and the weights they report.
//!
//! **Placement.** A hotkey the operator pinned (`placement.pins`) goes to its section. Any other
//! new hotkey goes to a section that has no seated miner at all, the lowest such first (so a
//! network starting up fills every section); once every section has one, to a section with the
//! fewest *proven* seats (miners with an accepted result), ties broken by a draw keyed by the
//! orchestrator's secret; if that section is full the key is refused until it has room.
//!
//! **The draw cannot be re-rolled.** The caller keys the draw by where the request comes from
//! (an address, not the hotkey), and [`tie_pick`] mixes it with the proven seats of every
//! section. So fresh keys from one address, however many are thrown away, all land in the
//! same section until a seat somewhere is proven or lost: grinding keys for a section gets
//! one try per change of the network's proven seats, not one per key. Keys
//! that never take work count only towards the first rule and towards `max_per_section`, so
//! registering throwaway keys cannot steer a key into a section of a running network (a key
//! their seats keep out of its drawn section is refused, not sent elsewhere); they hold their
//! seats for `placement.claim_s` only ([`super::standing`]). While a section has no seated
//! miner at all (a network starting up), a registrant can still reach it: each key it seats
//! fills another empty section, so it keeps the key that lands where it wants. Drawing among
//! the empty sections would not stop that, and drawing among all sections at the start (by
//! proven seats alone) would put every key of one address in one section, leaving the
//! pipeline without its other sections.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, usize_of};
use super::rows::{MINER_COLUMNS, read_miner};
use super::standing::{HOLDS_SEAT, PROVEN};
use crate::orchestrator::repo_types::{MinerRow, RepoError};

/// How a registering hotkey is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The operator pinned it to this section.
    Pinned(usize),
    /// Placed by the rules of the module documentation; `draw`, which the caller keys by the
    /// registrant's address with a secret, breaks ties (through [`tie_pick`]).
    Draw(u64),
    /// The section with the fewest seated miners, lowest first (`placement.ordered`: for a
    /// private network whose miners are all the operator's; throwaway keys can steer it).
    Ordered,
}

/// Seats of one section, leaving out the registering hotkey.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Seats {
    /// Seated miners (proven, or unproven within their claim).
    pub(super) seated: usize,
    /// Seated miners with an accepted result.
    pub(super) proven: usize,
}

impl Repository {
    /// Registers `hotkey` as [`Placement`] says (see the module documentation), or returns its
    /// existing section. A seat is held by a miner seen within the TTL, not excluded
    /// ([`super::standing`]) and proven or within its claim, so silent, excluded or idle
    /// hotkeys do not fill a section for good. A returning miner keeps its section unless it
    /// had lost its seat and the section has filled up meanwhile; then it is placed like a new
    /// one. Updates the device and `max_in_flight` it reports.
    ///
    /// # Errors
    /// [`RepoError::SectionsFull`] when every section (or the pinned one) holds
    /// `max_per_section` seated miners; [`RepoError::SectionFull`] when the section a new key
    /// draws does.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &self,
        hotkey: &str,
        device: &str,
        max_in_flight: usize,
        n_sections: usize,
        max_per_section: usize,
        placement: Placement,
        now_ms: u64,
    ) -> Result<usize, RepoError> {
        let policy = self.standing;
        self.write(|tx| {
            let seat_params = params![
                to_i64(now_ms),
                to_i64(policy.miner_ttl_ms),
                i64::from(policy.exclude_after),
                hotkey,
                to_i64(policy.claim_ms)
            ];
            let existing: Option<(i64, bool)> = tx
                .query_row_cached(
                    &format!("SELECT section, {HOLDS_SEAT} FROM miners WHERE hotkey = ?4"),
                    seat_params,
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let mut seats = vec![Seats::default(); n_sections];
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT section, COUNT(*), SUM({PROVEN}) FROM miners \
                 WHERE {HOLDS_SEAT} AND hotkey != ?4 GROUP BY section"
            ))?;
            let rows = stmt.query_map(seat_params, |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (section, seated, proven) = row?;
                if let Some(c) = seats.get_mut(usize_of(section)) {
                    *c = Seats {
                        seated: usize_of(seated),
                        proven: usize_of(proven),
                    };
                }
            }
            drop(stmt);
            let has_room = |s: usize| seats.get(s).is_some_and(|c| c.seated < max_per_section);
            let place = || match placement {
                Placement::Pinned(s) if has_room(s) => Ok(s),
                Placement::Pinned(_) => Err(RepoError::SectionsFull {
                    max: max_per_section,
                }),
                Placement::Draw(draw) => choose(&seats, max_per_section, draw),
                Placement::Ordered => least_seated(&seats, max_per_section),
            };
            if let Some((section, seated)) = existing {
                let section = usize_of(section);
                let section = match placement {
                    Placement::Pinned(s) if s != section => place()?,
                    _ if seated || has_room(section) => section,
                    _ => place()?,
                };
                tx.execute_cached(
                    "UPDATE miners SET device = ?2, max_in_flight = ?3, last_seen = ?4, \
                     section = ?5 WHERE hotkey = ?1",
                    params![
                        hotkey,
                        device,
                        to_i64(max_in_flight as u64),
                        to_i64(now_ms),
                        to_i64(section as u64)
                    ],
                )?;
                return Ok(section);
            }
            let section = place()?;
            tx.execute_cached(
                "INSERT INTO miners (hotkey, section, registered_at, last_seen, device, \
                 max_in_flight) VALUES (?1, ?2, ?3, ?3, ?4, ?5)",
                params![
                    hotkey,
                    to_i64(section as u64),
                    to_i64(now_ms),
                    device,
                    to_i64(max_in_flight as u64)
                ],
            )?;
            Ok(section)
        })
    }

    /// The miner registered under `hotkey`, if any.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn miner(&self, hotkey: &str) -> Result<Option<MinerRow>, RepoError> {
        self.read_hot(|conn| {
            Ok(conn
                .query_row_cached(
                    &format!("SELECT {MINER_COLUMNS} FROM miners WHERE hotkey = ?1"),
                    [hotkey],
                    read_miner,
                )
                .optional()?)
        })
    }

    /// Every registered miner, by section then registration time.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn miners(&self) -> Result<Vec<MinerRow>, RepoError> {
        self.read(miners_in)
    }

    /// Records that `hotkey` was seen now.
    ///
    /// # Errors
    /// [`RepoError::NotRegistered`].
    pub fn touch(&self, hotkey: &str, now_ms: u64) -> Result<(), RepoError> {
        self.write_hot(|tx| {
            let n = tx.execute_cached(
                "UPDATE miners SET last_seen = ?2 WHERE hotkey = ?1",
                params![hotkey, to_i64(now_ms)],
            )?;
            if n == 0 {
                return Err(RepoError::NotRegistered {
                    hotkey: hotkey.to_string(),
                });
            }
            Ok(())
        })
    }

    /// Takes `hotkey`'s seat now, as if it had not been seen since the epoch: routing gives it
    /// no new work and its section may seat someone else (a miner that left the subnet). A
    /// hotkey not registered is a no-op.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn retire(&self, hotkey: &str) -> Result<(), RepoError> {
        self.write_hot(|tx| {
            tx.execute_cached(
                "UPDATE miners SET last_seen = 0 WHERE hotkey = ?1",
                params![hotkey],
            )?;
            Ok(())
        })
    }

    /// Records the weights a miner reports holding (heartbeat).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn set_weights(
        &self,
        hotkey: &str,
        epoch: u64,
        hash: Option<&str>,
    ) -> Result<(), RepoError> {
        self.write_hot(|tx| {
            tx.execute_cached(
                "UPDATE miners SET weights_epoch = ?2, weights_hash = ?3 WHERE hotkey = ?1",
                params![hotkey, to_i64(epoch), hash],
            )?;
            Ok(())
        })
    }
}

/// Every registered miner, by section then registration time, read on `conn`.
pub(super) fn miners_in(conn: &Connection) -> Result<Vec<MinerRow>, RepoError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {MINER_COLUMNS} FROM miners ORDER BY section, registered_at, hotkey"
    ))?;
    let rows = stmt.query_map([], read_miner)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Where a new hotkey goes (see the module documentation): the lowest section with no seated
/// miner; else, among the sections with the fewest proven seats, the one `draw` picks, if it has
/// room. A full pick is refused, not moved on to a section with room: otherwise keys that fill
/// the other sections to `max_per_section` would steer.
fn choose(seats: &[Seats], max_per_section: usize, draw: u64) -> Result<usize, RepoError> {
    let full = RepoError::SectionsFull {
        max: max_per_section,
    };
    if seats.iter().all(|c| c.seated >= max_per_section) {
        return Err(full);
    }
    if let Some(empty) = seats.iter().position(|c| c.seated == 0) {
        return Ok(empty);
    }
    let fewest = seats.iter().map(|c| c.proven).min().ok_or(full)?;
    let ties: Vec<usize> = (0..seats.len())
        .filter(|&s| seats[s].proven == fewest)
        .collect();
    let section = ties[tie_pick(draw, seats, ties.len())];
    if seats[section].seated >= max_per_section {
        return Err(RepoError::SectionFull {
            section,
            max: max_per_section,
        });
    }
    Ok(section)
}

/// Which of `n_ties` tied sections `draw` picks: `BLAKE3(draw, proven seats of every section)`
/// modulo `n_ties`. Mixing in the proven seats gives one address a fresh pick each time the
/// network's proven seats change, and none while they stay (seats of keys that never took
/// work are not in it).
pub(super) fn tie_pick(draw: u64, seats: &[Seats], n_ties: usize) -> usize {
    let mut h = blake3::Hasher::new();
    h.update(b"TIE\n");
    h.update(&draw.to_le_bytes());
    for s in seats {
        h.update(&(s.proven as u64).to_le_bytes());
    }
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.finalize().as_bytes()[..8]);
    (u64::from_le_bytes(first) % n_ties.max(1) as u64) as usize
}

/// The section with the fewest seated miners that still has room, lowest first.
fn least_seated(seats: &[Seats], max_per_section: usize) -> Result<usize, RepoError> {
    (0..seats.len())
        .filter(|&s| seats[s].seated < max_per_section)
        .min_by_key(|&s| (seats[s].seated, s))
        .ok_or(RepoError::SectionsFull {
            max: max_per_section,
        })
}
