//! Why a driver rejected a connection string, in words that quote no
//! value from it.

/// Why tokio-postgres rejected a connection string, in words that quote
/// nothing from it: option names it knows (`invalid value for option
/// `port``) and its fixed texts; an unknown option's name, a character it
/// tripped on and UTF-8 details are left out.
#[cfg(feature = "postgres")]
pub(crate) fn pg_reason(e: &tokio_postgres::Error) -> String {
    let Some(cause) = std::error::Error::source(e) else {
        return e.to_string();
    };
    let text = cause.to_string();
    let why = if text.starts_with("invalid value for option `") {
        // The option name is a `&'static str` inside tokio-postgres.
        text.as_str()
    } else if text.starts_with("unknown option `") {
        "an unknown option"
    } else if text.starts_with("unexpected character") {
        "an unexpected character"
    } else if matches!(
        text.as_str(),
        "unexpected EOF" | "unterminated quoted connection parameter value" | "unterminated parameter"
    ) {
        text.as_str()
    } else {
        "malformed (bad percent-encoding or UTF-8?)"
    };
    format!("{e}: {why}")
}

/// Why mysql_async rejected a URL, without the values it quotes.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_reason(e: &mysql_async::UrlError) -> String {
    use mysql_async::UrlError as U;
    match e {
        // The parameter names in these come from mysql_async's own table.
        U::FeatureRequired { .. } | U::InvalidPoolConstraints { .. } | U::Invalid => e.to_string(),
        U::InvalidParamValue { param, .. } => format!("invalid value for URL parameter `{param}`"),
        // url::ParseError's texts are fixed ("invalid port number").
        U::Parse(p) => format!("URL parse error: {p}"),
        U::UnknownParameter { .. } => "an unknown URL parameter".into(),
        U::UnsupportedScheme { .. } => "unsupported URL scheme".into(),
    }
}

#[cfg(all(test, feature = "postgres", feature = "mysql"))]
mod tests {
    use super::*;

    #[test]
    fn driver_reasons_quote_nothing() {
        // How many of the drivers' own texts quote the secret: why they are
        // reworded rather than shown.
        let mut raw_quotes = 0;
        for s in [
            "postgres://u:x@h/db?secret=1",
            "postgres://u:x@h:secret/db",
            "postgres://u:x@h/db?sslmode=secret",
            "host=h secret",
            "host=h password='secret",
            "postgres://u:x@h/%ff%fesecret",
        ] {
            let e = s.parse::<tokio_postgres::Config>().expect_err(s);
            raw_quotes += usize::from(format!("{e} {:?}", std::error::Error::source(&e)).contains("secret"));
            let why = pg_reason(&e);
            assert!(!why.contains("secret"), "{s}: {why}");
        }
        for s in [
            "mysql://u:x@h/db?secret=1",
            "mysql://u:x@h/db?pool_min=secret",
            "mysql://u:x@h:secret/db",
            "mysql://u:x@[secret/db",
        ] {
            let e = mysql_async::Opts::from_url(s).expect_err(s);
            raw_quotes += usize::from(e.to_string().contains("secret"));
            let why = mysql_reason(&e);
            assert!(!why.contains("secret"), "{s}: {why}");
        }
        assert!(raw_quotes >= 3, "the drivers quote values: {raw_quotes}");
    }
}
