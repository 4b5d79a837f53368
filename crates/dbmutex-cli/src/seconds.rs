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

#[cfg(test)]
mod tests {
    use super::*;

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
