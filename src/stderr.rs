//! stderr that never holds up the lease path (docs/contract.md §10).
//!
//! leaderrun shares its stderr with whatever started it: a cron mailer, a
//! log collector, a terminal. If that reader stops reading, a plain
//! `write(2)` blocks once the pipe is full, and a holder blocked in a log
//! call cannot stop its command at the give-up deadline. Setting
//! `O_NONBLOCK` on fd 2 is no answer: the flag lives on the open file
//! description, which the command shares, and would break *its* writes.
//!
//! So every line goes through a bounded queue to one writer thread, which
//! alone makes blocking writes. When the queue is full the line is dropped
//! and counted; once the writer catches up it says how many were lost. A
//! write error (the reader went away, a terminal hung up) is swallowed: it
//! never panics and never changes what happens to the command or the exit
//! status. The thread starts with the first line, so a quiet run (a healthy
//! cron job) starts no thread at all.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Lines that may wait for the writer; more than a burst of warnings, few
/// enough that memory stays flat when stderr is stuck for hours.
const QUEUE: usize = 256;

enum Msg {
    Line(Vec<u8>),
    Flush(SyncSender<()>),
}

/// A bounded queue in front of one writer thread that alone makes the
/// blocking writes.
struct Queue {
    tx: Mutex<SyncSender<Msg>>,
    dropped: std::sync::Arc<AtomicU64>,
}

impl Queue {
    fn start<W: Write + Send + 'static>(out: W, capacity: usize) -> Option<Queue> {
        let (tx, rx) = sync_channel(capacity);
        let dropped = std::sync::Arc::new(AtomicU64::new(0));
        let d = dropped.clone();
        std::thread::Builder::new()
            .name("stderr".into())
            .spawn(move || writer(out, rx, &d))
            .ok()?;
        Some(Queue {
            tx: Mutex::new(tx),
            dropped,
        })
    }

    /// Never blocks: a line that finds the queue full is counted, not kept.
    fn push(&self, bytes: Vec<u8>) {
        let Ok(tx) = self.tx.lock() else { return };
        match tx.try_send(Msg::Line(bytes)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Wait until everything queued so far is written, or `limit` passed.
    /// The marker itself may have to wait for room in the queue.
    fn flush(&self, limit: Duration) {
        let t0 = std::time::Instant::now();
        let (done_tx, done_rx) = sync_channel(1);
        let mut msg = Msg::Flush(done_tx);
        loop {
            let res = match self.tx.lock() {
                Ok(tx) => tx.try_send(msg),
                Err(_) => return,
            };
            match res {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if t0.elapsed() < limit => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => return,
            }
        }
        let _ = done_rx.recv_timeout(limit.saturating_sub(t0.elapsed()));
    }
}

static SINK: OnceLock<Option<Queue>> = OnceLock::new();

fn sink() -> Option<&'static Queue> {
    SINK.get_or_init(|| Queue::start(std::io::stderr(), QUEUE))
        .as_ref()
}

fn writer<W: Write>(mut out: W, rx: Receiver<Msg>, dropped: &AtomicU64) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Line(l) => {
                let _ = out.write_all(&l);
            }
            Msg::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(
                out,
                "leaderrun: {lost} log line(s) dropped: stderr was not being read"
            );
        }
    }
}

/// Queue `bytes` (one or more whole lines) for stderr; never blocks. Where
/// no writer thread can be started, the line is dropped rather than written
/// from here.
pub fn write(bytes: Vec<u8>) {
    if let Some(q) = sink() {
        q.push(bytes);
    }
}

/// `leaderrun: <text>` as one line on stderr.
pub fn line(text: &str) {
    write(format!("leaderrun: {text}\n").into_bytes());
}

/// Wait at most `limit` for queued lines to be written: called once before
/// exiting, so that a healthy run loses nothing and a stuck stderr delays
/// the exit by `limit` at most.
pub fn flush(limit: Duration) {
    if let Some(q) = SINK.get().and_then(Option::as_ref) {
        q.flush(limit);
    }
}

/// A `tracing` writer: each event is formatted into a buffer, which goes to
/// the queue as one piece when the event is done.
#[derive(Clone, Copy, Default)]
pub struct MakeWriter;

pub struct LineBuf(Vec<u8>);

impl Write for LineBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineBuf {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write(std::mem::take(&mut self.0));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for MakeWriter {
    type Writer = LineBuf;
    fn make_writer(&'a self) -> LineBuf {
        LineBuf(Vec::with_capacity(160))
    }
}

/// Write to stdout, ignoring a reader that went away (`status | head -1`):
/// a subcommand's answer is best effort once nobody reads it, never a panic.
pub fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

/// `println!` that never panics (see [`out`]).
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::stderr::out(&format!("{}\n", format_args!($($t)*)))
    };
}

/// `eprintln!` through the non-blocking queue (see [`write`]).
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::stderr::write(format!("{}\n", format_args!($($t)*)).into_bytes())
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn a_stuck_reader_costs_lines_not_time_and_the_loss_is_reported() {
        let (r, w) = nix::unistd::pipe().unwrap();
        // Fill the pipe through a non-blocking description of our own.
        let mut filler = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", w.as_raw_fd()))
            .unwrap();
        let mut filled = 0;
        while let Ok(n) = filler.write(&[b'.'; 4096]) {
            filled += n;
        }
        drop(filler);
        let q = Queue::start(std::fs::File::from(w), 4).unwrap();
        let t0 = std::time::Instant::now();
        for i in 0..50 {
            q.push(format!("line {i}\n").into_bytes());
        }
        assert!(t0.elapsed() < Duration::from_millis(200), "pushing blocked");
        // At most the queue and the one line in the writer's hands survive.
        assert!(q.dropped.load(Ordering::Relaxed) >= 45);
        // The reader comes back: what was kept arrives, then the count.
        let mut r = std::fs::File::from(r);
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = r.read_to_end(&mut all);
            all
        });
        q.flush(Duration::from_secs(5));
        q.push(b"after\n".to_vec());
        q.flush(Duration::from_secs(5));
        drop(q);
        let all = reader.join().unwrap();
        let text = String::from_utf8_lossy(&all[filled..]).into_owned();
        assert!(text.contains("line 0\n"), "{text}");
        assert!(text.contains("after\n"), "{text}");
        assert!(
            text.contains("log line(s) dropped: stderr was not being read"),
            "{text}"
        );
        assert!(!text.contains("line 49\n"), "{text}");
    }

    #[test]
    fn a_closed_reader_is_not_an_error() {
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        let q = Queue::start(std::fs::File::from(w), 4).unwrap();
        q.push(b"nobody reads this\n".to_vec());
        q.flush(Duration::from_secs(5));
    }
}
