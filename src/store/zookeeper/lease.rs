//! The store's operations on one connection: take, renew, give back, read
//! and clear a lease, each a handful of requests and one `multi`.
//!
//! For lease `NAME`, under `CHROOT/leaderrun/NAME`:
//!
//! * `epoch`: a persistent node whose data is the last epoch handed out, in
//!   decimal. Its version is what every write compares.
//! * `lease`: the grant, `EPOCH\nlease\nMS\nSESSION\nHOLDER`. Ephemeral,
//!   owned by the holder's session: ZooKeeper deletes it when the session
//!   expires. A `--min-hold` release replaces it with a persistent
//!   `EPOCH\nhold\nMS\n-\nHOLDER`, which ends `MS` after its creation by
//!   the ZooKeeper leader's clock.
//!
//! **The lease's values live in the lease node** (`--advertise`, and the
//! keep mark): a hold is only ever written by a release with a keep, when
//! the tenure's run has ended, so a hold *is* the "kept" mark; the
//! advertised value is a line of the grant (`Grant::encode`). So both are
//! written by the very `multi` that takes (or keeps) the lease, are this
//! tenure's alone (the node is made anew by each take, and the next take
//! deletes the last one), and go with the lease: with the session that
//! owns the node, the release that deletes it, the hold's end. A node of
//! its own would need its own ephemeral-or-persistent dance, kept in step
//! with the lease node's by every `multi`, to say no more.
//!
//! An acquisition is one `multi`: the counter set to epoch + 1 *at the
//! version read* (or created, at 1), an expired hold deleted at its
//! version, and the lease node created. Two racers that read the same
//! counter cannot both pass, and the node's existence keeps everyone else
//! out, so exactly one wins and the epoch rises by exactly one.

use std::time::Duration;

use super::conn::{Conn, Res, ZkError};
use super::once::{Found, Run};
use super::proto::{
    code, multi_error, op, read_multi, Acl, Op, OpResult, Reader, Stat, EPHEMERAL, PERSISTENT,
};
use crate::store::sql::millis;
use crate::store::{Acquired, LeaseInfo, LeaseKey};

/// How often an acquisition re-reads after losing a race on the counter,
/// before it reports the lease as held (someone else is changing it).
const ROUNDS: usize = 5;

/// Where one lease's nodes are.
pub(super) struct Paths {
    pub dir: String,
    pub counter: String,
    pub lease: String,
    /// `--once-per`'s run record (once.rs).
    pub run: String,
}

impl Paths {
    pub fn new(root: &str, name: &str) -> Paths {
        // A lease name may hold '/', '.', '..' or anything else: escaped,
        // so each name is exactly one node under the root and no name can
        // reach another's nodes.
        let dir = format!("{root}/{}", node_name(name));
        Paths {
            counter: format!("{dir}/epoch"),
            lease: format!("{dir}/lease"),
            run: format!("{dir}/run"),
            dir,
        }
    }
}

/// Bytes kept as they are in a node name: no '.', so neither "." nor
/// ".." can be formed, and no '/'; '%' is escaped like the rest.
const KEEP: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// The node a lease name is kept under.
pub(super) fn node_name(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, KEEP).to_string()
}

/// The lease name a node under the root stands for; `None` for a node
/// leaderrun did not name.
pub(super) fn lease_name(node: &str) -> Option<String> {
    let name = percent_encoding::percent_decode_str(node)
        .decode_utf8()
        .ok()?;
    (node_name(&name) == node).then(|| name.into_owned())
}

/// What the lease node says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Grant {
    pub epoch: i64,
    /// A `--min-hold` hold (persistent), not a live lease (ephemeral).
    pub hold: bool,
    pub ms: i64,
    /// The session that owns a lease node, and its password: what a renewal
    /// on another connection (a new process naming holder and epoch)
    /// resumes. Readable only by whoever may also delete the node (its ACL),
    /// so it gives nobody more than they had. Empty for a hold.
    pub session: Option<(i64, Vec<u8>)>,
    /// `--advertise`'s value for this tenure, kept through its hold.
    pub advertised: Option<String>,
    /// `--slots`' N for this tenure, above 1 (a plain run's grant has none).
    pub slots: Option<u32>,
    pub holder: String,
}

/// Bytes escaped in the advertised value's line: line breaks (and every
/// control character), so the value stays one line, and '%' itself.
const VALUE_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// What starts the advertised value's line, before the holder's: a
/// control character, which no holder `--holder` accepts (names.rs), so
/// a grant written before values were kept (the holder right after the
/// session) reads as it was. An older release reading a grant with a
/// value shows it in the holder, which compares with none of its own.
const VALUE_MARK: char = '\u{1e}';

/// What starts the line of `--slots`' N, after the value's and before the
/// holder's: another control character, for the same reason.
const SLOTS_MARK: char = '\u{1d}';

impl Grant {
    pub fn encode(&self) -> Vec<u8> {
        let kind = if self.hold { "hold" } else { "lease" };
        let session = self.session.as_ref().map_or("-".to_string(), |(id, pw)| {
            let hex: String = pw.iter().map(|b| format!("{b:02x}")).collect();
            format!("{id}:{hex}")
        });
        let value = self.advertised.as_deref().map_or(String::new(), |v| {
            let v = percent_encoding::utf8_percent_encode(v, VALUE_ESCAPED);
            format!("{VALUE_MARK}{v}\n")
        });
        let slots = self
            .slots
            .map_or(String::new(), |n| format!("{SLOTS_MARK}{n}\n"));
        format!(
            "{}\n{kind}\n{}\n{session}\n{value}{slots}{}",
            self.epoch, self.ms, self.holder
        )
        .into_bytes()
    }

    pub fn decode(data: &[u8]) -> Option<Grant> {
        let text = std::str::from_utf8(data).ok()?;
        let mut parts = text.splitn(5, '\n');
        let epoch = parts.next()?.parse().ok()?;
        let hold = match parts.next()? {
            "lease" => false,
            "hold" => true,
            _ => return None,
        };
        let ms = parts.next()?.parse().ok()?;
        let session = match parts.next()? {
            "-" => None,
            s => {
                let (id, hex) = s.split_once(':')?;
                if hex.len() % 2 != 0 || !hex.is_ascii() {
                    return None;
                }
                let pw = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
                    .collect::<Option<Vec<u8>>>()?;
                Some((id.parse().ok()?, pw))
            }
        };
        let rest = parts.next()?;
        let (advertised, rest) = match rest.strip_prefix(VALUE_MARK) {
            Some(marked) => {
                let (value, rest) = marked.split_once('\n')?;
                let value = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .ok()?;
                (Some(value.into_owned()), rest)
            }
            None => (None, rest),
        };
        let (slots, holder) = match rest.strip_prefix(SLOTS_MARK) {
            Some(marked) => {
                let (n, holder) = marked.split_once('\n')?;
                let n = n.parse::<u32>().ok().filter(|&n| n > 1)?;
                (Some(n), holder)
            }
            None => (None, rest),
        };
        Some(Grant {
            epoch,
            hold,
            ms,
            session,
            advertised,
            slots,
            holder: holder.to_string(),
        })
    }
}

/// The counter: the last epoch handed out and the node's version; `None`
/// when no epoch was ever handed out.
type Counter = Option<(i64, i32)>;

fn counter_of(node: Option<(Vec<u8>, Stat)>) -> Res<Counter> {
    match node {
        None => Ok(None),
        Some((data, stat)) => std::str::from_utf8(&data)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(|e| Some((e, stat.version)))
            .ok_or(ZkError::Refused(
                "its epoch node does not hold a number: it was written by something else".into(),
            )),
    }
}

/// The requests leaderrun makes, each one round trip.
impl Conn {
    /// A node's data and metadata; `None` when it does not exist.
    pub async fn get(&mut self, path: &str) -> Res<Option<(Vec<u8>, Stat)>> {
        match self
            .request(op::GET_DATA, |w| {
                w.string(path).bool(false);
            })
            .await
        {
            Ok(body) => {
                let mut r = Reader::new(&body);
                let data = r.buffer()?.to_vec();
                Ok(Some((data, r.stat()?)))
            }
            Err(ZkError::Server(code::NO_NODE)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `path` exists, leaving a watch on it when `watch`.
    pub async fn exists(&mut self, path: &str, watch: bool) -> Res<bool> {
        match self
            .request(op::EXISTS, |w| {
                w.string(path).bool(watch);
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(ZkError::Server(code::NO_NODE)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Create `path` when missing (its parent must exist). Looked for
    /// first: ZooKeeper checks the parent's `create` permission before it
    /// says a node exists, so a root made by someone else under a parent
    /// this identity may only read would otherwise refuse every run.
    pub async fn ensure(&mut self, path: &str, acl: Acl) -> Res<()> {
        if self.exists(path, false).await? {
            return Ok(());
        }
        let create = Op::Create {
            path,
            data: &[],
            acl,
            flags: PERSISTENT,
        };
        match self.request(op::CREATE, |w| create.write(w)).await {
            Ok(_) | Err(ZkError::Server(code::NODE_EXISTS)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `root` (`CHROOT/leaderrun`) and the chroot's nodes above it, when
    /// missing: the chroot's open to anyone, as a ZooKeeper client's chroot
    /// is only a prefix; `root` with `acl`.
    pub async fn ensure_root(&mut self, root: &str, acl: Acl) -> Res<()> {
        if let Some(parent) = root.strip_suffix("/leaderrun").filter(|p| !p.is_empty()) {
            let mut at = String::new();
            for part in parent.split('/').skip(1) {
                at = format!("{at}/{part}");
                self.ensure(&at, Acl::Open).await?;
            }
        }
        self.ensure(root, acl).await
    }

    /// A `multi`: `Ok(Ok(results))` when it was applied, `Ok(Err(code))`
    /// when it was not, with the code of the operation that failed.
    pub async fn multi(&mut self, ops: &[Op<'_>]) -> Res<Result<Vec<OpResult>, i32>> {
        let body = self
            .request(op::MULTI, |w| super::proto::write_multi(w, ops))
            .await?;
        let results = read_multi(&mut Reader::new(&body))?;
        Ok(match multi_error(&results) {
            None => Ok(results),
            Some(c) if c == code::SESSION_EXPIRED => return Err(ZkError::Expired),
            Some(c) => Err(c),
        })
    }

    /// Make the server this connection talks to catch up with the leader,
    /// so the reads after it are not older than any write acknowledged
    /// before it.
    pub async fn sync(&mut self, path: &str) -> Res<()> {
        self.request(op::SYNC, |w| {
            w.string(path);
        })
        .await
        .map(|_| ())
    }

    /// The names of `path`'s children; empty when `path` does not exist.
    pub async fn children(&mut self, path: &str) -> Res<Vec<String>> {
        match self
            .request(op::GET_CHILDREN, |w| {
                w.string(path).bool(false);
            })
            .await
        {
            Ok(body) => Ok(Reader::new(&body).strings()?),
            Err(ZkError::Server(code::NO_NODE)) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The ZooKeeper leader's wall clock now (milliseconds since 1970):
    /// the `mtime` a write of `dir`'s (empty) data is stamped with. The
    /// only clock a hold's end is compared with, so no host's clock is.
    pub(super) async fn leader_now(&mut self, dir: &str) -> Res<i64> {
        let body = self
            .request(op::SET_DATA, |w| {
                w.string(dir).buffer(&[]).int(-1);
            })
            .await?;
        Ok(Reader::new(&body).stat()?.mtime)
    }

    async fn read(&mut self, p: &Paths) -> Res<(Counter, Option<(Grant, Stat)>)> {
        let counter = counter_of(self.get(&p.counter).await?)?;
        let lease = match self.get(&p.lease).await? {
            None => None,
            Some((data, stat)) => Some((
                Grant::decode(&data).ok_or(ZkError::Refused(
                    "its lease node was written by something else".into(),
                ))?,
                stat,
            )),
        };
        Ok((counter, lease))
    }

    /// Take the lease for `key`'s holder, with the ephemeral node on this
    /// connection's session and `key`'s advertised value in it; under
    /// `--once-per` (`rule`), the period too (once.rs). `Held` when it is
    /// held (or others keep changing it); `Err(why)` for a run record this
    /// release cannot read.
    pub async fn take(
        &mut self,
        root: &str,
        p: &Paths,
        key: &LeaseKey,
        lease: Duration,
        rule: Option<crate::store::Period>,
        acl: Acl,
    ) -> Res<Result<Acquired, String>> {
        let holder = key.holder.as_str();
        for _ in 0..ROUNDS {
            let (counter, current) = self.read(p).await?;
            let last = counter.map_or(0, |(e, _)| e);
            let mut expired_hold = None;
            if let Some((g, stat)) = &current {
                if stat.ephemeral_owner == self.creds.id && g.holder == holder && g.epoch == last {
                    // Ours already: an earlier attempt whose reply was lost
                    // took it on this very session.
                    return Ok(Ok(Acquired::Taken(g.epoch)));
                }
            }
            // The period before the lease: a run of this period that still
            // holds the lease is "done this period" too (under
            // `--retry-failed`, one with no end yet is found held below).
            let run = match rule {
                Some(rule) => match self.period(p, rule).await? {
                    Found::Done { started_ms_ago } => {
                        return Ok(Ok(Acquired::DoneThisPeriod { started_ms_ago }))
                    }
                    Found::Open { record } => Some(record),
                    Found::Unreadable(why) => return Ok(Err(why)),
                },
                None => None,
            };
            if let Some((g, stat)) = &current {
                if !g.hold {
                    return Ok(Ok(Acquired::Held));
                }
                if self.leader_now(&p.dir).await? < stat.ctime.saturating_add(g.ms) {
                    return Ok(Ok(Acquired::Held));
                }
                expired_hold = Some(stat.version);
            }
            if counter.is_none() {
                self.ensure_root(root, acl).await?;
                self.ensure(&p.dir, acl).await?;
            }
            let epoch = last + 1;
            let (next, value) = (
                epoch.to_string(),
                Grant {
                    epoch,
                    hold: false,
                    ms: millis(lease),
                    session: Some((self.creds.id, self.creds.passwd.clone())),
                    advertised: key.advertise.clone(),
                    slots: key.slots_value(),
                    holder: holder.to_string(),
                }
                .encode(),
            );
            let mut ops = vec![match counter {
                Some((_, version)) => Op::SetData {
                    path: &p.counter,
                    data: next.as_bytes(),
                    version,
                },
                None => Op::Create {
                    path: &p.counter,
                    data: next.as_bytes(),
                    acl,
                    flags: PERSISTENT,
                },
            }];
            if let Some(version) = expired_hold {
                ops.push(Op::Delete {
                    path: &p.lease,
                    version,
                });
            }
            ops.push(Op::Create {
                path: &p.lease,
                data: &value,
                acl,
                flags: EPHEMERAL,
            });
            // Under --once-per the run record is made anew, so that its
            // creation time is this run's start by the leader's clock; the
            // last one is deleted at the version read.
            let record = Run {
                epoch,
                outcome: None,
                holder: holder.to_string(),
            }
            .encode();
            if let Some(last_run) = run {
                if let Some(version) = last_run {
                    ops.push(Op::Delete {
                        path: &p.run,
                        version,
                    });
                }
                ops.push(Op::Create {
                    path: &p.run,
                    data: &record,
                    acl,
                    flags: PERSISTENT,
                });
            }
            match self.multi(&ops).await? {
                Ok(_) => return Ok(Ok(Acquired::Taken(epoch))),
                // Someone else moved the counter or the lease node between
                // the reads and the multi: read again.
                Err(code::BAD_VERSION | code::NODE_EXISTS | code::NO_NODE) => continue,
                Err(c) => return Err(ZkError::Server(c)),
            }
        }
        Ok(Ok(Acquired::Held))
    }

    /// Whether the lease is still `holder`'s at `epoch` on this session:
    /// one `multi` (a check, a rewrite), which ZooKeeper's leader runs through its
    /// quorum like any write, after checking the session is alive. The
    /// caller made a fresh handshake first (mod.rs says why).
    pub async fn still_ours(&mut self, p: &Paths, holder: &str, epoch: i64) -> Res<bool> {
        let (counter, current) = self.read(p).await?;
        let Some((e, version)) = counter else {
            return Ok(false);
        };
        // The lease node's own version, never -1: -1 is ZooKeeper's "any
        // version", which would pass a node that is no longer ours.
        let (g, lease_version) = match current {
            Some((g, stat))
                if !g.hold
                    && g.epoch == epoch
                    && g.holder == holder
                    && stat.ephemeral_owner == self.creds.id =>
            {
                (g, stat.version)
            }
            _ => return Ok(false),
        };
        if e != epoch {
            return Ok(false);
        }
        // The lease node rewritten as it is, at its version: as much a
        // proof as a check, and its `mtime` becomes this renewal's time by
        // the leader's clock, from which `info` tells how long is left.
        let data = g.encode();
        let checks = [
            Op::Check {
                path: &p.counter,
                version,
            },
            Op::SetData {
                path: &p.lease,
                data: &data,
                version: lease_version,
            },
        ];
        match self.multi(&checks).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(code::BAD_VERSION | code::NO_NODE)) | Err(ZkError::Expired) => Ok(false),
            Ok(Err(c)) => Err(ZkError::Server(c)),
            Err(e) => Err(e),
        }
    }

    /// Give the lease back if it is still `holder`'s at `epoch`, from any
    /// session (the watchdog's has its own). With `keep`, a persistent hold
    /// replaces it, and the counter is rewritten (same value, new version)
    /// so that a renewal still in flight fails its check.
    pub async fn give_back(
        &mut self,
        p: &Paths,
        holder: &str,
        epoch: i64,
        keep: Duration,
        acl: Acl,
    ) -> Res<bool> {
        // A renewal rewrites the lease node (a new version): one still in
        // flight when this read is made (the watchdog's hand-back after a
        // kill -9) fails this multi, and a second look finds the node
        // still this holder's at the new version.
        for _ in 0..ROUNDS {
            match self.give_back_once(p, holder, epoch, keep, acl).await? {
                Some(done) => return Ok(done),
                None => continue,
            }
        }
        Ok(false)
    }

    /// One look and one `multi`; `None` when the node changed in between.
    async fn give_back_once(
        &mut self,
        p: &Paths,
        holder: &str,
        epoch: i64,
        keep: Duration,
        acl: Acl,
    ) -> Res<Option<bool>> {
        let (counter, current) = self.read(p).await?;
        let (Some((e, version)), Some((g, stat))) = (counter, current) else {
            return Ok(Some(false));
        };
        if e != epoch || g.epoch != epoch || g.holder != holder || g.hold {
            return Ok(Some(false));
        }
        let next = e.to_string();
        // The hold is the keep mark; the tenure's advertised value moves
        // into it.
        let hold = Grant {
            epoch,
            hold: true,
            ms: millis(keep),
            session: None,
            advertised: g.advertised.clone(),
            slots: g.slots,
            holder: holder.to_string(),
        }
        .encode();
        let mut ops = vec![
            Op::Check {
                path: &p.counter,
                version,
            },
            Op::Delete {
                path: &p.lease,
                version: stat.version,
            },
        ];
        if !keep.is_zero() {
            ops[0] = Op::SetData {
                path: &p.counter,
                data: next.as_bytes(),
                version,
            };
            ops.push(Op::Create {
                path: &p.lease,
                data: &hold,
                acl,
                flags: PERSISTENT,
            });
        }
        match self.multi(&ops).await? {
            Ok(_) => Ok(Some(true)),
            Err(code::BAD_VERSION) => Ok(None),
            Err(code::NO_NODE) => Ok(Some(false)),
            Err(c) => Err(ZkError::Server(c)),
        }
    }

    /// The lease as the ensemble has it, after a `sync`, so it is not older
    /// than anything acknowledged before this call.
    pub async fn info(&mut self, name: &str, p: &Paths) -> Res<Option<LeaseInfo>> {
        self.sync(&p.dir).await?;
        let (counter, current) = self.read(p).await?;
        let Some((epoch, _)) = counter else {
            return Ok(None);
        };
        let (holder, expires_in_ms, advertised, kept, slots) = match current {
            None => (None, None, None, false, None),
            // A hold that ended is a free lease: none of its values.
            Some((g, stat)) if g.hold => {
                let now = self.leader_now(&p.dir).await?;
                let left = stat.ctime.saturating_add(g.ms).saturating_sub(now);
                let live = left > 0;
                (
                    Some(g.holder).filter(|_| live),
                    Some(left),
                    g.advertised.filter(|_| live),
                    live,
                    g.slots.filter(|_| live),
                )
            }
            // The session times out `ms` after the ensemble last heard
            // from its holder, which is when the last renewal (or the
            // acquisition) stamped the node, by the leader's clock; the
            // ensemble expires sessions up to a tick late, and a new leader
            // restarts every timeout, so a node still there is held.
            Some((g, stat)) => {
                let now = self.leader_now(&p.dir).await?;
                let left = stat.mtime.saturating_add(g.ms).saturating_sub(now);
                (
                    Some(g.holder),
                    Some(left.max(1)),
                    g.advertised,
                    false,
                    g.slots,
                )
            }
        };
        Ok(Some(LeaseInfo {
            name: name.to_string(),
            holder,
            epoch,
            expires_in_ms,
            advertised,
            kept,
            slots,
        }))
    }

    /// A node's ACL, each entry as `scheme:id:perms` (`perms` in
    /// ZooKeeper's letters, `cdrwa`). A digest id is shown by its user
    /// alone: the rest is a hash of the password.
    pub async fn acl_of(&mut self, path: &str) -> Res<Vec<String>> {
        let body = self
            .request(op::GET_ACL, |w| {
                w.string(path);
            })
            .await?;
        let mut r = Reader::new(&body);
        let n = r.int()?;
        let mut out = Vec::new();
        for _ in 0..n.max(0) {
            let (perms, scheme, id) = (r.int()?, r.string()?, r.string()?);
            let id = match scheme.as_str() {
                "digest" => id.split(':').next().unwrap_or_default().to_string(),
                _ => id,
            };
            let letters: String = [(4, 'c'), (8, 'd'), (1, 'r'), (2, 'w'), (16, 'a')]
                .iter()
                .filter(|(bit, _)| perms & bit != 0)
                .map(|(_, l)| *l)
                .collect();
            out.push(format!("{scheme}:{id}:{letters}"));
        }
        Ok(out)
    }

    /// What this identity lacks under `root` of what a run does there:
    /// create a node (a new lease's) and list them (`status`). Tried, as
    /// ZooKeeper has no question for it: an ephemeral probe, named as no
    /// lease can be (a '.'), created and deleted again (when deleting is
    /// refused, it goes with the session).
    pub async fn lacks_under(&mut self, root: &str) -> Res<Vec<&'static str>> {
        let mut missing = Vec::new();
        let probe = format!("{root}/init.probe");
        let create = Op::Create {
            path: &probe,
            data: &[],
            acl: Acl::Open,
            flags: EPHEMERAL,
        };
        match self.request(op::CREATE, |w| create.write(w)).await {
            // At version 0, which a node just created has: never ZooKeeper's
            // "any version" (-1).
            Ok(_) => match self
                .request(op::DELETE, |w| {
                    w.string(&probe).int(0);
                })
                .await
            {
                Ok(_) | Err(ZkError::Server(code::NO_AUTH | code::NO_NODE | code::BAD_VERSION)) => {
                }
                Err(e) => return Err(e),
            },
            // Another init's probe: the permission was checked first.
            Err(ZkError::Server(code::NODE_EXISTS)) => {}
            Err(ZkError::Server(code::NO_AUTH)) => missing.push("create"),
            Err(e) => return Err(e),
        }
        match self.children(root).await {
            Ok(_) => {}
            Err(ZkError::Server(code::NO_AUTH)) => missing.push("read"),
            Err(e) => return Err(e),
        }
        Ok(missing)
    }

    /// Every lease under `root`, by name.
    pub async fn every(&mut self, root: &str) -> Res<Vec<LeaseInfo>> {
        self.sync(root).await?;
        let mut names: Vec<String> = self
            .children(root)
            .await?
            .iter()
            .filter_map(|n| lease_name(n))
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(info) = self.info(&name, &Paths::new(root, &name)).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Delete the lease node (only at `epoch`, when given); the lease as it
    /// was, or `None` when there was nothing to clear.
    pub async fn clear(
        &mut self,
        name: &str,
        p: &Paths,
        epoch: Option<i64>,
    ) -> Res<Option<LeaseInfo>> {
        for _ in 0..ROUNDS {
            let Some(before) = self.info(name, p).await? else {
                return Ok(None);
            };
            let (counter, current) = self.read(p).await?;
            let (Some((e, version)), Some((_, stat))) = (counter, current) else {
                return Ok(None);
            };
            if epoch.is_some_and(|want| want != e) || e != before.epoch {
                return Ok(None);
            }
            let ops = [
                Op::Check {
                    path: &p.counter,
                    version,
                },
                Op::Delete {
                    path: &p.lease,
                    version: stat.version,
                },
            ];
            match self.multi(&ops).await? {
                Ok(_) => return Ok(Some(before)),
                Err(code::BAD_VERSION | code::NO_NODE) => continue,
                Err(c) => return Err(ZkError::Server(c)),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_round_trips_and_rejects_what_is_not_one() {
        let g = Grant {
            epoch: 42,
            hold: true,
            ms: 1500,
            session: None,
            advertised: None,
            slots: None,
            holder: "host a:1\nodd".into(),
        };
        assert_eq!(Grant::decode(&g.encode()), Some(g.clone()));
        for value in ["10.0.0.7:8080 (a)", "line\nbreak 100% \u{1e}", ""] {
            for slots in [None, Some(2), Some(64)] {
                let v = Grant {
                    advertised: Some(value.into()),
                    slots,
                    ..g.clone()
                };
                assert_eq!(Grant::decode(&v.encode()), Some(v), "{value:?}");
            }
        }
        let n = Grant {
            slots: Some(3),
            ..g.clone()
        };
        assert_eq!(Grant::decode(&n.encode()), Some(n));
        let live = Grant {
            hold: false,
            session: Some((-7, vec![0, 255, 16])),
            ..g
        };
        assert_eq!(Grant::decode(&live.encode()), Some(live));
        assert_eq!(
            Grant::decode(b"7\nlease\n10\n-\nh").map(|g| (g.hold, g.advertised, g.holder)),
            Some((false, None, "h".into())),
            "a grant written before values were kept"
        );
        for bad in [
            &b""[..],
            b"x\nlease\n1\n-\nh",
            b"1\nother\n1\n-\nh",
            b"1\nlease\n1\n-",
            b"1\nlease\n1\n5:0\nh",
            b"1\nlease\n1\n5:zz\nh",
            b"1\nlease\n1\n-\n\x1eno holder line",
            b"1\nlease\n1\n-\n\x1e%ff\nh",
            b"1\nlease\n1\n-\n\x1d1\nh",
            b"1\nlease\n1\n-\n\x1dx\nh",
            b"1\nlease\n1\n-\n\x1d2",
            b"\xff",
        ] {
            assert_eq!(Grant::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn counter_reads_a_number_or_refuses() {
        let stat = Stat {
            version: 3,
            ..Stat::default()
        };
        assert_eq!(counter_of(None).ok(), Some(None));
        assert_eq!(
            counter_of(Some((b"12".to_vec(), stat))).ok(),
            Some(Some((12, 3)))
        );
        assert!(counter_of(Some((b"twelve".to_vec(), stat))).is_err());
    }

    #[test]
    fn paths_sit_under_the_root() {
        let p = Paths::new("/apps/leaderrun", "job.1");
        assert_eq!(p.dir, "/apps/leaderrun/job%2E1");
        assert_eq!(p.counter, "/apps/leaderrun/job%2E1/epoch");
        assert_eq!(p.lease, "/apps/leaderrun/job%2E1/lease");
    }

    #[test]
    fn names_are_one_node_each_and_read_back() {
        for name in ["a/../b", "..", ".", "x%2F", "ü", "{leader}:1", "a b"] {
            let node = node_name(name);
            assert!(!node.contains('/') && !node.contains('.'), "{node}");
            assert_eq!(lease_name(&node).as_deref(), Some(name));
        }
        assert_eq!(lease_name("job%2e1"), None, "not a name leaderrun wrote");
    }
}
