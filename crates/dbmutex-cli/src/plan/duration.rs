//! Durations given on the command line: one grammar for every time
//! option (`-w`, `--kill-after`, `--max-hold`, `--once-per`).

use std::time::Duration;

/// The longest duration accepted: about ten years. Anything longer is a typo
/// (or an attempt at "forever", which is the default when no timeout is given).
pub const MAX_SECONDS: f64 = 10.0 * 365.25 * 24.0 * 3600.0;

/// Parses seconds as flock(1) does: a non-negative decimal number, fractions
/// allowed (`0.3`, `2`, `1.5e1`). Rejects negatives, NaN, infinities and
/// values above [`MAX_SECONDS`].
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let v: f64 = t.parse().map_err(|_| "not a number".to_owned())?;
    if v.is_nan() || v.is_infinite() {
        return Err("not a finite number of seconds".into());
    }
    if v.is_sign_negative() && v != 0.0 {
        return Err("negative: give 0 or more seconds".into());
    }
    if v > MAX_SECONDS {
        return Err("more than ten years: leave the timeout out to wait forever".into());
    }
    Ok(Duration::from_secs_f64(v.abs()))
}

/// Parses a duration: seconds as [`parse_seconds`] (`1.5`), or a number
/// with one unit, `ms`, `s`, `m`, `h` or `d` (`250ms`, `2s`, `30m`, `1h`,
/// `1.5d`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (number, factor) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else {
        match t.char_indices().last() {
            Some((i, 's')) => (&t[..i], 1.0),
            Some((i, 'm')) => (&t[..i], 60.0),
            Some((i, 'h')) => (&t[..i], 3600.0),
            Some((i, 'd')) => (&t[..i], 86400.0),
            _ => (t, 1.0),
        }
    };
    // The value is not repeated: clap quotes it, and scrubs one that looks
    // like a URL with a password.
    let bad = |e| format!("{e}; a duration is a number with an optional unit (1.5, 250ms, 2s, 1m, 1h)");
    let seconds = parse_seconds(number).map_err(bad)?;
    let total = seconds.as_secs_f64() * factor;
    if total > MAX_SECONDS {
        return Err("more than ten years".into());
    }
    Ok(Duration::from_secs_f64(total))
}

/// A `--once-per` window: [`parse_duration`], but not 0, which would mean
/// "no limit" and is surely a mistake.
pub fn parse_once_per(s: &str) -> Result<Duration, String> {
    non_zero(
        s,
        "a window of 0 limits nothing: leave --once-per out to run every time",
    )
}

/// `--lock-delay`: a duration, not 0 (which would delay nothing).
pub fn parse_lock_delay(s: &str) -> Result<Duration, String> {
    non_zero(s, "a lock-delay of 0 delays nothing: leave --lock-delay out")
}

/// A duration, with `zero` as the error for 0.
fn non_zero(s: &str, zero: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(zero.into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_one_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_once_per("0s").is_err());
        assert!(parse_lock_delay("0ms").is_err());
        assert_eq!(parse_lock_delay("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration(" 1.5d "), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in [
            "", "h", "ms", "1x", "1hh", "-1h", "1h30m", "1sms", "nanh", "4000d", "1e300s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn accepts_seconds_and_fractions() {
        assert_eq!(parse_seconds("0"), Ok(Duration::ZERO));
        assert_eq!(parse_seconds("-0"), Ok(Duration::ZERO));
        assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_seconds("0.3"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_seconds(".5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_seconds(" 2.25 "), Ok(Duration::from_millis(2250)));
        assert_eq!(parse_seconds("1e1"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_seconds("315576000"), Ok(Duration::from_secs(315_576_000)));
    }

    #[test]
    fn rejects_what_is_not_a_sane_duration() {
        for bad in [
            "",
            " ",
            "abc",
            "1s",
            "1,5",
            "-1",
            "-0.001",
            "NaN",
            "nan",
            "inf",
            "-inf",
            "infinity",
            "1e300",
            "315576001",
        ] {
            assert!(parse_seconds(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn messages_say_what_is_wrong() {
        assert!(parse_seconds("-1").unwrap_err().contains("negative"));
        assert!(parse_seconds("nan").unwrap_err().contains("finite"));
        assert!(parse_seconds("1e12").unwrap_err().contains("ten years"));
        assert!(parse_seconds("x").unwrap_err().contains("not a number"));
        assert!(parse_duration("1x").unwrap_err().contains("250ms"));
    }
}
