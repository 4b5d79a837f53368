//! TLS for PostgreSQL connections, as `sslmode` asks (rustls, with the
//! `tls` feature; `connect.rs` plugs it into tokio-postgres).

#[cfg(feature = "tls")]
mod connect;

#[cfg(feature = "tls")]
use std::sync::Arc;

use crate::{Error, Result};

#[derive(Clone)]
pub(super) enum Tls {
    Off,
    #[cfg(feature = "tls")]
    Rustls(connect::MakeRustlsConnect),
}

#[cfg(feature = "tls")]
pub(super) fn make_tls(verify: bool, rootcert: Option<&str>) -> Result<Tls> {
    use rustls::ClientConfig;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?;
    let config = if verify {
        let mut roots = rustls::RootCertStore::empty();
        match rootcert {
            // libpq's `system`: the platform's trusted roots; ours are the
            // Mozilla roots dbmutex carries (webpki-roots).
            Some(path) if path != "system" => {
                use rustls::pki_types::pem::PemObject;
                let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                    .map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                for c in certs {
                    let c = c.map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                    roots
                        .add(c)
                        .map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                }
            }
            _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth()
    };
    Ok(Tls::Rustls(connect::MakeRustlsConnect::new(config)))
}

#[cfg(not(feature = "tls"))]
pub(super) fn make_tls(_verify: bool, _rootcert: Option<&str>) -> Result<Tls> {
    Err(Error::Config(
        "TLS requested (sslmode) but dbmutex was built without the `tls` feature; use sslmode=disable".into(),
    ))
}

/// libpq's `sslmode=prefer`/`require`: encrypt, but accept any certificate.
#[cfg(feature = "tls")]
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

#[cfg(feature = "tls")]
impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
