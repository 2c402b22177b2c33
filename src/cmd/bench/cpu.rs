//! Where a machine's CPU time went while a local network ran, from the kernel's own accounting
//! (Linux `/proc`), not from what the processes report: the miners, orchestrator and
//! validators that `iota local` started (its direct children, told apart by their
//! subcommand), everything else the machine ran, and its idle time.
//!
//! Utilization (a miner's compute time over its wall time) cannot say whether the machine had
//! CPU to spare: with more processes than cores, a miner computing slowly because it shares a
//! core counts as busy, and one waiting while the others use every core counts as idle. This
//! breakdown says that.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;

/// Which process of the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// `iota mine`.
    Miner,
    /// `iota orchestrate`.
    Orchestrator,
    /// `iota validate`.
    Validator,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Miner => "miners",
            Role::Orchestrator => "orchestrator",
            Role::Validator => "validators",
        })
    }
}

/// The machine's CPU time so far, in clock ticks summed over its cores (`/proc/stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// User, nice, system, interrupt and stolen time.
    pub busy: u64,
    /// Idle and I/O wait.
    pub idle: u64,
}

/// CPU time of the machine and of each child process at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The machine's totals.
    pub machine: MachineTicks,
    /// Each child's role and user + system ticks, by pid.
    pub procs: BTreeMap<u32, (Role, u64)>,
}

/// CPU seconds between two snapshots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    /// Processes and seconds by role.
    pub roles: BTreeMap<Role, (usize, f64)>,
    /// Busy seconds of the machine outside those processes.
    pub other_s: f64,
    /// Idle seconds of the machine.
    pub idle_s: f64,
}

impl Breakdown {
    /// Every second of every core in the span (busy and idle).
    pub fn capacity_s(&self) -> f64 {
        self.roles.values().map(|r| r.1).sum::<f64>() + self.other_s + self.idle_s
    }
}

/// The `cpu` line of `/proc/stat`.
pub fn parse_machine(proc_stat: &str) -> Option<MachineTicks> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    if v.len() < 4 {
        return None;
    }
    Some(MachineTicks {
        busy: at(0) + at(1) + at(2) + at(5) + at(6) + at(7),
        idle: at(3) + at(4),
    })
}

/// Parent pid and user + system ticks from `/proc/PID/stat` (the fields after the command
/// name, which is in parentheses and may itself hold spaces or parentheses).
pub fn parse_pid_stat(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// The role of a process from its `/proc/PID/cmdline` (NUL-separated arguments): the
/// subcommand of `iota`, or `None` for anything else.
pub fn role_of(cmdline: &[u8]) -> Option<Role> {
    let sub = cmdline.split(|&b| b == 0).nth(1)?;
    match sub {
        b"mine" => Some(Role::Miner),
        b"orchestrate" => Some(Role::Orchestrator),
        b"validate" => Some(Role::Validator),
        _ => None,
    }
}

/// The machine's totals and every direct child of `parent` that is a miner, orchestrator or
/// validator. `None` where `/proc` cannot be read (not Linux).
pub fn snapshot(parent: u32) -> Option<Snapshot> {
    let machine = parse_machine(&fs::read_to_string("/proc/stat").ok()?)?;
    let mut procs = BTreeMap::new();
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between the listing and these reads: skip it.
        let Some((ppid, ticks)) = fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| parse_pid_stat(&s))
        else {
            continue;
        };
        if ppid != parent {
            continue;
        }
        let Some(role) = fs::read(entry.path().join("cmdline"))
            .ok()
            .and_then(|c| role_of(&c))
        else {
            continue;
        };
        procs.insert(pid, (role, ticks));
    }
    Some(Snapshot { machine, procs })
}

/// Clock ticks per second of `/proc`'s counters.
fn ticks_per_s() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: sysconf only reads a configuration value.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 {
            return t as f64;
        }
    }
    100.0
}

/// CPU seconds from `a` to `b`: a process seen in `b` counts from its ticks in `a` (0 if it
/// started since).
pub fn between(a: &Snapshot, b: &Snapshot) -> Breakdown {
    between_at(a, b, ticks_per_s())
}

fn between_at(a: &Snapshot, b: &Snapshot, hz: f64) -> Breakdown {
    let mut roles: BTreeMap<Role, (usize, f64)> = BTreeMap::new();
    let mut in_roles = 0u64;
    for (pid, (role, ticks)) in &b.procs {
        let before = a.procs.get(pid).map_or(0, |p| p.1);
        let d = ticks.saturating_sub(before);
        in_roles += d;
        let r = roles.entry(*role).or_default();
        r.0 += 1;
        r.1 += d as f64 / hz;
    }
    let busy = b.machine.busy.saturating_sub(a.machine.busy);
    Breakdown {
        roles,
        other_s: busy.saturating_sub(in_roles) as f64 / hz,
        idle_s: b.machine.idle.saturating_sub(a.machine.idle) as f64 / hz,
    }
}

/// Prints `b` as a table: seconds and share of the machine's capacity per row.
pub fn print(b: &Breakdown) {
    let cap = b.capacity_s().max(1e-9);
    println!("\nCPU in the steady state, from /proc   processes   cpu s   share of all cores");
    for (role, (n, s)) in &b.roles {
        println!(
            "{:<37} {n:>9}  {s:>6.2}  {:>8.1}%",
            role.to_string(),
            100.0 * s / cap
        );
    }
    println!(
        "{:<37} {:>9}  {:>6.2}  {:>8.1}%",
        "rest of the machine",
        "",
        b.other_s,
        100.0 * b.other_s / cap
    );
    println!(
        "{:<37} {:>9}  {:>6.2}  {:>8.1}%",
        "idle",
        "",
        b.idle_s,
        100.0 * b.idle_s / cap
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_lines_parse() {
        let stat = "cpu  100 5 20 400 10 1 2 3 7 0\ncpu0 50 2 10 200 5 0 1 1 0 0\n";
        assert_eq!(
            parse_machine(stat),
            Some(MachineTicks {
                busy: 100 + 5 + 20 + 1 + 2 + 3,
                idle: 410
            })
        );
        assert_eq!(parse_machine("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_machine("cpu  1 x 3 4\n"), None);
        // A command name with spaces and a parenthesis.
        let pid = "42 (iota (x) y) S 7 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0";
        assert_eq!(parse_pid_stat(pid), Some((7, 281)));
        assert_eq!(parse_pid_stat("42 (iota) S 7"), None);
        assert_eq!(
            role_of(b"/bin/iota\0mine\0--wallet\0w\0"),
            Some(Role::Miner)
        );
        assert_eq!(role_of(b"iota\0orchestrate\0"), Some(Role::Orchestrator));
        assert_eq!(role_of(b"iota\0validate\0"), Some(Role::Validator));
        assert_eq!(role_of(b"iota\0local\0"), None);
        assert_eq!(role_of(b""), None);
    }

    #[test]
    fn a_span_counts_each_process_from_its_first_ticks() {
        let a = Snapshot {
            machine: MachineTicks {
                busy: 1000,
                idle: 500,
            },
            procs: BTreeMap::from([(1, (Role::Miner, 100)), (2, (Role::Orchestrator, 40))]),
        };
        let b = Snapshot {
            machine: MachineTicks {
                busy: 1400,
                idle: 600,
            },
            procs: BTreeMap::from([
                (1, (Role::Miner, 250)),
                (2, (Role::Orchestrator, 90)),
                // Started after `a`: all of its ticks are in the span.
                (3, (Role::Miner, 120)),
            ]),
        };
        let got = between_at(&a, &b, 100.0);
        assert_eq!(got.roles[&Role::Miner], (2, 2.7));
        assert_eq!(got.roles[&Role::Orchestrator], (1, 0.5));
        assert!((got.other_s - 0.8).abs() < 1e-12, "{got:?}");
        assert!((got.idle_s - 1.0).abs() < 1e-12);
        assert!((got.capacity_s() - 5.0).abs() < 1e-12);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_real_child_is_found_with_its_role_and_its_cpu() {
        // A real child whose second argument is `mine` (`sh mine`, a script of that name)
        // and which spends CPU, then waits.
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("mine"),
            "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30\n",
        )
        .unwrap();
        let before = snapshot(std::process::id()).unwrap();
        let mut child = std::process::Command::new("sh")
            .arg("mine")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let mut seen = None;
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let snap = snapshot(std::process::id()).unwrap();
            if snap.procs.get(&child.id()).is_some_and(|p| p.1 > 0) {
                seen = Some(snap);
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let after = seen.expect("the child's CPU time never showed in /proc");
        assert_eq!(after.procs[&child.id()].0, Role::Miner);
        let span = between(&before, &after);
        let (n, s) = span.roles[&Role::Miner];
        assert_eq!(n, 1);
        assert!(s > 0.0, "{span:?}");
        assert!(span.capacity_s() >= s);
    }
}
