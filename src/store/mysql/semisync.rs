//! Semi-synchronous replication: what `require=sync` checks, and what
//! `status` says of the server's replication.

use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use crate::store::Replication;

/// # `?require=sync`
///
/// MySQL and MariaDB replicate asynchronously by default: a primary that
/// fails right after acknowledging an acquisition may leave it on no
/// replica, and a promoted replica hands the same epoch out again while the
/// first holder runs. With semi-synchronous replication the primary waits,
/// at commit, until a replica has the transaction, *unless* no replica
/// acknowledges within `rpl_semi_sync_master_timeout` (10 s by default):
/// then it switches to asynchronous replication and returns success to the
/// client all the same. The commit's reply cannot tell the two apart.
///
/// What the client can see is the server's count of commits that were not
/// acknowledged (`Rpl_semi_sync_master_no_tx`, `…_source_no_tx` on MySQL
/// 8), which the server raises before it replies to such a commit. So with
/// `require=sync`, each acquire, in one call on one connection:
///
/// 1. reads the semi-sync status and refuses unless it is ON with at least
///    one semi-sync replica connected (nothing is written then);
/// 2. acquires, and reads the count again: if it rose, some commit in that
///    window went unacknowledged, possibly this one. The lease is handed
///    back at once and the attempt reported as failed (may heal: `--wait`
///    keeps trying), so the command is never started on an acquisition
///    that may exist on the primary alone.
///
/// A renewal is checked the same way (step 2): one that may not be on a
/// replica does not count, so the holder's deadline stays where the last
/// acknowledged renewal put it, which is what a promoted replica would
/// enforce. A release is not checked: losing one only delays a rival.
///
/// Nothing is cached: the count read before the statement must be fresh to
/// mean anything, and a cached "ON" would let an acquisition through in the
/// very window after a fallback that this check is for. It costs two reads
/// of `SHOW GLOBAL STATUS` per acquire and one per renewal (each a round
/// trip, no privilege needed). The count is server-wide, so another
/// client's unacknowledged commit in the same moment also fails this
/// attempt: a false alarm costs a retry, never safety. What remains: the
/// replica that acknowledged must be the one promoted (a failover tool's
/// job), and with MariaDB's default `rpl_semi_sync_master_wait_point =
/// AFTER_COMMIT` other clients see the acquisition before it is
/// acknowledged (harmless here: they see it held).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct SemiSync {
    /// `Rpl_semi_sync_…_status`; `None` when the server has no such
    /// variable (the semi-sync plugin is not loaded).
    pub(super) on: Option<bool>,
    /// Semi-sync replicas connected.
    pub(super) clients: i64,
    /// Commits not acknowledged by a replica, since the server started.
    pub(super) no_tx: i64,
}

pub(super) const SEMI_SYNC_STATUS_SQL: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN (
    'Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_clients', 'Rpl_semi_sync_master_no_tx',
    'Rpl_semi_sync_source_status', 'Rpl_semi_sync_source_clients', 'Rpl_semi_sync_source_no_tx')";

pub(super) const REPLICATION_VARS_SQL: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN (
    'rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled',
    'rpl_semi_sync_master_timeout', 'rpl_semi_sync_source_timeout', 'log_bin', 'wsrep_on')";

/// `SHOW …` rows as (lowercased name without the master/source prefix,
/// value).
pub(super) async fn show(
    c: &mut MySqlConnection,
    sql: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let text = |r: &sqlx::mysql::MySqlRow, i: usize| -> Result<String, sqlx::Error> {
        r.try_get::<String, _>(i).or_else(|_| {
            r.try_get::<Vec<u8>, _>(i)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
    };
    let rows = sqlx::query(sql).fetch_all(&mut *c).await?;
    rows.iter()
        .map(|r| {
            let name = text(r, 0)?.to_ascii_lowercase();
            let name = name
                .replace("rpl_semi_sync_master_", "")
                .replace("rpl_semi_sync_source_", "");
            Ok((name, text(r, 1)?))
        })
        .collect()
}

pub(super) fn value<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

pub(super) fn is_on(v: Option<&str>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1")
}

pub(super) async fn semi_sync(c: &mut MySqlConnection) -> Result<SemiSync, sqlx::Error> {
    let st = show(c, SEMI_SYNC_STATUS_SQL).await?;
    let int = |n: &str| value(&st, n).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(SemiSync {
        on: value(&st, "status").map(|v| is_on(Some(v))),
        clients: int("clients"),
        no_tx: int("no_tx"),
    })
}

/// Why a call did not go ahead (or was undone).
pub(super) enum Refusal {
    /// The lease table is missing and could not be created (with the
    /// create's error, when it gave one).
    Table(Option<sqlx::Error>),
    /// `require=sync`: the server has no semi-synchronous replication.
    NoSemiSync,
    /// `require=sync`: semi-sync is configured off.
    SemiSyncOff,
    /// `require=sync`: semi-sync is on but has fallen back to asynchronous.
    FellBack,
    /// `require=sync`: no semi-sync replica is connected.
    NoReplica,
    /// `require=sync`: the commit may not be on a replica.
    NotAcknowledged { acquired: bool },
    /// `require=sync`: the login may not read what the check needs.
    CannotSee(String),
    /// `--once-per`: the run record is not one this release can decide
    /// on (why, as `crate::store::unreadable` says it).
    Unreadable(String),
}

/// Step 1 of the `require=sync` check: `None` when an acquisition may go
/// ahead.
pub(super) async fn sync_refusal(
    c: &mut MySqlConnection,
    st: &SemiSync,
) -> Result<Option<Refusal>, sqlx::Error> {
    Ok(match st.on {
        None => Some(Refusal::NoSemiSync),
        Some(true) if st.clients >= 1 => None,
        Some(true) => Some(Refusal::NoReplica),
        Some(false) => {
            let vars = show(c, REPLICATION_VARS_SQL).await?;
            Some(if is_on(value(&vars, "enabled")) {
                Refusal::FellBack
            } else {
                Refusal::SemiSyncOff
            })
        }
    })
}

/// What `status` shows for the server's replication.
pub(super) fn describe_replication(vars: &[(String, String)], st: &SemiSync) -> Replication {
    let timeout = value(vars, "timeout").unwrap_or("?");
    if is_on(value(vars, "wsrep_on")) {
        // A Galera commit returns once the cluster has certified it.
        return Replication {
            can_lose_acknowledged: Some(false),
            detail: "Galera (wsrep_on)".into(),
        };
    }
    match st.on {
        Some(true) if st.clients >= 1 => Replication {
            can_lose_acknowledged: Some(false),
            detail: format!(
                "semi-synchronous, {} replica(s) connected; falls back to asynchronous after \
                 rpl_semi_sync_master_timeout ({timeout} ms) without an acknowledgement",
                st.clients
            ),
        },
        Some(true) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "semi-synchronous, but no replica connected".into(),
        },
        Some(false) if is_on(value(vars, "enabled")) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "semi-synchronous, fallen back to asynchronous (no replica acknowledged)"
                .into(),
        },
        _ if is_on(value(vars, "log_bin")) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "asynchronous (binary log on, semi-synchronous replication off)".into(),
        },
        // Storage-level replication (a replicated disk, a cloud service's
        // standby) is invisible from here.
        _ => Replication::unknown("binary log off: no replica is fed from this server"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What `status` says follows what the server reports, and only a
    /// working semi-sync (or Galera) is "cannot lose".
    #[test]
    fn replication_is_told_from_the_servers_own_variables() {
        let sync = |on, clients| SemiSync {
            on,
            clients,
            no_tx: 0,
        };
        let cases = [
            (vars(&[("wsrep_on", "ON")]), sync(None, 0), Some(false)),
            (vars(&[("enabled", "ON")]), sync(Some(true), 2), Some(false)),
            (vars(&[("enabled", "ON")]), sync(Some(true), 0), Some(true)),
            (vars(&[("enabled", "ON")]), sync(Some(false), 1), Some(true)),
            (vars(&[("log_bin", "ON")]), sync(Some(false), 0), Some(true)),
            (vars(&[("log_bin", "OFF")]), sync(Some(false), 0), None),
            (vars(&[]), sync(None, 0), None),
        ];
        for (v, st, want) in cases {
            let r = describe_replication(&v, &st);
            assert_eq!(r.can_lose_acknowledged, want, "{v:?} {st:?}: {}", r.detail);
        }
    }
}
