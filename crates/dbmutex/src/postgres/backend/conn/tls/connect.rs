//! tokio-postgres's TLS hooks over tokio-rustls, with `tls-server-end-point`
//! channel binding (what tokio-postgres-rustls provides, without the
//! X.509 parser it takes for one object identifier, and usable with no
//! PostgreSQL-specific crate behind the `tls` feature).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;

/// Makes a TLS connector per connection (and per cancel request).
#[derive(Clone)]
pub(crate) struct MakeRustlsConnect(TlsConnector);

impl MakeRustlsConnect {
    pub(crate) fn new(config: rustls::ClientConfig) -> Self {
        Self(TlsConnector::from(Arc::new(config)))
    }
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> io::Result<RustlsConnect> {
        // A name rustls refuses fails in `connect`, not here: with
        // sslmode=prefer a server without TLS never gets that far.
        Ok(RustlsConnect {
            connector: self.0.clone(),
            hostname: hostname.to_owned(),
        })
    }
}

/// One handshake, for the host tokio-postgres connects to.
pub(crate) struct RustlsConnect {
    connector: TlsConnector,
    hostname: String,
}

type Handshake<S> = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Handshake<S>;

    fn connect(self, stream: S) -> Handshake<S> {
        Box::pin(async move {
            let name = ServerName::try_from(self.hostname)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let tls = self.connector.connect(name, stream).await?;
            Ok(RustlsStream(tls))
        })
    }
}

/// An established TLS connection to the server.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| server_end_point(cert.as_ref()))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The `tls-server-end-point` binding data (RFC 5929 §4.1): the server
/// certificate hashed with its own signature's hash, SHA-256 in place of
/// SHA-1. None for a signature without a single hash (Ed25519, RSA-PSS) or
/// a certificate we cannot read: SCRAM then runs without channel binding,
/// as libpq does for such certificates.
fn server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    let hashed = match signature_algorithm(cert)? {
        SHA1 | SHA1_RSA | SHA256 | SHA256_RSA | SHA256_ECDSA => Sha256::digest(cert).to_vec(),
        SHA384 | SHA384_RSA | SHA384_ECDSA => Sha384::digest(cert).to_vec(),
        SHA512 | SHA512_RSA | SHA512_ECDSA => Sha512::digest(cert).to_vec(),
        _ => return None,
    };
    Some(hashed)
}

// Object identifiers (DER contents) of the signature algorithms above.
const SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];
const SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
const SHA384: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02];
const SHA512: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03];
const SHA1_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05];
const SHA256_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const SHA384_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const SHA512_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const SHA256_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const SHA384_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const SHA512_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];

/// The certificate's outer `signatureAlgorithm` object identifier:
/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm
/// SEQUENCE { algorithm OBJECT IDENTIFIER, ... }, ... }`. rustls has
/// verified (or been told to accept) the certificate; this only reads it.
fn signature_algorithm(cert: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (certificate, _) = der(cert, SEQUENCE)?;
    let (_tbs, rest) = der(certificate, SEQUENCE)?;
    let (algorithm, _) = der(rest, SEQUENCE)?;
    let (oid, _) = der(algorithm, OID)?;
    Some(oid)
}

/// The DER element with `tag` at the start of `input`: its contents and
/// what follows it.
fn der(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let (octets, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
        if octets.is_empty() || octets.len() > 4 {
            return None;
        }
        let len = octets.iter().fold(0usize, |len, &b| len << 8 | usize::from(b));
        (len, rest)
    };
    rest.split_at_checked(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    /// `openssl req -x509 -sha384` with a P-256 key: ecdsa-with-SHA384.
    const ECDSA_SHA384: &str = "-----BEGIN CERTIFICATE-----
MIIBfzCCASWgAwIBAgIUX2RHxKTHO6pcVNaxvGn9yCDiw2QwCgYIKoZIzj0EAwMw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTI2MTIwMTA1MDMwMVoYDzIxMjYxMTA3
MDUwMzAxWjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAARk59NURIwK9TtRUxA2JpoIxrllqs2UB7tPHI5EXk7FF7mWZNQpuTkl
qQ36SFZ8FIQ430wHBEES1cext50QlXK8o1MwUTAdBgNVHQ4EFgQUAzA30fsrpyD7
/crF4Iyee3KTf3swHwYDVR0jBBgwFoAUAzA30fsrpyD7/crF4Iyee3KTf3swDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAwNIADBFAiEAvFkrp4VT7nrTrWsqMHed
wMVUGs3z3uNlYb9V3c0lTcQCIAEJ3FjY0pSatGs1XEXnVErZSInYdmSB64IC8HLt
YCNn
-----END CERTIFICATE-----";
    /// Its `openssl x509 -noout -fingerprint -sha384`.
    const ECDSA_SHA384_FINGERPRINT: &str = "FC:8F:01:E8:67:65:9F:41:2E:11:76:19:32:C9:E0:60:04:CB:4A:C5:C4:5D:3D:4E:C0:85:3C:13:3C:65:91:DF:8F:B2:1E:D2:E6:60:FE:88:27:FA:6A:5F:DA:3D:BD:AE";
    /// An Ed25519 certificate: no hash of its own.
    const ED25519: &str = "-----BEGIN CERTIFICATE-----
MIIBLjCB4aADAgECAhQwZq4pMWtbXwdeTdUEFwi1pRX6XDAFBgMrZXAwDDEKMAgG
A1UEAwwBeDAgFw0yNjEyMDEwNTAzMDFaGA8yMTI2MTEwNzA1MDMwMVowDDEKMAgG
A1UEAwwBeDAqMAUGAytlcAMhAOb85SFzmcNcpaRxVKDRoO6Upp0U21+H0bHsbOwO
mrCZo1MwUTAdBgNVHQ4EFgQUrix6KKvmlN2Oe+/jCjB+c4Wb72cwHwYDVR0jBBgw
FoAUrix6KKvmlN2Oe+/jCjB+c4Wb72cwDwYDVR0TAQH/BAUwAwEB/zAFBgMrZXAD
QQA8uA/y2vSNh8D65q7ZKmIsxVe81QLritGgGFw9quMNttsZSr/P8zt41cS7ZP4D
7fVPdEj8JbOPZPLTuQL67JgL
-----END CERTIFICATE-----";

    fn der_of(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn binding_hashes_with_the_signature_hash() {
        let hex: Vec<String> = server_end_point(&der_of(ECDSA_SHA384))
            .unwrap()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        assert_eq!(hex.join(":"), ECDSA_SHA384_FINGERPRINT);
    }

    #[test]
    fn no_binding_without_a_single_hash() {
        assert_eq!(server_end_point(&der_of(ED25519)), None);
    }

    #[test]
    fn damaged_certificates_give_no_binding() {
        let cert = der_of(ECDSA_SHA384);
        for len in 0..cert.len() {
            assert_eq!(server_end_point(&cert[..len]), None, "{len} bytes");
        }
        let mut wrong_tag = cert.clone();
        wrong_tag[0] = 0x31;
        assert_eq!(server_end_point(&wrong_tag), None);
        let mut huge = cert;
        huge[1] = 0x88; // an 8-octet length
        assert_eq!(server_end_point(&huge), None);
    }
}
