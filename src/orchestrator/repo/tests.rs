//! Tests of the state store as a whole: registration, routing, deadlines, replay cache,
//! reopening the file.

use super::registry::{Seats, tie_pick};
use super::*;
use crate::api::WorkKind;
use crate::orchestrator::repo_types::*;

const LIMITS: RoutingLimits = RoutingLimits {
    forward_ms: 1_000,
    backward_ms: 2_000,
    max_in_flight: 2,
    tail: 2,
    samples_per_step: 0,
    lanes: false,
    single_lane_epochs: 0,
    single_lane_max_in_flight: 0,
    early_epochs: 0,
    early_max_in_flight: 0,
    epochs: Epochs {
        every: 100,
        early_samples: 0,
        early_every: 20,
    },
    epoch_share_per_in_flight: 0,
    lane_wait_ms: 2000,
    live_ms: 60_000,
};
const T0: u64 = 1_000_000;

/// Three sections, miners a0/a1 (head), b0/b1 (middle), c0 (tail).
fn network() -> Repository {
    let repo = Repository::open_in_memory().unwrap();
    for (i, hk) in ["a0", "b0", "c0", "a1", "b1"].iter().enumerate() {
        let pin = Placement::Pinned([0, 1, 2, 0, 1][i]);
        let section = repo
            .register(hk, "cpu", 8, 3, 50, pin, T0 + i as u64)
            .unwrap();
        assert_eq!(section, [0, 1, 2, 0, 1][i], "{hk}");
    }
    repo
}

fn ok(hash: &str) -> Accepted {
    Accepted {
        output_hash: Some(hash.into()),
        output_key: Some(format!("out/{hash}")),
        loss: Some(2.5),
        timings: Default::default(),
    }
}

/// Sample `u` of epoch 0 with token and target hashes `tok`/`tgt`.
fn sample(u: u64) -> NewSample<'static> {
    NewSample {
        epoch: 0,
        id: u,
        tokens_hash: "tok",
        targets_hash: "tgt",
    }
}

/// Starts sample `u` at the head and returns its assignment id.
fn start(repo: &Repository, u: u64) -> u64 {
    start_at(repo, u, "a0", LIMITS, T0)
}

/// Starts sample `u` with its head forward assigned to `hk` at `now`; its assignment id.
fn start_at(repo: &Repository, u: u64, hk: &str, limits: RoutingLimits, now: u64) -> u64 {
    repo.start_sample(&sample(u), hk, SampleRoom::default(), limits, now)
        .unwrap()
        .unwrap()
        .id
}

/// Standing with claims that never lapse (tests of other rules).
const LONG_CLAIMS: Standing = Standing {
    backoff_ms: 10_000,
    exclude_after: 3,
    exclusion_ms: 600_000,
    miner_ttl_ms: 60_000,
    claim_ms: 1 << 50,
};

/// Marks `hk` as having had a result accepted.
fn prove(repo: &Repository, hk: &str) {
    repo.write(|tx| {
        tx.execute("UPDATE miners SET forwards = 1 WHERE hotkey = ?1", [hk])?;
        Ok(())
    })
    .unwrap();
}

#[test]
fn registration_fills_empty_sections_then_draws_and_remembers() {
    let repo = Repository::open_in_memory().unwrap();
    let reg = |hk: &str, draw: u64, now: u64| {
        repo.register(hk, "cpu", 1, 3, 3, Placement::Draw(draw), now)
    };
    // Empty sections first, lowest first, whatever the draw.
    let sections: Vec<usize> = (0..3)
        .map(|i| reg(&format!("m{i}"), 7, 0).unwrap())
        .collect();
    assert_eq!(sections, vec![0, 1, 2]);
    // Then the fewest proven seats (none proven: a tie of three), the draw picking.
    assert_eq!(reg("m3", draw_picking(1, &[0, 0, 0], 3), 0).unwrap(), 1);
    prove(&repo, "m0");
    prove(&repo, "m2");
    assert_eq!(
        reg("m4", 0, 0).unwrap(),
        1,
        "the only section without a proven miner"
    );
    // Re-registering keeps the section, even when another section has fewer proven seats.
    assert_eq!(reg("m4", 0, 5).unwrap(), 1);
    assert_eq!(repo.miners().unwrap().len(), 5);
    // Section 1 is full (m1 m3 m4, none proven): a new key draws it and is refused, not sent
    // to a section with room.
    assert!(matches!(
        reg("n0", 0, 5),
        Err(RepoError::SectionFull { section: 1, max: 3 })
    ));
    // A pin places a key where the operator said, while there is room.
    let pin = |hk: &str, s: usize| repo.register(hk, "gpu", 1, 3, 3, Placement::Pinned(s), 5);
    assert_eq!(pin("p0", 2).unwrap(), 2);
    assert_eq!(repo.miner("p0").unwrap().unwrap().device, "gpu");
    assert!(matches!(
        pin("p1", 1),
        Err(RepoError::SectionsFull { max: 3 })
    ));
    // One proven seat each: the draw picks among all three, where there is room.
    prove(&repo, "m1");
    let all = [1, 1, 1];
    assert_eq!(reg("n0", draw_picking(0, &all, 3), 5).unwrap(), 0);
    assert_eq!(reg("n1", draw_picking(2, &all, 3), 5).unwrap(), 2);
    assert_eq!(reg("n2", draw_picking(0, &all, 3), 5).unwrap(), 0);
    assert!(matches!(
        reg("n3", 0, 5),
        Err(RepoError::SectionsFull { max: 3 })
    ));
}

/// Issue 42, goal 7: keys that never take work cannot steer a new key into the section its
/// owner wants, and a flood of them frees its seats after `claim_ms`.
#[test]
fn throwaway_keys_neither_steer_nor_lock_a_section() {
    let repo = Repository::open_in_memory().unwrap();
    let claim = Standing::default().claim_ms;
    let reg = |hk: &str, placement: Placement, now: u64| {
        repo.register(hk, "cpu", 1, 3, 4, placement, now)
    };
    for s in 0..3 {
        reg(&format!("h{s}"), Placement::Pinned(s), T0).unwrap();
        prove(&repo, &format!("h{s}"));
    }
    // Throwaways piled into sections 0 and 1 (three each, filling them) leave every section at
    // one proven seat, so a new key's section is the draw's alone, each once in three draws: a
    // key drawn to a full section is refused, not sent to the one the throwaways left open.
    for i in 0..3 {
        reg(&format!("t0-{i}"), Placement::Pinned(0), T0 + 1).unwrap();
        reg(&format!("t1-{i}"), Placement::Pinned(1), T0 + 1).unwrap();
    }
    let landed: Vec<Result<usize, RepoError>> = (0..3)
        .map(|d| {
            let draw = draw_picking(d, &[1, 1, 1], 3);
            reg(&format!("real{d}"), Placement::Draw(draw), T0 + 2)
        })
        .collect();
    assert!(
        matches!(
            landed.as_slice(),
            [
                Err(RepoError::SectionFull { section: 0, .. }),
                Err(RepoError::SectionFull { section: 1, .. }),
                Ok(2)
            ]
        ),
        "{landed:?}"
    );
    // Section 0 is full (h0 and three throwaways): closed to a pinned key, until the
    // throwaways' claims lapse while the proven miner keeps its seat.
    assert!(matches!(
        reg("late", Placement::Pinned(0), T0 + 2),
        Err(RepoError::SectionsFull { max: 4 })
    ));
    repo.touch("h0", T0 + claim).unwrap();
    assert!(matches!(
        reg("late", Placement::Pinned(0), T0 + claim),
        Err(RepoError::SectionsFull { max: 4 })
    ));
    assert_eq!(
        reg("late", Placement::Pinned(0), T0 + 1 + claim + 1).unwrap(),
        0
    );
}

/// A draw that picks the `index`-th of `n_ties` tied sections when the sections hold
/// `proven` proven seats (found by trying draws in order).
fn draw_picking(index: usize, proven: &[usize], n_ties: usize) -> u64 {
    let seats: Vec<Seats> = proven
        .iter()
        .map(|&proven| Seats { seated: 0, proven })
        .collect();
    (0..)
        .find(|&d| tie_pick(d, &seats, n_ties) == index)
        .expect("some draw picks every index")
}

/// Issue 42, goal 7: the draw is the address's, so fresh keys from one address cannot re-roll
/// it. They all land in one section while the proven seats stay as they are; only a proven
/// seat changing gives that address a new pick.
#[test]
fn fresh_keys_from_one_address_do_not_re_roll_their_section() {
    let repo = Repository::open_in_memory().unwrap();
    let reg = |hk: &str, placement: Placement| repo.register(hk, "cpu", 1, 3, 50, placement, T0);
    for s in 0..3 {
        reg(&format!("h{s}"), Placement::Pinned(s)).unwrap();
        prove(&repo, &format!("h{s}"));
    }
    let address = 0x5eed_u64;
    let first = reg("k0", Placement::Draw(address)).unwrap();
    for i in 1..20 {
        assert_eq!(
            reg(&format!("k{i}"), Placement::Draw(address)).unwrap(),
            first,
            "key {i} from the same address"
        );
    }
    // Another address may draw elsewhere: over many addresses every section is drawn.
    let mut drawn = [false; 3];
    for a in 0..64u64 {
        drawn[reg(&format!("a{a}"), Placement::Draw(a)).unwrap()] = true;
    }
    assert_eq!(drawn, [true; 3], "addresses spread over the tied sections");
    // A seat proven in the first section ends the tie there: the address's next key goes to
    // one of the other two, as its pick over the new proven seats says.
    prove(&repo, "k0");
    let mut proven = [1usize; 3];
    proven[first] = 2;
    let ties: Vec<usize> = (0..3).filter(|&s| s != first).collect();
    let seats: Vec<Seats> = proven
        .iter()
        .map(|&proven| Seats { seated: 0, proven })
        .collect();
    assert_eq!(
        reg("k-next", Placement::Draw(address)).unwrap(),
        ties[tie_pick(address, &seats, 2)]
    );
}

#[test]
fn a_sample_travels_forward_then_backward_through_the_forward_miners() {
    let repo = network();
    let f0 = start(&repo, 0);
    // Each acceptance says who may now have work (they are woken: `orchestrator::wakeups`).
    assert_eq!(
        repo.accept(f0, "a0", &ok("h0"), LIMITS, T0 + 10).unwrap(),
        Routed::Opened {
            section: 1,
            prefer: None
        }
    );
    // The head's output is an open forward of section 1, taken by whoever asks.
    let w = repo.take_work("b1", 4, LIMITS, T0 + 20).unwrap();
    assert_eq!(w.assignments.len(), 1);
    let f1 = &w.assignments[0];
    assert_eq!(
        (f1.section, f1.kind, f1.input_hash.as_str()),
        (1, WorkKind::Forward, "h0")
    );
    assert_eq!(f1.deadline_ms, Some(T0 + 20 + 1_000));
    assert!(
        repo.take_work("b0", 4, LIMITS, T0 + 20)
            .unwrap()
            .assignments
            .is_empty()
    );
    assert_eq!(
        repo.accept(f1.id, "b1", &ok("h1"), LIMITS, T0 + 30)
            .unwrap(),
        Routed::Opened {
            section: 2,
            prefer: None
        }
    );
    let w = repo.take_work("c0", 4, LIMITS, T0 + 40).unwrap();
    let f2 = &w.assignments[0];
    assert_eq!(f2.targets_hash.as_deref(), Some("tgt"));
    assert_eq!(
        repo.accept(f2.id, "c0", &ok("g2"), LIMITS, T0 + 50)
            .unwrap(),
        Routed::Backward { miner: "b1".into() }
    );
    // The backward of section 1 goes to b1 (it ran the forward), not to b0.
    assert!(
        repo.take_work("b0", 4, LIMITS, T0 + 60)
            .unwrap()
            .assignments
            .is_empty()
    );
    let w = repo.take_work("b1", 4, LIMITS, T0 + 60).unwrap();
    let b1 = &w.assignments[0];
    assert_eq!(
        (b1.kind, b1.section, b1.input_hash.as_str()),
        (WorkKind::Backward, 1, "g2")
    );
    assert_eq!(
        repo.accept(b1.id, "b1", &ok("g1"), LIMITS, T0 + 70)
            .unwrap(),
        Routed::Backward { miner: "a0".into() }
    );
    let w = repo.take_work("a0", 1, LIMITS, T0 + 80).unwrap();
    let b0 = &w.assignments[0];
    assert_eq!((b0.kind, b0.section), (WorkKind::Backward, 0));
    let none = Accepted {
        output_hash: None,
        output_key: None,
        loss: None,
        timings: Default::default(),
    };
    assert_eq!(
        repo.accept(b0.id, "a0", &none, LIMITS, T0 + 90).unwrap(),
        Routed::Finished
    );
    let s = repo.sample(0).unwrap().unwrap();
    assert_eq!(s.outcome, SampleOutcome::Completed);
    assert_eq!(s.loss, Some(2.5));
    assert_eq!(
        repo.pathway(0).unwrap(),
        vec![(0, "a0".into()), (1, "b1".into()), (2, "c0".into())]
    );
    let c0 = repo.miner("c0").unwrap().unwrap();
    assert_eq!((c0.forwards, c0.backwards), (1, 1));
    let b1m = repo.miner("b1").unwrap().unwrap();
    assert_eq!((b1m.forwards, b1m.backwards), (1, 1));
}

#[test]
fn lane_routing_offers_a_forward_to_the_same_ranked_miner_first_then_to_anyone() {
    let repo = network();
    let lanes = RoutingLimits {
        lanes: true,
        ..LIMITS
    };
    let start_by = |u: u64, hk: &str| start_at(&repo, u, hk, lanes, T0 + 10);
    // What `hk` is handed at `now`, by input hash, and the id of the first.
    let take = |hk: &str, now: u64| {
        let w = repo.take_work(hk, 4, lanes, now).unwrap();
        let first = w.assignments.first().map(|a| a.id);
        let inputs: Vec<String> = w.assignments.into_iter().map(|a| a.input_hash).collect();
        (inputs, first)
    };
    let opened = |section: usize, prefer: &str| Routed::Opened {
        section,
        prefer: Some(prefer.into()),
    };
    let (f0, f1) = (start_by(0, "a0"), start_by(1, "a1"));
    // Ranks by registration: a0, a1 at the head; b0, b1 in the middle; c0 alone at the tail.
    let routed = repo.accept(f0, "a0", &ok("x0"), lanes, T0 + 20).unwrap();
    assert_eq!(routed, opened(1, "b0"));
    let routed = repo.accept(f1, "a1", &ok("x1"), lanes, T0 + 20).unwrap();
    assert_eq!(routed, opened(1, "b1"));
    // b1 asks first but gets only its own lane's forward; b0 then gets the other.
    assert_eq!(take("b1", T0 + 30).0, ["x1"]);
    let (inputs, b0) = take("b0", T0 + 30);
    assert_eq!(inputs, ["x0"]);
    // One tail miner: both lanes end at c0 (rank modulo the section's live miners).
    let routed = repo.accept(b0.unwrap(), "b0", &ok("y0"), lanes, T0 + 40);
    assert_eq!(routed.unwrap(), opened(2, "c0"));
    // A forward its lane's miner leaves is anyone's after `lane_wait_ms`.
    let f2 = start_by(2, "a0");
    repo.accept(f2, "a0", &ok("x2"), lanes, T0 + 50).unwrap();
    assert!(take("b1", T0 + 60).0.is_empty());
    assert_eq!(take("b1", T0 + 50 + lanes.lane_wait_ms).0, ["x2"]);
}

#[test]
fn a_lane_spreads_its_forwards_over_a_next_section_with_more_live_miners() {
    let repo = network();
    let lanes = RoutingLimits {
        lanes: true,
        ..LIMITS
    };
    // a1 stops heartbeating: a0 is the head's only live miner, b0 and b1 both stay live.
    let now = T0 + LIMITS.live_ms + 10;
    for hk in ["a0", "b0", "b1", "c0"] {
        repo.touch(hk, now).unwrap();
    }
    let partners: Vec<_> = (0..4)
        .map(|u| head_forward_to(&repo, "a0", u, lanes, now))
        .collect();
    // Both middle miners get a0's lane, alternately, instead of b0 alone.
    assert_eq!(partners, ["b0", "b1", "b0", "b1"]);
    assert_eq!(take_inputs(&repo, "b1", lanes, now), ["x1", "x3"]);
    assert_eq!(take_inputs(&repo, "b0", lanes, now), ["x0", "x2"]);
}

#[test]
fn a_lane_skips_a_head_miner_that_takes_work_and_delivers_none() {
    let repo = network();
    let lanes = RoutingLimits {
        lanes: true,
        ..LIMITS
    };
    let a0_forward = |u: u64, now: u64| head_forward_to(&repo, "a0", u, lanes, now);
    // a1 is live and holds a forward but has delivered none: it holds no lane, so a0's
    // forwards spread over both middle miners (before, every one waited for b0 and b1 got
    // nothing while a1 held its work).
    let held = start_at(&repo, 0, "a1", lanes, T0 + 10);
    let partners: Vec<_> = (1..5).map(|u| a0_forward(u, T0 + 20)).collect();
    assert_eq!(partners, ["b1", "b0", "b1", "b0"]);
    // a1 delivers: one lane each.
    repo.accept(held, "a1", &ok("x0"), lanes, T0 + 30).unwrap();
    let partners: Vec<_> = (5..7).map(|u| a0_forward(u, T0 + 40)).collect();
    assert_eq!(partners, ["b0", "b0"]);
    // a1 takes a forward and misses its deadline: once its back-off is over it is live again
    // but holds no lane until a result of it is accepted.
    let f = start_at(&repo, 7, "a1", lanes, T0 + 50);
    let late = T0 + 50 + lanes.forward_ms + 1;
    repo.expire(lanes, late).unwrap();
    let later = late + Standing::default().backoff_ms + 1;
    for hk in ["a0", "a1", "b0", "b1", "c0"] {
        repo.touch(hk, later).unwrap();
    }
    assert!(
        repo.held(f, "a1", lanes.tail).is_err(),
        "the forward went back"
    );
    let partners: Vec<_> = (8..10).map(|u| a0_forward(u, later)).collect();
    assert_eq!(partners, ["b0", "b1"]);
}

/// Starts sample `u` at head miner `hk`, accepts its forward (output `x{u}`) at `now` and
/// returns the middle miner it is offered to.
fn head_forward_to(repo: &Repository, hk: &str, u: u64, limits: RoutingLimits, now: u64) -> String {
    let f = start_at(repo, u, hk, limits, now);
    match repo
        .accept(f, hk, &ok(&format!("x{u}")), limits, now)
        .unwrap()
    {
        Routed::Opened {
            section: 1,
            prefer: Some(p),
        } => p,
        other => panic!("sample {u}: {other:?}"),
    }
}

/// The input hashes of what `hk` is handed at `now` (up to 4 assignments).
fn take_inputs(repo: &Repository, hk: &str, limits: RoutingLimits, now: u64) -> Vec<String> {
    let w = repo.take_work(hk, 4, limits, now).unwrap();
    w.assignments.into_iter().map(|a| a.input_hash).collect()
}

#[test]
fn a_single_lane_gives_all_training_work_to_the_first_ranked_miners_until_its_epochs_end() {
    let repo = network();
    let single = RoutingLimits {
        samples_per_step: 2,
        max_in_flight: 4,
        single_lane_epochs: 1,
        ..LIMITS
    };
    let head = |hk: &str| repo.take_work(hk, 4, single, T0).unwrap().head_capacity;
    // Epoch 0: a0 (first registered) may start the whole step, a1 nothing.
    assert_eq!((head("a0"), head("a1")), (2, 0));
    let f0 = start(&repo, 0);
    let f1 = start(&repo, 1);
    repo.accept(f0, "a0", &ok("x0"), single, T0).unwrap();
    repo.accept(f1, "a0", &ok("x1"), single, T0).unwrap();
    // Middle: b1 asks first and gets nothing; b0 takes both forwards of the step.
    assert!(take_inputs(&repo, "b1", single, T0).is_empty());
    assert_eq!(take_inputs(&repo, "b0", single, T0).len(), 2);
    // After the merge that ends epoch 0, the step is shared again.
    repo.begin_uploading(0, T0 + 100, T0).unwrap();
    repo.begin_merging(T0 + 200, T0).unwrap();
    repo.finish_merge(0).unwrap();
    assert_eq!((head("a0"), head("a1")), (1, 1));
}

/// With asynchronous steps the lane's miners keep their in-flight cap, and every forward is
/// offered to the next section's lane miner at once. Before, the single lane held one sample
/// at a time (the 100 samples of `iota bench learning --single-lane 100` took 303 s instead
/// of about 3), and lane routing offered every other forward to a miner off the lane first
/// (68.6 s with the cap fixed: each odd sample waited `lane_wait_ms` at each hop).
#[test]
fn a_single_lane_of_asynchronous_steps_keeps_its_in_flight_cap() {
    let repo = network();
    let single = RoutingLimits {
        samples_per_step: 0,
        max_in_flight: 3,
        single_lane_epochs: 1,
        lanes: true,
        ..LIMITS
    };
    let head = |hk: &str| repo.take_work(hk, 4, single, T0).unwrap().head_capacity;
    assert_eq!((head("a0"), head("a1")), (3, 0));
    let forwards: Vec<u64> = (0..3).map(|i| start(&repo, i)).collect();
    for (i, f) in forwards.iter().enumerate() {
        repo.accept(*f, "a0", &ok(&format!("x{i}")), single, T0)
            .unwrap();
    }
    assert!(take_inputs(&repo, "b1", single, T0).is_empty());
    assert_eq!(take_inputs(&repo, "b0", single, T0).len(), 3);
}

/// `single_lane_max_in_flight` caps the lane's miners while the lane lasts, and the run's
/// own cap applies again from the merge that ends it.
#[test]
fn a_single_lane_in_flight_cap_holds_only_while_the_lane_lasts() {
    let repo = network();
    let single = RoutingLimits {
        samples_per_step: 0,
        max_in_flight: 3,
        single_lane_epochs: 1,
        single_lane_max_in_flight: 1,
        lanes: true,
        ..LIMITS
    };
    let head = |hk: &str| repo.take_work(hk, 4, single, T0).unwrap().head_capacity;
    assert_eq!((head("a0"), head("a1")), (1, 0));
    let f0 = start(&repo, 0);
    repo.accept(f0, "a0", &ok("x0"), single, T0).unwrap();
    // One forward in flight: the head has no room, the middle's lane miner takes it.
    assert_eq!(head("a0"), 0);
    assert_eq!(take_inputs(&repo, "b0", single, T0).len(), 1);
    repo.begin_uploading(0, T0 + 100, T0).unwrap();
    repo.begin_merging(T0 + 200, T0).unwrap();
    repo.finish_merge(0).unwrap();
    assert_eq!((head("a0"), head("a1")), (3, 3));
}

/// `early_max_in_flight` caps every miner of every lane (none idles, unlike the single lane)
/// for the early epochs, and the run's own cap applies again from the merge that ends them.
#[test]
fn an_early_in_flight_cap_holds_every_lane_until_its_epochs_end() {
    let repo = network();
    let early = RoutingLimits {
        samples_per_step: 0,
        max_in_flight: 3,
        early_epochs: 1,
        early_max_in_flight: 1,
        lanes: true,
        ..LIMITS
    };
    let head = |hk: &str| repo.take_work(hk, 4, early, T0).unwrap().head_capacity;
    assert_eq!((head("a0"), head("a1")), (1, 1));
    let f0 = start(&repo, 0);
    repo.accept(f0, "a0", &ok("x0"), early, T0).unwrap();
    // a0 holds one forward: no room; a1, in the other lane, still has its one.
    assert_eq!((head("a0"), head("a1")), (0, 1));
    assert_eq!(take_inputs(&repo, "b0", early, T0).len(), 1);
    repo.begin_uploading(0, T0 + 100, T0).unwrap();
    repo.begin_merging(T0 + 200, T0).unwrap();
    repo.finish_merge(0).unwrap();
    assert_eq!((head("a0"), head("a1")), (3, 3));
}

/// `epoch_share_per_in_flight` caps a miner at one forward per that many samples of its share
/// of the epoch, at least one, and reads the early merges' shorter epochs.
#[test]
fn short_epochs_cap_the_forwards_a_miner_holds() {
    let repo = network();
    let with = |every: u64, early_epochs: u64| RoutingLimits {
        max_in_flight: 4,
        epochs: Epochs {
            every,
            early_samples: early_epochs * 8,
            early_every: 8,
        },
        epoch_share_per_in_flight: 4,
        ..LIMITS
    };
    let head = |limits| repo.take_work("a0", 8, limits, T0).unwrap().head_capacity;
    // The head has two live miners: a 100-sample epoch is 50 each, so the run's cap holds.
    assert_eq!(head(with(100, 0)), 4);
    // 24 samples: 12 each, 3 in flight; 8: 4 each, 1; 2: 1 each, still 1.
    assert_eq!(head(with(24, 0)), 3);
    assert_eq!(head(with(8, 0)), 1);
    assert_eq!(head(with(2, 0)), 1);
    // During the early merges the epoch is `early_every` (8): 1 in flight.
    assert_eq!(head(with(100, 1)), 1);
    // Off: the run's cap.
    let off = RoutingLimits {
        epoch_share_per_in_flight: 0,
        ..with(8, 0)
    };
    assert_eq!(head(off), 4);
}

#[test]
fn synchronous_steps_share_a_step_among_the_live_miners_of_a_section() {
    let repo = network();
    let sync = RoutingLimits {
        samples_per_step: 2,
        max_in_flight: 4,
        ..LIMITS
    };
    // Head: a0 and a1 are live, so each may start one of the step's two samples.
    assert_eq!(repo.take_work("a0", 4, sync, T0).unwrap().head_capacity, 1);
    let f0 = start(&repo, 0);
    let f1 = start(&repo, 1);
    repo.accept(f0, "a0", &ok("x0"), sync, T0).unwrap();
    repo.accept(f1, "a0", &ok("x1"), sync, T0).unwrap();
    // Middle: b0 takes one of the two open forwards, b1 the other.
    let w = repo.take_work("b0", 4, sync, T0).unwrap();
    assert_eq!(w.assignments.len(), 1);
    let w = repo.take_work("b1", 4, sync, T0).unwrap();
    assert_eq!(w.assignments.len(), 1);
    // A miner silent for longer than `live_ms` does not count towards the share.
    let repo = network();
    let f0 = start(&repo, 0);
    let f1 = start(&repo, 1);
    repo.accept(f0, "a0", &ok("x0"), sync, T0).unwrap();
    repo.accept(f1, "a0", &ok("x1"), sync, T0).unwrap();
    // b1 was last seen at registration: b0 is the section's only live miner.
    let later = T0 + sync.live_ms + 10;
    assert_eq!(take_inputs(&repo, "b0", sync, later).len(), 2);
    // Nor does a backed-off one: b0's forward expires, and b1 takes both open forwards.
    let repo = network();
    head_done(&repo, 0, T0);
    head_done(&repo, 1, T0);
    let taken = |hk: &str, now: u64| take_inputs(&repo, hk, sync, now).len();
    assert_eq!(taken("b0", T0), 1);
    assert_eq!(repo.expire(sync, T0 + 1_001).unwrap().len(), 1);
    assert!(!repo.may_take_new_work("b0", T0 + 1_002).unwrap());
    assert_eq!(taken("b1", T0 + 1_002), 2);
    // Asynchronous steps: no share, b0 takes up to its in-flight cap.
    let repo = network();
    let f0 = start(&repo, 0);
    let f1 = start(&repo, 1);
    repo.accept(f0, "a0", &ok("x0"), LIMITS, T0).unwrap();
    repo.accept(f1, "a0", &ok("x1"), LIMITS, T0).unwrap();
    assert_eq!(take_inputs(&repo, "b0", LIMITS, T0).len(), 2);
}

#[test]
fn backward_work_is_served_first_and_in_flight_is_capped() {
    let repo = network();
    // Two samples through the head: a0 reaches its in-flight cap of 2.
    let f0 = start(&repo, 0);
    let f1 = start(&repo, 1);
    assert_eq!(
        repo.take_work("a0", 4, LIMITS, T0).unwrap().head_capacity,
        0
    );
    repo.accept(f0, "a0", &ok("x0"), LIMITS, T0).unwrap();
    repo.accept(f1, "a0", &ok("x1"), LIMITS, T0).unwrap();
    // b0 takes both forwards (cap 2); b1 then gets nothing.
    let w = repo.take_work("b0", 4, LIMITS, T0).unwrap();
    assert_eq!(w.assignments.len(), 2);
    for a in &w.assignments {
        repo.accept(a.id, "b0", &ok("y"), LIMITS, T0).unwrap();
    }
    let w = repo.take_work("c0", 1, LIMITS, T0).unwrap();
    repo.accept(w.assignments[0].id, "c0", &ok("g"), LIMITS, T0)
        .unwrap();
    // Sample 2's forward is open in section 1, and b0 has a backward: b0 asks for one
    // piece of work and gets the backward, even though the forward is older.
    let f2 = repo
        .start_sample(
            &sample(2),
            "a0",
            SampleRoom::default(),
            RoutingLimits {
                max_in_flight: 3,
                ..LIMITS
            },
            T0,
        )
        .unwrap()
        .unwrap();
    repo.accept(f2.id, "a0", &ok("x2"), LIMITS, T0).unwrap();
    let w = repo
        .take_work(
            "b0",
            1,
            RoutingLimits {
                max_in_flight: 3,
                ..LIMITS
            },
            T0,
        )
        .unwrap();
    assert_eq!(w.assignments.len(), 1);
    assert_eq!(w.assignments[0].kind, WorkKind::Backward);
    // b0 is at its cap (two samples awaiting backward), so the open forward goes to b1.
    assert!(
        repo.take_work("b0", 4, LIMITS, T0)
            .unwrap()
            .assignments
            .is_empty()
    );
    let w = repo.take_work("b1", 4, LIMITS, T0).unwrap();
    assert_eq!(
        (w.assignments[0].sample, w.assignments[0].kind),
        (2, WorkKind::Forward)
    );
}

#[test]
fn missed_forward_is_reoffered_and_missed_backward_drops_the_sample() {
    let repo = network();
    let f0 = start(&repo, 0);
    // Nothing expires before the deadline.
    assert!(repo.expire(LIMITS, T0 + 1_000).unwrap().is_empty());
    let fallout = repo.expire(LIMITS, T0 + 1_001).unwrap();
    assert!(matches!(fallout.as_slice(), [Fallout::Reoffered { .. }]));
    assert_eq!(repo.miner("a0").unwrap().unwrap().penalties, 1);
    assert!(matches!(
        repo.accept(f0, "a0", &ok("late"), LIMITS, T0 + 1_002),
        Err(RepoError::NotAssigned {
            state: AssignmentState::Expired,
            ..
        })
    ));
    // The re-offered forward goes to the next head miner that asks (not a0: backed off).
    assert!(
        repo.take_work("a0", 4, LIMITS, T0 + 2_000)
            .unwrap()
            .assignments
            .is_empty()
    );
    let w = repo.take_work("a1", 4, LIMITS, T0 + 2_000).unwrap();
    let again = &w.assignments[0];
    assert_eq!((again.sample, again.section, again.attempts), (0, 0, 1));
    repo.accept(again.id, "a1", &ok("h"), LIMITS, T0 + 2_010)
        .unwrap();
    let w = repo.take_work("b0", 4, LIMITS, T0 + 2_020).unwrap();
    repo.accept(w.assignments[0].id, "b0", &ok("h1"), LIMITS, T0 + 2_030)
        .unwrap();
    let w = repo.take_work("c0", 4, LIMITS, T0 + 2_040).unwrap();
    repo.accept(w.assignments[0].id, "c0", &ok("g"), LIMITS, T0 + 2_050)
        .unwrap();
    // b0 never collects its backward: it expires 2 s later and the sample is dropped.
    let fallout = repo.expire(LIMITS, T0 + 4_051).unwrap();
    match fallout.as_slice() {
        [Fallout::Dropped { sample: 0, reason }] => {
            assert!(reason.contains("backward of section 1"), "{reason}");
            assert!(reason.contains("b0"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let s = repo.sample(0).unwrap().unwrap();
    assert_eq!(s.outcome, SampleOutcome::Dropped);
    assert!(s.reason.unwrap().contains("deadline"));
    assert_eq!(repo.miner("b0").unwrap().unwrap().penalties, 1);
    assert_eq!(
        repo.counts().unwrap(),
        LedgerCounts {
            completed: 0,
            dropped: 1,
            active: 0
        }
    );
}

#[test]
fn the_status_snapshot_reads_what_the_separate_queries_read() {
    let repo = network();
    let first = start(&repo, 0);
    start(&repo, 1);
    repo.accept(first, "a0", &ok("h"), LIMITS, T0 + 20).unwrap();
    let snap = repo.status_snapshot(16, T0).unwrap();
    let info = repo.phase_info().unwrap();
    assert_eq!(
        (snap.phase.phase, snap.phase.epoch),
        (info.phase, info.epoch)
    );
    assert_eq!(snap.phase.deadline_ms, info.deadline_ms);
    assert_eq!(snap.next_sample, repo.run_state().unwrap().2);
    assert_eq!(snap.next_sample, 2);
    assert_eq!(snap.miners, repo.miners().unwrap());
    assert_eq!(snap.counts, repo.counts().unwrap());
    assert_eq!(snap.counts.active, 2, "{:?}", snap.counts);
    assert_eq!(
        (snap.recent_loss, snap.completed_since),
        repo.recent(16, T0).unwrap()
    );
    assert_eq!(snap.evals, repo.eval_summaries().unwrap());
    assert_eq!(
        snap.epoch_progress,
        repo.epoch_progress(info.epoch).unwrap()
    );
    assert_eq!(
        snap.epoch_evals,
        (
            repo.evals_started(info.epoch).unwrap(),
            repo.evals_active(info.epoch).unwrap()
        )
    );
}

#[test]
fn the_merge_status_rows_are_what_the_separate_queries_read() {
    let repo = network();
    let distance = crate::orchestrator::outliers::UploadDistance {
        miner: "a0".into(),
        distance: [1.0; 3],
        reference_norm: 1.0,
    };
    repo.lease_upload(0, 0, "a0", T0 + 1_000).unwrap();
    repo.lease_upload(0, 0, "a1", T0 + 1_000).unwrap();
    assert!(
        repo.accept_upload(0, "a0", "h", 4, 1.0, &distance, T0 + 10)
            .unwrap()
    );
    let plan = PlanRow {
        uploaders: vec!["a0".into()],
        weights: vec![1.0],
        len: 4,
        partitions: 1,
        replication: 1,
        finalized: false,
    };
    repo.save_plan(0, 0, &plan).unwrap();
    repo.record_result(0, 0, 0, "a0", "r", 4, T0 + 20).unwrap();
    repo.record_result(0, 0, 0, "a1", "r", 4, T0 + 21).unwrap();
    let outcome = SectionOutcome {
        verdicts: vec![(0, "recomputed: replicas disagreed".into())],
        flags: vec![(0, "a1".into(), "wrong partition".into())],
        checkpoint: Some(("ck".into(), 16)),
        optimizer_step: 3,
    };
    repo.finalize_section(0, 0, &outcome, T0 + 30).unwrap();

    let rows = repo.merge_status_rows(3, |_| Some(0)).unwrap();
    assert_eq!(rows.phase, repo.phase_info().unwrap());
    assert_eq!(rows.epoch, Some(0));
    assert_eq!(rows.sections.len(), 3);
    for (section, got) in rows.sections.iter().enumerate() {
        let want = SectionMergeRows {
            checkpoint: repo.latest_checkpoint(section).unwrap(),
            uploads: repo.uploads_of(0, section).unwrap(),
            plan: repo.plan(0, section).unwrap(),
            results: repo.results(0, section).unwrap(),
            verdicts: repo.verdicts(0, section).unwrap(),
            flags: repo.flags(0, section).unwrap(),
        };
        assert_eq!(*got, want, "section {section}");
    }
    // Section 0 has one of everything (two results, two uploads), the others nothing.
    let s0 = &rows.sections[0];
    assert_eq!(s0.checkpoint.as_ref().map(|c| c.epoch), Some(1));
    assert_eq!(s0.uploads.len(), 2);
    assert!(s0.plan.as_ref().is_some_and(|p| p.finalized));
    assert_eq!(
        (s0.results.len(), s0.verdicts.len(), s0.flags.len()),
        (2, 1, 1)
    );
    assert_eq!(rows.sections[1], SectionMergeRows::default());

    // No merge to show: only the checkpoints are read.
    let none = repo.merge_status_rows(3, |_| None).unwrap();
    assert_eq!(none.epoch, None);
    assert_eq!(
        none.sections[0],
        SectionMergeRows {
            checkpoint: s0.checkpoint.clone(),
            ..SectionMergeRows::default()
        }
    );
}

#[test]
fn refused_forward_is_reoffered_and_repeated_failures_drop() {
    // Penalties that keep no one from work, to try one miner again and again.
    let repo = network().with_standing(Standing {
        backoff_ms: 0,
        exclude_after: u32::MAX,
        ..Standing::default()
    });
    let mut id = start(&repo, 0);
    for attempt in 1..MAX_ATTEMPTS {
        let f = repo.refuse(id, "a0", "hash mismatch", LIMITS, T0).unwrap();
        let Fallout::Reoffered { assignment } = f else {
            panic!("attempt {attempt}: {f:?}");
        };
        let w = repo.take_work("a0", 1, LIMITS, T0).unwrap();
        assert_eq!(w.assignments[0].id, assignment);
        assert_eq!(w.assignments[0].attempts, attempt);
        id = assignment;
    }
    let f = repo.refuse(id, "a0", "hash mismatch", LIMITS, T0).unwrap();
    assert!(matches!(f, Fallout::Dropped { sample: 0, .. }), "{f:?}");
    assert_eq!(
        repo.miner("a0").unwrap().unwrap().penalties,
        u64::from(MAX_ATTEMPTS)
    );
    assert!(
        repo.sample(0)
            .unwrap()
            .unwrap()
            .reason
            .unwrap()
            .contains("hash mismatch")
    );
}

#[test]
fn only_the_holder_may_submit_or_release() {
    let repo = network();
    let f0 = start(&repo, 0);
    assert!(matches!(
        repo.accept(f0, "b0", &ok("h"), LIMITS, T0),
        Err(RepoError::NotHolder { .. })
    ));
    assert!(matches!(
        repo.held(999, "a0", 2),
        Err(RepoError::UnknownAssignment { id: 999 })
    ));
    assert!(
        repo.release("b0", &[f0, 999], LIMITS, T0)
            .unwrap()
            .is_empty()
    );
    let f = repo.release("a0", &[f0], LIMITS, T0).unwrap();
    assert!(matches!(f.as_slice(), [Fallout::Reoffered { .. }]));
    assert_eq!(
        repo.miner("a0").unwrap().unwrap().penalties,
        0,
        "release is no fault"
    );
}

#[test]
fn signatures_are_remembered_until_expiry() {
    let repo = Repository::open_in_memory().unwrap();
    assert!(repo.record_signature("s1", 100, 0).unwrap());
    assert!(!repo.record_signature("s1", 100, 50).unwrap());
    assert!(repo.record_signature("s2", 300, 101).unwrap());
    assert_eq!(
        repo.signature_count().unwrap(),
        1,
        "s1 expired and was forgotten"
    );
}

/// After a quiet spell, when every remembered id has expired, one request forgets at most
/// [`super::replay::FORGET_AT_ONCE`] of them (it runs on an async worker), and the following
/// requests forget the rest.
#[test]
fn expired_signatures_are_forgotten_a_bounded_batch_per_request() {
    use super::replay::{FORGET_AT_ONCE, FORGET_EXPIRED};
    assert!(FORGET_EXPIRED.contains(&format!("LIMIT {FORGET_AT_ONCE})")));
    let repo = Repository::open_in_memory().unwrap();
    let n = 3 * FORGET_AT_ONCE;
    for i in 0..n {
        assert!(
            repo.record_signature(&format!("old{i}"), 1_000, 10)
                .unwrap()
        );
    }
    assert_eq!(repo.signature_count().unwrap(), n);
    assert!(repo.record_signature("new0", 9_000, 2_000).unwrap());
    assert_eq!(repo.signature_count().unwrap(), n - FORGET_AT_ONCE + 1);
    for i in 1..=3 {
        assert!(
            repo.record_signature(&format!("new{i}"), 9_000, 2_000)
                .unwrap()
        );
    }
    assert_eq!(
        repo.signature_count().unwrap(),
        4,
        "the expired ids are gone, the four new ones kept"
    );
}

#[test]
fn samples_start_in_order_within_the_budget() {
    let repo = network();
    assert!(matches!(
        repo.start_sample(&sample(1), "a0", SampleRoom::default(), LIMITS, T0),
        Err(RepoError::SampleOrder {
            expected: 0,
            got: 1
        })
    ));
    start(&repo, 0);
    assert_eq!(
        repo.start_sample(
            &sample(1),
            "a0",
            SampleRoom {
                budget: Some(1),
                per_epoch: None,
                per_step: None,
            },
            LIMITS,
            T0
        )
        .unwrap(),
        None
    );
    assert_eq!(repo.run_state().unwrap().2, 1);
}

/// The WAL is copied into the database file by the store's own thread: far less is written
/// than the 1,000 pages after which a commit would checkpoint, yet the file grows with it.
#[test]
fn the_log_is_checkpointed_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let repo = Repository::open(&path).unwrap();
    assert!(repo.checkpoints_in_background());
    std::thread::sleep(super::checkpoints::EVERY * 3);
    let before = std::fs::metadata(&path).unwrap().len();
    for i in 0..500 {
        repo.register(
            &format!("m{i:03}-{}", "x".repeat(200)),
            "cpu",
            4,
            3,
            500,
            Placement::Draw(0),
            T0,
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(&path).unwrap().len() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "the database file stayed at {before} bytes"
        );
        std::thread::sleep(super::checkpoints::EVERY);
    }
    // An in-memory store has no log to checkpoint.
    assert!(
        !Repository::open_in_memory()
            .unwrap()
            .checkpoints_in_background()
    );
}

/// The commits still finish and restart the log, only less often: under steady writes (each
/// commit at least one page of log) the log file stays near [`COMMIT_PAGES`] pages instead of
/// growing with every page written.
///
/// [`COMMIT_PAGES`]: super::checkpoints::COMMIT_PAGES
#[test]
fn the_log_restarts_after_its_commit_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let repo = Repository::open(&path).unwrap();
    let pages = super::checkpoints::COMMIT_PAGES as u64;
    // Four times the pages after which a commit checkpoints, at one page per commit at least.
    for i in 0..4 * pages {
        assert!(
            repo.record_signature(&format!("sig-{i:08}"), u64::MAX / 2, T0)
                .unwrap()
        );
    }
    let log = std::fs::metadata(dir.path().join("state.sqlite-wal"))
        .unwrap()
        .len();
    // A log frame is a 4 KiB page and a 24-byte header. A commit's checkpoint is skipped
    // while the background thread's is under way, so the log can run past the threshold: with
    // the whole library's tests sharing 2 cores it reached 1.22x of it once, 1.68x once and
    // 2.78x once (2026-11-28; the bounds were 1.2x, 1.5x, then 2.5x), and 3.51x with three
    // builds beside the suite (2026-11-29). How far past the threshold it runs depends on the
    // machine's load, so the test asserts what does not: the log was restarted, since one that
    // never is reaches 4x.
    let bound = 4 * pages * (4096 + 24) - 1;
    assert!(log <= bound, "the log grew to {log} bytes (bound {bound})");
    assert_eq!(repo.signature_count().unwrap(), 4 * pages);
}

#[test]
fn state_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    {
        let repo = Repository::open(&path).unwrap();
        repo.register("a0", "cpu", 4, 1, 50, Placement::Draw(0), T0)
            .unwrap();
        let one = RoutingLimits { tail: 0, ..LIMITS };
        let f = repo
            .start_sample(&sample(0), "a0", SampleRoom::default(), one, T0)
            .unwrap()
            .unwrap();
        repo.accept(f.id, "a0", &ok("g0"), one, T0).unwrap();
        repo.start_sample(&sample(1), "a0", SampleRoom::default(), one, T0)
            .unwrap();
    }
    let repo = Repository::open(&path).unwrap();
    assert_eq!(repo.miner("a0").unwrap().unwrap().forwards, 1);
    assert_eq!(
        repo.sample(0).unwrap().unwrap().outcome,
        SampleOutcome::Completed
    );
    assert_eq!(repo.run_state().unwrap().2, 2);
    // The in-flight forward of sample 1 is re-offered after its deadline.
    let f = repo
        .expire(RoutingLimits { tail: 0, ..LIMITS }, T0 + 5_000)
        .unwrap();
    assert!(matches!(f.as_slice(), [Fallout::Reoffered { .. }]));
}

/// Starts sample `u` at `now` and has the head accept its forward at once: an open forward of
/// section 1 follows.
fn head_done(repo: &Repository, u: u64, now: u64) {
    let id = start_at(repo, u, "a0", LIMITS, now);
    repo.accept(id, "a0", &ok(&format!("h{u}")), LIMITS, now)
        .unwrap();
}

/// Issue 9, "sections that fill up": a hotkey that stopped heartbeating no longer holds a seat,
/// so a section full of silent hotkeys (sybils, or churn) takes new miners again. A silent
/// miner that returns keeps its section while there is room, and is refused when its seat
/// was taken meanwhile.
#[test]
fn r9_silent_miners_free_their_seats() {
    // Claims that outlast the test: the TTL is what is tested here.
    let repo = Repository::open_in_memory()
        .unwrap()
        .with_standing(LONG_CLAIMS);
    let ttl = Standing::default().miner_ttl_ms;
    assert_eq!(
        repo.register("x", "cpu", 1, 1, 2, Placement::Draw(0), T0)
            .unwrap(),
        0
    );
    assert_eq!(
        repo.register("y", "cpu", 1, 1, 2, Placement::Draw(0), T0)
            .unwrap(),
        0
    );
    assert!(matches!(
        repo.register("z", "cpu", 1, 1, 2, Placement::Draw(0), T0 + 1),
        Err(RepoError::SectionsFull { max: 2 })
    ));
    // x keeps heartbeating, y goes silent.
    repo.touch("x", T0 + ttl).unwrap();
    assert_eq!(
        repo.register("z", "cpu", 1, 1, 2, Placement::Draw(0), T0 + ttl + 1)
            .unwrap(),
        0
    );
    assert!(matches!(
        repo.register("y", "cpu", 1, 1, 2, Placement::Draw(0), T0 + ttl + 2),
        Err(RepoError::SectionsFull { max: 2 })
    ));
    // A live miner re-registering keeps its seat however full the section is.
    assert_eq!(
        repo.register("x", "cpu", 1, 1, 2, Placement::Draw(0), T0 + ttl + 3)
            .unwrap(),
        0
    );
    assert_eq!(repo.miners().unwrap().len(), 3, "nobody's record is lost");
}

/// Issue 9, "penalties that count": a failure backs the miner off (no new forwards, others get
/// the work), failures in a row exclude it (and free its seat), an accepted result clears it;
/// several failures of work taken before one strike are one episode; every decision is in the
/// ledger.
#[test]
fn r9_failures_back_off_then_exclude_and_a_result_clears() {
    let policy = LONG_CLAIMS;
    let repo = network().with_standing(policy);
    head_done(&repo, 0, T0);
    head_done(&repo, 1, T0);
    let t1 = T0 + 100;
    assert_eq!(
        repo.take_work("b0", 4, LIMITS, t1)
            .unwrap()
            .assignments
            .len(),
        2
    );
    // Both forwards expire: one strike, not two.
    let fallout = repo.expire(LIMITS, t1 + 1_001).unwrap();
    assert_eq!(fallout.len(), 2, "{fallout:?}");
    let s = repo.standing_of("b0").unwrap();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!((s[0].decision.as_str(), s[0].strikes), ("backoff", 1));
    assert_eq!(s[0].until_ms, Some(t1 + 1_001 + policy.backoff_ms));
    assert_eq!(repo.miner("b0").unwrap().unwrap().penalties, 2);
    // Backed off: the re-offered forwards go to b1.
    let later = t1 + 2_000;
    assert!(
        repo.take_work("b0", 4, LIMITS, later)
            .unwrap()
            .assignments
            .is_empty()
    );
    assert!(!repo.may_take_new_work("b0", later).unwrap());
    assert_eq!(
        repo.take_work("b1", 4, LIMITS, later)
            .unwrap()
            .assignments
            .len(),
        2
    );
    // Two more failures in a row, each on work taken after the previous strike.
    let mut now = t1 + 1_001 + policy.backoff_ms;
    for (u, strikes) in [(2u64, 2u32), (3, 3)] {
        head_done(&repo, u, now);
        let got = repo.take_work("b0", 1, LIMITS, now).unwrap().assignments;
        assert_eq!(got.len(), 1, "strike {strikes}");
        now += 1_001;
        repo.expire(LIMITS, now).unwrap();
        let last = repo.standing_of("b0").unwrap().pop().unwrap();
        assert_eq!(last.strikes, strikes);
        now = last.until_ms.unwrap();
    }
    let s = repo.standing_of("b0").unwrap();
    let decisions: Vec<&str> = s.iter().map(|d| d.decision.as_str()).collect();
    assert_eq!(decisions, ["backoff", "backoff", "excluded"]);
    let excluded_at = s[2].at_ms;
    assert_eq!(s[1].until_ms, Some(s[1].at_ms + 2 * policy.backoff_ms));
    assert_eq!(s[2].until_ms, Some(excluded_at + policy.exclusion_ms));
    // Excluded: no work, and no seat. Sections hold a0 a1 | b0 b1 | c0 with 2 seats each.
    let during = excluded_at + policy.exclusion_ms / 2;
    head_done(&repo, 4, during);
    assert!(
        repo.take_work("b0", 4, LIMITS, during)
            .unwrap()
            .assignments
            .is_empty()
    );
    for hk in ["a0", "a1", "b1", "c0"] {
        repo.touch(hk, during).unwrap();
    }
    // b0's seat is free: section 1 takes n1, section 2 n2, and then both are full.
    let pin = |s: usize| Placement::Pinned(s);
    assert_eq!(
        repo.register("n1", "cpu", 1, 3, 2, pin(1), during).unwrap(),
        1
    );
    assert_eq!(
        repo.register("n2", "cpu", 1, 3, 2, pin(2), during).unwrap(),
        2
    );
    assert!(matches!(
        repo.register("n3", "cpu", 1, 3, 2, pin(1), during),
        Err(RepoError::SectionsFull { max: 2 })
    ));
    // After the exclusion it gets work again; an accepted result clears its strikes.
    let after = excluded_at + policy.exclusion_ms;
    let got = repo.take_work("b0", 1, LIMITS, after).unwrap().assignments;
    assert_eq!(got.len(), 1);
    repo.accept(got[0].id, "b0", &ok("x"), LIMITS, after + 10)
        .unwrap();
    let last = repo.standing_of("b0").unwrap().pop().unwrap();
    assert_eq!((last.decision.as_str(), last.strikes), ("cleared", 0));
    assert!(repo.may_take_new_work("b0", after + 10).unwrap());
}

#[test]
fn evaluation_samples_travel_forward_only_and_stay_out_of_training_counts() {
    let repo = network();
    let evals: Vec<EvalSample> = (0..2)
        .map(|u| EvalSample {
            id: eval_id(0, u),
            tokens_hash: format!("tok{u}"),
            targets_hash: format!("tgt{u}"),
        })
        .collect();
    assert_eq!(repo.start_evals(0, &evals, T0).unwrap(), 2);
    // Started once only.
    assert_eq!(repo.start_evals(0, &evals, T0).unwrap(), 0);
    assert!(repo.evals_started(0).unwrap());
    // Any head miner takes them, beyond the in-flight allowance (they keep nothing).
    let w = repo.take_work("a1", 4, LIMITS, T0 + 1).unwrap();
    let kinds: Vec<(u64, WorkKind, usize)> = w
        .assignments
        .iter()
        .map(|a| (a.sample, a.kind, a.section))
        .collect();
    assert_eq!(
        kinds,
        [
            (eval_id(0, 0), WorkKind::Eval, 0),
            (eval_id(0, 1), WorkKind::Eval, 0)
        ]
    );
    let mut ids: Vec<u64> = w.assignments[..2].iter().map(|a| a.id).collect();
    for (section, miner) in [(0, "a1"), (1, "b0"), (2, "c0")] {
        let mut next = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let mut result = ok(&format!("e{section}{i}"));
            result.loss = Some(3.0 + i as f32);
            repo.accept(*id, miner, &result, LIMITS, T0 + 10).unwrap();
        }
        if section < 2 {
            let w = repo
                .take_work(["b0", "c0"][section], 4, LIMITS, T0 + 20)
                .unwrap();
            for a in &w.assignments {
                assert_eq!((a.kind, a.section), (WorkKind::Eval, section + 1));
                next.push(a.id);
            }
            assert_eq!(next.len(), 2);
        }
        ids = next;
    }
    // No backward follows: the tail's loss completes them.
    for miner in ["a0", "b0", "c0"] {
        let w = repo.take_work(miner, 4, LIMITS, T0 + 30).unwrap();
        assert!(w.assignments.is_empty(), "{miner}: {:?}", w.assignments);
    }
    assert_eq!(repo.evals_active(0).unwrap(), 0);
    let summary = repo.eval_summaries().unwrap();
    assert_eq!(summary.len(), 1);
    assert_eq!((summary[0].samples, summary[0].completed), (2, 2));
    assert_eq!(summary[0].eval_loss, Some(3.5));
    // Training counts and the epoch's progress ignore them.
    assert_eq!(repo.counts().unwrap().completed, 0);
    assert_eq!(repo.epoch_progress(0).unwrap(), (0, 0));
}

/// The queries that run on every request (or on unauthenticated pages) read ranges of an
/// index, never the whole ledger or replay cache: `EXPLAIN QUERY PLAN` names an index and no
/// full scan or sort of the table.
#[test]
fn hot_queries_use_indexes() {
    let repo = Repository::open_in_memory().unwrap();
    let hot = [
        ("epoch progress", super::phase::EPOCH_PROGRESS),
        ("replay expiry", super::replay::FORGET_EXPIRED),
        ("recent loss", super::stats::RECENT_LOSS),
        ("completed since", super::stats::COMPLETED_SINCE),
    ];
    for (name, sql) in hot {
        let plan = repo.query_plan(sql).unwrap();
        assert!(plan.contains("USING"), "{name}: no index in\n{plan}");
        for table in ["samples", "seen_signatures"] {
            assert!(
                !plan.contains(&format!("SCAN {table}")),
                "{name}: full scan of {table} in\n{plan}"
            );
        }
        assert!(!plan.contains("TEMP B-TREE"), "{name}: sorts in\n{plan}");
    }
}

/// A cached statement whose `LIMIT` is a bound parameter runs as prepared: binding another
/// limit does not make SQLite parse and plan it again (it did, on every `/api/work`, until
/// the connection turned on the query planner's stability guarantee).
#[test]
fn a_bound_limit_does_not_replan_a_cached_statement() {
    use rusqlite::StatementStatus;
    let repo = network();
    for (i, max) in [1, 4, 2, 3, 1, 4].into_iter().enumerate() {
        repo.take_work("a0", max, LIMITS, T0 + 10 + i as u64)
            .unwrap();
    }
    let (runs, replans) = repo
        .read(|conn| {
            let stmt = conn.prepare_cached(super::routing::BACKWARDS_WAITING)?;
            Ok((
                stmt.get_status(StatementStatus::VmStep),
                stmt.get_status(StatementStatus::RePrepare),
            ))
        })
        .unwrap();
    assert!(runs > 0, "the statement never ran");
    assert_eq!(replans, 0, "planned again {replans} times");
}

/// Race (issue 9): whether an epoch has room for one more sample is decided in the
/// transaction that starts it, so no interleaving of requests can start more than its merge
/// needs; nothing starts in an epoch other than the current one, or outside training.
#[test]
fn r9_an_epoch_starts_no_more_samples_than_its_merge_needs() {
    let repo = network();
    let room = SampleRoom {
        budget: None,
        per_epoch: Some(2),
        per_step: None,
    };
    let begin = |u: u64| repo.start_sample(&sample(u), "a0", room, LIMITS, T0);
    assert!(begin(0).unwrap().is_some());
    assert!(begin(1).unwrap().is_some());
    assert_eq!(begin(2).unwrap(), None, "the epoch has its two samples");
    assert_eq!(repo.run_state().unwrap().2, 2, "no id was used up");
    // Tokens stored for another epoch start nothing.
    let other = NewSample {
        epoch: 1,
        ..sample(2)
    };
    let wide = SampleRoom::default();
    assert_eq!(
        repo.start_sample(&other, "a0", wide, LIMITS, T0).unwrap(),
        None
    );
    // Nor does anything start once training ended.
    repo.begin_uploading(0, T0 + 60_000, T0).unwrap();
    assert_eq!(
        repo.start_sample(&sample(2), "a0", wide, LIMITS, T0)
            .unwrap(),
        None
    );
}

/// A row of per-epoch counts: epoch, kind, active, completed, dropped, completed with a loss.
type CountRow = (i64, String, i64, i64, i64, i64);

/// The per-epoch counters, as a full count of the ledger would give them.
fn counted(repo: &Repository) -> (Vec<CountRow>, Vec<CountRow>) {
    repo.read(|conn| {
        let rows = |sql: &str| -> Result<Vec<CountRow>, RepoError> {
            let mut stmt = conn.prepare(sql)?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        Ok((
            rows(
                "SELECT epoch, kind, active, completed, dropped, loss_n FROM sample_counts \
                  WHERE active + completed + dropped > 0 ORDER BY epoch, kind",
            )?,
            rows(
                "SELECT epoch, kind, SUM(outcome = 'active'), SUM(outcome = 'completed'), \
                  SUM(outcome = 'dropped'), SUM(outcome = 'completed' AND loss IS NOT NULL) \
                  FROM samples GROUP BY epoch, kind ORDER BY epoch, kind",
            )?,
        ))
    })
    .unwrap()
}

/// Issue 9, counters instead of scans: the counters the hot paths read (epoch progress,
/// status counts, evaluations, epoch losses) follow every change of the ledger (start,
/// accept, refuse, release, expiry, the end of an epoch, evaluations), and a state file
/// written before they existed gets them filled when it is opened.
#[test]
fn r9_counters_follow_the_ledger_and_are_filled_for_an_old_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let check = |repo: &Repository, when: &str| {
        let (counters, ledger) = counted(repo);
        assert_eq!(counters, ledger, "{when}");
    };
    {
        let repo = Repository::open(&path).unwrap();
        for (i, hk) in ["a0", "b0", "c0"].iter().enumerate() {
            repo.register(hk, "cpu", 8, 3, 50, Placement::Draw(0), T0 + i as u64)
                .unwrap();
        }
        let heads: Vec<u64> = (0..5).map(|u| start(&repo, u)).collect();
        check(&repo, "started");
        // Sample 0 all the way: forwards through b0 and c0 (loss), backwards to the head.
        repo.accept(heads[0], "a0", &ok("h0"), LIMITS, T0).unwrap();
        let f1 = repo.take_work("b0", 1, LIMITS, T0).unwrap().assignments[0].id;
        repo.accept(f1, "b0", &ok("h1"), LIMITS, T0).unwrap();
        let f2 = repo.take_work("c0", 1, LIMITS, T0).unwrap().assignments[0].id;
        repo.accept(f2, "c0", &ok("h2"), LIMITS, T0).unwrap();
        let b1 = repo.take_work("b0", 1, LIMITS, T0).unwrap().assignments[0].id;
        repo.accept(b1, "b0", &ok("g1"), LIMITS, T0).unwrap();
        let b0 = repo.take_work("a0", 1, LIMITS, T0).unwrap().assignments[0].id;
        repo.accept(b0, "a0", &ok("g0"), LIMITS, T0).unwrap();
        assert_eq!(repo.counts().unwrap().completed, 1);
        check(&repo, "one completed");
        // A refusal, a release and missed deadlines re-offer (the end of the epoch drops).
        repo.refuse(heads[1], "a0", "bad", LIMITS, T0).unwrap();
        repo.release("a0", &heads[2..3], LIMITS, T0).unwrap();
        repo.expire(LIMITS, T0 + 10_000).unwrap();
        check(&repo, "refused, released, expired");
        // Evaluations of epoch 0, then the end of the epoch drops what is under way.
        let evals: Vec<EvalSample> = (0..2)
            .map(|u| EvalSample {
                id: eval_id(0, u),
                tokens_hash: "t".into(),
                targets_hash: "g".into(),
            })
            .collect();
        repo.start_evals(0, &evals, T0).unwrap();
        check(&repo, "evaluations started");
        let cancelled = repo.begin_uploading(0, T0 + 60_000, T0 + 10_000).unwrap();
        assert!(cancelled > 0);
        check(&repo, "epoch ended");
        assert_eq!(repo.epoch_progress(0).unwrap(), (1, 0));
    }
    // An older state file: no counters yet.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("DROP TABLE sample_counts").unwrap();
    }
    let repo = Repository::open(&path).unwrap();
    check(&repo, "reopened without counters");
    let (counters, _) = counted(&repo);
    assert!(!counters.is_empty());
}

/// Race (issue 9): an acceptance that arrives after a long check is conditional. A work result
/// whose deadline passed while it was checked (the forward was re-offered meanwhile) is not
/// accepted, and nothing is routed from it; a merge upload whose lease ended, or whose
/// section's plan was built, while it was checked stays out of the merge.
#[test]
fn r9_an_acceptance_after_a_long_check_is_conditional() {
    let repo = network();
    let f0 = start(&repo, 0);
    // The check outlives the deadline: the forward is re-offered, then the result arrives.
    let fallout = repo.expire(LIMITS, T0 + 5_000).unwrap();
    assert!(matches!(fallout.as_slice(), [Fallout::Reoffered { .. }]));
    assert!(matches!(
        repo.accept(f0, "a0", &ok("h0"), LIMITS, T0 + 5_001),
        Err(RepoError::NotAssigned { .. })
    ));
    assert!(
        repo.take_work("b0", 4, LIMITS, T0 + 5_002)
            .unwrap()
            .assignments
            .is_empty(),
        "nothing was routed from the late result"
    );
    // A refused result cannot flip to accepted either.
    let w = repo
        .take_work("a1", 1, LIMITS, T0 + 5_003)
        .unwrap()
        .assignments;
    repo.refuse(w[0].id, "a1", "bad", LIMITS, T0 + 5_004)
        .unwrap();
    assert!(
        repo.accept(w[0].id, "a1", &ok("h0"), LIMITS, T0 + 5_005)
            .is_err()
    );

    // Merge uploads.
    let distance = |miner: &str| crate::orchestrator::outliers::UploadDistance {
        miner: miner.into(),
        distance: [1.0; 3],
        reference_norm: 1.0,
    };
    for hk in ["a0", "a1", "b0"] {
        repo.lease_upload(0, 0, hk, T0 + 1_000).unwrap();
    }
    // a0 is accepted in time; a1's check ends after its lease.
    assert!(
        repo.accept_upload(0, "a0", "h", 4, 1.0, &distance("a0"), T0 + 999)
            .unwrap()
    );
    assert!(
        !repo
            .accept_upload(0, "a1", "h", 4, 1.0, &distance("a1"), T0 + 1_001)
            .unwrap()
    );
    assert_eq!(
        repo.upload(0, "a1").unwrap().unwrap().state,
        UploadState::Leased
    );
    // b0's section plan is built while b0's check runs.
    let plan = PlanRow {
        uploaders: vec![],
        weights: vec![],
        len: 4,
        partitions: 1,
        replication: 1,
        finalized: false,
    };
    repo.save_plan(0, 0, &plan).unwrap();
    assert!(
        !repo
            .accept_upload(0, "b0", "h", 4, 1.0, &distance("b0"), T0 + 10)
            .unwrap()
    );
    // An accepted upload cannot be accepted again (with another hash).
    assert!(
        !repo
            .accept_upload(0, "a0", "x", 4, 1.0, &distance("a0"), T0 + 11)
            .unwrap()
    );
    assert_eq!(
        repo.upload(0, "a0").unwrap().unwrap().hash.as_deref(),
        Some("h")
    );
}
