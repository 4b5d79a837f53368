//! Raw driver connections, with no dbmutex logic: for the floor, the round
//! trip and the connection counts.

use anyhow::{bail, Context};
use tokio_postgres::config::SslMode;

/// A plaintext tokio-postgres connection that the server lists under `app`.
pub async fn pg_connect(url: &str, app: &str) -> anyhow::Result<tokio_postgres::Client> {
    // The driver's parse errors can quote parts of the URL: not shown.
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|_| anyhow::anyhow!("bad PostgreSQL URL {}", dbmutex::redact_url(url)))?;
    if config.get_ssl_mode() != SslMode::Disable {
        bail!(
            "raw connections are plaintext: use sslmode=disable (or leave sslmode out) \
             so dbmutex and the floor are measured on the same transport"
        );
    }
    config.application_name(app);
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {}", dbmutex::redact_url(url)))?;
    tokio::spawn(async move {
        // Ends when the client is dropped; an error then is of no interest.
        let _ = conn.await;
    });
    Ok(client)
}

/// A MySQL / MariaDB connection (a plain `Conn`: pools reset connections,
/// which would release user locks), over the transport the URL names, as
/// dbmutex's are: mysql_async would otherwise switch a loopback TCP URL to
/// the server's Unix socket, about 20 µs faster per round trip here, which
/// once made dbmutex look 0.53 × its floor.
pub async fn my_connect(url: &str) -> anyhow::Result<mysql_async::Conn> {
    let opts = mysql_async::Opts::from_url(url)
        .map_err(|_| anyhow::anyhow!("bad MySQL URL {}", dbmutex::redact_url(url)))?;
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let opts = if query.split('&').any(|kv| kv.starts_with("prefer_socket=")) {
        opts
    } else {
        mysql_async::OptsBuilder::from_opts(opts)
            .prefer_socket(false)
            .into()
    };
    mysql_async::Conn::new(opts)
        .await
        .with_context(|| format!("connecting to {}", dbmutex::redact_url(url)))
}
