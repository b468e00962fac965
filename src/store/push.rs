//! Push wake-ups: a hint that a lease was freed, so a waiting contender tries
//! again at once instead of at its next poll.
//!
//! A wake-up decides nothing (docs/contract.md): the atomic acquire still
//! does, and the poll every `P` stays as the fallback. So everything here may
//! fail, arrive twice, arrive for nothing, or not arrive, without any effect
//! on safety; the only thing it must never do is arrive *before* the lease is
//! free and then stay silent, and it cannot: every store publishes in the
//! same step as the release (a Postgres `NOTIFY` is delivered at commit, a
//! Redis `PUBLISH` runs inside the release script) or after it (the embedded
//! store touches a file once the transaction committed).
//!
//! The elector subscribes ([`Wakeups::arm`]) *before* every acquisition
//! attempt, so a release that lands after the attempt found the lease held
//! is always seen by the subscription, never between the two.
//!
//! Each subscription lives on a connection (or file descriptor) of its own,
//! never on the store's command connection: a subscriber that breaks must not
//! cost the lease loop a reconnect, and the command connection's reads must
//! not interleave with notifications.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use super::StoreError;

pub type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + 'a>>;

/// A subscription to "lease NAME was freed".
pub trait Wakeups {
    /// Called before each acquisition attempt: subscribe when not subscribed
    /// (rebuilding a broken subscription), and forget wake-ups already
    /// received, which the attempt about to be made supersedes. An error
    /// leaves the contender polling until the next attempt arms again.
    fn arm<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()>;

    /// Completes when a wake-up for `name` arrived since `arm`, or with an
    /// error when the subscription broke (the caller then polls). Never
    /// completes otherwise; dropping the future loses nothing.
    fn wake<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()>;
}

pub type AnyWakeups = Box<dyn Wakeups>;

// ---------------------------------------------------------------------------
// Postgres: LISTEN on one fixed channel, the lease name as payload.

/// The one channel every release and clear notifies. One fixed channel, not
/// one per lease: channel names are identifiers, cut at 63 bytes without a
/// word (`LISTEN` on a 128-byte name would listen on its first 63 bytes, and
/// two long names would share a channel by accident). The payload (up to
/// 8000 bytes) carries the whole name.
pub const PG_CHANNEL: &str = "leaderrun_released";

pub struct PgWakeups {
    opts: sqlx::postgres::PgConnectOptions,
    listener: Option<sqlx::postgres::PgListener>,
    /// The server process the `LISTEN` was made on.
    backend: i32,
    /// The `LISTEN` was seen not to hold on this connection (a pooler in
    /// transaction mode): for the rest of the run, wake-ups are unavailable
    /// and nothing is tried again.
    pooled: bool,
}

impl PgWakeups {
    pub fn new(opts: sqlx::postgres::PgConnectOptions) -> PgWakeups {
        PgWakeups {
            opts,
            listener: None,
            backend: 0,
            pooled: false,
        }
    }
}

fn pg_err(what: &str, e: &sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!("{what}: {}", super::sql::message(e)))
}

/// What the elector logs once (at info, as `push_broken`) when the `LISTEN`
/// does not hold.
const POOLED: &str = "LISTEN does not hold on this connection: a pooler in transaction mode \
     (PgBouncer's pool_mode = transaction) hands each transaction to any server connection; \
     run waiters there with --no-push";

/// Rows of a statement run on the listener's own connection, so that any
/// notification arriving meanwhile is kept for `wake`.
async fn listener_rows(
    l: &mut sqlx::postgres::PgListener,
    sql: &str,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    sqlx::Executor::fetch_all(&mut *l, sqlx::raw_sql(sql))
        .await
        .map_err(|e| pg_err("cannot LISTEN", &e))
}

/// The server process now serving the listener, and whether it listens on
/// the channel. With `backend`, that server process (and no other) is first
/// made to `LISTEN` (a no-op when it already does): every statement the
/// listener sends after its first names the channel, so an operator
/// looking for the waiters' connections in `pg_stat_activity` finds them.
async fn serving(
    l: &mut sqlx::postgres::PgListener,
    backend: Option<i32>,
) -> Result<(i32, bool), StoreError> {
    let listen = backend.map_or(String::new(), |b| {
        format!("DO $$BEGIN IF pg_backend_pid() = {b} THEN LISTEN {PG_CHANNEL}; END IF; END$$; ")
    });
    let q = format!(
        "{listen}SELECT pg_backend_pid(), EXISTS (SELECT FROM pg_listening_channels() c \
         WHERE c = '{PG_CHANNEL}')"
    );
    let rows = listener_rows(l, &q).await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Unavailable("cannot LISTEN: no answer".into()))?;
    let get = |e: sqlx::Error| pg_err("cannot LISTEN", &e);
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
    /// (every lease call sends `UNLISTEN *` first, src/store/postgres.rs),
    /// and until then it harms nobody: each lease call that meets it also
    /// ends it.
    async fn subscribe(&mut self) -> Result<(), StoreError> {
        // A pool of one, made lazily: sqlx's listener wants a pool, and the
        // connection it takes is this subscription's alone.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(self.opts.clone());
        let mut l = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .map_err(|e| pg_err("cannot LISTEN", &e))?;
        let (backend, _) = serving(&mut l, None).await?;
        // A LISTEN takes effect at commit: the statement after it sees it.
        serving(&mut l, Some(backend)).await?;
        if serving(&mut l, Some(backend)).await? != (backend, true) {
            self.give_up(l).await;
            return Err(StoreError::Unavailable(POOLED.into()));
        }
        self.backend = backend;
        self.listener = Some(l);
        Ok(())
    }

    /// Push does not work on this connection: say so for good, and end a
    /// `LISTEN` left on the server connection that last served us, if this
    /// lands there (best effort: lease calls end any that is left).
    async fn give_up(&mut self, mut l: sqlx::postgres::PgListener) {
        self.pooled = true;
        self.listener = None;
        let _ = listener_rows(&mut l, "UNLISTEN *").await;
    }
}

impl Wakeups for PgWakeups {
    fn arm<'a>(&'a mut self, _name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            if self.pooled {
                return Err(StoreError::Unavailable(POOLED.into()));
            }
            match self.listener.as_mut() {
                None => self.subscribe().await?,
                Some(l) => match serving(l, Some(self.backend)).await {
                    Ok(now) if now == (self.backend, true) => {}
                    Ok(_) => {
                        if let Some(l) = self.listener.take() {
                            self.give_up(l).await;
                        }
                        return Err(StoreError::Unavailable(POOLED.into()));
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
        })
    }

    fn wake<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            loop {
                let Some(l) = self.listener.as_mut() else {
                    return Err(StoreError::Unavailable("not listening".into()));
                };
                match l.try_recv().await {
                    Ok(Some(n)) if n.payload() == name => return Ok(()),
                    Ok(Some(_)) => {}
                    // The listener would reconnect by itself on the next
                    // call, silently missing what was sent meanwhile; drop
                    // it instead, so the caller knows to poll until `arm`
                    // builds a new one.
                    Ok(None) => {
                        self.listener = None;
                        return Err(StoreError::Unavailable(
                            "the LISTEN connection was lost".into(),
                        ));
                    }
                    Err(e) => {
                        self.listener = None;
                        return Err(pg_err("the LISTEN connection failed", &e));
                    }
                }
            }
        })
    }
}

// ---------------------------------------------------------------------------
// Redis: SUBSCRIBE to a channel per lease, published by the release script.

/// The channel the release and clear scripts publish on for `name`. One
/// channel per lease (Redis channel names have no length limit), in the
/// lease's hash tag so a cluster routes it with the lease's keys.
pub fn redis_channel(name: &str) -> String {
    format!("{{leaderrun:{name}}}:released")
}

pub struct RedisWakeups {
    client: ::redis::Client,
    sub: Option<::redis::aio::PubSub>,
}

impl RedisWakeups {
    pub fn new(client: ::redis::Client) -> RedisWakeups {
        RedisWakeups { client, sub: None }
    }
}

impl Wakeups for RedisWakeups {
    fn arm<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            let err =
                |e: ::redis::RedisError| StoreError::Unavailable(format!("cannot SUBSCRIBE: {e}"));
            if self.sub.is_none() {
                let mut s = self.client.get_async_pubsub().await.map_err(err)?;
                s.subscribe(redis_channel(name)).await.map_err(err)?;
                self.sub = Some(s);
            }
            // Drain what already arrived: the attempt that follows sees it.
            if let Some(s) = self.sub.as_mut() {
                let mut stream = s.on_message();
                loop {
                    let next = std::future::poll_fn(|cx| {
                        std::task::Poll::Ready(futures_core::Stream::poll_next(
                            Pin::new(&mut stream),
                            cx,
                        ))
                    })
                    .await;
                    match next {
                        std::task::Poll::Ready(Some(_)) => continue,
                        std::task::Poll::Ready(None) => {
                            drop(stream);
                            self.sub = None;
                            return Err(StoreError::Unavailable(
                                "the SUBSCRIBE connection was lost".into(),
                            ));
                        }
                        std::task::Poll::Pending => break,
                    }
                }
            }
            Ok(())
        })
    }

    fn wake<'a>(&'a mut self, _name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            let Some(s) = self.sub.as_mut() else {
                return Err(StoreError::Unavailable("not subscribed".into()));
            };
            let got = {
                let mut stream = s.on_message();
                std::future::poll_fn(|cx| {
                    futures_core::Stream::poll_next(Pin::new(&mut stream), cx)
                })
                .await
                .is_some()
            };
            if got {
                // Only this lease's channel is subscribed.
                Ok(())
            } else {
                self.sub = None;
                Err(StoreError::Unavailable(
                    "the SUBSCRIBE connection was lost".into(),
                ))
            }
        })
    }
}

// ---------------------------------------------------------------------------
// The embedded store: an inotify watch on a directory of per-lease files.

/// Why inotify on a file touched after the release, and not a `flock` the
/// holder keeps while leading: a lock dies with the process that holds it,
/// and when leaderrun is killed its command keeps running until the watchdog
/// has stopped it and released the lease. A waiter woken by the lock would
/// find the lease still held, and then have nothing left to wait on for the
/// watchdog's release (the lock is free, so blocking on it returns at once).
/// A file touched by whoever releases — leaderrun, its watchdog, `leaderrun
/// release` — wakes the waiter exactly when the lease is free. What is left,
/// leaderrun and its watchdog killed together, is an expiry, and the waiter
/// has already scheduled its next attempt for then.
///
/// The directory sits beside the database (`leases.db-wake/`), one empty file
/// per lease name; names cannot contain `/` or start with `.`, so they are
/// safe file names and cannot collide with the temporary files below.
pub fn wake_dir(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wake");
    PathBuf::from(s)
}

/// Tell waiters on this host that `name` was freed: a file renamed into
/// place, which inotify reports as `IN_MOVED_TO` with the lease's name.
/// Renaming needs only the directory to be writable, whoever created the
/// file before. Best effort: a waiter that misses it polls.
pub fn touch(db: &Path, name: &str) {
    let dir = wake_dir(db);
    let attempt = || -> std::io::Result<()> {
        if !dir.is_dir() {
            make_dir(db, &dir)?;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, b"")?;
        std::fs::rename(&tmp, dir.join(name))
    };
    if let Err(e) = attempt() {
        tracing::debug!(
            event = "push_failed",
            "cannot wake waiters ({e}); they poll"
        );
    }
}

/// The wake directory, with the database directory's permissions: whoever
/// may use the database may wake and be woken.
fn make_dir(db: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = db
        .parent()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0o700, |m| m.permissions().mode() & 0o7777);
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// tokio wants `AsRawFd`; nix's inotify offers `AsFd`.
struct Ino(nix::sys::inotify::Inotify);

impl std::os::fd::AsRawFd for Ino {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

pub struct FileWakeups {
    db: PathBuf,
    fd: Option<tokio::io::unix::AsyncFd<Ino>>,
}

impl FileWakeups {
    pub fn new(db: PathBuf) -> FileWakeups {
        FileWakeups { db, fd: None }
    }

    /// Read what is pending; `Ok(true)` when `name` was woken, an error when
    /// the watch is gone (the directory was removed).
    fn drain(&mut self, name: &str) -> Result<bool, StoreError> {
        use nix::sys::inotify::AddWatchFlags as F;
        let Some(fd) = self.fd.as_ref() else {
            return Err(StoreError::Unavailable("not watching".into()));
        };
        let mut woken = false;
        loop {
            match fd.get_ref().0.read_events() {
                Ok(evs) => {
                    for ev in evs {
                        if ev.mask.intersects(F::IN_IGNORED | F::IN_Q_OVERFLOW) {
                            // The watch is gone, or events were dropped:
                            // anything may have happened.
                            self.fd = None;
                            return Err(StoreError::Unavailable(
                                "the wake-up directory watch ended".into(),
                            ));
                        }
                        if ev.name.as_deref().and_then(|n| n.to_str()) == Some(name) {
                            woken = true;
                        }
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return Ok(woken),
                Err(e) => {
                    self.fd = None;
                    return Err(StoreError::Unavailable(format!("inotify: {e}")));
                }
            }
        }
    }
}

impl Wakeups for FileWakeups {
    fn arm<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
            if self.fd.is_none() {
                let dir = wake_dir(&self.db);
                let fail = |e: &dyn std::fmt::Display| {
                    StoreError::Unavailable(format!("cannot watch {}: {e}", dir.display()))
                };
                if !dir.is_dir() {
                    make_dir(&self.db, &dir).map_err(|e| fail(&e))?;
                }
                let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                    .map_err(|e| fail(&e))?;
                ino.add_watch(&dir, F::IN_MOVED_TO | F::IN_CLOSE_WRITE)
                    .map_err(|e| fail(&e))?;
                // SAFETY: `Ino` owns the descriptor, so it stays open (and
                // the same file) for as long as the registration lives.
                let fd = unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        Ino(ino),
                        tokio::io::Interest::READABLE,
                    )
                }
                .map_err(|e| fail(&e.into_parts().1))?;
                self.fd = Some(fd);
            }
            self.drain(name).map(|_| ())
        })
    }

    fn wake<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            loop {
                let Some(fd) = self.fd.as_ref() else {
                    return Err(StoreError::Unavailable("not watching".into()));
                };
                let mut ready = fd
                    .readable()
                    .await
                    .map_err(|e| StoreError::Unavailable(format!("inotify: {e}")))?;
                ready.clear_ready();
                drop(ready);
                if self.drain(name)? {
                    return Ok(());
                }
            }
        })
    }
}
