//! Push wake-ups on Postgres: `LISTEN` on one fixed channel (two for
//! `watch`), the lease name as the payload.

use sqlx::postgres::PgConnectOptions;

use crate::store::wake::{Heard, Wakeups};
use crate::store::StoreError;

/// The one channel every release and clear notifies. One fixed channel, not
/// one per lease: channel names are identifiers, cut at 63 bytes without a
/// word (`LISTEN` on a 128-byte name would listen on its first 63 bytes, and
/// two long names would share a channel by accident). The payload (up to
/// 8000 bytes) carries the whole name.
pub const PG_CHANNEL: &str = "leaderrun_released";

/// The channel every acquisition notifies, for `watch` alone: a waiting
/// contender does not listen on it (an acquisition is nothing it can act
/// on). Fixed, as [`PG_CHANNEL`], and named in the acquire statements.
pub const PG_ACQUIRED_CHANNEL: &str = "leaderrun_acquired";

/// The channels a subscription listens on.
fn channels(heard: Heard) -> &'static [&'static str] {
    match heard {
        Heard::Releases => &[PG_CHANNEL],
        Heard::Changes => &[PG_CHANNEL, PG_ACQUIRED_CHANNEL],
    }
}

pub struct PgWakeups {
    opts: sqlx::postgres::PgConnectOptions,
    /// The lease whose release wakes us (the notification's payload).
    name: String,
    /// The channels listened on ([`channels`]).
    channels: &'static [&'static str],
    listener: Option<sqlx::postgres::PgListener>,
    /// The server process the `LISTEN` was made on.
    backend: i32,
    /// The `LISTEN` was seen not to hold on this connection (a pooler in
    /// transaction mode): for the rest of the run, wake-ups are unavailable
    /// and nothing is tried again.
    pooled: bool,
}

impl PgWakeups {
    pub(crate) fn new(
        opts: sqlx::postgres::PgConnectOptions,
        name: String,
        heard: Heard,
    ) -> PgWakeups {
        PgWakeups {
            opts,
            name,
            channels: channels(heard),
            listener: None,
            backend: 0,
            pooled: false,
        }
    }
}

pub(super) fn pg_err(what: &str, e: sqlx::Error) -> StoreError {
    StoreError::unavailable(format!("{what}: {}", crate::store::sql::message(&e))).with_source(e)
}

/// What the elector logs once (at info, as `push_broken`) when the `LISTEN`
/// does not hold.
pub(super) const POOLED: &str =
    "LISTEN does not hold on this connection: a pooler in transaction mode \
     (PgBouncer's pool_mode = transaction) hands each transaction to any server connection; \
     run waiters there with --no-push";

/// Rows of a statement run on the listener's own connection, so that any
/// notification arriving meanwhile is kept for `wake`.
pub(super) async fn listener_rows(
    l: &mut sqlx::postgres::PgListener,
    sql: &str,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    sqlx::Executor::fetch_all(&mut *l, sqlx::raw_sql(sql))
        .await
        .map_err(|e| pg_err("cannot LISTEN", e))
}

/// The server process now serving the listener, and whether it listens on
/// every one of `chans`. With `backend`, that server process (and no other)
/// is first made to `LISTEN` (a no-op when it already does): every
/// statement the listener sends after its first names the channels, so an
/// operator looking for the waiters' connections in `pg_stat_activity`
/// finds them.
pub(super) async fn serving(
    l: &mut sqlx::postgres::PgListener,
    backend: Option<i32>,
    chans: &[&str],
) -> Result<(i32, bool), StoreError> {
    let listen = backend.map_or(String::new(), |b| {
        let each: String = chans.iter().map(|c| format!("LISTEN {c}; ")).collect();
        format!("DO $$BEGIN IF pg_backend_pid() = {b} THEN {each}END IF; END$$; ")
    });
    let names = chans
        .iter()
        .map(|c| format!("'{c}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let q = format!(
        "{listen}SELECT pg_backend_pid(), (SELECT count(DISTINCT c) FROM pg_listening_channels() c \
         WHERE c IN ({names})) = {}",
        chans.len()
    );
    let rows = listener_rows(l, &q).await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::unavailable("cannot LISTEN: no answer"))?;
    let get = |e: sqlx::Error| pg_err("cannot LISTEN", e);
    Ok((
        sqlx::Row::try_get(row, 0).map_err(get)?,
        sqlx::Row::try_get(row, 1).map_err(get)?,
    ))
}

impl PgWakeups {
    /// Subscribe on a connection of its own, making sure the subscription
    /// holds. Behind a pooler in transaction mode each transaction may run
    /// on another server connection: a `LISTEN` would stay on whichever one
    /// ran it, listen for nobody, and hand its notifications to the next
    /// client that gets that server connection. So the `LISTEN` is made only
    /// on the server process that answered the statement before (a `DO`
    /// block compares `pg_backend_pid()`), and is then checked by the next
    /// statement (and before every later attempt, in `arm`): the same server
    /// process, listening. Anything else means the connection is pooled per
    /// transaction, and push is given up for the run.
    ///
    /// A pooler that happened to hand back the same server connection every
    /// time is indistinguishable from a direct connection; its `LISTEN` is
    /// found out when another client's transaction ran there in between
    /// (every lease call sends `UNLISTEN *` first, statements.rs),
    /// and until then it harms nobody: each lease call that meets it also
    /// ends it.
    pub(super) async fn subscribe(&mut self) -> Result<(), StoreError> {
        // A pool of one, made lazily: sqlx's listener wants a pool, and the
        // connection it takes is this subscription's alone.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(self.opts.clone());
        let mut l = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .map_err(|e| pg_err("cannot LISTEN", e))?;
        let chans = self.channels;
        let (backend, _) = serving(&mut l, None, chans).await?;
        // A LISTEN takes effect at commit: the statement after it sees it.
        serving(&mut l, Some(backend), chans).await?;
        if serving(&mut l, Some(backend), chans).await? != (backend, true) {
            self.give_up(l).await;
            return Err(StoreError::unavailable(POOLED));
        }
        self.backend = backend;
        self.listener = Some(l);
        Ok(())
    }

    /// Push does not work on this connection: say so for good, and end a
    /// `LISTEN` left on the server connection that last served us, if this
    /// lands there (best effort: lease calls end any that is left).
    pub(super) async fn give_up(&mut self, mut l: sqlx::postgres::PgListener) {
        self.pooled = true;
        self.listener = None;
        let _ = listener_rows(&mut l, "UNLISTEN *").await;
    }
}

impl Wakeups for PgWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        if self.pooled {
            return Err(StoreError::unavailable(POOLED));
        }
        match self.listener.as_mut() {
            None => self.subscribe().await?,
            Some(l) => match serving(l, Some(self.backend), self.channels).await {
                Ok(now) if now == (self.backend, true) => {}
                Ok(_) => {
                    if let Some(l) = self.listener.take() {
                        self.give_up(l).await;
                    }
                    return Err(StoreError::unavailable(POOLED));
                }
                Err(e) => {
                    self.listener = None;
                    return Err(e);
                }
            },
        }
        if let Some(l) = self.listener.as_mut() {
            while l.next_buffered().is_some() {}
        }
        Ok(())
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        let name = self.name.clone();
        let name = name.as_str();
        loop {
            let Some(l) = self.listener.as_mut() else {
                return Err(StoreError::unavailable("not listening"));
            };
            match l.try_recv().await {
                // Any slot of the name (`--slots`; see FileWakeups), on
                // any channel listened on.
                Ok(Some(n)) if crate::names::slot_of(n.payload(), name).is_some() => return Ok(()),
                Ok(Some(_)) => {}
                // The listener would reconnect by itself on the next
                // call, silently missing what was sent meanwhile; drop
                // it instead, so the caller knows to poll until `arm`
                // builds a new one.
                Ok(None) => {
                    self.listener = None;
                    return Err(StoreError::unavailable("the LISTEN connection was lost"));
                }
                Err(e) => {
                    self.listener = None;
                    return Err(pg_err("the LISTEN connection failed", e));
                }
            }
        }
    }
}

/// Push wake-ups over several hosts: LISTEN on one; when that fails (a host
/// down, or a standby, which refuses LISTEN), the next `arm` tries the next
/// host, round the list. Until then the contender polls, as with any broken
/// subscription.
pub struct HostsWakeups {
    hosts: Vec<PgConnectOptions>,
    at: usize,
    heard: Heard,
    inner: PgWakeups,
}

impl HostsWakeups {
    /// `None` for an empty list.
    pub(super) fn new(
        hosts: Vec<PgConnectOptions>,
        name: &str,
        heard: Heard,
    ) -> Option<HostsWakeups> {
        let first = hosts.first()?.clone();
        Some(HostsWakeups {
            hosts,
            at: 0,
            heard,
            inner: PgWakeups::new(first, name.to_string(), heard),
        })
    }
}

impl Wakeups for HostsWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        let r = self.inner.arm().await;
        if r.is_err() && self.hosts.len() > 1 {
            self.at = (self.at + 1) % self.hosts.len();
            let name = std::mem::take(&mut self.inner.name);
            self.inner = PgWakeups::new(self.hosts[self.at].clone(), name, self.heard);
        }
        r
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        self.inner.wake().await
    }
}
