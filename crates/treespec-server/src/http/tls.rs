//! HTTPS, as llama-server's `--ssl-cert-file` / `--ssl-key-file` give it: the certificate chain
//! and private key are read from PEM files once at the start, and every connection is a TLS
//! session (rustls, TLS 1.2 and 1.3, ALPN `http/1.1`) before hyper sees a byte.
//!
//! One thing works differently behind TLS: a client that left is noticed when a write to it
//! fails, not when its socket half-closes ([`super::serve::PeerClosed`] peeks at the raw socket,
//! where a departing TLS client's `close_notify` record sits unread ahead of the end-of-file).
//! Streamed answers write every step and non-streamed ones probe while they wait, so an
//! abandoned request still lets go of its lane; only the moment differs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Longest a client may take over its TLS handshake before the connection is dropped (a client
/// trickling a handshake must not hold a task; hyper's own header timeout starts after it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The PEM files of a server's certificate chain and private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, the server's own first (`--ssl-cert-file`).
    pub cert: PathBuf,
    /// Its private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) (`--ssl-key-file`).
    pub key: PathBuf,
}

impl TlsFiles {
    /// What accepts this server's TLS connections; an error names the file and what is wrong.
    pub fn acceptor(&self) -> Result<TlsAcceptor> {
        let certs = read_chain(&self.cert)?;
        let key =
            PrivateKeyDer::from_pem_file(&self.key).map_err(|e| pem_error(&self.key, "private key", e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .with_context(|| {
                format!(
                    "{} and {}: the private key does not fit the certificate, or is of a kind TLS cannot use",
                    self.key.display(),
                    self.cert.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Every certificate in `path`, in order; none is an error.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, "certificate", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, "certificate", e))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
            path.display()
        ));
    }
    Ok(certs)
}

fn pem_error(path: &Path, what: &str, e: rustls::pki_types::pem::Error) -> anyhow::Error {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => anyhow!("{}: cannot read the {what} file: {io}", path.display()),
        Error::NoItemsFound => anyhow!("{}: no PEM {what} in the file", path.display()),
        other => anyhow!("{}: not a PEM {what}: {other}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key in `dir`, and a second, unrelated key.
    fn pair(dir: &Path) -> (TlsFiles, PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let files = TlsFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") };
        std::fs::write(&files.cert, made.cert.pem()).unwrap();
        std::fs::write(&files.key, made.key_pair.serialize_pem()).unwrap();
        let other = dir.join("other-key.pem");
        std::fs::write(&other, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
        (files, other)
    }

    #[test]
    fn a_certificate_and_its_key_load() {
        let dir = tempfile::tempdir().unwrap();
        pair(dir.path()).0.acceptor().unwrap();
    }

    #[test]
    fn errors_name_the_file_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let (files, other) = pair(dir.path());
        let check = |cert: &Path, key: &Path, expect: &[&str]| {
            let e =
                TlsFiles { cert: cert.to_owned(), key: key.to_owned() }.acceptor().err().expect("refused");
            let e = format!("{e:#}");
            assert!(expect.iter().all(|x| e.contains(x)), "{expect:?} in {e}");
        };
        check(&dir.path().join("nope.pem"), &files.key, &["nope.pem", "cannot read the certificate"]);
        // The key given as the certificate, and the certificate as the key.
        check(&files.key, &files.key, &["key.pem", "no PEM certificate"]);
        check(&files.cert, &files.cert, &["cert.pem", "private key"]);
        check(&files.cert, &other, &["does not fit"]);
    }
}
