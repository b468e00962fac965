//! `WAIT` and `WAITAOF`: a write counts, with `?replicas=N`, only once `N`
//! replicas have it and the primary has it on disk, all within the call's
//! deadline.

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::RedisError;
use tokio::time::Instant;

use super::server::{count, Server};

/// After a write on `c`: until `n` replicas acknowledge it (`WAIT`) and,
/// on Redis 7.2 and later with an append-only file (`aof`), until the
/// primary has it on disk (`WAITAOF 1 0`), all before `deadline - reserve`.
/// The timeouts sent are shorter by the server's `tick` ([`Server::tick`]),
/// since that is how late they may end. `None` when confirmed; otherwise
/// what fell short.
///
/// `WAIT` must run on the connection that wrote, right after the write:
/// it waits for that connection's last write. A replica's acknowledgement
/// means it has the write in memory, so a failover to it keeps the write;
/// the primary's disk keeps it across a restart. The replicas' own disks
/// are not waited for (`WAITAOF 1 N` would refuse every call where replicas
/// run without an append-only file, and guards only a second failure).
/// `WAIT` and `WAITAOF` take a timeout in milliseconds, where 0 means for
/// ever: 0 is never sent.
pub(super) async fn confirm(
    c: &mut MultiplexedConnection,
    n: u32,
    server: &Server,
    deadline: Instant,
    reserve: Duration,
) -> Result<Option<String>, RedisError> {
    let reserve = reserve + server.tick();
    let Some(t) = wait_ms(deadline, reserve) else {
        return Ok(Some(format!(
            "left no time to wait for {}",
            count(n, "replica")
        )));
    };
    let acked: i64 = ::redis::cmd("WAIT").arg(n).arg(t).query_async(c).await?;
    if acked < i64::from(n) {
        return Ok(Some(format!(
            "reached {acked} of {} within {t} ms",
            count(n, "replica")
        )));
    }
    if server.waitaof() {
        let Some(t) = wait_ms(deadline, reserve) else {
            return Ok(Some("left no time to wait for the primary's disk".into()));
        };
        let synced: Vec<i64> = ::redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(t)
            .query_async(c)
            .await?;
        if synced.first().copied().unwrap_or(0) < 1 {
            return Ok(Some(format!(
                "was not on the primary's disk within {t} ms (WAITAOF)"
            )));
        }
    }
    Ok(None)
}

/// Whole milliseconds from now to `deadline - reserve`; `None` below one.
pub(super) fn wait_ms(deadline: Instant, reserve: Duration) -> Option<u64> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .saturating_sub(reserve);
    u64::try_from(left.as_millis()).ok().filter(|ms| *ms > 0)
}

/// What to keep back from a call's deadline for what follows a `WAIT` (on
/// top of the server's tick): at least `floor` and `1/share` of what is
/// left, and `round_trips` times the round trip the script took, but never
/// more than half of what is left.
pub(super) fn reserve(
    rtt: Duration,
    left: Duration,
    floor: Duration,
    share: u32,
    round_trips: u32,
) -> Duration {
    (rtt * round_trips)
        .max(floor)
        .max(left / share)
        .min(left / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_fit_the_deadline() {
        let ms = Duration::from_millis;
        // The hand-back's share of a 1.3 s acquisition: a quarter.
        assert_eq!(reserve(ms(1), ms(1300), ms(50), 4, 4), ms(325));
        // A slow round trip takes more, never more than half.
        assert_eq!(reserve(ms(100), ms(300), ms(50), 4, 4), ms(150));
        assert_eq!(reserve(ms(1), ms(300), ms(10), 5, 2), ms(60));
        let soon = Instant::now() + ms(50);
        assert_eq!(
            wait_ms(soon, ms(60)),
            None,
            "never WAIT 0: that is for ever"
        );
        assert!(wait_ms(Instant::now() + ms(500), ms(100)).is_some_and(|t| t <= 400));
    }
}
