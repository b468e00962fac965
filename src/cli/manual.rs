//! The prose of `--help`'s end and of the man page, beside the flags it
//! explains: the timing defaults and rules, and the man page's sections
//! after EXIT STATUS (rendered by src/generate.rs; the exit tables are
//! src/exit.rs's).

/// The five durations: symbol, flag, default. The one statement of the
/// defaults outside `timing.rs`, rendered into `--help`, the man page and
/// checked against `Timing::resolve` by a unit test in cli/mod.rs.
pub const TIMING_DEFAULTS: &[(&str, &str, &str)] = &[
    ("L", "--lease", "15s"),
    ("R", "--renew", "L/3"),
    ("G", "--give-up", "2L/3"),
    ("K", "--kill-after", "(L − G)/2"),
    ("P", "--retry", "2s"),
];

/// A relation between the durations that leaderrun refuses to start without.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub rule: &'static str,
    pub why: &'static str,
    /// Flags that break this rule and no other: the test that the table
    /// and `Timing::resolve` agree runs them and expects a usage error.
    pub broken_by: &'static [&'static str],
}

/// Every timing relation, as `--help`, the man page and the README state it.
pub const TIMING_RULES: &[Rule] = &[
    Rule {
        rule: "0 < R < G",
        why: "a renewal is due before the holder gives up",
        broken_by: &["--renew", "10s", "--give-up", "10s"],
    },
    Rule {
        rule: "G − R ≥ 100ms",
        why: "room to retry a failed renewal several times before giving up",
        broken_by: &["--renew", "5s", "--give-up", "5050ms"],
    },
    Rule {
        rule: "G + K < L",
        why: "the command is dead (SIGKILL sent) before the store lets a rival acquire",
        broken_by: &["--give-up", "10s", "--kill-after", "5s"],
    },
    Rule {
        rule: "P ≥ 50ms",
        why: "a waiting contender polls without busying a core",
        broken_by: &["--wait", "--retry", "1ms"],
    },
];

/// The timing paragraph of the man page, after the defaults and the rules.
pub const TIMING_TEXT: &[Block] = &[
    Block::Para(
        "The rules are checked against the lease the store will really grant (etcd grants whole \
         seconds). The holder counts from the moment it sent its last successful renewal, on \
         CLOCK_BOOTTIME. The store set expiry at least L after that moment, by its own clock. At \
         sent + G the command's process group gets SIGTERM, at sent + G + K SIGKILL; since G + K < L \
         the command is dead before any rival can acquire. A failed renewal is retried at once on a \
         fresh connection, then every min(P, R, (G − R)/4).",
    ),
    Block::Para(
        "With the defaults: renew every 5s, SIGTERM after 10s without a successful renewal, SIGKILL \
         at 12.5s, expiry at 15s at the earliest. A waiting contender takes over within L + P of a \
         holder's death, and within P of a clean release.",
    ),
];

/// A piece of the man page's prose. Backticks mark code, rendered bold.
#[derive(Debug, Clone, Copy)]
pub enum Block {
    Para(&'static str),
    /// A term and its explanation.
    Item(&'static str, &'static str),
    /// Lines shown verbatim.
    Example(&'static [&'static str]),
}

/// The man page's sections after EXIT STATUS and TIMING, beside the flags
/// they explain.
pub const MAN_SECTIONS: &[(&str, &[Block])] = &[
    (
        "ENVIRONMENT",
        &[
            Block::Item(
                "`LEADERRUN_NAME`, `LEADERRUN_STORE`",
                "defaults for --name and --store",
            ),
            Block::Item(
                "`DATABASE_URL`",
                "the store, when neither --store nor LEADERRUN_STORE is set",
            ),
            Block::Item(
                "`LEADERRUN_STATE_DIR`, `XDG_STATE_HOME`, `HOME`",
                "where the embedded store lives when no store is configured (see FILES)",
            ),
            Block::Item(
                "`NOTIFY_SOCKET`",
                "set by systemd for Type=notify units: leaderrun sends READY=1 and keeps STATUS= \
                 current; the command does not inherit it",
            ),
            Block::Item(
                "`LEASE_EPOCH`, `LEASE_NAME`, `LEASE_HOLDER`",
                "set for the command: the fencing token, the lease name and this process's holder \
                 id. `leaderrun check` reads LEASE_NAME and LEASE_EPOCH and is a usage error \
                 without them or --name and --epoch",
            ),
            Block::Item(
                "`LEASE_SLOT`",
                "set for the command under --slots: its slot, 0 to N-1 (LEASE_EPOCH is that \
                 slot's own epoch); `leaderrun check` reads it as it reads LEASE_EPOCH",
            ),
            Block::Item(
                "`LEASE_STATE`",
                "set for the command: where the run publishes its lease (/proc/PID/fd/N, no \
                 secret in it), so that `leaderrun check` inside the command asks the run, \
                 whatever store it was given, and says yes only before its give-up deadline; \
                 with --store, check reads that store instead",
            ),
        ],
    ),
    (
        "FILES",
        &[Block::Para(
            "The embedded store: $LEADERRUN_STATE_DIR/leases.db; for root \
             /var/lib/leaderrun/leases.db; otherwise $XDG_STATE_HOME/leaderrun/leases.db or \
             ~/.local/state/leaderrun/leases.db, with a file per lease in leases.db-leases/ \
             beside it. One host only; never on a network filesystem.",
        )],
    ),
    (
        "EXAMPLES",
        &[
            Block::Para("Run a nightly job at most once at a time on this host:"),
            Block::Example(&["leaderrun --name nightly -- ./report.sh"]),
            Block::Para(
                "The same cron line on several hosts, sharing a Postgres: the job runs once per \
                 firing, and a host whose clock or cron is late (by less than half the period) \
                 skips:",
            ),
            Block::Example(&[
                "0 3 * * * leaderrun --store postgres://app@db/jobs --name invoice-sweeper --once-per 1d -- /opt/app/sweep.sh",
            ]),
            Block::Para("A standby systemd service: every host runs it, one leads:"),
            Block::Example(&["ExecStart=/usr/bin/leaderrun -v --wait --name ingest -- /usr/bin/ingestd"]),
            Block::Para("Before a step that must not run twice, from inside the command:"),
            Block::Example(&["leaderrun check || exit 75"]),
            Block::Para("Who holds what, and clearing a lease whose holder is gone:"),
            Block::Example(&[
                "leaderrun status",
                "leaderrun release --name invoice-sweeper --epoch 41",
            ]),
        ],
    ),
];

/// Text for the end of `--help`: the timing table and both exit tables.
pub fn after_help() -> String {
    use crate::exit::{plain, RUN_FORM, SUBCOMMANDS};
    let mut out = String::from("Timing (durations such as 500ms, 15s, 2m):\n");
    for (sym, flag, default) in TIMING_DEFAULTS {
        out.push_str(&hanging(
            &format!("{sym} {flag}"),
            &format!("default {default}"),
        ));
    }
    let rules: Vec<&str> = TIMING_RULES.iter().map(|r| r.rule).collect();
    out.push_str(&format!("Refused unless {}.\n", rules.join(", ")));
    for (title, table) in [
        ("Exit status (run form):", RUN_FORM),
        ("Exit status (subcommands):", SUBCOMMANDS),
    ] {
        out.push_str(&format!("\n{title}\n"));
        for s in table {
            out.push_str(&hanging(&plain(s.status), &plain(s.meaning)));
        }
    }
    out
}

/// `term` in a column of its own, `text` wrapped beside it: clap prints
/// after-help text as it is.
fn hanging(term: &str, text: &str) -> String {
    const INDENT: usize = 26;
    const WIDTH: usize = 100;
    let mut out = format!("  {term:<w$}", w = INDENT - 2);
    if term.len() > INDENT - 3 {
        out = format!("  {term}\n{:INDENT$}", "");
    }
    let mut col = INDENT;
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 && col + 1 + word.len() > WIDTH {
            out.push_str(&format!("\n{:INDENT$}", ""));
            col = INDENT;
        } else if i > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out.push('\n');
    out
}
