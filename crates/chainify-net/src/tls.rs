//! TLS between organizations and for clients (rustls, on ring).
//!
//! A network has one certificate authority; `chainify init` issues every organization a server
//! certificate for its hosts (names and IP addresses) and writes the CA certificate beside the
//! network file. Servers present their certificate; clients and peers trust only the CA. The
//! protocol's own signatures (votes, early-abort responses, proposals) authenticate messages;
//! TLS keeps them private and binds endpoints to organizations: a certificate names its
//! organization (`org3.chainify.internal`) and every connection checks that name, not the
//! endpoint's host, which several organizations' certificates may share.

use std::path::Path;

use tonic::transport::{Channel, Identity, ServerTlsConfig};

use crate::NetError;

/// The TLS material of a participant: the CA it trusts and, for servers, its identity.
#[derive(Clone, Debug)]
pub struct Tls {
    ca: Vec<u8>,
    identity: Option<Identity>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, NetError> {
    std::fs::read(path).map_err(|e| NetError::Tls(format!("{what} {}: {e}", path.display())))
}

impl Tls {
    /// Trusts the CA certificate in `ca` (PEM); a client.
    pub fn client(ca: &Path) -> Result<Tls, NetError> {
        Ok(Tls {
            ca: read(ca, "CA certificate")?,
            identity: None,
        })
    }

    /// Trusts the CA in `ca` and presents the certificate `cert` with key `key` (PEM); a server.
    pub fn server(ca: &Path, cert: &Path, key: &Path) -> Result<Tls, NetError> {
        Ok(Tls {
            ca: read(ca, "CA certificate")?,
            identity: Some(Identity::from_pem(
                read(cert, "certificate")?,
                read(key, "private key")?,
            )),
        })
    }

    /// From PEM text (tests, embedded use).
    pub fn from_pem(ca: &str, identity: Option<(&str, &str)>) -> Tls {
        Tls {
            ca: ca.as_bytes().to_vec(),
            identity: identity.map(|(c, k)| Identity::from_pem(c, k)),
        }
    }

    /// The server side, when this participant has an identity.
    pub fn server_config(&self) -> Option<ServerTlsConfig> {
        self.identity
            .clone()
            .map(|id| ServerTlsConfig::new().identity(id))
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca
    }
}

/// A lazily connecting channel to `endpoint` (`host:port`), over TLS when `tls` is given, to
/// the server certified as `tls_name` ([`chainify_core::OrgId::tls_name`] or
/// [`chainify_core::ORDERER_TLS_NAME`]). Calls fail (and the channel reconnects) while the
/// peer is down.
pub fn channel(endpoint: &str, tls: Option<&Tls>, tls_name: &str) -> Result<Channel, NetError> {
    chainify_client::channel(endpoint, tls.map(Tls::ca_pem), tls_name).map_err(|e| {
        NetError::Endpoint {
            endpoint: endpoint.to_owned(),
            problem: e.to_string(),
        }
    })
}

/// PEM certificate and private key.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// A network's CA, one server certificate per organization and one for the solo orderer.
#[derive(Clone, Debug)]
pub struct NetworkCerts {
    /// The CA (self-signed).
    pub ca: Issued,
    /// Organization `i + 1`'s, in the order of the hosts given.
    pub orgs: Vec<Issued>,
    /// The solo orderer's.
    pub orderer: Issued,
}

/// Issues a CA named after `network`; for each entry of `hosts` a certificate for
/// organization `i + 1`, valid for its own name ([`chainify_core::OrgId::tls_name`]) and for
/// those hosts (plus `localhost` and 127.0.0.1, for other tools); and one for the orderer
/// ([`chainify_core::ORDERER_TLS_NAME`]) on `orderer_hosts`. No certificate names another
/// organization, which is what binds an endpoint to its organization.
pub fn issue_network_certs(
    network: &str,
    hosts: &[Vec<String>],
    orderer_hosts: &[String],
) -> Result<NetworkCerts, NetError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| NetError::Tls(format!("issuing certificates: {e}"));
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("chainify network {network} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let ca = Issued {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
    };
    let issuer = Issuer::new(ca_params, ca_key);
    let issue = |name: String, what: String, names: &[String]| -> Result<Issued, NetError> {
        let mut sans: Vec<String> = vec![name, "localhost".into(), "127.0.0.1".into()];
        for n in names {
            if !sans.contains(n) {
                sans.push(n.clone());
            }
        }
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::new(sans).map_err(err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("chainify {network} {what}"));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer).map_err(err)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    };
    let mut orgs = Vec::new();
    for (i, names) in (1u32..).zip(hosts) {
        let org = chainify_core::OrgId(i);
        orgs.push(issue(org.tls_name(), org.to_string(), names)?);
    }
    let orderer = issue(
        chainify_core::ORDERER_TLS_NAME.into(),
        "orderer".into(),
        orderer_hosts,
    )?;
    Ok(NetworkCerts { ca, orgs, orderer })
}
