//! A TCP proxy that injects network faults between one leaderrun and its
//! store: `blackhole` keeps every connection open and accepts new ones but
//! delivers nothing in either direction (a partition, not a refusal);
//! `stall` delivers nothing either but loses nothing: what was sent arrives
//! once the link heals (a congested or paused link, such as a replication
//! stream that must stay intact); `reset` drops every connection; `heal`
//! forwards again.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Proxy {
    pub port: u16,
    black: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().expect("addr").port();
        let black = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, c, s) = (black.clone(), conns.clone(), stop.clone());
        let st = stalled.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut list = c.lock().expect("lock");
                    list.push(client.try_clone().expect("clone"));
                    list.push(server.try_clone().expect("clone"));
                }
                pump(
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                    b.clone(),
                    st.clone(),
                );
                pump(server, client, b.clone(), st.clone());
            }
        });
        Proxy {
            port,
            black,
            stalled,
            conns,
            stop,
        }
    }

    pub fn blackhole(&self) {
        self.black.store(true, Ordering::SeqCst);
    }

    /// Hold everything back, in both directions, without losing a byte.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.black.store(false, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
    }

    pub fn reset(&self) {
        for s in self.conns.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, black: Arc<AtomicBool>, stalled: Arc<AtomicBool>) {
    thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    // Stalled: hold this chunk and read no more, so the rest
                    // waits in the kernel's buffers, in order.
                    while stalled.load(Ordering::SeqCst) {
                        thread::sleep(std::time::Duration::from_millis(1));
                    }
                    // Blackholed bytes are lost, as on a partitioned link.
                    if black.load(Ordering::SeqCst) {
                        continue;
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.heal();
        self.reset();
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
