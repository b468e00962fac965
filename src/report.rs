//! Status for the long-running standby pattern: systemd's notify protocol
//! and a Prometheus metrics file.
//!
//! With `NOTIFY_SOCKET` set (a `Type=notify` unit), leaderrun sends
//! `READY=1` once it has contended for the first time, and keeps `STATUS=`
//! current: "waiting; held by host-b:812 (epoch 7) for another 9s",
//! "leading, epoch 7", "lost lease; stopping the command". With
//! `--metrics-file` it rewrites that file (write, then rename: readers never
//! see half a file) on every change.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::elector::{describe_held, Observer};
use crate::store::LeaseInfo;

pub struct Reporter {
    name: String,
    notify: Option<UnixDatagram>,
    ready_sent: bool,
    metrics: Option<PathBuf>,
    leading: bool,
    epoch: i64,
    changes: u64,
    renew_failures: u64,
    last_renewal: Option<SystemTime>,
    last_status: String,
}

/// Connect to `$NOTIFY_SOCKET`: a path, or `@name` for the abstract namespace.
fn notify_socket() -> Option<UnixDatagram> {
    let addr = std::env::var_os("NOTIFY_SOCKET")?;
    let addr = addr.to_str()?;
    let sock = UnixDatagram::unbound().ok()?;
    let res = if let Some(abs) = addr.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())
            .and_then(|a| sock.connect_addr(&a))
    } else {
        sock.connect(addr)
    };
    // A datagram to a busy systemd would block: a status line is not worth
    // holding up the lease loop for (docs/contract.md §10).
    match res.and_then(|()| sock.set_nonblocking(true)) {
        Ok(()) => Some(sock),
        Err(e) => {
            tracing::warn!(
                event = "notify_failed",
                "cannot reach NOTIFY_SOCKET {addr}: {e}"
            );
            None
        }
    }
}

impl Reporter {
    pub fn new(name: &str, metrics: Option<PathBuf>) -> Reporter {
        Reporter {
            name: name.to_string(),
            notify: notify_socket(),
            ready_sent: false,
            metrics,
            leading: false,
            epoch: 0,
            changes: 0,
            renew_failures: 0,
            last_renewal: None,
            last_status: String::new(),
        }
    }

    pub fn shared(self) -> Rc<RefCell<Reporter>> {
        Rc::new(RefCell::new(self))
    }

    fn send(&self, msg: &str) {
        if let Some(s) = &self.notify {
            if let Err(e) = s.send(msg.as_bytes()) {
                tracing::debug!(event = "notify_failed", "NOTIFY_SOCKET: {e}");
            }
        }
    }

    fn status(&mut self, text: String) {
        if text != self.last_status {
            let ready = if self.ready_sent { "" } else { "READY=1\n" };
            self.send(&format!("{ready}STATUS={text}"));
            self.ready_sent = true;
            self.last_status = text;
        }
        self.write_metrics();
    }

    /// Tell systemd the service is up: contending is its normal state, even
    /// while the store cannot be reached yet.
    pub fn starting(&mut self) {
        self.status(format!("contending for lease {}", self.name));
    }

    pub fn acquired(&mut self, epoch: i64) {
        self.leading = true;
        self.epoch = epoch;
        self.changes += 1;
        self.last_renewal = Some(SystemTime::now());
        self.status(format!("leading, epoch {epoch}"));
    }

    pub fn lost(&mut self) {
        self.leading = false;
        self.changes += 1;
        self.status(format!(
            "lost lease (epoch {}); stopping the command",
            self.epoch
        ));
    }

    pub fn released(&mut self) {
        if self.leading {
            self.leading = false;
            self.changes += 1;
        }
        self.send("STOPPING=1");
        self.status(format!(
            "command finished; lease released (epoch {})",
            self.epoch
        ));
    }

    fn write_metrics(&self) {
        let Some(path) = &self.metrics else { return };
        let l = format!("{{name=\"{}\"}}", self.name);
        let mut m = String::new();
        let mut metric = |name: &str, help: &str, kind: &str, value: String| {
            let _ = writeln!(m, "# HELP leaderrun_{name} {help}\n# TYPE leaderrun_{name} {kind}\nleaderrun_{name}{l} {value}");
        };
        metric(
            "leading",
            "1 while this process holds the lease.",
            "gauge",
            u8::from(self.leading).to_string(),
        );
        metric(
            "epoch",
            "Epoch (fencing token) of the lease this process last held.",
            "gauge",
            self.epoch.to_string(),
        );
        metric(
            "leader_changes_total",
            "Times this process became or stopped being the leader.",
            "counter",
            self.changes.to_string(),
        );
        metric(
            "renew_failures_total",
            "Renewals that failed (the store did not answer in time, or errored).",
            "counter",
            self.renew_failures.to_string(),
        );
        // Only the timestamp: the file is rewritten at renewals, so an age
        // computed when writing would read ~0 every time, and would stop
        // growing exactly when it matters (a hung or frozen leaderrun). The
        // reader's clock ages the timestamp: alert on
        // `time() - leaderrun_last_renewal_timestamp_seconds`.
        let at = match self.last_renewal {
            Some(t) => t
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_secs_f64()
                .to_string(),
            None => "NaN".into(),
        };
        metric(
            "last_renewal_timestamp_seconds",
            "Unix time of the last successful acquisition or renewal; alert on time() minus this while leading.",
            "gauge",
            at,
        );
        if let Some(w) = metrics_writer() {
            w.put(path.clone(), m);
        }
    }
}

/// The elector's view, forwarded to a shared [`Reporter`].
pub struct Shared(pub Rc<RefCell<Reporter>>);

impl Observer for Shared {
    fn wants_holder(&self) -> bool {
        self.0.borrow().notify.is_some()
    }
    fn waiting(&mut self, held: Option<&LeaseInfo>) {
        let text = match held {
            Some(info) => format!("waiting; {}", describe_held(info)),
            None => "waiting; the lease is held elsewhere".into(),
        };
        self.0.borrow_mut().status(text);
    }
    fn renewed(&mut self, _lease: &crate::elector::Lease) {
        let mut r = self.0.borrow_mut();
        r.last_renewal = Some(SystemTime::now());
        r.write_metrics();
    }
    fn renew_failed(&mut self, _epoch: i64) {
        let mut r = self.0.borrow_mut();
        r.renew_failures += 1;
        r.write_metrics();
    }
}

/// The metrics file is written by a thread of its own (docs/contract.md §10): a
/// slow or hung filesystem (NFS, a full disk) must not hold up the lease
/// loop. Only the newest content matters, so a write still pending is
/// replaced, never queued. The lock is held only to swap the pending
/// content, never across a write, so [`MetricsWriter::put`] cannot wait for
/// the file; the thread sleeps until there is something to write.
struct MetricsWriter {
    state: Mutex<Pending>,
    /// Signalled when content is put: the writer thread waits on it.
    work: Condvar,
    /// Signalled when the writer has nothing left: [`flush_metrics`] waits
    /// on it.
    idle: Condvar,
}

/// The newest content not yet written, and whether a write is under way.
#[derive(Default)]
struct Pending {
    next: Option<(PathBuf, String)>,
    writing: bool,
}

static WRITER: OnceLock<Option<Arc<MetricsWriter>>> = OnceLock::new();

fn metrics_writer() -> Option<&'static MetricsWriter> {
    WRITER.get_or_init(MetricsWriter::start).as_deref()
}

impl MetricsWriter {
    /// The writer and its thread; `None` if no thread can be started (the
    /// metrics are then not written, and nothing else changes).
    fn start() -> Option<Arc<MetricsWriter>> {
        let w = Arc::new(MetricsWriter {
            state: Mutex::default(),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        let mine = w.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || mine.run())
            .ok()?;
        Some(w)
    }

    /// The thread: take the newest content, write it without the lock, and
    /// say so when nothing newer came meanwhile.
    fn run(&self) {
        loop {
            let (path, text) = {
                let Ok(mut g) = self.state.lock() else { return };
                loop {
                    if let Some(next) = g.next.take() {
                        g.writing = true;
                        break next;
                    }
                    g = match self.work.wait(g) {
                        Ok(g) => g,
                        Err(_) => return,
                    };
                }
            };
            write_atomically(&path, &text);
            let Ok(mut g) = self.state.lock() else { return };
            g.writing = false;
            if g.next.is_none() {
                self.idle.notify_all();
            }
        }
    }

    fn put(&self, path: PathBuf, text: String) {
        if let Ok(mut g) = self.state.lock() {
            g.next = Some((path, text));
            self.work.notify_one();
        }
    }

    /// Wait (at most `limit`) until nothing is pending or being written.
    fn flush(&self, limit: Duration) {
        let until = Instant::now() + limit;
        let Ok(mut g) = self.state.lock() else { return };
        while g.next.is_some() || g.writing {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            g = match self.idle.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(_) => return,
            };
        }
    }
}

/// Write, then rename: readers never see half a file.
fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let res = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(
            event = "metrics_failed",
            "cannot write {}: {e}",
            path.display()
        );
    }
}

/// Wait (at most `limit`) for a pending metrics write: called before exit,
/// so the file's last state is the one written.
pub fn flush_metrics(limit: Duration) {
    if let Some(w) = WRITER.get().and_then(Option::as_deref) {
        w.flush(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that hangs (here: the temporary file is a FIFO nobody
    /// reads, as a hung NFS mount would hang it) holds up neither `put`,
    /// which the lease loop calls, nor an exit's flush beyond its limit;
    /// once it unsticks, the newest content is what ends up in the file.
    #[test]
    fn a_hung_write_blocks_neither_put_nor_flush_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        nix::unistd::mkfifo(&tmp, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let w = MetricsWriter::start().unwrap();
        w.put(path.clone(), "first\n".into());
        for _ in 0..5_000 {
            if w.state.lock().unwrap().writing {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(w.state.lock().unwrap().writing, "the writer never started");
        let t0 = Instant::now();
        for i in 0..1_000 {
            w.put(path.clone(), format!("v{i}\n"));
        }
        assert!(t0.elapsed() < Duration::from_millis(200), "put waited");
        let t0 = Instant::now();
        w.flush(Duration::from_millis(300));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // Unstick it: the hung write delivers what it held, and the newest
        // content follows at once.
        assert_eq!(std::fs::read_to_string(&tmp).unwrap(), "first\n");
        let t0 = Instant::now();
        w.flush(Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "v999\n");
    }

    #[test]
    fn flush_returns_at_once_when_nothing_is_pending() {
        let w = MetricsWriter::start().unwrap();
        let t0 = Instant::now();
        w.flush(Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
