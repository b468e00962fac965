//! The operator's subcommands: status, release, check, init.

use std::time::Duration;

use crate::cli::{Admin, Common};
use crate::exit;
use crate::json::Json;
use crate::stderr::out;
use crate::store::{LeaseInfo, StoreAdmin, StoreError};

/// Admin calls are one-shot; this bounds connecting plus the statement.
const CALL: Duration = Duration::from_secs(10);

/// `1`: the answer is "no" (no such lease, nothing cleared, not live).
pub const NO: i32 = 1;

pub async fn run(cmd: Admin, common: Common) -> i32 {
    let mut store = match crate::store::resolve(common.store, "leaderrun admin", CALL) {
        Ok(s) => s,
        Err(msg) => {
            crate::stderr::line(&format!("error: {msg}"));
            return exit::USAGE;
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
        Admin::Init { print } => {
            if print {
                out(&format!("{};\n", store.table_sql()));
                Ok(0)
            } else {
                store.init(CALL).await.map(|()| {
                    out(&format!("lease table ready in {}\n", store.describe()));
                    0
                })
            }
        }
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(event = "store_error", "{e}");
            exit::FAILURE
        }
    }
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
            Some(_) => out(&format!(
                "{}\n",
                objs.first().map(String::as_str).unwrap_or("null")
            )),
            None => out(&format!("[{}]\n", objs.join(","))),
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
        out(&format!(
            "{:w$}  {:hw$}  {:>6}  STATE\n",
            "NAME", "HOLDER", "EPOCH"
        ));
        for l in &leases {
            let holder = l.holder.as_deref().unwrap_or("-");
            out(&format!(
                "{:w$}  {holder:hw$}  {:>6}  {}\n",
                l.name,
                l.epoch,
                state(l)
            ));
        }
    }
    if name.is_some() && leases.is_empty() {
        if !json {
            crate::stderr::line(&format!("no lease named {}", name.unwrap_or_default()));
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
            out(&format!(
                "released {name}: was held by {} at epoch {} ({}); the next holder gets epoch {} or higher\n",
                was.holder.as_deref().unwrap_or("-"),
                was.epoch,
                state(&was),
                was.epoch + 1
            ));
            Ok(0)
        }
        None => {
            match epoch {
                Some(e) => crate::stderr::line(&format!(
                    "{name} is not held at epoch {e}; nothing released"
                )),
                None => crate::stderr::line(&format!("{name} is not held; nothing released")),
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
