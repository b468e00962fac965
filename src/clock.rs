//! The local clock every deadline is measured on.
//!
//! docs/contract.md §3: the holder's give-up deadline must keep counting through a
//! frozen process (SIGSTOP, a long GC-like stall, a VM pause) *and* through a
//! suspended machine. `CLOCK_MONOTONIC` — which `std::time::Instant` and
//! tokio's timers use — stops during suspend, so a laptop or VM that sleeps for
//! a minute would wake up believing it still leads. `CLOCK_BOOTTIME` keeps
//! counting and never jumps with the wall clock, so every deadline here is a
//! point on that clock, and timers are `timerfd`s armed on it with an absolute
//! expiry: after a resume they are already due, not "N seconds later".

use std::future::Future;
use std::time::Duration;

/// A point on a clock, as the time since that clock's origin. Only
/// differences between stamps of the same clock mean anything.
pub type Stamp = Duration;

pub trait Clock {
    fn now(&self) -> Stamp;
    /// Completes once `now() >= at` (immediately when already past).
    fn sleep_until(&self, at: Stamp) -> impl Future<Output = ()>;
}

/// `CLOCK_BOOTTIME`, with `timerfd` timers on the same clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Stamp {
        boottime_now()
    }

    async fn sleep_until(&self, at: Stamp) {
        if self.now() >= at {
            return;
        }
        match boot_timer(at) {
            Ok(fd) => wait_timer(fd, at).await,
            // Only when timerfd is unavailable (seccomp, an odd kernel):
            // poll the boot clock in short monotonic steps, so a suspend
            // delays the deadline by at most one step.
            Err(_) => {
                while self.now() < at {
                    let left = at.saturating_sub(self.now());
                    tokio::time::sleep(left.min(Duration::from_millis(50))).await;
                }
            }
        }
    }
}

// Both the clock read and the timer arm are raw system calls, not the libc
// wrappers: a preloaded library that fakes time for the process (libfaketime,
// as tests and some CI setups use) interposes on the wrappers, and one that
// shifts absolute timer expiries would silently postpone the give-up deadline.
// The kernel's boot clock is what the contract is stated in.

/// `CLOCK_BOOTTIME` now, by a raw system call (see above).
pub fn boottime_now() -> Stamp {
    use nix::libc;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clock_gettime,
            libc::CLOCK_BOOTTIME,
            &mut ts as *mut libc::timespec,
        )
    };
    // CLOCK_BOOTTIME exists on every Linux since 2.6.39; failing to read it
    // is not a state this program can run safely in.
    assert_eq!(rc, 0, "CLOCK_BOOTTIME is readable");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A non-blocking timerfd on the boot clock that fires at `at` (absolute).
pub fn boot_timer(at: Stamp) -> nix::Result<nix::sys::timerfd::TimerFd> {
    use nix::libc;
    use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
    use std::os::fd::{AsFd, AsRawFd};
    let fd = TimerFd::new(
        ClockId::CLOCK_BOOTTIME,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: at.as_secs() as libc::time_t,
            tv_nsec: at.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: timerfd_settime reads one itimerspec through a valid pointer
    // and may write none (old value pointer is null).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timerfd_settime,
            fd.as_fd().as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &spec as *const libc::itimerspec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    if rc != 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(fd)
}

/// Owns the timerfd so it stays open exactly as long as it is registered.
struct Timer(nix::sys::timerfd::TimerFd);

impl std::os::fd::AsRawFd for Timer {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

async fn wait_timer(fd: nix::sys::timerfd::TimerFd, at: Stamp) {
    use std::os::fd::AsRawFd;
    use tokio::io::{unix::AsyncFd, Interest};
    // SAFETY: `Timer` owns the descriptor, so it stays open (and is the same
    // file) for as long as the registration lives.
    let afd = match unsafe { AsyncFd::register_with_interest(Timer(fd), Interest::READABLE) } {
        Ok(a) => a,
        Err(_) => {
            // Cannot register with the reactor: fall back to polling.
            while boottime_now() < at {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            return;
        }
    };
    loop {
        let Ok(mut guard) = afd.readable().await else {
            return;
        };
        let mut buf = [0u8; 8];
        match nix::unistd::read(afd.get_ref().as_raw_fd(), &mut buf) {
            Ok(8) => return,
            _ if boottime_now() >= at => return,
            _ => guard.clear_ready(),
        }
    }
}

/// tokio's clock, for unit tests that run with `tokio::time::pause()` and
/// move time by hand.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub struct TestClock {
    origin: tokio::time::Instant,
}

#[cfg(test)]
impl Default for TestClock {
    fn default() -> Self {
        TestClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(test)]
impl Clock for TestClock {
    fn now(&self) -> Stamp {
        tokio::time::Instant::now() - self.origin
    }
    async fn sleep_until(&self, at: Stamp) {
        tokio::time::sleep_until(self.origin + at).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn boot_timer_fires_at_its_deadline() {
        let c = BootClock;
        let start = c.now();
        let at = start + Duration::from_millis(120);
        c.sleep_until(at).await;
        let woke = c.now();
        assert!(woke >= at, "woke {woke:?} before {at:?}");
        assert!(
            woke < at + Duration::from_millis(500),
            "woke late: {woke:?}"
        );
        // A deadline in the past is already due.
        c.sleep_until(start).await;
    }
}
