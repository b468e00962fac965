//! What a Redis server says about itself (`INFO`), and what that means for
//! the leases it keeps: the run's warning, `status`'s line.

use std::time::Duration;

use crate::store::Replication;

/// What a server says about itself (`INFO`), as far as leases go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Server {
    /// Changes whenever the process restarts.
    pub(super) run_id: String,
    /// Changes whenever the server's replication history does: promoted
    /// from replica, or resynchronised from another primary (its data
    /// replaced by that primary's). Also, harmlessly, when a primary frees
    /// or creates its replication backlog (`repl-backlog-ttl` after its
    /// last replica left, and when the next one attaches).
    pub(super) replid: String,
    pub(super) version: (u32, u32),
    /// How often the server looks at blocked clients' timeouts
    /// (`configured_hz`, the least its dynamic `hz` goes down to).
    pub(super) hz: u32,
    /// `INFO replication`'s `role`: `master` or `slave`.
    pub(super) role: String,
    /// A replica's primary, `host:port`.
    pub(super) master: Option<String>,
    pub(super) connected_replicas: u32,
    /// `min-replicas-to-write` (with `min-replicas-max-lag`) is on: Redis
    /// prints `min_slaves_good_slaves` only then.
    pub(super) min_replicas_to_write: bool,
    pub(super) aof: bool,
}

impl Server {
    /// From the text of `INFO` sections (`field:value` lines).
    pub(super) fn parse(sections: &[&str]) -> Server {
        let mut s = Server::default();
        let (mut host, mut port) = (None, None);
        for line in sections.iter().flat_map(|t| t.lines()) {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "run_id" => s.run_id = v.to_string(),
                "master_replid" => s.replid = v.to_string(),
                "redis_version" => s.version = parse_version(v),
                "configured_hz" => s.hz = v.parse().unwrap_or(0),
                "role" => s.role = v.to_string(),
                "master_host" => host = Some(v.to_string()),
                "master_port" => port = Some(v.to_string()),
                "connected_slaves" => s.connected_replicas = v.parse().unwrap_or(0),
                "min_slaves_good_slaves" => s.min_replicas_to_write = true,
                "aof_enabled" => s.aof = v == "1",
                _ => {}
            }
        }
        if let (Some(h), Some(p)) = (host, port) {
            s.master = Some(format!("{h}:{p}"));
        }
        s
    }

    /// How late a `WAIT` may return after its timeout: Redis notices a
    /// blocked client's timeout only on its next cron tick (measured on
    /// 7.0: `WAIT 1 100` with no replica answering returns after 200 ms at
    /// the default hz of 10). 100 ms when the server did not say.
    pub(super) fn tick(&self) -> Duration {
        let hz = if self.hz == 0 { 10 } else { self.hz.min(500) };
        Duration::from_millis(1000 / u64::from(hz))
    }

    pub(super) fn is_replica(&self) -> bool {
        self.role == "slave"
    }

    /// `WAITAOF` (Redis 7.2) can confirm that the primary's append-only
    /// file has a write on disk, whatever `appendfsync` says.
    pub(super) fn waitaof(&self) -> bool {
        self.version >= (7, 2) && self.aof
    }
}

/// `7.0.15` → (7, 0); anything unreadable reads as the oldest.
pub(super) fn parse_version(v: &str) -> (u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// What makes a primary able to lose an acquisition it acknowledged, in the
/// words of the run's warning.
pub(super) fn risks(server: &Server, fsync: Option<&str>, replicas: u32) -> Vec<String> {
    let mut out = Vec::new();
    if !server.aof {
        out.push(
            "it keeps no append-only file (appendonly no), so a restart forgets every lease \
             and epoch counter"
                .to_string(),
        );
    } else if let Some(f) = fsync.filter(|f| *f != "always") {
        // With replicas=N on 7.2, WAITAOF confirms the disk write instead.
        if !(replicas > 0 && server.waitaof()) {
            out.push(format!(
                "appendfsync {f}, so a crash can lose the last second of acquisitions and hand \
                 an epoch out twice"
            ));
        }
    }
    if replicas == 0 && server.connected_replicas > 0 && !server.min_replicas_to_write {
        out.push(format!(
            "min-replicas-to-write is 0 with {} connected and no replicas= in the URL, so a \
             primary cut off from its replicas keeps granting leases that a failover loses",
            count(server.connected_replicas, "replica")
        ));
    }
    out
}

pub(super) fn count(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// What `status` says of the server's replication, and whether a failover
/// can lose an acknowledged acquisition: not when every acquisition waits
/// for a replica (`replicas=N ≥ 1`, so a promoted replica has it) *and*
/// the primary has it on disk before it answers (an append-only file with
/// `appendfsync always`, or `WAITAOF` on 7.2), so a restart keeps it too.
pub(super) fn replication_of(server: &Server, fsync: Option<&str>, replicas: u32) -> Replication {
    if server.is_replica() {
        let of = server.master.as_deref().unwrap_or("an unknown primary");
        return Replication::unknown(format!(
            "a replica of {of} (read-only: leases are taken on its primary; ask that)"
        ));
    }
    let mut parts = vec![format!(
        "primary, {} connected",
        count(server.connected_replicas, "replica")
    )];
    parts.push(if replicas > 0 {
        format!("every acquisition and renewal waits for {replicas} (replicas={replicas})")
    } else {
        "nothing waits for a replica (no replicas= in the URL)".into()
    });
    if replicas > server.connected_replicas {
        parts.push(format!(
            "fewer replicas connected than replicas={replicas}: every acquisition fails"
        ));
    }
    parts.push(match (server.aof, fsync) {
        (false, _) => "appendonly no".into(),
        (true, Some(f)) => format!("appendonly yes (appendfsync {f})"),
        (true, None) => "appendonly yes (appendfsync not readable: no CONFIG GET)".into(),
    });
    parts.push(format!(
        "min-replicas-to-write {}",
        if server.min_replicas_to_write {
            "on"
        } else {
            "0"
        }
    ));
    let can_lose = if replicas == 0 || !server.aof {
        Some(true)
    } else if replicas > 0 && server.waitaof() {
        Some(false)
    } else {
        fsync.map(|f| f != "always")
    };
    Replication {
        can_lose_acknowledged: can_lose,
        detail: parts.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `INFO` as Redis 7.0.15 prints it (trimmed), `\r\n` line ends.
    const PRIMARY_INFO: [&str; 3] = [
        "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\
         run_id:01aa66b6a0446fea775d0bcb96a5a29291255dd2\r\nhz:10\r\nconfigured_hz:10\r\n",
        "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmin_slaves_good_slaves:1\r\n\
         slave0:ip=127.0.0.1,port=47112,state=online,offset=126,lag=0\r\n\
         master_replid:a10368cb331c9efd9249127fb92b6edc679e6058\r\n\
         master_replid2:0000000000000000000000000000000000000000\r\n",
        "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n",
    ];

    #[test]
    fn server_from_info() {
        let s = Server::parse(&PRIMARY_INFO);
        assert_eq!(s.run_id, "01aa66b6a0446fea775d0bcb96a5a29291255dd2");
        assert_eq!(s.replid, "a10368cb331c9efd9249127fb92b6edc679e6058");
        assert_eq!((s.version, s.hz, s.role.as_str()), ((7, 0), 10, "master"));
        assert_eq!(
            (s.connected_replicas, s.min_replicas_to_write, s.aof),
            (1, true, true)
        );
        assert_eq!(s.master, None);
        assert!(!s.waitaof(), "7.0 has no WAITAOF");
        assert_eq!(s.tick(), Duration::from_millis(100));
        let replica = Server::parse(&[
            "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\n",
            "# Server\r\nredis_version:7.2.4\r\nconfigured_hz:100\r\n",
        ]);
        assert!(replica.is_replica());
        assert_eq!(replica.master.as_deref(), Some("10.0.0.1:6379"));
        assert_eq!(replica.tick(), Duration::from_millis(10));
        assert_eq!(parse_version("7.2.4"), (7, 2));
        assert_eq!(parse_version("x"), (0, 0));
        // Nothing said: the defaults are the careful ones.
        let empty = Server::parse(&[]);
        assert_eq!(
            (empty.tick(), empty.aof, empty.waitaof()),
            (Duration::from_millis(100), false, false)
        );
    }

    fn server(aof: bool, version: (u32, u32), replicas: u32, min: bool) -> Server {
        Server {
            role: "master".into(),
            aof,
            version,
            connected_replicas: replicas,
            min_replicas_to_write: min,
            ..Server::default()
        }
    }

    #[test]
    fn what_the_warning_names() {
        let none = |s: &Server, f: Option<&str>, n: u32| risks(s, f, n).is_empty();
        assert!(none(&server(true, (7, 0), 1, true), Some("always"), 0));
        assert!(
            none(&server(true, (7, 0), 0, false), Some("always"), 0),
            "no replicas"
        );
        assert!(
            none(&server(true, (7, 0), 2, false), None, 1),
            "replicas= waits"
        );
        let r = risks(&server(false, (7, 0), 1, false), None, 0);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].contains("appendonly no") && r[1].contains("min-replicas-to-write is 0"));
        let r = risks(&server(true, (7, 0), 0, false), Some("everysec"), 1);
        assert!(r[0].contains("appendfsync everysec"), "{r:?}");
        // WAITAOF confirms the disk write when replicas= asks for waiting.
        assert!(none(&server(true, (7, 2), 1, false), Some("everysec"), 1));
        assert!(!none(&server(true, (7, 2), 0, true), Some("everysec"), 0));
    }

    #[test]
    fn what_status_says_a_failover_can_lose() {
        let lose =
            |s: &Server, f: Option<&str>, n: u32| replication_of(s, f, n).can_lose_acknowledged;
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("always"), 1),
            Some(false)
        );
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("always"), 0),
            Some(true)
        );
        assert_eq!(
            lose(&server(false, (7, 0), 1, true), Some("always"), 1),
            Some(true)
        );
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("everysec"), 1),
            Some(true)
        );
        assert_eq!(lose(&server(true, (7, 0), 1, true), None, 1), None);
        assert_eq!(lose(&server(true, (7, 2), 1, true), None, 1), Some(false));
        let r = replication_of(&server(true, (7, 0), 0, false), Some("always"), 2);
        assert!(r.detail.contains("every acquisition fails"), "{r:?}");
        let replica = Server {
            role: "slave".into(),
            master: Some("h:6379".into()),
            ..Server::default()
        };
        let r = replication_of(&replica, None, 1);
        assert_eq!(r.can_lose_acknowledged, None);
        assert!(r.detail.contains("a replica of h:6379"), "{r:?}");
    }
}
