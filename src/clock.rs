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

/// A point on a clock: an instant, not a length of time. Only differences
/// between stamps of the same clock mean anything, so the arithmetic is
/// that of an instant: a stamp plus or minus a duration is a stamp, a stamp
/// minus a stamp is a duration, and two stamps cannot be added (a deadline
/// computed as `sent + sent` would not compile).
///
/// ```compile_fail
/// use leaderrun::clock::Stamp;
/// let sent = Stamp::ORIGIN;
/// let _ = sent + sent;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Stamp(Duration);

impl Stamp {
    /// The clock's origin (boot, for [`BootClock`]).
    pub const ORIGIN: Stamp = Stamp(Duration::ZERO);

    /// The stamp `d` after the clock's origin.
    pub const fn from_origin(d: Duration) -> Stamp {
        Stamp(d)
    }

    /// The time since the clock's origin: what goes over a pipe or into a
    /// store row that counts on this clock.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// `self + d`, or None past the largest stamp.
    pub fn checked_add(self, d: Duration) -> Option<Stamp> {
        self.0.checked_add(d).map(Stamp)
    }

    /// How long after `earlier` this is; zero when it is not after it.
    pub fn saturating_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// Past the largest stamp it stays there: no deadline wraps to the past.
impl std::ops::Add<Duration> for Stamp {
    type Output = Stamp;
    fn add(self, d: Duration) -> Stamp {
        self.checked_add(d).unwrap_or(Stamp(Duration::MAX))
    }
}

impl std::ops::AddAssign<Duration> for Stamp {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

/// Before the origin it stays there (no instant on this clock is earlier).
impl std::ops::Sub<Duration> for Stamp {
    type Output = Stamp;
    fn sub(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_sub(d))
    }
}

/// The time from `earlier` to `self`, zero when `earlier` is not earlier
/// (as `std::time::Instant` does): a negative wait is no wait.
impl std::ops::Sub<Stamp> for Stamp {
    type Output = Duration;
    fn sub(self, earlier: Stamp) -> Duration {
        self.saturating_since(earlier)
    }
}

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
            // Only when timerfd is unavailable (seccomp, an odd kernel).
            Err(_) => poll_until(boottime_now, at).await,
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
    Stamp(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
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
            tv_sec: at.0.as_secs() as libc::time_t,
            tv_nsec: at.0.subsec_nanos() as libc::c_long,
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
        // Cannot register with the reactor: fall back to polling.
        Err(_) => return poll_until(boottime_now, at).await,
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

/// The longest monotonic step of the polling fallback.
const POLL_STEP: Duration = Duration::from_millis(50);

/// Wait until `now() >= at` without a timer on `now`'s clock: sleep on
/// tokio's (monotonic) clock in steps of at most [`POLL_STEP`], reading
/// `now` again after each, so a suspend delays the deadline by at most one
/// step. The fallback when no timerfd can be had or registered.
async fn poll_until(now: impl Fn() -> Stamp, at: Stamp) {
    while now() < at {
        let left = at - now();
        tokio::time::sleep(left.min(POLL_STEP)).await;
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
        Stamp(tokio::time::Instant::now() - self.origin)
    }
    async fn sleep_until(&self, at: Stamp) {
        tokio::time::sleep_until(self.origin + at.0).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instant's arithmetic: a duration moves it, two instants give a
    /// duration, and nothing wraps (a deadline never lands in the past, a
    /// wait is never negative).
    #[test]
    fn stamps_move_by_durations_and_never_wrap() {
        let ms = Duration::from_millis;
        let t = Stamp::from_origin(ms(1000));
        assert_eq!((t + ms(500)).since_origin(), ms(1500));
        assert_eq!((t - ms(400)).since_origin(), ms(600));
        assert_eq!(t + ms(500) - t, ms(500));
        assert_eq!(t - (t + ms(500)), Duration::ZERO);
        assert_eq!(t.saturating_since(t - ms(1)), ms(1));
        assert_eq!((t + ms(1)).saturating_since(t), ms(1));
        assert_eq!(t.saturating_since(t + ms(1)), Duration::ZERO);
        assert_eq!(t - ms(5000), Stamp::ORIGIN);
        assert_eq!(t.checked_add(ms(1)), Some(Stamp::from_origin(ms(1001))));
        assert_eq!(t.checked_add(Duration::MAX), None);
        assert_eq!(t + Duration::MAX, Stamp::from_origin(Duration::MAX));
        let mut u = t;
        u += ms(2);
        assert_eq!(u, Stamp::from_origin(ms(1002)));
        assert!(t < u);
        assert_eq!(Stamp::default(), Stamp::ORIGIN);
        assert_eq!(Stamp::ORIGIN.since_origin(), Duration::ZERO);
    }

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

    #[test]
    fn the_boot_timer_never_blocks_and_is_not_inherited() {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
        use std::os::fd::{AsFd, AsRawFd};
        let fd = boot_timer(boottime_now() + Duration::from_secs(60)).expect("a timerfd");
        let raw = fd.as_fd().as_raw_fd();
        // Read by the runtime's thread when the reactor says it is ready: a
        // read that would block must fail instead of stalling every timer.
        let fl = OFlag::from_bits_truncate(fcntl(raw, FcntlArg::F_GETFL).unwrap());
        assert!(fl.contains(OFlag::O_NONBLOCK), "{fl:?}");
        let mut buf = [0u8; 8];
        assert_eq!(
            nix::unistd::read(raw, &mut buf),
            Err(nix::errno::Errno::EAGAIN)
        );
        // The command leaderrun runs must not inherit the give-up timer.
        let fd_fl = FdFlag::from_bits_truncate(fcntl(raw, FcntlArg::F_GETFD).unwrap());
        assert!(fd_fl.contains(FdFlag::FD_CLOEXEC), "{fd_fl:?}");
    }

    /// What the reactor is asked to watch, and what is read when it says
    /// ready, is the timer itself (not some other descriptor).
    #[test]
    fn the_reactor_watches_the_timer_itself() {
        use std::os::fd::{AsFd, AsRawFd};
        let fd = boot_timer(boottime_now() + Duration::from_secs(60)).expect("a timerfd");
        let raw = fd.as_fd().as_raw_fd();
        assert_eq!(Timer(fd).as_raw_fd(), raw);
    }

    /// The polling fallback wakes at the deadline, not before it, and after
    /// a suspend (the boot clock jumps, tokio's does not) within one step.
    #[tokio::test(start_paused = true)]
    async fn the_polling_fallback_keeps_to_the_boot_clock() {
        use std::cell::Cell;
        let c = TestClock::default();
        let at = Stamp::from_origin(Duration::from_millis(120));
        poll_until(|| c.now(), at).await;
        assert_eq!(c.now(), at);
        // Already due: no sleep at all.
        poll_until(|| c.now(), at).await;
        assert_eq!(c.now(), at);

        let c = TestClock::default();
        let suspended = Cell::new(Duration::ZERO);
        let boot = || c.now() + suspended.get();
        let resume = async {
            tokio::time::sleep(Duration::from_millis(110)).await;
            suspended.set(Duration::from_secs(5));
        };
        let until = Stamp::from_origin(Duration::from_secs(1));
        let ((), ()) = tokio::join!(poll_until(boot, until), resume);
        assert!(
            c.now() <= Stamp::from_origin(Duration::from_millis(110) + POLL_STEP),
            "{:?}",
            c.now()
        );
    }
}
