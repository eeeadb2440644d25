//! The one parser of every duration flag: humantime's syntax (`500ms`, `10s`, `2m`, `7days`),
//! with limits. Zero is refused where it would mean nothing (an interval of nothing spins, a
//! timeout of nothing fires at once), and a value past a cap is refused by name: past it, a
//! deadline `now + value` could overflow the clock, and no setting of Ember needs more.

use std::time::Duration;

/// The longest interval or timeout a flag takes: one day.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The longest age a retention flag (what is kept, and for how long) takes: one year.
pub const MAX_AGE: Duration = Duration::from_secs(365 * 24 * 3600);

const HINT: &str = "write e.g. 500ms, 10s, 2m";

/// Parses an interval or a timeout: more than zero, at most [`MAX_DURATION`] (one day).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    within(text, Duration::from_nanos(1), MAX_DURATION, "1day")
}

/// Parses a wait that may be zero (zero: do not wait), at most [`MAX_DURATION`] (one day).
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    within(text, Duration::ZERO, MAX_DURATION, "1day")
}

/// Parses a job's timeout or deadline: more than zero, at most thirty days (what the driver
/// takes).
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let cap = Duration::from_millis(crate::driver::core::MAX_TIMEOUT_MS);
    within(text, Duration::from_nanos(1), cap, "30days")
}

/// A grace that may be turned off: `--disconnect-grace off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace(pub Option<Duration>);

/// Parses a [`Grace`]: `off`, or a wait as [`parse_wait`] reads it.
pub fn parse_grace(text: &str) -> Result<Grace, String> {
    match text.trim() {
        "off" => Ok(Grace(None)),
        text => parse_wait(text).map(|grace| Grace(Some(grace))),
    }
}

/// Parses a retention age: more than zero, at most [`MAX_AGE`] (one year).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    within(text, Duration::from_nanos(1), MAX_AGE, "1year")
}

/// Parses `--lease`: a duration from 200ms to 10min. Shorter, a renewal (a third of it) would
/// race the broker's own round trips; longer, a dead leader would hold the cluster that long.
pub fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = parse(text)?;
    if lease < Duration::from_millis(200) || lease > Duration::from_secs(600) {
        return Err(format!("{text:?} is outside 200ms..=10min"));
    }
    Ok(lease)
}

/// `duration` as the parsers above read it: how `--help` shows a default, written from the
/// constant the config takes it from. Whole seconds stay seconds below an hour (`120s`, as
/// Spark writes its timeouts), whole hours stay hours below two days (`24h`), and longer whole
/// days are days (`7days`); anything finer is humantime's own form (`500ms`).
pub fn show_duration(duration: Duration) -> String {
    const HOUR: u64 = 3600;
    const DAY: u64 = 24 * HOUR;
    let secs = duration.as_secs();
    if duration.subsec_nanos() != 0 {
        humantime::format_duration(duration).to_string()
    } else if secs < HOUR || secs % HOUR != 0 {
        format!("{secs}s")
    } else if secs < 2 * DAY || secs % DAY != 0 {
        format!("{}h", secs / HOUR)
    } else {
        format!("{}days", secs / DAY)
    }
}

fn within(text: &str, min: Duration, max: Duration, max_name: &str) -> Result<Duration, String> {
    let value = parse(text)?;
    if value < min {
        return Err(format!(
            "{text:?} is zero; give a duration above zero ({HINT})"
        ));
    }
    if value > max {
        return Err(format!("{text:?} is more than the cap of {max_name}"));
    }
    Ok(value)
}

fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("{e} ({HINT})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_within_their_limits_parse_and_the_rest_say_why_not() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1day"), Ok(MAX_DURATION));
        assert_eq!(parse_wait("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("365days"), Ok(MAX_AGE));
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_age("0ms").unwrap_err().contains("zero"));
        assert!(parse_duration("25h").unwrap_err().contains("1day"));
        assert!(parse_wait("2days").unwrap_err().contains("1day"));
        assert!(parse_age("366days").unwrap_err().contains("1year"));
        // humantime itself refuses what overflows a Duration.
        assert!(parse_age("99999999999999999999years").is_err());
        for bad in ["", "ten seconds", "-1s", "5"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_lease("100ms").is_err());
        assert_eq!(parse_lease("3s"), Ok(Duration::from_secs(3)));
    }

    #[test]
    fn a_shown_duration_reads_back_as_itself() {
        let shown = |secs| show_duration(Duration::from_secs(secs));
        assert_eq!(shown(120), "120s");
        assert_eq!(shown(3600), "1h");
        assert_eq!(shown(24 * 3600), "24h");
        assert_eq!(shown(7 * 24 * 3600), "7days");
        for duration in [
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(5400),
            Duration::from_secs(36 * 3600),
            Duration::from_secs(7 * 24 * 3600),
            MAX_AGE,
        ] {
            assert_eq!(parse_age(&show_duration(duration)), Ok(duration));
        }
    }
}
