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

use chainify_core::TLS_DOMAIN;

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
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().map_err(rcgen_error)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("chainify network {network} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(rcgen_error)?;
    let ca = Issued {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
    };
    let issuer = Issuer::new(ca_params, ca_key);
    let mut orgs = Vec::new();
    for (i, names) in (1u32..).zip(hosts) {
        let org = chainify_core::OrgId(i);
        orgs.push(leaf(
            &issuer,
            &format!("chainify {network} {org}"),
            &org.tls_name(),
            names,
        )?);
    }
    let orderer = leaf(
        &issuer,
        &format!("chainify {network} orderer"),
        chainify_core::ORDERER_TLS_NAME,
        orderer_hosts,
    )?;
    Ok(NetworkCerts { ca, orgs, orderer })
}

/// Issues one server certificate from an existing CA (its certificate and key, PEM) for
/// `tls_name` ([`chainify_core::OrgId::tls_name`] or [`chainify_core::ORDERER_TLS_NAME`]) and
/// `hosts`: a network whose certificates predate organization names, a new host.
pub fn issue_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    tls_name: &str,
    hosts: &[String],
) -> Result<Issued, NetError> {
    let key = rcgen::KeyPair::from_pem(ca_key_pem)
        .map_err(|e| NetError::Tls(format!("the CA's private key: {e}")))?;
    let bad_cert = |e: &dyn std::fmt::Display| NetError::Tls(format!("the CA certificate: {e}"));
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(ca_cert_pem.as_bytes()).map_err(|e| bad_cert(&e))?;
    let cert = pem.parse_x509().map_err(|e| bad_cert(&e))?;
    // Certificates signed with another key would be refused only at the first connection.
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(NetError::Tls(
            "the CA's private key is not the key of the CA certificate".into(),
        ));
    }
    let issuer = rcgen::Issuer::from_ca_cert_der(&pem.contents.as_slice().into(), key)
        .map_err(|e| bad_cert(&e))?;
    leaf(&issuer, &format!("chainify {tls_name}"), tls_name, hosts)
}

fn rcgen_error(e: rcgen::Error) -> NetError {
    NetError::Tls(format!("issuing certificates: {e}"))
}

/// A server (and client) certificate for `tls_name`, `localhost`, 127.0.0.1 and `hosts`.
fn leaf(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    common_name: &str,
    tls_name: &str,
    hosts: &[String],
) -> Result<Issued, NetError> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
    let mut sans: Vec<String> = vec![tls_name.into(), "localhost".into(), "127.0.0.1".into()];
    for n in hosts {
        // A wildcard or another participant's name would let this certificate pass for it.
        // (A trailing dot names the same host to some clients.)
        let lower = n.to_ascii_lowercase();
        let lower = lower.strip_suffix('.').unwrap_or(&lower);
        if lower.contains('*') || lower == TLS_DOMAIN || lower.ends_with(&format!(".{TLS_DOMAIN}"))
        {
            return Err(NetError::Tls(format!(
                "host {n:?}: a certificate may not name a wildcard or a name under {TLS_DOMAIN}, which names the network's participants"
            )));
        }
        if !sans.contains(n) {
            sans.push(n.clone());
        }
    }
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let mut params = CertificateParams::new(sans).map_err(rcgen_error)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, issuer).map_err(rcgen_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::OrgId;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    /// A health service over TLS with `issued` on a loopback port; its address.
    async fn serve(ca: &Issued, issued: &Issued) -> String {
        let tls = Tls::from_pem(&ca.cert_pem, Some((&issued.cert_pem, &issued.key_pem)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (_, health) = tonic_health::server::health_reporter();
        let server = crate::server_builder(Some(&tls))
            .unwrap()
            .add_service(health)
            .serve_with_incoming(crate::incoming(listener));
        tokio::spawn(server);
        addr
    }

    async fn check(addr: &str, ca: &Issued, tls_name: &str) -> Result<(), tonic::Status> {
        let channel = channel(addr, Some(&Tls::from_pem(&ca.cert_pem, None)), tls_name).unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .map(|_| ())
    }

    #[tokio::test]
    async fn an_endpoint_answers_only_for_the_organization_its_certificate_names() {
        let certs = issue_network_certs("n", &[vec![], vec!["example.org".into()]], &[]).unwrap();
        let org2 = serve(&certs.ca, &certs.orgs[1]).await;
        check(&org2, &certs.ca, &OrgId(2).tls_name()).await.unwrap();
        // Organization 1's name at organization 2's endpoint: the handshake fails, naming both.
        let e = check(&org2, &certs.ca, &OrgId(1).tls_name())
            .await
            .unwrap_err();
        assert!(
            e.message()
                .contains("not valid for name \"org1.chainify.internal\"")
                && e.message().contains("org2.chainify.internal"),
            "{e}"
        );
        let e = check(&org2, &certs.ca, chainify_core::ORDERER_TLS_NAME)
            .await
            .unwrap_err();
        assert!(e.message().contains("orderer.chainify.internal"), "{e}");
        // The orderer's certificate names no organization.
        let orderer = serve(&certs.ca, &certs.orderer).await;
        check(&orderer, &certs.ca, chainify_core::ORDERER_TLS_NAME)
            .await
            .unwrap();
        assert!(
            check(&orderer, &certs.ca, &OrgId(1).tls_name())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_certificate_issued_later_from_the_network_ca_is_trusted_for_its_name() {
        let certs = issue_network_certs("n", &[vec![]], &[]).unwrap();
        let reissued = issue_cert(
            &certs.ca.cert_pem,
            &certs.ca.key_pem,
            &OrgId(3).tls_name(),
            &["org3.example.net".into()],
        )
        .unwrap();
        let org3 = serve(&certs.ca, &reissued).await;
        check(&org3, &certs.ca, &OrgId(3).tls_name()).await.unwrap();
        check(&org3, &certs.ca, "org3.example.net").await.unwrap();
        assert!(check(&org3, &certs.ca, &OrgId(1).tls_name()).await.is_err());
        // Another network's CA does not vouch for it.
        let other = issue_network_certs("m", &[vec![]], &[]).unwrap();
        let e = check(&org3, &other.ca, &OrgId(3).tls_name())
            .await
            .unwrap_err();
        assert!(e.message().contains("invalid peer certificate"), "{e}");
    }

    #[test]
    fn issuing_from_a_ca_that_cannot_be_read_names_what_is_wrong() {
        let certs = issue_network_certs("n", &[vec![]], &[]).unwrap();
        let name = OrgId(1).tls_name();
        let e = issue_cert(&certs.ca.cert_pem, "not a key", &name, &[]).unwrap_err();
        assert!(e.to_string().contains("the CA's private key"), "{e}");
        let e = issue_cert("not a certificate", &certs.ca.key_pem, &name, &[]).unwrap_err();
        assert!(e.to_string().contains("the CA certificate"), "{e}");
        let other = issue_network_certs("m", &[vec![]], &[]).unwrap();
        let e = issue_cert(&certs.ca.cert_pem, &other.ca.key_pem, &name, &[]).unwrap_err();
        assert!(
            e.to_string().contains("not the key of the CA certificate"),
            "{e}"
        );
        // A host that would make the certificate pass for another participant.
        for host in [
            "*.chainify.internal",
            "ORG2.chainify.internal",
            "org2.chainify.internal.",
            "orderer.chainify.internal",
            "chainify.internal",
            "*.example.net",
        ] {
            let e = issue_cert(&certs.ca.cert_pem, &certs.ca.key_pem, &name, &[host.into()])
                .unwrap_err();
            assert!(e.to_string().contains(&format!("host {host:?}")), "{e}");
            let e = issue_network_certs("n", &[vec![host.into()]], &[]).unwrap_err();
            assert!(e.to_string().contains("a certificate may not name"), "{e}");
        }
        issue_cert(
            &certs.ca.cert_pem,
            &certs.ca.key_pem,
            &name,
            &["org1.example.net".into()],
        )
        .unwrap();
    }
}
