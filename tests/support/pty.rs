//! An interactive shell on a pseudo-terminal, driven like a person at a
//! keyboard: type a line, read the screen until some text appears. Job
//! control (Ctrl-C, Ctrl-Z, `fg`) is the shell's and the kernel's own.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Shell {
    master: std::fs::File,
    child: Child,
    pub screen: String,
}

impl Shell {
    /// `bash` with no startup files, job control on, on a fresh pty, with
    /// `env` added.
    pub fn start(env: &[(&str, &str)]) -> Shell {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let master: OwnedFd = pty.master;
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-i"])
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave));
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("bash on a pty");
        let master = std::fs::File::from(master);
        // Non-blocking reads: the test polls the screen.
        let fd = master.as_raw_fd();
        let fl = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).expect("getfl");
        let fl = nix::fcntl::OFlag::from_bits_truncate(fl) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(fl)).expect("setfl");
        let mut sh = Shell {
            master,
            child,
            screen: String::new(),
        };
        sh.expect("$ ", Duration::from_secs(10));
        sh
    }

    pub fn type_keys(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).expect("type");
    }

    pub fn line(&mut self, line: &str) {
        self.type_keys(&format!("{line}\n"));
    }

    fn pump(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            match self.master.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => self.screen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => return,
            }
        }
    }

    /// Wait until `text` appears on the screen after what was consumed so
    /// far; consume up to and including it. Returns how long it took.
    pub fn expect(&mut self, text: &str, limit: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            self.pump();
            if let Some(i) = self.screen.find(text) {
                self.screen.drain(..i + text.len());
                return t0.elapsed();
            }
            if t0.elapsed() > limit {
                panic!(
                    "{text:?} did not appear within {limit:?}; screen:\n{}",
                    self.screen
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
