//! The pace a request body must keep (see [`BodyRules`]): a byte within the idle limit of the
//! last, the minimum rate over a sliding window once the grace period has passed, and the whole
//! body within its deadline. [`Pace`] remembers when the body's bytes came, in a fixed ring of
//! marks (no allocation), and says when the body must deliver more and what it is refused with
//! if it does not.
//!
//! The window: at every moment `t` past the grace period, the bytes that came in the last window
//! (`(t - window, t]`) must be at least `min_rate × window`. The window is the grace period (at
//! least 1 s), so the first check, at the end of the grace period, asks for what the old
//! average-since-the-start check asked then; afterwards a body cannot bank a burst and trickle on
//! it, as it could under an average (a 16 MiB burst then one byte every 29 s kept the old check
//! satisfied for over an hour while holding its 16 MiB).

use std::time::Duration;

use tokio::time::Instant;

use super::body::BodyRules;
use super::error::ApiError;

/// How many marks a body keeps: spaced at least an eighth of the window apart, ten of them
/// always reach back past the window.
const MARKS: usize = 10;

/// When a body's bytes came: marks of (milliseconds since it began, bytes received by then),
/// oldest first.
pub(crate) struct Pace {
    /// When the body began.
    began: Instant,
    /// The ring of marks; `len` of them are set, the newest at `newest`.
    marks: [(u32, u64); MARKS],
    /// Where the newest mark is.
    newest: usize,
    /// How many marks are set.
    len: usize,
    /// When the newest mark was made (milliseconds since the body began): it is moved forward
    /// for an eighth of the window from then, so the marks were made that far apart.
    opened: u32,
}

impl Pace {
    /// A body beginning now.
    pub(crate) fn new() -> Pace {
        Pace::since(Instant::now())
    }

    /// A body that began at `began`.
    pub(crate) fn since(began: Instant) -> Pace {
        Pace {
            began,
            marks: [(0, 0); MARKS],
            newest: 0,
            len: 0,
            opened: 0,
        }
    }

    /// Notes that `received` bytes had come by now. A mark made less than an eighth of `window`
    /// ago is moved forward instead of adding one: it then says its bytes came later than some
    /// did, which can only make [`Pace::due`] later (by at most that eighth), never earlier.
    pub(crate) fn note(&mut self, received: u64, window: Duration) {
        self.note_at(received, window, Instant::now());
    }

    /// [`Pace::note`] at `now`.
    fn note_at(&mut self, received: u64, window: Duration, now: Instant) {
        let since = now.saturating_duration_since(self.began);
        let at = u32::try_from(since.as_millis()).unwrap_or(u32::MAX);
        let spacing = u32::try_from(window.as_millis() / 8)
            .unwrap_or(u32::MAX)
            .max(1);
        if self.len > 0 {
            let last = &mut self.marks[self.newest];
            if last.1 == received {
                return;
            }
            if at.saturating_sub(self.opened) < spacing {
                *last = (at, received);
                return;
            }
        }
        self.newest = (self.newest + 1) % MARKS;
        self.marks[self.newest] = (at, received);
        self.len = (self.len + 1).min(MARKS);
        self.opened = at;
    }

    /// When the body, `received` bytes in, must deliver more, and the refusal due then: the
    /// earliest of the idle limit from now (408 `REQUEST_TIMEOUT`), the moment its last window
    /// falls below the minimum rate (408 `BODY_TOO_SLOW`) and its deadline (408
    /// `BODY_DEADLINE`).
    pub(crate) fn due(&self, rules: &BodyRules, received: u64) -> (Instant, ApiError) {
        self.due_at(rules, received, Instant::now())
    }

    /// [`Pace::due`] at `now`.
    fn due_at(&self, rules: &BodyRules, received: u64, now: Instant) -> (Instant, ApiError) {
        let mut due = (now + rules.idle, ApiError::body_timeout(rules.idle));
        if !rules.deadline.is_zero() {
            let at = self.began + rules.deadline;
            if at < due.0 {
                due = (at, ApiError::body_deadline(rules.deadline));
            }
        }
        if rules.min_rate == 0 {
            return due;
        }
        let window = rules.window();
        let need = (rules.min_rate as f64 * window.as_secs_f64()) as u64;
        // With nothing more coming, the window's bytes fall below `need` once the moment the
        // body passed `received - need` bytes is a window old. A body that has not sent `need`
        // in all fails as soon as the grace period ends.
        let passed = received
            .checked_sub(need)
            .map(|floor| self.first_past(floor).unwrap_or(now));
        let start = self.began + rules.grace;
        let rate_at = passed.map_or(start, |at| (at + window).max(start));
        if rate_at < due.0 {
            due = (rate_at, ApiError::body_too_slow(rules.min_rate, window));
        }
        due
    }

    /// The time of the oldest mark with more than `floor` bytes: no earlier than the moment the
    /// body passed `floor` (a mark's bytes had come by its time).
    fn first_past(&self, floor: u64) -> Option<Instant> {
        (0..self.len)
            .map(|i| self.marks[(self.newest + MARKS - (self.len - 1) + i) % MARKS])
            .find(|&(_, bytes)| bytes > floor)
            .map(|(ms, _)| self.began + Duration::from_millis(u64::from(ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(min_rate: u64, grace: Duration) -> BodyRules {
        BodyRules {
            idle: Duration::from_secs(30),
            min_rate,
            grace,
            deadline: Duration::from_mins(10),
            budget: super::super::budget::Budget::new(1 << 20),
            owner: super::super::budget::Owner::NONE,
        }
    }

    /// A body that sent a burst and then nothing is due one window after the burst, however
    /// large the burst (an average since the start would give it hours).
    #[test]
    fn a_burst_buys_one_window_not_hours() {
        let r = rules(1000, Duration::from_secs(10));
        let began = Instant::now();
        let mut pace = Pace::since(began);
        let now = began + Duration::from_secs(2);
        pace.note_at(16 << 20, r.window(), now);
        let (at, refusal) = pace.due_at(&r, 16 << 20, now);
        assert_eq!(refusal.code(), "BODY_TOO_SLOW");
        assert_eq!(at, began + Duration::from_secs(12));
    }

    /// A body that keeps the rate is never due before its idle limit; one that has sent less
    /// than a window's worth is due when the grace ends; the deadline bounds every body.
    #[test]
    fn a_steady_body_is_due_only_at_its_idle_limit_or_deadline() {
        let r = rules(1000, Duration::from_secs(10));
        let began = Instant::now();
        let mut pace = Pace::since(began);
        assert_eq!(pace.due_at(&r, 0, began).0, began + Duration::from_secs(10));
        let mut sent = 0;
        for s in 1..590 {
            let now = began + Duration::from_secs(s);
            sent += 1500;
            pace.note_at(sent, r.window(), now);
            let (at, refusal) = pace.due_at(&r, sent, now);
            assert!(at > now, "{s}: due in the past");
            if s >= 10 && refusal.code() == "BODY_TOO_SLOW" {
                // Due a window after the body passed `sent - 10_000` (6.7 s ago): 3.3 s from
                // now, or later by up to the gap between two marks (an eighth of the window
                // plus the time between notes).
                let ahead = at - now;
                assert!(
                    ahead >= Duration::from_millis(3300) && ahead <= Duration::from_millis(5600),
                    "{s}: due {ahead:?}"
                );
            }
        }
        let now = began + Duration::from_secs(605);
        sent += 30_000;
        pace.note_at(sent, r.window(), now);
        let (at, refusal) = pace.due_at(&r, sent, now);
        assert_eq!(refusal.code(), "BODY_DEADLINE");
        assert_eq!(at, began + Duration::from_mins(10));
    }

    /// A trickle under the rate is due once its last window falls short, though its average
    /// since a fast start is far above the rate.
    #[test]
    fn a_trickle_after_a_fast_start_is_cut() {
        let r = rules(4096, Duration::from_secs(10));
        let began = Instant::now();
        let mut pace = Pace::since(began);
        let mut sent = 4 << 20;
        pace.note_at(sent, r.window(), began + Duration::from_secs(1));
        for s in 2..30 {
            let now = began + Duration::from_secs(s);
            sent += 1000;
            pace.note_at(sent, r.window(), now);
            let (at, _) = pace.due_at(&r, sent, now);
            if at <= now {
                assert!(s >= 10, "cut at {s} s, before the grace ended");
                return;
            }
        }
        panic!("a 1 KB/s trickle was never cut");
    }
}
