//! The operator's subcommands: status, release, check, init.

use std::time::Duration;

use crate::cli::{Admin, Common};
use crate::exit;
use crate::json::Json;
use crate::store::{Init, LeaseInfo, StoreAdmin, StoreError};

/// Admin calls are one-shot; this bounds connecting plus the statement.
const CALL: Duration = Duration::from_secs(10);

/// `1`: the answer is "no" (no such lease, nothing cleared, not live).
pub const NO: i32 = 1;

pub async fn run(cmd: Admin, common: Common) -> i32 {
    let choice = crate::store::choose(common.store, common.store_origin);
    if let (Admin::Init { print: true }, None) = (&cmd, &choice) {
        // No store configured: the embedded one creates its own table, so
        // whoever asks for SQL means a server's, and Postgres is the default.
        print_schema(crate::store::postgres::SCHEMA, "no store configured; ");
        return 0;
    }
    let choice = choice.as_ref().map(|(s, o)| (s.as_str(), *o));
    let mut store = match crate::store::open(choice, "leaderrun admin", CALL) {
        Ok(s) => s,
        Err(e) => {
            crate::errln!("leaderrun: error: {e}");
            return e.exit_code();
        }
    };
    tracing::info!(event = "store", "store {}", store.describe());
    if let Admin::Release { name, .. } | Admin::Check { name, .. } = &cmd {
        crate::logging::set_context(name, "");
    }
    let res = match cmd {
        Admin::Status { name, json } => status(&mut store, name, json).await,
        Admin::Release { name, epoch } => release(&mut store, &name, epoch).await,
        Admin::Check { name, epoch } => check(&mut store, &name, epoch).await,
        Admin::Init { print: true } => match store.schema() {
            Some(schema) => {
                print_schema(schema, "");
                Ok(0)
            }
            None => {
                crate::errln!(
                    "leaderrun: {} keeps no table; there is no SQL to print",
                    store.describe()
                );
                Ok(0)
            }
        },
        Admin::Init { print: false } => store.init(CALL).await.map(|done| {
            match done {
                Init::Ready => crate::outln!("lease table ready in {}", store.describe()),
                Init::NothingToDo => {
                    crate::outln!("nothing to do: {} keeps no table", store.describe())
                }
            }
            0
        }),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(event = "store_error", "{e}");
            exit::FAILURE
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

async fn status<S: StoreAdmin + crate::store::Store>(
    store: &mut S,
    name: Option<String>,
    json: bool,
) -> Result<i32, StoreError> {
    let leases = match &name {
        Some(n) => store.inspect(n, CALL).await?.into_iter().collect(),
        None => store.list(CALL).await?,
    };
    if json {
        let objs: Vec<String> = leases.iter().map(lease_json).collect();
        match &name {
            Some(_) => crate::outln!("{}", objs.first().map(String::as_str).unwrap_or("null")),
            None => crate::outln!("[{}]", objs.join(",")),
        }
    } else if !leases.is_empty() {
        let w = leases
            .iter()
            .map(|l| l.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let hw = leases
            .iter()
            .map(|l| l.holder.as_deref().map_or(1, str::len))
            .max()
            .unwrap_or(6)
            .max(6);
        crate::outln!("{:w$}  {:hw$}  {:>6}  STATE", "NAME", "HOLDER", "EPOCH");
        for l in &leases {
            let holder = l.holder.as_deref().unwrap_or("-");
            crate::outln!("{:w$}  {holder:hw$}  {:>6}  {}", l.name, l.epoch, state(l));
        }
    }
    if name.is_some() && leases.is_empty() {
        if !json {
            crate::errln!("leaderrun: no lease named {}", name.unwrap_or_default());
        }
        return Ok(NO);
    }
    Ok(0)
}

fn ago(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(ms.unsigned_abs())).to_string()
}

fn state(l: &LeaseInfo) -> String {
    match (&l.holder, l.expires_in_ms) {
        (Some(_), ms) if ms > 0 => format!("held, expires in {}", ago(ms)),
        (Some(_), ms) => format!("expired {} ago", ago(ms)),
        (None, ms) => format!("free since {} ago", ago(ms.min(0))),
    }
}

fn lease_json(l: &LeaseInfo) -> String {
    let mut j = Json::new();
    j.str("name", &l.name)
        .opt_str("holder", l.holder.as_deref())
        .int("epoch", l.epoch)
        .bool("live", l.is_live())
        .int("expires_in_ms", l.expires_in_ms);
    j.finish()
}

async fn release<S: StoreAdmin>(
    store: &mut S,
    name: &str,
    epoch: Option<i64>,
) -> Result<i32, StoreError> {
    match store.clear(name, epoch, CALL).await? {
        Some(was) => {
            crate::outln!(
                "released {name}: was held by {} at epoch {} ({}); the next holder gets epoch {} or higher",
                was.holder.as_deref().unwrap_or("-"),
                was.epoch,
                state(&was),
                was.epoch.saturating_add(1)
            );
            Ok(0)
        }
        None => {
            match epoch {
                Some(e) => {
                    crate::errln!("leaderrun: {name} is not held at epoch {e}; nothing released")
                }
                None => crate::errln!("leaderrun: {name} is not held; nothing released"),
            }
            Ok(NO)
        }
    }
}

async fn check<S: crate::store::Store>(
    store: &mut S,
    name: &str,
    epoch: i64,
) -> Result<i32, StoreError> {
    let info = store.inspect(name, CALL).await?;
    match info {
        Some(l) if l.is_live() && l.epoch == epoch => Ok(0),
        Some(l) => {
            tracing::warn!(
                event = "check_failed",
                epoch,
                "lease {name} is not live at epoch {epoch}: {} at epoch {}",
                state(&l),
                l.epoch
            );
            Ok(NO)
        }
        None => {
            tracing::warn!(event = "check_failed", epoch, "no lease named {name}");
            Ok(NO)
        }
    }
}
