//! Who ends a stopped leaderrun that holds a lease file's (or the store
//! file's) write lock, and when: the policy; stopped.rs finds the holder and
//! ends it safely. docs/stores.md, "The embedded store in detail", gives
//! the rules and their bounds.

use super::*;

/// Whether a stopped leaderrun that holds lease `name`'s file may be ended
/// for a caller with `claim`, given the row as it was last committed
/// (`None`: no row; `Err`: it cannot even be read, which only a process
/// stopped while rebuilding the WAL index, before it read anything, causes).
///
/// Ended are the processes that stand between the lease and the one it
/// belongs to: when the lease is free, over, or from another boot, nobody's
/// run depends on the stopped process any more (a holder stopped past its
/// lease has lost it; its watchdog stopped its command by `G + K < L`);
/// and when the caller holds the current grant, the stopped process (a
/// contender, an operator's command, a watcher) has no claim on the lease
/// at all, while waiting for it would cost the holder its lease. A stopped
/// holder of a live lease is never ended by a rival: it may be continued
/// before its give-up deadline, and then it has lost nothing.
pub(super) fn may_end(
    row: Result<Option<&State>, ()>,
    claim: Claim<'_>,
    now: i64,
    boot: &str,
) -> bool {
    let Ok(Some(row)) = row else { return true };
    if !row.live(now, boot) {
        return true;
    }
    match claim {
        Claim::Lease => false,
        Claim::Grant { holder, epoch } => {
            row.holder.as_deref() == Some(holder) && row.epoch == epoch
        }
    }
}

/// What holds a lease file's write lock, as far as `unblock` could tell.
#[derive(PartialEq, Eq)]
pub(super) enum Blocked {
    /// A live process, or one that is not ours to end: wait.
    Other,
    /// A stopped leaderrun, left alone because the lease is live and not
    /// the caller's (`may_end`).
    ByLiveLease,
    /// A stopped leaderrun, ended: the lock is about to be let go.
    Ended,
}

/// Lease file `file`'s write lock is taken by someone else: if that is a
/// stopped leaderrun that `may_end` allows ending, end it (its locks go
/// with it, and the caller's next attempt gets the lock).
pub(super) async fn unblock(
    file: &Path,
    conn: Option<&mut SqliteConnection>,
    name: &str,
    claim: Claim<'_>,
) -> Blocked {
    let Some(pid) = stopped::stopped_holder(file) else {
        return Blocked::Other;
    };
    let Ok(boot) = boot_id() else {
        return Blocked::Other;
    };
    let row = match conn {
        Some(c) => read_state(c, name).await.map_err(|_| ()),
        None => Err(()),
    };
    if !may_end(
        row.as_ref().map(Option::as_ref).map_err(|_| ()),
        claim,
        now_ms(),
        &boot,
    ) {
        tracing::debug!(
            event = "store_stopped_holder",
            pid,
            "a stopped leaderrun (pid {pid}) holds the file of lease {name}; the lease is live"
        );
        return Blocked::ByLiveLease;
    }
    if !stopped::end(file, pid) {
        return Blocked::Other;
    }
    tracing::warn!(
        event = "store_stopped_holder",
        pid,
        "ended leaderrun pid {pid}: it was stopped while it held the file of lease {name} ({}), which held up the lease",
        file.display()
    );
    Blocked::Ended
}

/// The store's own file is written only to move a lease out of it (and by
/// an older leaderrun, during an upgrade): a leaderrun stopped while it
/// holds that file's write lock holds up the move of every lease not moved
/// yet, so it is ended. It holds nothing of value there: a leaderrun of
/// this release only marks rows moved, and an older one is ended as a
/// kill -9 would end it (its watchdog hands its lease back).
pub(super) fn end_stopped_on_store_file(db: &Path) -> bool {
    let Some(pid) = stopped::stopped_holder(db) else {
        return false;
    };
    if !stopped::end(db, pid) {
        return false;
    }
    tracing::warn!(
        event = "store_stopped_holder",
        pid,
        "ended leaderrun pid {pid}: it was stopped while it held the write lock of {}",
        db.display()
    );
    true
}

/// `BEGIN IMMEDIATE` on the store's own file, a [`SLICE`] at a time, a
/// stopped leaderrun in the way ended (`end_stopped_on_store_file`); the
/// caller's timeout bounds the wait.
pub(super) async fn begin_on_store_file(
    conn: &mut SqliteConnection,
    db: &Path,
) -> Result<(), sqlx::Error> {
    loop {
        match sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await {
            Ok(_) => return Ok(()),
            Err(e) if busy(&e) => {
                end_stopped_on_store_file(db);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(holder: Option<&str>, epoch: i64, expires_at: i64, boot: &str) -> State {
        State {
            holder: holder.map(str::to_string),
            epoch,
            expires_at,
            boot: boot.to_string(),
        }
    }

    #[test]
    fn a_stopped_process_is_ended_only_for_a_better_claim() {
        let grant = Claim::Grant {
            holder: "h",
            epoch: 7,
        };
        let live = state(Some("h"), 7, 2_000, "b");
        // A live lease: its holder may end a stopped process in its way, a
        // rival may not.
        assert!(may_end(Ok(Some(&live)), grant, 1_000, "b"));
        assert!(!may_end(Ok(Some(&live)), Claim::Lease, 1_000, "b"));
        // ...nor may a former holder (another epoch, another holder).
        let other = Claim::Grant {
            holder: "h",
            epoch: 6,
        };
        assert!(!may_end(Ok(Some(&live)), other, 1_000, "b"));
        let stranger = Claim::Grant {
            holder: "x",
            epoch: 7,
        };
        assert!(!may_end(Ok(Some(&live)), stranger, 1_000, "b"));
        // Over, free, from another boot, no row, unreadable: anyone.
        assert!(may_end(Ok(Some(&live)), Claim::Lease, 2_000, "b"));
        let free = state(None, 7, 5_000, "b");
        assert!(may_end(Ok(Some(&free)), Claim::Lease, 1_000, "b"));
        assert!(may_end(Ok(Some(&live)), Claim::Lease, 1_000, "other boot"));
        assert!(may_end(Ok(None), Claim::Lease, 1_000, "b"));
        assert!(may_end(Err(()), Claim::Lease, 1_000, "b"));
    }
}
