//! Ending a connection whose statement is still running in the server (an
//! abandoned wait): a cancel request first, on a socket of its own, then
//! the close.

use std::sync::Arc;
use std::time::Duration;

use super::session::PgConn;
use super::tls::Tls;

impl PgConn {
    /// Asks the server to cancel the statement running on this session, in
    /// the background, then closes the connection. Used when a waiting
    /// statement is abandoned: without the cancel, a backend blocked in a
    /// lock wait would not notice the closed socket until it got the lock.
    pub(crate) fn cancel_and_close(self: &Arc<Self>) {
        let token = self.cancel.clone();
        let tls = self.tls.clone();
        let me = self.clone();
        // The close must follow the cancel: a cancel sent after the session
        // is gone is harmless, but a closed session cannot be cancelled.
        drop(self.runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                // A socket we dialed ourselves left tokio-postgres without
                // the address to send the cancel to: we dial it again (a
                // Unix socket's without TLS, which PostgreSQL refuses there).
                #[cfg(unix)]
                if let Some(unix) = &me.unix {
                    if let Ok(stream) = tokio::net::UnixStream::connect(&unix.path).await {
                        let _ = token.cancel_query_raw(stream, tokio_postgres::NoTls).await;
                    }
                    return;
                }
                let Some(ends) = &me.ends else {
                    let _ = match tls {
                        Tls::Off => token.cancel_query(tokio_postgres::NoTls).await,
                        #[cfg(feature = "tls")]
                        Tls::Rustls(t) => token.cancel_query(t).await,
                    };
                    return;
                };
                let Ok(stream) = super::direct::dial_one(ends.peer, None, Duration::from_secs(1)).await
                else {
                    return;
                };
                let _ = match tls {
                    Tls::Off => token.cancel_query_raw(stream, tokio_postgres::NoTls).await,
                    #[cfg(feature = "tls")]
                    Tls::Rustls(mut t) => {
                        use tokio_postgres::tls::MakeTlsConnect;
                        match <_ as MakeTlsConnect<tokio::net::TcpStream>>::make_tls_connect(
                            &mut t, &ends.name,
                        ) {
                            Ok(c) => token.cancel_query_raw(stream, c).await,
                            Err(_) => return,
                        }
                    }
                };
            })
            .await;
            me.close();
        }));
    }
}
