//! The operator's subcommands: status, release, check, watch, init.

use std::time::Duration;

use tracing::Level;

use crate::cli::{Admin, Common};
use crate::error::Error;
use crate::exit::Exit;
use crate::logging;
use crate::store::{Init, LeaseInfo, Replication, RunRecord, Store};

/// Admin calls are one-shot; this bounds connecting plus the statement.
const CALL: Duration = Duration::from_secs(10);

pub async fn run(cmd: Admin, common: Common) -> Result<Exit, Error> {
    // Every line about one lease names it, the refusals included.
    if let Admin::Release { name, .. }
    | Admin::Check { name, .. }
    | Admin::Status {
        name: Some(name), ..
    }
    | Admin::Watch {
        name: Some(name), ..
    } = &cmd
    {
        logging::set_context(name, "");
    }
    // Inside a command, `check` asks the leaderrun that runs it, which
    // knows its own store (published.rs).
    if let Admin::Check { name, epoch, slot } = &cmd {
        if let Some(exit) = check_with_holder(name, *slot, *epoch, &common)? {
            return Ok(exit);
        }
    }
    // Flags first: a bad one is refused before any store is touched.
    let interval = match &cmd {
        Admin::Watch { retry, .. } => watch_interval(retry.clone())?,
        _ => crate::timing::DEFAULT_RETRY,
    };
    let choice = crate::store::choose(
        common.store.map(crate::redact::Secret::into_exposed),
        common.store_origin,
    );
    // No store configured: the embedded one creates its own table, so
    // whoever asks for SQL means a server's, and Postgres is the default.
    // (A build without Postgres prints the embedded store's, below.)
    #[cfg(feature = "postgres")]
    if let (Admin::Init { print: true }, None) = (&cmd, &choice) {
        print_schema(crate::store::postgres::SCHEMA, "no store configured; ");
        return Ok(Exit::Yes);
    }
    let choice = choice.as_ref().map(|(s, o)| (s.as_str(), *o));
    let mut store = crate::store::open(choice, "leaderrun admin", CALL)?;
    // Looking must not create: a typo in a file store's path would
    // otherwise leave a new, empty store behind and answer "no leases".
    // A watcher started before this host's first run is the exception: the
    // embedded default is made where and as a run would make it, and the
    // watcher sees that run take the lease.
    let may_create = matches!(cmd, Admin::Init { .. })
        || (choice.is_none() && matches!(cmd, Admin::Watch { .. }));
    if !may_create {
        if let Some(file) = file_store(choice).filter(|f| !f.exists()) {
            if let Some((_, origin)) = choice {
                return Err(Error::NoStoreFile {
                    file: crate::names::printable(&file.to_string_lossy()),
                    origin,
                });
            }
            // The embedded default before its first use: nothing has run
            // here, so there are no leases, which is an answer, not an error.
            return answer(cmd, Vec::new(), &store.describe());
        }
    }
    tracing::info!(event = "store", "store {}", store.describe());
    match cmd {
        Admin::Status { name, json } => {
            let leases = match &name {
                Some(n) => store.inspect_slots(n, CALL).await?,
                None => store.list(CALL).await?,
            };
            // What a failover can lose is worth a line, not a failed
            // status: a role that may not look says so.
            let repl = store
                .replication(CALL)
                .await
                .unwrap_or_else(|e| Replication::unknown(format!("not known ({e})")));
            let runs = store.run_records(name.as_deref(), CALL).await?;
            status(leases, &runs, name, json, Some(&repl))
        }
        Admin::Release {
            name,
            slot,
            epoch,
            holder,
        } => release(&mut store, &lease(&name, slot), epoch, holder.as_deref()).await,
        Admin::Check { name, epoch, slot } => check(&mut store, &lease(&name, slot), epoch).await,
        Admin::Watch { name, json, .. } => {
            crate::watch::run(&mut store, name, json, interval).await
        }
        Admin::Init { print: true } => {
            match store.schema() {
                Some(schema) => print_schema(schema, ""),
                None => {
                    let msg = format!(
                        "{} keeps no table; there is no SQL to print",
                        store.describe()
                    );
                    logging::say(Level::INFO, "no_table", &msg);
                }
            }
            Ok(Exit::Yes)
        }
        Admin::Init { print: false } => {
            match store.init(CALL).await? {
                Init::Ready => crate::outln!("lease table ready in {}", store.describe()),
                Init::NothingToDo => {
                    crate::outln!("nothing to do: {} keeps no table", store.describe())
                }
                Init::Done(what) => crate::outln!("{what}"),
            }
            Ok(Exit::Yes)
        }
    }
}

/// The table's SQL, after a comment naming its dialect (so that SQL for one
/// server is not fed to another by mistake).
fn print_schema(schema: crate::store::Schema, why: &str) {
    crate::outln!(
        "-- leaderrun lease table, {why}dialect: {} (other stores: pass --store)",
        schema.dialect
    );
    crate::outln!("{};", schema.sql);
}

/// The file of a file-backed store (the embedded SQLite), if that is what
/// `choice` names.
fn file_store(choice: Option<(&str, crate::store::Origin)>) -> Option<std::path::PathBuf> {
    match choice {
        None => crate::store::sqlite::default_path().ok(),
        Some((raw, _)) => url::Url::parse(raw)
            .ok()
            .filter(|u| u.scheme() == "sqlite")
            .and_then(|u| u.to_file_path().ok()),
    }
}

/// What the subcommand says about a store that holds these leases (used
/// for an embedded store that does not exist yet: none).
fn answer(cmd: Admin, leases: Vec<LeaseInfo>, shown: &str) -> Result<Exit, Error> {
    match cmd {
        Admin::Status { name, json } => status(leases, &[], name, json, None),
        Admin::Release {
            name,
            slot,
            epoch,
            holder,
        } => {
            not_released(&lease(&name, slot), epoch, holder.as_deref());
            Ok(Exit::No)
        }
        Admin::Check { name, epoch, slot } => {
            let name = lease(&name, slot);
            tracing::warn!(
                event = "check_failed",
                epoch,
                "no lease named {name} in {shown} (no run has made it yet)"
            );
            Ok(Exit::No)
        }
        Admin::Init { .. } => Ok(Exit::Yes),
        // Not reached: a watcher may create the embedded default (above).
        Admin::Watch { .. } => Ok(Exit::Yes),
    }
}

/// The lease `release` and `check` act on: the name, or one of its slots.
fn lease(name: &str, slot: Option<u32>) -> String {
    crate::names::slot_name(name, slot.unwrap_or(0))
}

/// `watch --retry`, with the run form's default and lower bound.
fn watch_interval(retry: Option<crate::duration::DurationArg>) -> Result<Duration, Error> {
    use crate::timing::{TimingError, DEFAULT_RETRY, MIN_RETRY};
    let retry = retry.unwrap_or_else(|| DEFAULT_RETRY.into());
    if retry.value() < MIN_RETRY {
        return Err(Error::Usage(
            TimingError::RetryTooShort { retry }.to_string(),
        ));
    }
    Ok(retry.value())
}

/// The failover line under the table, and its JSON fields.
fn can_lose(r: &Replication) -> &'static str {
    match r.can_lose_acknowledged {
        Some(true) => "a failover can lose an acknowledged acquisition",
        Some(false) => "a failover cannot lose an acknowledged acquisition",
        None => "whether a failover can lose an acknowledged acquisition is not known",
    }
}

fn status(
    leases: Vec<LeaseInfo>,
    runs: &[RunRecord],
    name: Option<String>,
    json: bool,
    repl: Option<&Replication>,
) -> Result<Exit, Error> {
    let run_of = |l: &LeaseInfo| runs.iter().find(|r| r.name == l.name);
    if json {
        let objs: Vec<LeaseJson> = leases
            .iter()
            .map(|l| LeaseJson::new(l, repl).with_run(run_of(l)))
            .collect();
        // `--name`: the lease's object, or null; otherwise an array.
        let text = match &name {
            Some(_) => {
                let mut objs = objs.into_iter();
                let first = objs.next().map(|mut o| {
                    o.other_slots = objs.collect();
                    o
                });
                serde_json::to_string(&first)
            }
            None => serde_json::to_string(&objs),
        };
        crate::outln!("{}", text.map_err(Error::Output)?);
    } else {
        // The header even for no leases: a script or a reader can tell
        // "nothing there" from "nothing ran".
        use crate::names::{display_width, printable};
        let rows: Vec<[String; 4]> = leases
            .iter()
            .map(|l| {
                [
                    printable(&l.name),
                    l.holder.as_deref().map_or("-".into(), printable),
                    l.epoch.to_string(),
                    state(l),
                ]
            })
            .collect();
        let head = ["NAME", "HOLDER", "EPOCH", "STATE"].map(String::from);
        let width = |i: usize| {
            rows.iter()
                .chain([&head])
                .map(|r| display_width(&r[i]))
                .max()
                .unwrap_or(0)
        };
        let (w0, w1, w2) = (width(0), width(1), width(2));
        // Padded by display width: a holder in Cyrillic or CJK lines up.
        let pad = |s: &str, w: usize| " ".repeat(w.saturating_sub(display_width(s)));
        for r in [&head].into_iter().chain(&rows) {
            crate::outln!(
                "{}{}  {}{}  {}{}  {}",
                r[0],
                pad(&r[0], w0),
                r[1],
                pad(&r[1], w1),
                pad(&r[2], w2),
                r[2],
                r[3]
            );
        }
        // The last `--once-per` run of each lease that has one, a line each.
        for l in &leases {
            if let Some(r) = run_of(l) {
                crate::outln!("{}", last_run(r, l));
            }
        }
        // Scripts read `--json`; the table is for people, and this line is
        // what they should know about the store under it.
        if let Some(r) = repl {
            crate::outln!("replication: {}; {}", r.detail, can_lose(r));
        }
    }
    if name.is_some() && leases.is_empty() {
        if !json {
            let msg = format!("no lease named {}", name.unwrap_or_default());
            logging::say(Level::WARN, "no_lease", &msg);
        }
        return Ok(Exit::No);
    }
    Ok(Exit::Yes)
}

/// A time to or since expiry as a person reads it: to a tenth of a second
/// below ten seconds, then in two or three figures of one unit (the
/// store's milliseconds are noise here; `--json` keeps them).
fn ago(ms: i64) -> String {
    use crate::duration::{about, show};
    show(about(Duration::from_millis(ms.unsigned_abs()))).to_string()
}

fn state(l: &LeaseInfo) -> String {
    let mut s = match (&l.holder, l.expires_in_ms) {
        // The run has ended; only --min-hold holds the lease now.
        (Some(_), Some(ms)) if ms > 0 && l.kept => {
            format!("kept by --min-hold (run ended), expires in {}", ago(ms))
        }
        (Some(_), Some(ms)) if ms > 0 => format!("held, expires in {}", ago(ms)),
        (Some(_), Some(ms)) => format!("expired {} ago", ago(ms)),
        (Some(_), None) => "held".into(),
        (None, Some(ms)) => format!("free since {} ago", ago(ms.min(0))),
        // A store that deletes the lease key keeps no time of its end.
        (None, None) => "free".into(),
    };
    if let Some(a) = &l.advertised {
        s.push_str(&format!("; advertises {}", crate::names::printable(a)));
    }
    s
}

/// The last `--once-per` run of `l`, for people. A run with no end written
/// says so, with what became of its lease; no outcome is made up.
fn last_run(r: &RunRecord, l: &LeaseInfo) -> String {
    use crate::names::printable;
    let holder = r.holder.as_deref().map_or("-".into(), printable);
    let end = match (&r.outcome, r.ended_ms_ago) {
        (Some(o), _) if !crate::store::known_outcome(o) => format!(
            "outcome \"{}\" unreadable (not one this release writes: --once-per runs on it \
             exit 125)",
            printable(o)
        ),
        (Some(o), Some(ms)) => format!("ended {} ago: {}", ago(ms), printable(o)),
        _ if l.epoch != r.epoch => "no end recorded".into(),
        _ if l.is_live() => "running (lease held)".into(),
        _ => match (&l.holder, l.expires_in_ms) {
            (Some(_), Some(ms)) => format!("no end recorded; lease expired {} ago", ago(ms)),
            (None, Some(ms)) => format!("no end recorded; lease freed {} ago", ago(ms)),
            (_, None) => "no end recorded".into(),
        },
    };
    format!(
        "last run of {}: started {} ago ({}) by {holder}, epoch {}; {end}",
        printable(&r.name),
        ago(r.started_ms_ago),
        r.started_at,
        r.epoch,
    )
}

/// One lease in `status --json`. Scripts parse these names; the
/// replication fields are there only when the store was asked.
#[derive(serde::Serialize)]
struct LeaseJson<'a> {
    /// The lease's name as runs give it (a slot's lease `NAME#i` is `NAME`
    /// here, with `slot` i).
    name: &'a str,
    holder: Option<&'a str>,
    epoch: i64,
    live: bool,
    expires_in_ms: Option<i64>,
    /// The run has ended and only `--min-hold` keeps the lease.
    kept: bool,
    /// The holder's `--advertise` value, `null` when none.
    advertised: Option<&'a str>,
    /// The slot (`--slots`): 0 for the lease `NAME` itself.
    slot: u32,
    /// The N this tenure was taken with: 1 for a plain run, or free.
    slots: u32,
    #[serde(flatten)]
    replication: Option<ReplicationJson<'a>>,
    /// The last `--once-per` run, where the store keeps one for this name.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_run: Option<RunJson<'a>>,
    /// With `--name`: the name's slots above 0, where a `--slots` run made
    /// any (the object itself is slot 0).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    other_slots: Vec<LeaseJson<'a>>,
}

/// A run record in `status --json`: times by the store's clock; `ended_*`
/// and `outcome` are `null` when no end was written (still running, or
/// its leaderrun was killed before it could write one).
#[derive(serde::Serialize)]
struct RunJson<'a> {
    started_at: &'a str,
    started_ms_ago: i64,
    ended_at: Option<&'a str>,
    ended_ms_ago: Option<i64>,
    holder: Option<&'a str>,
    epoch: i64,
    outcome: Option<&'a str>,
    /// `true` (and only then present) when the outcome is not one this
    /// release writes: a `--once-per` run on it exits 125.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unreadable: bool,
}

#[derive(serde::Serialize)]
struct ReplicationJson<'a> {
    replication: &'a str,
    /// `null` when not known.
    failover_can_lose_acquisition: Option<bool>,
}

impl<'a> LeaseJson<'a> {
    fn new(l: &'a LeaseInfo, repl: Option<&'a Replication>) -> LeaseJson<'a> {
        let (name, slot) = crate::names::split_slot(&l.name);
        LeaseJson {
            name,
            slot,
            slots: if l.holder.is_some() {
                l.slots_of_tenure()
            } else {
                1
            },
            holder: l.holder.as_deref(),
            epoch: l.epoch,
            live: l.is_live(),
            expires_in_ms: l.expires_in_ms_shown(),
            kept: l.kept,
            advertised: l.advertised.as_deref(),
            replication: repl.map(|r| ReplicationJson {
                replication: &r.detail,
                failover_can_lose_acquisition: r.can_lose_acknowledged,
            }),
            last_run: None,
            other_slots: Vec::new(),
        }
    }

    fn with_run(mut self, r: Option<&'a RunRecord>) -> LeaseJson<'a> {
        self.last_run = r.map(|r| RunJson {
            started_at: &r.started_at,
            started_ms_ago: r.started_ms_ago,
            ended_at: r.ended_at.as_deref(),
            ended_ms_ago: r.ended_ms_ago,
            holder: r.holder.as_deref(),
            epoch: r.epoch,
            outcome: r.outcome.as_deref(),
            unreadable: r
                .outcome
                .as_deref()
                .is_some_and(|o| !crate::store::known_outcome(o)),
        });
        self
    }
}

async fn release(
    store: &mut Store,
    name: &str,
    epoch: Option<i64>,
    holder: Option<&str>,
) -> Result<Exit, Error> {
    // `--holder`: the lease is cleared at the epoch that holder has, read
    // first. The clear names that epoch, so a lease someone else took
    // between the two calls (a higher epoch) is never freed: the holder's
    // own run, and nothing after it.
    let epoch = match holder {
        None => epoch,
        Some(h) => match store.inspect(name, CALL).await? {
            Some(l) if l.holder.as_deref() == Some(h) && epoch.is_none_or(|e| e == l.epoch) => {
                Some(l.epoch)
            }
            _ => {
                not_released(name, epoch, Some(h));
                return Ok(Exit::No);
            }
        },
    };
    match store.clear(name, epoch, CALL).await? {
        Some(was) => {
            crate::outln!(
                "released {name}: was held by {} at epoch {} ({}); the next holder gets epoch {} or higher",
                was.holder.as_deref().map_or("-".into(), crate::names::printable),
                was.epoch,
                state(&was),
                was.epoch.saturating_add(1)
            );
            Ok(Exit::Yes)
        }
        None => {
            not_released(name, epoch, holder);
            Ok(Exit::No)
        }
    }
}

fn not_released(name: &str, epoch: Option<i64>, holder: Option<&str>) {
    let by = holder.map_or(String::new(), |h| {
        format!(" by {}", crate::names::printable(h))
    });
    let msg = match epoch {
        Some(e) => format!("{name} is not held{by} at epoch {e}; nothing released"),
        None => format!("{name} is not held{by}; nothing released"),
    };
    logging::say(Level::WARN, "not_released", &msg);
}

/// `check` answered by the leaderrun whose command asks (published.rs):
/// `None` when it is not the one to ask. It is, when leaderrun published
/// its lease for this process (`LEASE_STATE`), the lease asked about is
/// that one, and no `--store` on the command line names a store to read.
fn check_with_holder(
    name: &str,
    slot: Option<u32>,
    epoch: i64,
    common: &Common,
) -> Result<Option<Exit>, Error> {
    use crate::published::{answer, read, Answer, ReadError, VAR};
    let Some(path) = std::env::var(VAR).ok().filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    if common.store.is_some() && common.store_origin == crate::store::Origin::Flag {
        return Ok(None);
    }
    let own = std::env::var("LEASE_NAME").is_ok_and(|n| n == name);
    // The holder publishes the lease it took: under --slots, its slot's.
    let name = &lease(name, slot);
    let record = match read(&path) {
        Ok(r) if r.name == *name => r,
        // Another lease than the one this command runs under: a store's.
        Ok(_) => return Ok(None),
        Err(_) if !own => return Ok(None),
        Err(ReadError::Gone(_)) => {
            tracing::warn!(
                event = "check_failed",
                epoch,
                "lease {name} is not live at epoch {epoch}: the leaderrun that held it has exited"
            );
            return Ok(Some(Exit::No));
        }
        Err(source) => {
            return Err(Error::LeaseState {
                name: name.to_string(),
                source,
            })
        }
    };
    match answer(&record, epoch, crate::clock::boottime_now()) {
        Answer::Live => Ok(Some(Exit::Yes)),
        Answer::NotLive(why) => {
            tracing::warn!(
                event = "check_failed",
                epoch,
                "lease {name} in {} {why} (as its holder, leaderrun pid {}, says)",
                record.store,
                record.pid
            );
            Ok(Some(Exit::No))
        }
    }
}

async fn check(store: &mut Store, name: &str, epoch: i64) -> Result<Exit, Error> {
    let info = store.inspect(name, CALL).await?;
    let shown = store.describe();
    match info {
        Some(l) if l.is_live() && l.epoch == epoch => Ok(Exit::Yes),
        Some(l) => {
            tracing::warn!(
                event = "check_failed",
                epoch,
                "lease {name} in {shown} is not live at epoch {epoch}: {} at epoch {}",
                state(&l),
                l.epoch
            );
            Ok(Exit::No)
        }
        None => {
            tracing::warn!(
                event = "check_failed",
                epoch,
                "no lease named {name} in {shown}"
            );
            Ok(Exit::No)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes scripts parse: keys in this order, control characters
    /// escaped, text that is not ASCII left as it is.
    #[test]
    fn status_json_keeps_its_shape() {
        let l = LeaseInfo {
            name: "n".into(),
            holder: Some("h\"\\\n\u{1}é".into()),
            epoch: -3,
            expires_in_ms: Some(1500),
            advertised: Some("10.0.0.7:8080".into()),
            kept: false,
            slots: None,
        };
        let repl = Replication::unknown("not known (x)");
        let j = serde_json::to_string(&LeaseJson::new(&l, Some(&repl))).unwrap();
        assert_eq!(
            j,
            r#"{"name":"n","holder":"h\"\\\n\u0001é","epoch":-3,"live":true,"expires_in_ms":1500,"kept":false,"advertised":"10.0.0.7:8080","slot":0,"slots":1,"replication":"not known (x)","failover_can_lose_acquisition":null}"#
        );
    }

    fn info(holder: Option<&str>, ms: Option<i64>) -> LeaseInfo {
        LeaseInfo {
            name: "n".into(),
            holder: holder.map(str::to_string),
            epoch: 3,
            expires_in_ms: ms,
            ..LeaseInfo::default()
        }
    }

    /// A store that deletes the lease key (Redis, etcd) keeps no time of a
    /// free lease's end: none is made up.
    #[test]
    fn a_free_lease_without_a_known_end_shows_no_age() {
        assert_eq!(state(&info(None, None)), "free");
        let j = serde_json::to_string(&LeaseJson::new(&info(None, None), None)).unwrap();
        assert_eq!(
            j,
            r#"{"name":"n","holder":null,"epoch":3,"live":false,"expires_in_ms":null,"kept":false,"advertised":null,"slot":0,"slots":1}"#
        );
        assert_eq!(state(&info(None, Some(-1500))), "free since 1.5s ago");
        // In JSON a free lease has no expiry on any store, whether or not
        // the store kept when it ended.
        let j = serde_json::to_string(&LeaseJson::new(&info(None, Some(-1500)), None)).unwrap();
        assert!(j.contains(r#""expires_in_ms":null"#), "{j}");
        let j = serde_json::to_string(&LeaseJson::new(&info(Some("h"), Some(-200)), None)).unwrap();
        assert!(j.contains(r#""expires_in_ms":-200"#), "{j}");
        assert_eq!(state(&info(Some("h"), Some(2500))), "held, expires in 2.5s");
        assert_eq!(state(&info(Some("h"), Some(-200))), "expired 200ms ago");
        assert_eq!(
            state(&info(Some("h"), Some(365 * 86_400_000 - 700))),
            "held, expires in 365d"
        );
    }

    /// A lease kept by `--min-hold` after its run ended reads differently
    /// from one whose command still runs; the advertised value is shown
    /// printable.
    #[test]
    fn a_kept_lease_and_an_advertised_value_are_told() {
        let mut l = info(Some("h"), Some(2500));
        l.kept = true;
        l.advertised = Some("http://a/\u{202e}x".into());
        assert_eq!(
            state(&l),
            format!(
                "kept by --min-hold (run ended), expires in 2.5s; advertises http://a/\\u{{202e}}x"
            )
        );
        assert!(!state(&l).contains('\u{202e}'));
    }
}
