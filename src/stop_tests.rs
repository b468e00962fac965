//! The stop plan's arithmetic and the stop sequence, instant by instant.

use super::*;
use crate::timing::TimingArgs;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Stamp {
    Stamp::from_origin(ms(n))
}

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms; the grace is capped at 100 ms.
fn timing() -> Timing {
    lease(3000)
}

fn lease(l: u64) -> Timing {
    Timing::resolve(TimingArgs {
        lease: Some(ms(l).into()),
        ..Default::default()
    })
    .expect("a valid timing")
}

/// Sent at 1 s: G at 3 s, G + K at 3.5 s, expiry at 4 s.
fn plan() -> StopPlan {
    StopPlan::new(at(1000), timing())
}

#[test]
fn the_plan_counts_every_deadline_from_sent() {
    let p = plan();
    assert_eq!(p.sent(), at(1000));
    assert_eq!(p.timing(), timing());
    assert_eq!(p.give_up_at(), at(3000));
    assert_eq!(p.kill_at(), at(3500));
    assert_eq!(p.expires(), at(4000));
    assert_eq!(p.grace(), ms(100));
    assert_eq!(p.watchdog_term_at(), at(3100));
}

/// A short K: the grace is a quarter of it, so the SIGKILL still comes
/// well after the watchdog's SIGTERM.
#[test]
fn the_watchdogs_grace_is_a_quarter_of_k_when_that_is_less() {
    // L = 600 ms: G = 400 ms, K = 100 ms.
    let p = StopPlan::new(at(0), lease(600));
    assert_eq!(p.grace(), ms(25));
    assert_eq!(p.watchdog_term_at(), at(425));
    assert_eq!(p.kill_at(), at(500));
    // Exactly 400 ms of K: the cap and the quarter agree.
    let t = Timing::resolve(TimingArgs {
        lease: Some(ms(3000).into()),
        kill_after: Some(ms(400).into()),
        ..Default::default()
    })
    .expect("valid");
    assert_eq!(StopPlan::new(at(0), t).grace(), ms(100));
}

#[test]
fn a_stop_begun_early_kills_k_later_and_one_begun_late_never_past_g_plus_k() {
    let p = plan();
    // Begun at 1.5 s (a renewal matched nothing): K later.
    assert_eq!(p.kill_from(at(1500)), at(2000));
    // Begun at 3.2 s: K later would be 3.7 s, past G + K.
    assert_eq!(p.kill_from(at(3200)), at(3500));
    // Begun exactly K before G + K: the two agree.
    assert_eq!(p.kill_from(at(3000)), at(3500));
    // Begun past G + K: at once (already due).
    assert_eq!(p.kill_from(at(9000)), at(3500));
}

#[test]
fn deadlines_only_move_on() {
    let mut p = plan();
    p.renewed(at(2000));
    assert_eq!(p.give_up_at(), at(4000));
    // A stale renewal, read after a fresher one: nothing moves back.
    p.renewed(at(1500));
    assert_eq!(p.sent(), at(2000));
    assert_eq!(p.kill_at(), at(4500));
}

/// Drive a stop from `now` as a caller does (one signal per call, until
/// a wait or the end), with everything alive: the steps taken, then the
/// wait or end.
fn steps(s: &mut Stop, now: Stamp) -> Vec<Step> {
    let mut out = Vec::new();
    loop {
        let step = s.next(now, true);
        out.push(step);
        if !matches!(step, Step::Term | Step::Kill { .. }) {
            return out;
        }
    }
}

#[test]
fn leaderruns_stop_terms_at_once_and_kills_k_later() {
    let p = plan();
    let mut s = Stop::at(&p, at(1500));
    assert!(!s.begun());
    assert_eq!(steps(&mut s, at(1500)), [Step::Term, Step::Wait(at(2000))]);
    assert!(s.begun() && !s.killed());
    // Nothing more before the kill deadline, however often asked.
    assert_eq!(steps(&mut s, at(1999)), [Step::Wait(at(2000))]);
    assert_eq!(
        steps(&mut s, at(2000)),
        [Step::Kill { first: true }, Step::Wait(at(2010))]
    );
    assert!(s.killed());
}

#[test]
fn past_g_plus_k_term_and_kill_go_out_together() {
    let p = plan();
    let mut s = Stop::at(&p, at(3600));
    assert_eq!(
        steps(&mut s, at(3600)),
        [Step::Term, Step::Kill { first: true }, Step::Wait(at(3610))]
    );
    // The watchdog's, woken past G + K (it was itself stopped): the same.
    let mut w = Stop::watchdog(&p);
    assert_eq!(
        steps(&mut w, at(5000)),
        [Step::Term, Step::Kill { first: true }, Step::Wait(at(5010))]
    );
}

#[test]
fn the_watchdogs_stop_terms_a_grace_after_g_and_kills_at_g_plus_k() {
    let p = plan();
    let mut s = Stop::watchdog(&p);
    assert_eq!(steps(&mut s, at(1000)), [Step::Wait(at(3100))]);
    assert!(!s.begun());
    assert_eq!(steps(&mut s, at(3099)), [Step::Wait(at(3100))]);
    assert_eq!(steps(&mut s, at(3100)), [Step::Term, Step::Wait(at(3500))]);
    assert_eq!(steps(&mut s, at(3499)), [Step::Wait(at(3500))]);
    assert_eq!(
        steps(&mut s, at(3500)),
        [Step::Kill { first: true }, Step::Wait(at(3510))]
    );
    // Woken between G + grace and G + K (after a thaw): SIGTERM only.
    let mut late = Stop::watchdog(&p);
    assert_eq!(
        steps(&mut late, at(3300)),
        [Step::Term, Step::Wait(at(3500))]
    );
}

#[test]
fn sigkill_goes_out_again_every_round_until_everything_is_gone() {
    let p = plan();
    let mut s = Stop::at(&p, at(3500));
    assert_eq!(
        steps(&mut s, at(3500)),
        [Step::Term, Step::Kill { first: true }, Step::Wait(at(3510))]
    );
    assert_eq!(steps(&mut s, at(3509)), [Step::Wait(at(3510))]);
    assert_eq!(
        steps(&mut s, at(3510)),
        [Step::Kill { first: false }, Step::Wait(at(3520))]
    );
    // A late caller: the round counts from when it went out.
    assert_eq!(
        steps(&mut s, at(3537)),
        [Step::Kill { first: false }, Step::Wait(at(3547))]
    );
    assert_eq!(s.next(at(3540), false), Step::Gone);
}

/// A kill that took longer than a round (a host with many processes to
/// read) is followed by a wait all the same, already due: the caller looks
/// whether anything still runs before the next round, and before the
/// verdict.
#[test]
fn every_sigkill_is_followed_by_a_look() {
    let p = plan();
    let mut s = Stop::at(&p, at(3500));
    assert_eq!(s.next(at(3500), true), Step::Term);
    assert_eq!(s.next(at(3500), true), Step::Kill { first: true });
    // Read again after the kill, 37 ms later: a wait, due already.
    assert_eq!(s.next(at(3537), true), Step::Wait(at(3510)));
    assert_eq!(s.next(at(3537), true), Step::Kill { first: false });
    assert_eq!(s.next(at(3600), true), Step::Wait(at(3547)));
    assert_eq!(s.next(at(3600), false), Step::Gone);
    // Past the verdict's time when the kill came back: a look first.
    let mut t = Stop::at(&p, at(3500));
    steps(&mut t, at(3500));
    assert_eq!(t.next(at(4495), true), Step::Kill { first: false });
    assert_eq!(t.next(at(4700), true), Step::Wait(at(4500)));
    assert_eq!(t.next(at(4700), false), Step::Gone);
    let mut u = Stop::at(&p, at(3500));
    steps(&mut u, at(3500));
    assert_eq!(u.next(at(4495), true), Step::Kill { first: false });
    assert_eq!(u.next(at(4700), true), Step::Wait(at(4500)));
    assert_eq!(u.next(at(4700), true), Step::Stuck);
}

#[test]
fn what_sigkill_does_not_end_within_a_second_is_stuck() {
    let p = plan();
    let mut s = Stop::at(&p, at(3500));
    steps(&mut s, at(3500));
    // The last round before the verdict waits no later than the verdict.
    assert_eq!(
        steps(&mut s, at(4495)),
        [Step::Kill { first: false }, Step::Wait(at(4500))]
    );
    assert_eq!(s.next(at(4499), true), Step::Wait(at(4500)));
    assert_eq!(s.next(at(4500), true), Step::Stuck);
    assert_eq!(s.next(at(9000), true), Step::Stuck);
    // Gone is gone, even after the verdict.
    assert_eq!(s.next(at(9000), false), Step::Gone);
}

#[test]
fn everything_gone_before_the_deadlines_ends_the_stop_with_nothing_sent() {
    let p = plan();
    let mut s = Stop::watchdog(&p);
    assert_eq!(s.next(at(3200), false), Step::Gone);
    assert!(!s.begun());
    let mut b = Stop::at(&p, at(1500));
    assert_eq!(b.next(at(1500), false), Step::Gone);
    assert!(!b.begun());
}

#[test]
fn after_leaderruns_death_the_kill_is_at_once_with_no_sigterm_and_kept_up_until_expiry() {
    let mut s = Stop::kill_now(at(1000), at(4000));
    assert_eq!(
        steps(&mut s, at(1000)),
        [Step::Kill { first: true }, Step::Wait(at(1010))]
    );
    assert!(s.begun() && s.killed());
    // A second of SIGKILL is not the verdict while the lease still runs.
    assert_eq!(
        steps(&mut s, at(2500)),
        [Step::Kill { first: false }, Step::Wait(at(2510))]
    );
    assert_eq!(
        steps(&mut s, at(3995)),
        [Step::Kill { first: false }, Step::Wait(at(4000))]
    );
    assert_eq!(s.next(at(4000), true), Step::Stuck);
    // With the expiry already near (or past), a second still.
    let mut near = Stop::kill_now(at(3900), at(4000));
    steps(&mut near, at(3900));
    assert_eq!(
        steps(&mut near, at(4000)),
        [Step::Kill { first: false }, Step::Wait(at(4010))]
    );
    assert_eq!(
        steps(&mut near, at(4899)),
        [Step::Kill { first: false }, Step::Wait(at(4900))]
    );
    assert_eq!(near.next(at(4900), true), Step::Stuck);
}
