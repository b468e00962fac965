//! The chaos suite's child: works in small steps, each a fenced write to
//! Postgres over its own direct connection, and logs every step with a
//! boot-clock timestamp to a shared file (one `write` per line, O_APPEND, so
//! lines from concurrent children never interleave).
//!
//! Log line: `<boot ns> <contender> <epoch> <pid> <kind>`, kind one of
//! `start`, `ok` (write accepted), `stale` (write rejected by the fence),
//! `err` (the database did not answer), `end` (SIGTERM).

use std::io::Write;
use std::time::Duration;

use sqlx::Connection;

/// One fenced resource per slot (`--slots`): row `slot + 1` of chaos_state.
pub const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS chaos_state (id int PRIMARY KEY, last_epoch bigint NOT NULL);
    INSERT INTO chaos_state VALUES (1, 0), (2, 0), (3, 0), (4, 0) ON CONFLICT DO NOTHING;
    CREATE TABLE IF NOT EXISTS chaos_accepted (id bigserial PRIMARY KEY, epoch bigint NOT NULL,
        contender text NOT NULL, slot int NOT NULL DEFAULT 0)";

/// The resource rejects an older epoch in the same statement as the write.
/// The row lock on chaos_state orders accepted writes, so chaos_accepted.id
/// is their commit order.
const FENCED_WRITE: &str = "WITH u AS (
        UPDATE chaos_state SET last_epoch = $1 WHERE id = $3 + 1 AND last_epoch <= $1 RETURNING last_epoch)
    INSERT INTO chaos_accepted (epoch, contender, slot) SELECT last_epoch, $2, $3 FROM u RETURNING id";

pub fn boot_ns() -> u128 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("boot clock");
    ts.tv_sec() as u128 * 1_000_000_000 + ts.tv_nsec() as u128
}

/// Runs when the chaos test binary is started with `CHAOS_CHILD=<log>|<url>|<contender>`.
pub fn main(spec: &str) {
    // A job that ignores SIGINT: the fault "Ctrl-C to leaderrun's group,
    // then kill -9" must then be cleaned up by the watchdog, not by the
    // forwarded interrupt.
    // SAFETY: setting a disposition to SIG_IGN runs no code of ours.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let mut parts = spec.splitn(3, '|');
    let (log, url, who) = (
        parts.next().expect("log"),
        parts.next().expect("url"),
        parts.next().expect("contender"),
    );
    let epoch: i64 = std::env::var("LEASE_EPOCH")
        .ok()
        .and_then(|e| e.parse().ok())
        .expect("LEASE_EPOCH");
    // Under --slots each slot is a lease of its own: its own log (the
    // checker runs per slot) and its own fenced resource.
    let slot: Option<i32> = std::env::var("LEASE_SLOT")
        .ok()
        .and_then(|s| s.parse().ok());
    let log = match slot {
        Some(s) => format!("{log}.{s}"),
        None => log.to_string(),
    };
    let slot = slot.unwrap_or(0);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .expect("log");
    let pid = std::process::id();
    let mut line = |kind: &str| {
        let l = format!("{} {who} {epoch} {pid} {kind}\n", boot_ns());
        let _ = file.write_all(l.as_bytes());
    };
    line("start");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("sig");
        let mut conn: Option<sqlx::PgConnection> = None;
        loop {
            tokio::select! {
                _ = term.recv() => { line("end"); std::process::exit(143) }
                _ = tokio::time::sleep(Duration::from_millis(25)) => {}
            }
            let step = async {
                if conn.is_none() {
                    conn = Some(sqlx::PgConnection::connect(url).await?);
                }
                let c = conn.as_mut().expect("connected");
                let row = sqlx::query(FENCED_WRITE)
                    .bind(epoch)
                    .bind(who)
                    .bind(slot)
                    .fetch_optional(c)
                    .await?;
                Ok::<bool, sqlx::Error>(row.is_some())
            };
            match tokio::time::timeout(Duration::from_millis(500), step).await {
                Ok(Ok(true)) => line("ok"),
                Ok(Ok(false)) => line("stale"),
                _ => {
                    conn = None;
                    line("err");
                }
            }
        }
    });
}
