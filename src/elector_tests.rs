//! The elector's timing, on tokio's paused clock with a scripted store.
//! (Store *semantics* are tested against real Postgres in tests/.)

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc::unbounded_channel;

use super::*;
use crate::clock::TestClock;
use crate::store::{Acquired, LeaseInfo, LeaseLock, StoreError, Wakeups};
use crate::timing::{Timing, TimingArgs};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The instant `n` ms after the test clock's origin.
fn at(n: u64) -> Stamp {
    Stamp::from_origin(ms(n))
}

/// L = 3 s, R = 1 s, G = 2 s, K = 0.5 s, P = 0.4 s.
fn timing() -> Timing {
    Timing::resolve(TimingArgs {
        lease: Some(ms(3000).into()),
        retry: Some(ms(400).into()),
        ..Default::default()
    })
    .unwrap()
}

/// One scripted answer: after `delay`, return `result` (`None`: hang forever).
type Step<T> = (Duration, Option<Result<T, StoreError>>);

#[derive(Default)]
struct Script {
    acquire: VecDeque<Step<Option<i64>>>,
    renew: VecDeque<Step<bool>>,
    release: VecDeque<Step<bool>>,
    /// An acquire that does not take answers "done this period, started
    /// this many ms ago" (`--once-per`) instead of "held".
    done: Option<i64>,
    /// What `inspect` answers (None: no such lease).
    held: Option<LeaseInfo>,
    /// From this time on, `inspect` answers this instead of `held`.
    rival_at: Option<(Stamp, LeaseInfo)>,
    /// `inspect` never answers.
    inspect_hangs: bool,
    /// The process freezes for this long while the next acquire or renew
    /// is in flight (see [`freeze`]).
    freeze: Option<Duration>,
    /// (what, when) for every call that reached the store.
    calls: Vec<(&'static str, Stamp)>,
    /// (what, how long it may take) for every renew and release call: the
    /// budget the store is given for its own statement or command timeout.
    budgets: Vec<(&'static str, Duration)>,
}

#[derive(Clone)]
struct Fake {
    s: Rc<RefCell<Script>>,
    clock: TestClock,
}

impl Fake {
    fn calls(&self, what: &str) -> Vec<Stamp> {
        self.s
            .borrow()
            .calls
            .iter()
            .filter(|c| c.0 == what)
            .map(|c| c.1)
            .collect()
    }
    fn budgets(&self, what: &str) -> Vec<Duration> {
        self.s
            .borrow()
            .budgets
            .iter()
            .filter(|c| c.0 == what)
            .map(|c| c.1)
            .collect()
    }
}

/// Move the paused clock on at once, inside the store call: the process
/// was frozen (SIGSTOP, a VM pause) while the call was in flight, and on
/// waking its answer is read in the same poll, before any timer has been
/// looked at again. (The first poll of `advance` moves the clock; the yield
/// it then waits for is not needed.)
fn freeze(d: Duration) {
    use std::future::Future;
    use std::task::{Context, Waker};
    let mut jump = std::pin::pin!(tokio::time::advance(d));
    let _ = jump.as_mut().poll(&mut Context::from_waker(Waker::noop()));
}

async fn play<T>(step: Option<Step<T>>, default: T) -> Result<T, StoreError> {
    let (delay, res) = step.unwrap_or((Duration::ZERO, Some(Ok(default))));
    tokio::time::sleep(delay).await;
    match res {
        Some(r) => r,
        None => std::future::pending().await,
    }
}

impl LeaseLock for Fake {
    type Wakeups = FakeWake;

    async fn acquire(&mut self, l: Duration, t: Duration) -> Result<Option<i64>, StoreError> {
        self.take(l, t).await.map(|a| match a {
            Acquired::Taken(epoch) => Some(epoch),
            _ => None,
        })
    }
    async fn take(&mut self, _: Duration, _: Duration) -> Result<Acquired, StoreError> {
        let step = {
            let mut s = self.s.borrow_mut();
            s.calls.push(("acquire", self.clock.now()));
            s.acquire.pop_front()
        };
        let frozen = self.s.borrow_mut().freeze.take();
        let res = play(step, None).await;
        if let Some(d) = frozen {
            freeze(d);
        }
        let done = self.s.borrow().done;
        res.map(|r| match (r, done) {
            (Some(epoch), _) => Acquired::Taken(epoch),
            (None, Some(started_ms_ago)) => Acquired::DoneThisPeriod { started_ms_ago },
            (None, None) => Acquired::Held,
        })
    }
    async fn renew(&mut self, _: i64, _: Duration, budget: Duration) -> Result<bool, StoreError> {
        let step = {
            let mut s = self.s.borrow_mut();
            s.calls.push(("renew", self.clock.now()));
            s.budgets.push(("renew", budget));
            s.renew.pop_front()
        };
        let frozen = self.s.borrow_mut().freeze.take();
        let res = play(step, true).await;
        if let Some(d) = frozen {
            freeze(d);
        }
        res
    }
    async fn release(&mut self, _: i64, _: Duration, budget: Duration) -> Result<bool, StoreError> {
        let step = {
            let mut s = self.s.borrow_mut();
            s.calls.push(("release", self.clock.now()));
            s.budgets.push(("release", budget));
            s.release.pop_front()
        };
        play(step, true).await
    }
    async fn inspect(&mut self, _: Duration) -> Result<Option<LeaseInfo>, StoreError> {
        let now = self.clock.now();
        let (seen, hangs) = {
            let mut s = self.s.borrow_mut();
            s.calls.push(("inspect", now));
            let seen = match &s.rival_at {
                Some((at, rival)) if now >= *at => Some(rival.clone()),
                _ => s.held.clone(),
            };
            (seen, s.inspect_hangs)
        };
        if hangs {
            std::future::pending::<()>().await;
        }
        Ok(seen)
    }
}

fn elector(script: Script) -> (Elector<Fake, TestClock>, Fake) {
    let clock = TestClock::default();
    let fake = Fake {
        s: Rc::new(RefCell::new(script)),
        clock,
    };
    let e = Elector::new(fake.clone(), clock, timing());
    (e, fake)
}

fn unavailable() -> Option<Result<bool, StoreError>> {
    Some(Err(StoreError::unavailable("down")))
}

fn lease_at(sent: Stamp) -> Lease {
    Lease {
        epoch: 1,
        sent,
        acquired_at: sent,
    }
}

#[tokio::test(start_paused = true)]
async fn healthy_renewals_keep_the_lease_forever() {
    let (mut e, fake) = elector(Script::default());
    let mut lease = lease_at(e.clock().now());
    let r = tokio::time::timeout(Duration::from_secs(30), e.hold(&mut lease)).await;
    assert!(r.is_err(), "lost a healthy lease: {r:?}");
    let renews = fake.calls("renew");
    // One renewal per R: 30 s / 1 s.
    assert_eq!(renews.len(), 30);
    assert_eq!(renews[0], at(1000));
    assert_eq!(renews[29], at(30_000));
}

#[tokio::test(start_paused = true)]
async fn hung_store_gives_up_at_exactly_g_after_the_last_good_send() {
    let mut script = Script::default();
    // the renewal at 1 s succeeds; every later one hangs forever
    script.renew.push_back((ms(30), Some(Ok(true))));
    for _ in 0..10 {
        script.renew.push_back((Duration::ZERO, None));
    }
    let (mut e, fake) = elector(script);
    let mut lease = lease_at(e.clock().now());
    let lost = e.hold(&mut lease).await;
    // The good renewal was *sent* at 1 s (answered at 1.03 s): G counts from the send.
    assert_eq!(lost.reason, LossReason::GaveUp);
    assert_eq!(lost.deadline, at(1000) + ms(2000));
    assert_eq!(e.clock().now(), at(3000));
    // Hung attempts were abandoned after R/2 and retried, not waited on until G.
    assert_eq!(fake.calls("renew"), vec![at(1000), at(2000), at(2500)]);
}

#[tokio::test(start_paused = true)]
async fn renewal_matching_nothing_is_a_loss_at_once() {
    let mut script = Script::default();
    script.renew.push_back((ms(5), Some(Ok(false))));
    let (mut e, _) = elector(script);
    let mut lease = lease_at(e.clock().now());
    let lost = e.hold(&mut lease).await;
    assert_eq!(lost.reason, LossReason::Superseded);
    assert_eq!(e.clock().now(), at(1005));
}

#[tokio::test(start_paused = true)]
async fn failed_renewal_is_retried_and_success_extends_from_its_send() {
    let mut script = Script::default();
    script.renew.push_back((ms(10), unavailable()));
    script.renew.push_back((ms(10), Some(Ok(true))));
    let (mut e, fake) = elector(script);
    let mut lease = lease_at(e.clock().now());
    let r = tokio::time::timeout(ms(2500), e.hold(&mut lease)).await;
    assert!(r.is_err(), "lost after a retried renewal succeeded");
    // the first retry goes out at once, when the failure is known
    assert_eq!(&fake.calls("renew")[..2], &[at(1000), at(1010)]);
    // the next regular renewal counts from the successful send
    assert_eq!(fake.calls("renew")[2], at(2010));
}

#[tokio::test(start_paused = true)]
async fn a_yes_that_arrives_after_the_deadline_is_not_believed() {
    let mut script = Script::default();
    // sent at 1.0 s, retried at once (1.01 s), then every (G - R)/4 = 250 ms
    for _ in 0..4 {
        script.renew.push_back((ms(10), unavailable()));
    }
    // retried at 1.76 s with 0.24 s left; "renewed" would arrive at 2.26 s
    script.renew.push_back((ms(500), Some(Ok(true))));
    let (mut e, fake) = elector(script);
    let mut lease = lease_at(e.clock().now());
    let lost = e.hold(&mut lease).await;
    assert_eq!(lost.reason, LossReason::GaveUp);
    assert_eq!(
        fake.calls("renew"),
        vec![at(1000), at(1010), at(1260), at(1510), at(1760)]
    );
    assert_eq!(
        e.clock().now(),
        at(2000),
        "step-down is timer-driven, not call-driven"
    );
}

#[tokio::test(start_paused = true)]
async fn waking_past_the_deadline_stops_before_talking_to_the_store() {
    let (mut e, fake) = elector(Script::default());
    let mut lease = lease_at(e.clock().now());
    let hold = e.hold(&mut lease);
    // The process is "frozen": time passes while the future is not polled.
    tokio::time::advance(ms(7000)).await;
    let lost = hold.await;
    assert!(
        matches!(lost.reason, LossReason::WokeLate(d) if d == ms(5000)),
        "{lost:?}"
    );
    assert!(
        fake.calls("renew").is_empty(),
        "talked to the store after waking late"
    );
}

#[tokio::test(start_paused = true)]
async fn try_once_makes_one_attempt() {
    let (mut e, fake) = elector(Script::default());
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(false, None, &mut rx).await;
    assert!(matches!(w, Waited::Held(_)), "{w:?}");
    assert_eq!(fake.calls("acquire").len(), 1);
}

/// `--once-per`: an acquire that finds this period's run done ends the
/// try-once with that, not "held", and asks the store nothing more.
#[tokio::test(start_paused = true)]
async fn done_this_period_ends_a_try_once() {
    let (mut e, fake) = elector(Script {
        done: Some(1234),
        ..Script::default()
    });
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(false, None, &mut rx).await;
    assert!(
        matches!(
            w,
            Waited::DoneThisPeriod {
                started_ms_ago: 1234
            }
        ),
        "{w:?}"
    );
    assert_eq!(fake.calls("acquire").len(), 1);
    assert!(fake.calls("inspect").is_empty());
}

#[tokio::test(start_paused = true)]
async fn waiting_retries_every_p_until_the_timeout() {
    let (mut e, fake) = elector(Script::default());
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, Some(ms(1000)), &mut rx).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    assert_eq!(e.clock().now(), at(1000));
    assert_eq!(fake.calls("acquire"), vec![at(0), at(400), at(800)]);
}

#[tokio::test(start_paused = true)]
async fn waiting_survives_an_outage_and_acquires_after_it() {
    let mut script = Script::default();
    for _ in 0..3 {
        script
            .acquire
            .push_back((ms(10), Some(Err(StoreError::unavailable("down")))));
    }
    script.acquire.push_back((ms(10), Some(Ok(Some(4)))));
    let (mut e, _) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    match e.wait_for_lease(true, None, &mut rx).await {
        Waited::Acquired(l) => {
            assert_eq!(l.epoch, 4);
            assert_eq!(l.sent, at(1200));
        }
        w => panic!("{w:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn fatal_error_ends_the_wait() {
    let mut script = Script::default();
    script
        .acquire
        .push_back((ms(10), Some(Err(StoreError::fatal("bad password")))));
    let (mut e, fake) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, None, &mut rx).await;
    assert!(matches!(&w, Waited::Failed(e) if !e.may_heal()), "{w:?}");
    assert_eq!(fake.calls("acquire").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn interrupt_during_a_granted_acquire_hands_the_lease_back() {
    let mut script = Script::default();
    script.acquire.push_back((ms(100), Some(Ok(Some(3)))));
    let (mut e, fake) = elector(script);
    let (tx, mut rx) = unbounded_channel::<i32>();
    let sender = async {
        tokio::time::sleep(ms(50)).await;
        tx.send(15).unwrap();
    };
    let (w, ()) = tokio::join!(e.wait_for_lease(true, None, &mut rx), sender);
    assert!(matches!(w, Waited::Interrupted(15)), "{w:?}");
    assert_eq!(fake.calls("release"), vec![at(100)]);
}

#[tokio::test(start_paused = true)]
async fn an_acquire_unanswered_within_g_is_abandoned() {
    let mut script = Script::default();
    script.acquire.push_back((ms(2100), Some(Ok(Some(9)))));
    let (mut e, fake) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(false, None, &mut rx).await;
    // the elector abandoned the call at G = 2 s; nothing was believed
    assert!(matches!(&w, Waited::Failed(e) if e.may_heal()), "{w:?}");
    assert_eq!(e.clock().now(), at(2000));
    assert!(fake.calls("release").is_empty());
}

#[tokio::test(start_paused = true)]
async fn min_hold_keeps_only_the_remainder() {
    let (mut e, _) = elector(Script::default());
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(300)).await;
    // nothing to assert on the fake's side but that release is attempted
    // while the lease is still alive and not after it expired:
    assert!(e.release(&lease, Some(ms(1000))).await);
    tokio::time::advance(ms(3000)).await;
    assert!(
        !e.release(&lease, Some(ms(1000))).await,
        "released an expired lease"
    );
}

fn held_for(ms_left: i64) -> Option<LeaseInfo> {
    Some(LeaseInfo {
        name: "n".into(),
        holder: Some("other".into()),
        epoch: 1,
        expires_in_ms: Some(ms_left),
        ..LeaseInfo::default()
    })
}

/// L = 3 s as above, but P = 10 s: anything that happens well before 10 s
/// is not the poll.
fn slow_poll() -> Timing {
    Timing::resolve(TimingArgs {
        lease: Some(ms(3000).into()),
        retry: Some(ms(10_000).into()),
        ..Default::default()
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_held_lease_is_tried_again_when_it_expires_not_at_the_next_poll() {
    let mut script = Script {
        held: held_for(700),
        ..Default::default()
    };
    script.acquire.push_back((ms(0), Some(Ok(None))));
    script.acquire.push_back((ms(0), Some(Ok(Some(2)))));
    let (mut e, fake) = elector(script);
    e.timing = slow_poll();
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, None, &mut rx).await;
    assert!(matches!(w, Waited::Acquired(_)), "{w:?}");
    assert_eq!(fake.calls("acquire"), vec![at(0), at(700) + EXPIRY_MARGIN]);
}

#[tokio::test(start_paused = true)]
async fn a_lease_expired_but_still_held_is_not_hammered() {
    // A store that deletes expired keys late: the time left reads 0 while
    // the attempts keep failing. The least wait doubles each time.
    let script = Script {
        held: held_for(0),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    e.timing = slow_poll();
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, Some(ms(700)), &mut rx).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    let calls = fake.calls("acquire");
    assert!(calls.len() <= 8, "{calls:?}");
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0] * 2), "{gaps:?}");
}

/// Wake-ups scripted on the paused clock: each `arm` counts, each `wake`
/// answers after its delay (an `Err` is a broken subscription).
type WakeStep = (Duration, Result<(), StoreError>);

#[derive(Clone, Default)]
struct FakeWake {
    wakes: Rc<RefCell<VecDeque<WakeStep>>>,
    arms: Rc<RefCell<u32>>,
}

impl Wakeups for FakeWake {
    async fn arm(&mut self) -> Result<(), StoreError> {
        *self.arms.borrow_mut() += 1;
        Ok(())
    }
    async fn wake(&mut self) -> Result<(), StoreError> {
        let next = self.wakes.borrow_mut().pop_front();
        match next {
            Some((d, r)) => {
                tokio::time::sleep(d).await;
                r
            }
            None => std::future::pending().await,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_brings_the_next_attempt_forward() {
    let mut script = Script {
        held: held_for(60_000),
        ..Default::default()
    };
    script.acquire.push_back((ms(0), Some(Ok(None))));
    script.acquire.push_back((ms(0), Some(Ok(None))));
    script.acquire.push_back((ms(0), Some(Ok(Some(2)))));
    let (mut e, fake) = elector(script);
    e.timing = slow_poll();
    let wake = FakeWake::default();
    wake.wakes.borrow_mut().push_back((ms(300), Ok(())));
    e.push(wake.clone());
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, None, &mut rx).await;
    assert!(matches!(w, Waited::Acquired(_)), "{w:?}");
    // The first attempt found it held: subscribe, try again at once, then
    // wait for the wake-up.
    assert_eq!(fake.calls("acquire"), vec![at(0), at(0), at(300)]);
    assert_eq!(
        *wake.arms.borrow(),
        2,
        "subscribed before each attempt after the first"
    );
}

#[tokio::test(start_paused = true)]
async fn a_broken_subscription_falls_back_to_polling() {
    let script = Script {
        held: held_for(60_000),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    e.timing = slow_poll();
    let wake = FakeWake::default();
    wake.wakes
        .borrow_mut()
        .push_back((ms(100), Err(StoreError::unavailable("gone"))));
    e.push(wake.clone());
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, Some(ms(25_000)), &mut rx).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    // Broken at 0.1 s: no attempt until the poll at 10 s, and the poll
    // continues at P after that.
    assert_eq!(
        fake.calls("acquire"),
        vec![at(0), at(0), at(10_000), at(20_000)]
    );
}

/// What the elector logged while `f` ran, as fmt lines.
async fn logged<F: std::future::Future>(f: F) -> (F::Output, String) {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let sink = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _g = tracing::subscriber::set_default(sub);
    let out = f.await;
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (out, text)
}

fn fails_at_once(n: usize) -> VecDeque<Step<bool>> {
    (0..n).map(|_| (Duration::ZERO, unavailable())).collect()
}

/// A release that fails (the store restarted under the holder) is retried
/// like a renewal: the first retry at once, on a fresh connection, then every
/// `min(P, R, (G − R)/4)` = 250 ms here, so a clean stop still hands over.
#[tokio::test(start_paused = true)]
async fn a_failed_release_is_retried_like_a_renewal() {
    let script = Script {
        release: fails_at_once(3),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(100)).await;
    let (freed, log) = logged(e.release(&lease, None)).await;
    assert!(freed);
    assert_eq!(
        fake.calls("release"),
        vec![at(100), at(100), at(350), at(600)]
    );
    assert!(log.contains("could not release"), "{log}");
    // The trouble is logged once and its end too.
    assert_eq!(log.matches("WARN").count(), 2, "{log}");
    assert!(
        log.contains("store_recovered") || log.contains("answers again"),
        "{log}"
    );
}

/// No retry outlives the lease: past `sent + L` it has expired by itself.
#[tokio::test(start_paused = true)]
async fn release_retries_stop_when_the_lease_would_have_expired() {
    let script = Script {
        release: fails_at_once(100),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(2200)).await;
    let (freed, log) = logged(e.release(&lease, None)).await;
    assert!(!freed);
    let calls = fake.calls("release");
    assert_eq!(calls.first(), Some(&at(2200)));
    assert!(calls.iter().all(|c| *c < at(3000)), "{calls:?}");
    assert_eq!(calls.len(), 5, "{calls:?}"); // 2.2, 2.2, 2.45, 2.7, 2.95
    assert_eq!(e.clock().now(), at(3000));
    assert!(log.contains("will expire by itself"), "{log}");
}

/// One hung release call is abandoned after the call cap (500 ms here) and
/// retried, as a renewal is.
#[tokio::test(start_paused = true)]
async fn a_hung_release_is_abandoned_and_retried() {
    let mut script = Script::default();
    script.release.push_back((Duration::ZERO, None));
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    assert!(e.release(&lease, None).await);
    assert_eq!(fake.calls("release"), vec![at(0), at(500)]);
}

/// A wrong password will not heal within a lease: one attempt.
#[tokio::test(start_paused = true)]
async fn a_release_refused_for_good_is_not_retried() {
    let mut script = Script::default();
    script
        .release
        .push_back((ms(5), Some(Err(StoreError::fatal("no grant")))));
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    assert!(!e.release(&lease, None).await);
    assert_eq!(fake.calls("release"), vec![at(0)]);
}

/// After a loss to the store's silence the lease is still ours in the store
/// until `sent + L`: it is handed back once the store answers.
#[tokio::test(start_paused = true)]
async fn after_a_loss_the_lease_is_handed_back_when_the_store_answers() {
    let script = Script {
        release: fails_at_once(4),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(2100)).await; // given up at G, command stopped
    assert!(e.release_after_loss(&lease).await);
    let calls = fake.calls("release");
    assert_eq!(calls.len(), 5);
    assert_eq!(calls[4], at(2100 + 250 * 3));
    // Without a store that extends leases on failover, never past sent + L.
    let script = Script {
        release: fails_at_once(100),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(2500)).await;
    assert!(!e.release_after_loss(&lease).await);
    assert!(fake.calls("release").iter().all(|c| *c < at(3000)));
}

/// etcd re-extends every lease by its TTL when a new leader takes over: a
/// lease lost in such a failover may live up to a lease past `sent + L`.
#[tokio::test(start_paused = true)]
async fn on_a_store_whose_failover_extends_leases_the_hand_back_tries_a_lease_longer() {
    let script = Script {
        release: fails_at_once(100),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    e.failover_extends_lease(true);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(2500)).await;
    assert!(!e.release_after_loss(&lease).await);
    let calls = fake.calls("release");
    assert!(calls.iter().any(|c| *c > at(5500)), "{calls:?}");
    assert!(calls.iter().all(|c| *c < at(6000)), "{calls:?}");
    // A normal release is still bounded by sent + L: it follows a renewal
    // the store accepted, not a failover.
    let script = Script {
        release: fails_at_once(100),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    e.failover_extends_lease(true);
    let lease = lease_at(e.clock().now());
    assert!(!e.release(&lease, None).await);
    assert!(fake.calls("release").iter().all(|c| *c < at(3000)));
}

/// A waiter's trouble ends in the log even when the retry that found the
/// store healed also won the lease.
#[tokio::test(start_paused = true)]
async fn store_recovered_follows_an_outage_that_ends_in_acquiring() {
    let mut script = Script::default();
    script
        .acquire
        .push_back((ms(10), Some(Err(StoreError::unavailable("down")))));
    script.acquire.push_back((ms(10), Some(Ok(Some(4)))));
    let (mut e, _) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let (w, log) = logged(e.wait_for_lease(true, None, &mut rx)).await;
    assert!(matches!(w, Waited::Acquired(_)), "{w:?}");
    let trouble = log.find("store_error").or_else(|| log.find("down"));
    let recovered = log.find("the store answers again");
    assert!(
        matches!((trouble, recovered), (Some(a), Some(b)) if a < b),
        "{log}"
    );
}

/// The reason a stop names in the log is the one that happened, with the
/// lateness rounded to the millisecond.
#[test]
fn loss_reasons_read_as_what_happened() {
    assert_eq!(
        LossReason::GaveUp.to_string(),
        "no renewal succeeded before the give-up deadline"
    );
    assert_eq!(
        LossReason::WokeLate(Duration::from_micros(5_250_700)).to_string(),
        "woke up 5.251s past the give-up deadline (frozen or suspended)"
    );
    assert_eq!(
        LossReason::Superseded.to_string(),
        "the renewal matched nothing: the lease is no longer ours at this epoch \
         (another holder took it, or it was released)"
    );
}

/// What an observer (systemd's status line, the metrics) was told, in order.
#[derive(Clone, Default)]
struct Seen(Rc<RefCell<Vec<String>>>);

impl Observer for Seen {
    fn waiting(&mut self, held: Option<&LeaseInfo>) {
        let who = held.and_then(|h| h.holder.clone());
        self.0.borrow_mut().push(format!("waiting {who:?}"));
    }
    fn renewed(&mut self, lease: &Lease) {
        let line = format!("renewed {} sent {:?}", lease.epoch, lease.sent);
        self.0.borrow_mut().push(line);
    }
    fn renew_failed(&mut self, epoch: i64) {
        self.0.borrow_mut().push(format!("renew failed {epoch}"));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_hears_every_renewal_and_every_failure() {
    let mut script = Script::default();
    script.renew.push_back((ms(10), unavailable()));
    script.renew.push_back((ms(10), Some(Ok(true))));
    let (mut e, _) = elector(script);
    let seen = Seen::default();
    e.observe(Box::new(seen.clone()));
    let mut lease = lease_at(e.clock().now());
    let r = tokio::time::timeout(ms(2500), e.hold(&mut lease)).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        *seen.0.borrow(),
        vec![
            "renew failed 1".to_string(),
            format!("renewed 1 sent {:?}", at(1010)),
            format!("renewed 1 sent {:?}", at(2010)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_observer_hears_who_holds_the_lease_while_waiting() {
    let mut script = Script {
        held: held_for(700),
        ..Default::default()
    };
    script.acquire.push_back((ms(0), Some(Ok(None))));
    script.acquire.push_back((ms(0), Some(Ok(Some(2)))));
    let (mut e, _) = elector(script);
    e.timing = slow_poll();
    let seen = Seen::default();
    e.observe(Box::new(seen.clone()));
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, None, &mut rx).await;
    assert!(matches!(w, Waited::Acquired(_)), "{w:?}");
    assert_eq!(
        *seen.0.borrow(),
        vec![r#"waiting Some("other")"#.to_string()]
    );
}

/// A grant read only after the process thawed past its give-up deadline is
/// useless (the lease may be a rival's any moment): it is handed back at
/// the epoch it was granted, reported with how late it came, and not used.
#[tokio::test(start_paused = true)]
async fn a_grant_read_after_a_freeze_past_g_is_handed_back() {
    let mut script = Script {
        freeze: Some(ms(2100)),
        ..Default::default()
    };
    script.acquire.push_back((ms(0), Some(Ok(Some(9)))));
    let (mut e, fake) = elector(script);
    // Sent at 0.5 s, not at the clock's origin: how late is counted from
    // the send.
    tokio::time::advance(ms(500)).await;
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(false, None, &mut rx).await;
    match w {
        Waited::Failed(e) if e.may_heal() => assert_eq!(
            e.to_string(),
            "the store confirmed the lease only after 2.1s, too late to use it"
        ),
        w => panic!("{w:?}"),
    }
    // Handed back at once, and only until the grant would have expired
    // (sent + L = 3.5 s): the release succeeds on its first try here.
    assert_eq!(fake.calls("release"), vec![at(2600)]);
    assert_eq!(fake.budgets("release"), vec![ms(500)]);
}

fn record(holder: Option<&str>, epoch: i64, expires_in_ms: Option<i64>) -> LeaseInfo {
    LeaseInfo {
        name: "n".into(),
        holder: holder.map(String::from),
        epoch,
        expires_in_ms,
        ..LeaseInfo::default()
    }
}

/// After stepping down, the lease's new holder is reported as soon as it
/// is seen: looked for every min(P, 50 ms), and only a live lease at a
/// later epoch counts (our own record, still live, is not a successor).
#[tokio::test(start_paused = true)]
async fn sitting_out_ends_when_a_rival_holds_a_later_epoch() {
    let script = Script {
        held: Some(record(Some("h"), 1, Some(2000))),
        rival_at: Some((at(1200), record(Some("other"), 2, Some(3000)))),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    assert_eq!(e.sit_out(1).await.as_deref(), Some("other"));
    assert_eq!(e.clock().now(), at(1200));
    let looks = fake.calls("inspect");
    assert_eq!(looks.len(), 1200 / 50 + 1, "{looks:?}");
    assert!(looks.windows(2).all(|w| w[1] - w[0] == ms(50)), "{looks:?}");
}

/// With no successor the wait is one lease long, not more: a freed record
/// at a later epoch (nobody holds it) is no successor either.
#[tokio::test(start_paused = true)]
async fn sitting_out_lasts_one_lease_without_a_successor() {
    let script = Script {
        held: Some(record(None, 2, None)),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    assert_eq!(e.sit_out(1).await, None);
    assert_eq!(e.clock().now(), at(3000));
    assert!(fake.calls("inspect").iter().all(|c| *c < at(3000)));
}

/// A look that hangs is abandoned after the call cap (R/2 = 500 ms), the
/// last one when the lease would have run out: the sit-out still ends at
/// exactly one lease.
#[tokio::test(start_paused = true)]
async fn sitting_out_abandons_hung_looks_and_ends_on_time() {
    let script = Script {
        inspect_hangs: true,
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    assert_eq!(e.sit_out(1).await, None);
    assert_eq!(e.clock().now(), at(3000));
    assert_eq!(
        fake.calls("inspect"),
        vec![at(0), at(550), at(1100), at(1650), at(2200), at(2750)]
    );
}

/// A hung release is abandoned when the lease would have expired, not a
/// whole call cap later: past `sent + L` there is nothing left to free.
#[tokio::test(start_paused = true)]
async fn a_hung_release_near_expiry_ends_with_the_lease() {
    let mut script = Script::default();
    script.release.push_back((Duration::ZERO, None));
    let (mut e, fake) = elector(script);
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(2700)).await;
    assert!(!e.release(&lease, None).await);
    assert_eq!(fake.calls("release"), vec![at(2700)]);
    assert_eq!(e.clock().now(), at(3000));
}

/// A waiter says who holds the lease once, not at every poll.
#[tokio::test(start_paused = true)]
async fn the_holder_is_logged_once_per_wait() {
    let script = Script {
        held: held_for(60_000),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let (w, log) = logged(e.wait_for_lease(true, Some(ms(1000)), &mut rx)).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    assert_eq!(fake.calls("acquire").len(), 3);
    assert_eq!(
        log.matches("waiting: lease n held by other (epoch 1)")
            .count(),
        1,
        "{log}"
    );
}

/// Each renewal tells the store how long it may take: the call cap
/// (R/2 = 500 ms), and never more than is left before the give-up deadline,
/// so the store's own timeout does not outlast the lease's usefulness.
#[tokio::test(start_paused = true)]
async fn a_renewal_is_given_no_more_time_than_is_left_before_g() {
    let mut script = Script::default();
    for _ in 0..5 {
        script.renew.push_back((ms(10), unavailable()));
    }
    let (mut e, fake) = elector(script);
    let mut lease = lease_at(e.clock().now());
    assert_eq!(e.hold(&mut lease).await.reason, LossReason::GaveUp);
    assert_eq!(
        fake.calls("renew"),
        vec![at(1000), at(1010), at(1260), at(1510), at(1760)]
    );
    assert_eq!(
        fake.budgets("renew"),
        vec![ms(500), ms(500), ms(500), ms(490), ms(240)]
    );
}

/// A renewal failure says how long is left before giving up, and the
/// renewal that ends the trouble says so once; healthy renewals say nothing
/// at that level.
#[tokio::test(start_paused = true)]
async fn renewal_trouble_and_its_end_are_logged_once() {
    let mut script = Script::default();
    script.renew.push_back((ms(10), unavailable()));
    let (mut e, _) = elector(script);
    let mut lease = lease_at(e.clock().now());
    let (r, log) = logged(tokio::time::timeout(ms(3500), e.hold(&mut lease))).await;
    assert!(r.is_err(), "{r:?}");
    // Failed at 1.01 s; G is at 2 s.
    assert!(
        log.contains("renewal failed (down); giving up in 990ms unless a retry succeeds"),
        "{log}"
    );
    assert_eq!(
        log.matches("renewed again after 1 failed attempt(s)")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("WARN").count(), 2, "{log}");
}

/// A release that works at once says "released" (with what --min-hold
/// keeps) and warns of nothing.
#[tokio::test(start_paused = true)]
async fn a_clean_release_says_so_and_warns_of_nothing() {
    let (mut e, _) = elector(Script::default());
    let lease = lease_at(e.clock().now());
    tokio::time::advance(ms(300)).await;
    let (freed, log) = logged(e.release(&lease, Some(ms(1000)))).await;
    assert!(freed);
    assert!(
        log.contains("released; kept for another 700ms (--min-hold)"),
        "{log}"
    );
    assert!(!log.contains("WARN"), "{log}");
    let (freed, log) = logged(e.release(&lease, None)).await;
    assert!(freed);
    assert!(
        log.contains("INFO leaderrun::elector: released event"),
        "{log}"
    );
    assert!(!log.contains("WARN"), "{log}");
}

/// The waiting line and the status line describe the lease as the store
/// has it: held (time left rounded up to whole seconds), held but expired,
/// or free.
#[test]
fn a_held_lease_is_described_as_the_store_has_it() {
    let held = record(Some("other"), 4, Some(1500));
    assert_eq!(
        describe_held(&held),
        "lease n held by other (epoch 4) for another 2s"
    );
    let expired = record(Some("other"), 4, Some(0));
    assert_eq!(
        describe_held(&expired),
        "lease n held by other (epoch 4), expired"
    );
    let unknown = record(Some("other"), 4, None);
    assert_eq!(
        describe_held(&unknown),
        "lease n held by other (epoch 4), expired"
    );
    assert_eq!(
        describe_held(&record(None, 5, None)),
        "lease n is free (epoch 5)"
    );
}

/// Polls that found the lease held with plenty of time left do not count
/// as attempts made too early: once the holder's lease is about to run out,
/// the next attempt still goes out at its expiry, not at the next poll.
#[tokio::test(start_paused = true)]
async fn a_long_wait_still_tries_at_the_expiry() {
    let script = Script {
        held: held_for(60_000),
        rival_at: Some((at(4000), held_for(150).unwrap())),
        ..Default::default()
    };
    let (mut e, fake) = elector(script);
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let w = e.wait_for_lease(true, Some(ms(4300)), &mut rx).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    let calls = fake.calls("acquire");
    // Every P = 400 ms up to 4 s, then at the expiry: 4 s + 150 ms + margin.
    assert_eq!(calls.len(), 12, "{calls:?}");
    assert_eq!(calls[10], at(4000));
    assert_eq!(calls[11], at(4150) + EXPIRY_MARGIN);
}

/// Up to 250 ms past the deadline is a timer firing late, reported as giving
/// up; more than that means the process did not run around the deadline.
#[tokio::test(start_paused = true)]
async fn lateness_beyond_250ms_is_reported_as_waking_late() {
    for (late, want) in [
        (250, LossReason::GaveUp),
        (251, LossReason::WokeLate(ms(251))),
    ] {
        let (mut e, fake) = elector(Script::default());
        let mut lease = lease_at(e.clock().now());
        let hold = e.hold(&mut lease);
        tokio::time::advance(ms(2000 + late)).await;
        let lost = hold.await;
        assert_eq!(lost.reason, want);
        assert_eq!(lost.deadline, at(2000));
        assert!(fake.calls("renew").is_empty());
    }
}

/// A broken subscription is said at info (only speed is lost), with the
/// poll interval that carries on; the next attempt subscribes again, which
/// ends that outage (at debug), so a second breakage is a new outage.
#[tokio::test(start_paused = true)]
async fn each_broken_subscription_is_logged_with_its_end() {
    let script = Script {
        held: held_for(60_000),
        ..Default::default()
    };
    let (mut e, _) = elector(script);
    e.timing = slow_poll();
    let wake = FakeWake::default();
    for _ in 0..2 {
        wake.wakes
            .borrow_mut()
            .push_back((ms(100), Err(StoreError::unavailable("gone"))));
    }
    e.push(wake.clone());
    let (_tx, mut rx) = unbounded_channel::<i32>();
    let (w, log) = logged(e.wait_for_lease(true, Some(ms(15_000)), &mut rx)).await;
    assert!(matches!(w, Waited::TimedOut), "{w:?}");
    let events: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("event=\"").nth(1))
        .filter(|ev| ev.starts_with("push_"))
        .collect();
    assert_eq!(
        events,
        vec!["push_broken\"", "push_restored\"", "push_broken\""],
        "{log}"
    );
    assert!(
        log.contains("INFO leaderrun::elector: push wake-ups unavailable (gone); polling every 10s until they work again"),
        "{log}"
    );
}
