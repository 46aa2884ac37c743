//! TLS: PEM loading, the rustls server config, and swapping it when the files change.
//! The only module that imports rustls.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::config::Tls;

/// TLS material that cannot be used; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificate {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("cannot read private key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("certificate {cert} and key {key} do not form a usable pair: {reason}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// Installs ring as the process's crypto provider; idempotent.
pub fn install_crypto_provider() {
    // Errs when a provider is already installed (tests call it repeatedly): that is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds a server config from PEM files: TLS 1.2 and 1.3, ALPN h2 then http/1.1.
pub fn load(files: &Tls) -> Result<ServerConfig, TlsError> {
    let certs = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::Key {
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_protocol_versions(&[
        &rustls::version::TLS13,
        &rustls::version::TLS12,
    ])
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| TlsError::Config {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: e.to_string(),
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::Cert {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no certificate in file".into()));
    }
    Ok(certs)
}

/// The current server config, replaced as a whole when the certificate changes. New
/// connections use the new one; established connections keep theirs.
pub struct TlsReloader {
    files: Tls,
    current: RwLock<Arc<ServerConfig>>,
    fingerprint: RwLock<Vec<u8>>,
}

impl TlsReloader {
    /// Loads the files once.
    pub fn new(files: Tls) -> Result<Self, TlsError> {
        let config = load(&files)?;
        let fingerprint = fingerprint(&files);
        Ok(Self {
            files,
            current: RwLock::new(Arc::new(config)),
            fingerprint: RwLock::new(fingerprint),
        })
    }

    /// Re-reads the files if their content changed. On failure the old config stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = fingerprint(&self.files);
        let same = *self
            .fingerprint
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            == now;
        if same {
            return Ok(false);
        }
        let config = load(&self.files)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
        *self
            .fingerprint
            .write()
            .unwrap_or_else(PoisonError::into_inner) = now;
        Ok(true)
    }

    /// Runs the handshake with the current config.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let config = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        tokio_rustls::TlsAcceptor::from(config).accept(stream).await
    }
}

/// Whether the client chose HTTP/2 by ALPN.
pub fn negotiated_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice())
}

/// The files' bytes: small, and comparing content (not mtime) survives the symlink swap
/// Kubernetes uses to rotate mounted secrets.
fn fingerprint(files: &Tls) -> Vec<u8> {
    let mut out = std::fs::read(&files.cert).unwrap_or_default();
    out.extend(std::fs::read(&files.key).unwrap_or_default());
    out
}
