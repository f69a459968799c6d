//! TLS on the gRPC port: the server's certificate and key (`--tls-cert`,
//! `--tls-key`) and, for mutual TLS, the CA that client certificates must be
//! signed by (`--tls-client-ca`). Files are read and their PEM checked at
//! start-up, so a wrong path or a broken file stops the server with an error
//! naming the flag and the file rather than at the first handshake.
//!
//! While the server runs, [`LiveTls`] follows the files: a certificate
//! renewed on disk (cert-manager, a mounted Secret, a cron job) is served
//! to new connections without a restart.
//!
//! This module only loads and checks; the handshakes are the servers'
//! (rustls: `server::handshake` for the gRPC port, the console's own).
//! It takes plain paths, from the server's settings or a client's flags.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::watched::Watched;

/// What is wrong with TLS settings or their files; names the flag and the
/// file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Settings given without the ones they need.
    #[error("{0}")]
    Incomplete(&'static str),
    #[error("{flag} {}: cannot read it: {source}", path.display())]
    Unreadable { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{flag} {}: {what}", path.display())]
    BadPem { flag: &'static str, path: PathBuf, what: String },
    #[error("--ca-cert and --client-cert need an https:// --server, not {0}")]
    PlaintextServer(String),
}

/// Where the server's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With it, every client must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Every file, in a fixed order.
    fn paths(&self) -> Vec<PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()].into_iter().flatten().cloned().collect()
    }

    /// The TLS settings given, or none for plaintext; a half-given set is an
    /// error naming what is missing.
    pub fn from_parts(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<TlsFiles>, TlsError> {
        let invalid = |m: &'static str| Err(TlsError::Incomplete(m));
        match (cert, key) {
            (None, None) if client_ca.is_some() => {
                invalid("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first")
            }
            (None, None) => Ok(None),
            (Some(_), None) => invalid("--tls-cert is given without --tls-key"),
            (None, Some(_)) => invalid("--tls-key is given without --tls-cert"),
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.to_owned(),
                key: key.to_owned(),
                client_ca: client_ca.map(Path::to_owned),
            })),
        }
    }

    /// Reads the files, checks that each holds what it should (and that
    /// the key goes with the certificate), and builds rustls's server
    /// settings: TLS 1.2 and 1.3, offering the protocols `alpn` names (in
    /// order of preference); with a client CA, a client must present a
    /// certificate it signed.
    pub fn rustls(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(&read_certificates("--tls-cert", &self.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad_pem("--tls-cert", &self.cert, &format!("broken PEM certificate ({e})")))?;
        let key = PrivateKeyDer::from_pem_slice(&read("--tls-key", &self.key)?)
            .map_err(|e| bad_pem("--tls-key", &self.key, &format!("no private key in PEM form ({e})")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| bad_pem("--tls-cert", &self.cert, &e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(&read_certificates("--tls-client-ca", ca)?) {
                    let cert = cert.map_err(|e| bad_pem("--tls-client-ca", ca, &e.to_string()))?;
                    roots.add(cert).map_err(|e| bad_pem("--tls-client-ca", ca, &e.to_string()))?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| bad_pem("--tls-client-ca", ca, &e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| bad_pem("--tls-key", &self.key, &format!("does not go with --tls-cert: {e}")))?;
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// A server's TLS settings that follow their files: when the contents of
/// the certificate, the key or the client CA change, they are read and
/// checked again, and new connections get the new settings (those made
/// before keep theirs). Files that do not make valid settings, such as a
/// certificate renewed before its key, leave the settings in use as they
/// are and are said once, until the next change.
#[derive(Clone)]
pub(crate) struct LiveTls {
    files: TlsFiles,
    alpn: &'static [&'static [u8]],
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
    /// The files as they were before they were first read, until
    /// [`LiveTls::follow`] takes them: a change while the server starts is
    /// not missed.
    loaded: Arc<Mutex<Option<Watched>>>,
}

impl LiveTls {
    /// Reads the files now (an error stops the start); ALPN offers `alpn`.
    pub(crate) fn load(files: TlsFiles, alpn: &'static [&'static [u8]]) -> Result<LiveTls, TlsError> {
        let loaded = Watched::new(files.paths());
        let config = files.rustls(alpn)?;
        Ok(LiveTls {
            files,
            alpn,
            current: Arc::new(RwLock::new(config)),
            loaded: Arc::new(Mutex::new(Some(loaded))),
        })
    }

    /// What the next handshake uses.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        tokio_rustls::TlsAcceptor::from(Arc::clone(&current))
    }

    /// Follows the files until `stop`.
    pub(crate) async fn follow(self, stop: tokio_util::sync::CancellationToken) {
        let files = &self.files;
        let loaded = self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        let mut watched = loaded.unwrap_or_else(|| Watched::new(files.paths()));
        let mut every = crate::watched::every();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            if !watched.changed() {
                continue;
            }
            match files.rustls(self.alpn) {
                Ok(config) => {
                    *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
                    tracing::info!(cert = %files.cert.display(), "the TLS files changed: new connections get them");
                }
                Err(e) => {
                    if matches!(e, TlsError::Unreadable { .. }) {
                        // Gone for a moment (being replaced): read them again.
                        watched.forget();
                    }
                    tracing::error!(
                        error = %e,
                        "the TLS files changed but do not make valid settings; connections go on with the ones before"
                    )
                }
            }
        }
    }
}

/// A client's TLS: none for an http:// `server`; for https://, the server
/// checked against `ca_cert` (or the system's roots), and `identity` (a
/// certificate and its key) presented when given.
pub(crate) fn client_config(
    server: &str,
    ca_cert: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<Option<ClientTlsConfig>, TlsError> {
    let https = server.starts_with("https://");
    if !https && (ca_cert.is_some() || identity.is_some()) {
        return Err(TlsError::PlaintextServer(server.to_owned()));
    }
    if !https {
        return Ok(None);
    }
    let mut tls = ClientTlsConfig::new();
    tls = match ca_cert {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read_certificates("--ca-cert", ca)?)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = identity {
        let cert = read_certificates("--client-cert", cert)?;
        let key_pem = read("--client-key", key)?;
        if let Err(e) = PrivateKeyDer::from_pem_slice(&key_pem) {
            return Err(bad_pem("--client-key", key, &format!("no private key in PEM form ({e})")));
        }
        tls = tls.identity(Identity::from_pem(cert, key_pem));
    }
    Ok(Some(tls))
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable { flag, path: path.to_owned(), source })
}

fn bad_pem(flag: &'static str, path: &Path, what: &str) -> TlsError {
    TlsError::BadPem { flag, path: path.to_owned(), what: what.to_owned() }
}

/// A file of one or more PEM certificates.
fn read_certificates(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(flag, path)?;
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        if let Err(e) = cert {
            return Err(bad_pem(flag, path, &format!("broken PEM certificate ({e})")));
        }
        found += 1;
    }
    if found == 0 {
        return Err(bad_pem(flag, path, "no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Option<&Path> {
        Some(Path::new(s))
    }

    #[test]
    fn cert_and_key_come_together() {
        assert_eq!(TlsFiles::from_parts(None, None, None).unwrap(), None);
        let err = TlsFiles::from_parts(p("c.pem"), None, None).unwrap_err().to_string();
        assert!(err.contains("--tls-cert is given without --tls-key"), "{err}");
        let err = TlsFiles::from_parts(None, p("k.pem"), None).unwrap_err().to_string();
        assert!(err.contains("--tls-key is given without --tls-cert"), "{err}");
        let err = TlsFiles::from_parts(None, None, p("ca.pem")).unwrap_err().to_string();
        assert!(err.contains("--tls-client-ca needs --tls-cert"), "{err}");
        let files = TlsFiles::from_parts(p("c.pem"), p("k.pem"), p("ca.pem")).unwrap().unwrap();
        assert_eq!(files.client_ca, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn unreadable_and_broken_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();

        let files = TlsFiles { cert: missing.clone(), key: garbage.clone(), client_ca: None };
        let err = files.rustls(&[]).unwrap_err().to_string();
        assert!(
            err.contains("--tls-cert") && err.contains("missing.pem") && err.contains("cannot read"),
            "{err}"
        );

        let files = TlsFiles { cert: garbage.clone(), key: garbage.clone(), client_ca: None };
        let err = files.rustls(&[]).unwrap_err().to_string();
        assert!(err.contains("--tls-cert") && err.contains("garbage.pem") && err.contains("no PEM"), "{err}");

        let signed = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, signed.cert.pem()).unwrap();
        let files = TlsFiles { cert: cert.clone(), key: garbage.clone(), client_ca: None };
        let err = files.rustls(&[]).unwrap_err().to_string();
        assert!(err.contains("--tls-key") && err.contains("garbage.pem"), "{err}");

        let key = dir.path().join("key.pem");
        std::fs::write(&key, signed.signing_key.serialize_pem()).unwrap();
        let files = TlsFiles { cert, key, client_ca: Some(garbage) };
        let err = files.rustls(&[]).unwrap_err().to_string();
        assert!(err.contains("--tls-client-ca") && err.contains("garbage.pem"), "{err}");
    }
}
