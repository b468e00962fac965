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

struct Sink {
    tx: Mutex<SyncSender<Msg>>,
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn sink() -> Option<&'static Sink> {
    SINK.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("stderr".into())
            .spawn(move || writer(rx))
            .ok()
            .map(|_| Sink { tx: Mutex::new(tx) })
    })
    .as_ref()
}

fn writer(rx: Receiver<Msg>) {
    let mut err = std::io::stderr();
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Line(l) => {
                let _ = err.write_all(&l);
            }
            Msg::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        }
        let lost = DROPPED.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(
                err,
                "leaderrun: {lost} log line(s) dropped: stderr was not being read"
            );
        }
    }
}

/// Queue `bytes` (one or more whole lines) for stderr; never blocks. Where
/// no writer thread can be started, the line is dropped rather than written
/// from here.
pub fn write(bytes: Vec<u8>) {
    let Some(s) = sink() else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let Ok(tx) = s.tx.lock() else { return };
    match tx.try_send(Msg::Line(bytes)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `leaderrun: <text>` as one line on stderr.
pub fn line(text: &str) {
    write(format!("leaderrun: {text}\n").into_bytes());
}

/// Lines dropped so far and not yet reported (for tests and the exit path).
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Wait at most `limit` for queued lines to be written: called once before
/// exiting, so that a healthy run loses nothing and a stuck stderr delays
/// the exit by `limit` at most.
pub fn flush(limit: Duration) {
    let Some(s) = SINK.get().and_then(Option::as_ref) else {
        return;
    };
    let (done_tx, done_rx) = sync_channel(1);
    let sent = match s.tx.lock() {
        Ok(tx) => tx.try_send(Msg::Flush(done_tx)).is_ok(),
        Err(_) => false,
    };
    if sent {
        let _ = done_rx.recv_timeout(limit);
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
