//! End to end, failures: a miner killed mid-run (its work is re-offered or dropped with a
//! recorded reason, and the run goes on with the miners left); the orchestrator killed and
//! restarted under running miners (they ride it out and resume); a miner stopped with Ctrl-C
//! (it exits cleanly); a miner killed during the merge (its twin covers its partitions, or it
//! is left out of the plan, and training resumes after the merge).

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use common::net::{completed, status, wait_for};
use common::procs::{Kids, start_miner, start_orchestrator, write_config};

/// The tests of this file run one at a time (each starts seven processes on a small machine).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn miners_ride_out_an_orchestrator_restart_and_stop_cleanly_on_ctrl_c() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = write_config(dir.path(), "restart-test");
    let mut orchestrator = Kids(vec![start_orchestrator(dir.path(), &config, &url)]);
    let mut miners = Kids(Vec::new());
    for i in 0..3 {
        miners
            .0
            .push(start_miner(dir.path(), &url, &format!("m{i}")).0);
    }
    wait_for("training to start", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= 3)
    });
    // Kill the orchestrator, leave it down a moment, start it again on the same state.
    drop(orchestrator);
    std::thread::sleep(Duration::from_secs(2));
    for m in miners.0.iter_mut() {
        assert!(
            m.try_wait().unwrap().is_none(),
            "a miner died with the orchestrator"
        );
    }
    orchestrator = Kids(vec![start_orchestrator(dir.path(), &config, &url)]);
    let before = status(&url).map(|s| completed(&s)).unwrap_or(0);
    wait_for(
        "progress after the restart",
        Duration::from_secs(60),
        || status(&url).is_some_and(|s| completed(&s) >= before + 5),
    );

    // Ctrl-C (SIGINT) to one miner: it finishes or releases its work and exits with success.
    let pid = miners.0[0].id().to_string();
    let killed = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(code) = miners.0[0].try_wait().unwrap() {
            break code;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "miner ignored Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(dir.path().join("m0.log")).unwrap();
    assert!(exit.success(), "miner exit {exit}: {log}");
    assert!(log.contains("iota mine: section"), "no summary line: {log}");
    drop(orchestrator);
}

#[test]
fn killed_miner_work_is_reoffered_or_dropped_and_the_run_continues() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = write_config(dir.path(), "kill-test");
    let mut kids = Kids(Vec::new());
    kids.0.push(start_orchestrator(dir.path(), &config, &url));

    let mut addresses = Vec::new();
    for i in 0..6 {
        let (child, address) = start_miner(dir.path(), &url, &format!("m{i}"));
        kids.0.push(child);
        addresses.push(address);
    }
    wait_for("training to start", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= 5)
    });

    // Kill a miner of the middle section (SIGKILL: no release, no goodbye).
    let db_path = dir.path().join("state/state.sqlite");
    let section_of = |address: &str| -> Option<i64> {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.query_row(
            "SELECT section FROM miners WHERE hotkey = ?1",
            [address],
            |r| r.get(0),
        )
        .ok()
    };
    let victim = (0..6)
        .find(|&i| section_of(&addresses[i]) == Some(1))
        .unwrap();
    let victim_address = addresses[victim].clone();
    // Freeze the victim, and kill it only while it holds unfinished work (an open assignment,
    // or a forward whose backward is still due), so the test always exercises re-offering or
    // dropping; otherwise let it run a little and try again.
    let pid = kids.0[victim + 1].id().to_string();
    let signal = |sig: &str| {
        assert!(
            Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    let holds_work = || -> bool {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        let open: i64 = db
            .query_row(
                "SELECT (SELECT COUNT(*) FROM assignments WHERE miner = ?1 AND state = 'assigned') \
                 + (SELECT COUNT(*) FROM pathway p JOIN samples s ON s.id = p.sample \
                    WHERE p.miner = ?1 AND p.backward_done = 0 AND s.outcome = 'active')",
                [&victim_address],
                |r| r.get(0),
            )
            .unwrap();
        open > 0
    };
    let start = Instant::now();
    loop {
        signal("-STOP");
        std::thread::sleep(Duration::from_millis(50));
        if holds_work() {
            break;
        }
        signal("-CONT");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the victim never held work"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
    // kids.0[0] is the orchestrator.
    kids.0[victim + 1].kill().unwrap();
    kids.0[victim + 1].wait().unwrap();
    let after_kill = status(&url).map(|s| completed(&s)).unwrap_or(0);

    // The run goes on with the other miners.
    wait_for("progress after the kill", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= after_kill + 10)
    });

    // The victim's unfinished work was re-offered or its samples dropped with a reason; none
    // of it is left assigned to the dead miner without an outcome.
    wait_for(
        "the victim's work to be settled",
        Duration::from_secs(30),
        || {
            let db = rusqlite::Connection::open(&db_path).unwrap();
            let stuck: i64 = db
                .query_row(
                    "SELECT COUNT(*) FROM assignments WHERE miner = ?1 AND state = 'assigned'",
                    [&victim_address],
                    |r| r.get(0),
                )
                .unwrap();
            stuck == 0
        },
    );
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let settled: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM assignments WHERE miner = ?1 AND reason IS NOT NULL",
            [&victim_address],
            |r| r.get(0),
        )
        .unwrap();
    let dropped_without_reason: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM samples WHERE outcome = 'dropped' AND reason IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let penalties: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM penalties WHERE miner = ?1",
            [&victim_address],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!("victim: {settled} assignments settled with a reason, {penalties} penalties");
    assert_eq!(dropped_without_reason, 0, "a sample was dropped silently");
    assert!(
        settled > 0 || penalties > 0,
        "the dead miner's work left no trace in the ledger (settled {settled}, penalties {penalties})"
    );
}

#[test]
fn a_miner_killed_during_the_merge_is_covered_and_the_run_goes_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = write_config(dir.path(), "merge-kill-test");
    let mut yaml = std::fs::read_to_string(&config).unwrap();
    yaml.push_str(
        "batches_before_merging: 16\nmerge: { upload_s: 20, lease_grace_s: 2, merge_s: 6 }\n",
    );
    std::fs::write(&config, yaml).unwrap();
    let mut kids = Kids(Vec::new());
    kids.0.push(start_orchestrator(dir.path(), &config, &url));
    let mut addresses = Vec::new();
    for i in 0..6 {
        let (child, address) = start_miner(dir.path(), &url, &format!("m{i}"));
        kids.0.push(child);
        addresses.push(address);
    }
    let db_path = dir.path().join("state/state.sqlite");
    let query = |sql: &str, arg: &str| -> i64 {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.query_row(sql, [arg], |r| r.get(0)).unwrap_or(-1)
    };
    wait_for("every miner to register", Duration::from_secs(60), || {
        query("SELECT COUNT(*) FROM miners WHERE ?1 = ?1", "") == 6
    });
    let victim = (0..6)
        .find(|&i| {
            query(
                "SELECT section FROM miners WHERE hotkey = ?1",
                &addresses[i],
            ) == 1
        })
        .unwrap();
    let victim_address = addresses[victim].clone();
    // Kill the victim right after its upload is accepted, before it can merge (or, if it
    // does not upload within a few seconds of the merge starting, before uploading).
    wait_for("the merge to start", Duration::from_secs(120), || {
        status(&url).is_some_and(|s| s["phase"] != "training")
    });
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5)
        && query(
            "SELECT COUNT(*) FROM uploads WHERE miner = ?1 AND state = 'accepted'",
            &victim_address,
        ) < 1
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    kids.0[victim + 1].kill().unwrap();
    kids.0[victim + 1].wait().unwrap();
    let uploaded = query(
        "SELECT COUNT(*) FROM uploads WHERE miner = ?1 AND state = 'accepted'",
        &victim_address,
    ) > 0;

    // The merge finishes without it (at the latest at its deadline) and training goes on.
    wait_for("the merge to finish", Duration::from_secs(90), || {
        status(&url).is_some_and(|s| s["epoch"].as_u64() == Some(1) && s["phase"] == "training")
    });
    // `iota merge --status` shows the finished merge, read at once: the next epoch (16 samples)
    // ends in its own merge, after which the document shows that one.
    let out = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["merge", "--status", "--orchestrator", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("| phase Training"), "{text}");
    assert_eq!(
        text.matches(" yes ").count(),
        3,
        "three finalised sections: {text}"
    );

    let before = status(&url).map(|s| completed(&s)).unwrap_or(0);
    wait_for("training after the merge", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= before + 4)
    });
    let checkpoints = query(
        "SELECT COUNT(*) FROM checkpoints WHERE epoch = 1 AND ?1 = ?1",
        "",
    );
    assert_eq!(checkpoints, 3, "every section has its merged checkpoint");
    let merged_results = query(
        "SELECT COUNT(*) FROM partition_results WHERE merger = ?1",
        &victim_address,
    );
    if uploaded && merged_results == 0 {
        // It uploaded, then died before merging: its twin's copies were used, it is flagged.
        let flagged = query(
            "SELECT COUNT(*) FROM merge_flags WHERE merger = ?1 AND reason = 'missing'",
            &victim_address,
        );
        assert!(flagged > 0, "the dead merger was not flagged");
        let single = query(
            "SELECT COUNT(*) FROM partition_outcomes WHERE section = 1 AND verdict = ?1",
            "single copy",
        );
        assert!(single > 0, "the twin's copy was not used");
    } else if !uploaded {
        // It died before uploading: it is not in the plan.
        let db = rusqlite::Connection::open(&db_path).unwrap();
        let uploaders: String = db
            .query_row(
                "SELECT uploaders FROM merge_plans WHERE epoch = 0 AND section = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(!uploaders.contains(&victim_address), "{uploaders}");
    }
    eprintln!("victim uploaded: {uploaded}, partition results: {merged_results}");

    // A late joiner starts from its section's merged checkpoint: the hash it reports for the
    // state it holds is the checkpoint's.
    let (child, late) = start_miner(dir.path(), &url, "late");
    kids.0.push(child);
    wait_for("the late joiner to adopt", Duration::from_secs(60), || {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.query_row(
            "SELECT m.weights_hash = c.hash FROM miners m JOIN checkpoints c \
             ON c.section = m.section AND c.epoch = m.weights_epoch \
             WHERE m.hotkey = ?1 AND m.weights_epoch >= 1",
            [&late],
            |r| r.get::<_, bool>(0),
        )
        .unwrap_or(false)
    });
}
