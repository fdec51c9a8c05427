//! TLS for `rediss://` (feature `tls`): a rustls client configuration with the ring provider,
//! trusting the system's root certificates or the CA the builder was given, with a client
//! certificate when one is given, as fred's connector.

use std::sync::Arc;

use fred::types::config::TlsConnector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{StoreError, StoreErrorKind};

/// What the builder was told about TLS.
#[derive(Default, Clone)]
pub(crate) struct TlsSettings {
    /// PEM certificates of the CAs to trust instead of the system's.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its private key, both PEM.
    pub(crate) client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Whether anything was set.
    pub(crate) fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.client_pem.is_some()
    }
}

fn config_error(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Config, message)
}

/// fred's connector for `settings`.
pub(crate) fn connector(settings: &TlsSettings) -> Result<TlsConnector, StoreError> {
    let mut roots = RootCertStore::empty();
    match &settings.ca_pem {
        Some(pem) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|e| config_error(format!("the TLS CA is not PEM certificates: {e}")))?;
            if certs.is_empty() {
                return Err(config_error("the TLS CA holds no PEM certificate".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| config_error(format!("the TLS CA certificate is not usable: {e}")))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                // A system certificate rustls cannot use is skipped, as browsers do.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(config_error(format!(
                    "no system root certificate could be loaded for TLS ({} errors); give the CA with tls_ca_file",
                    native.errors.len()
                )));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match &settings.client_pem {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(chain)
                    .collect::<Result<_, _>>()
                    .map_err(|e| config_error(format!("the TLS client certificate is not PEM: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| config_error(format!("the TLS client key is not a PEM private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error(format!("the TLS client certificate is not usable: {e}")))?
        }
    };
    Ok(TlsConnector::from(config))
}
