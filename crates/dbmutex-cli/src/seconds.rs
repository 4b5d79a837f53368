//! Durations given on the command line in seconds.

use std::time::Duration;

/// The longest duration accepted: about ten years. Anything longer is a typo
/// (or an attempt at "forever", which is the default when no timeout is given).
pub const MAX_SECONDS: f64 = 10.0 * 365.25 * 24.0 * 3600.0;

/// Parses `SECONDS` as flock(1) does: a non-negative decimal number, fractions
/// allowed (`0.3`, `2`, `1.5e1`). Rejects negatives, NaN, infinities and
/// values above [`MAX_SECONDS`].
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let v: f64 = t
        .parse()
        .map_err(|_| "not a number of seconds (examples: 5, 0.3)".to_owned())?;
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

/// Parses a window: seconds as [`parse_seconds`] (`3600`), or a number
/// with one unit, `s`, `m`, `h` or `d` (`90s`, `30m`, `1h`, `1.5d`).
pub fn parse_window(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (number, unit) = match t.char_indices().last() {
        Some((i, c @ ('s' | 'm' | 'h' | 'd'))) => (&t[..i], c),
        _ => (t, 's'),
    };
    let factor = match unit {
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86400.0,
        _ => 1.0,
    };
    let bad = |_| format!("not a duration: {t:?} (examples: 3600, 90s, 30m, 1h, 1d)");
    let seconds = parse_seconds(number).map_err(bad)?;
    let total = seconds.as_secs_f64() * factor;
    if total > MAX_SECONDS {
        return Err("more than ten years".into());
    }
    Ok(Duration::from_secs_f64(total))
}

/// A `--once-per` window: [`parse_window`], but not 0, which would mean
/// "no limit" and is surely a mistake.
pub fn parse_once_per(s: &str) -> Result<Duration, String> {
    match parse_window(s)? {
        Duration::ZERO => Err("a window of 0 limits nothing: leave --once-per out to run every time".into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_one_unit() {
        assert_eq!(parse_window("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_window("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window(" 1.5d "), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_window("0"), Ok(Duration::ZERO));
        for bad in ["", "h", "1x", "1hh", "-1h", "1h30m", "nanh", "4000d", "1e300s"] {
            assert!(parse_window(bad).is_err(), "{bad:?} accepted");
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
    }
}
