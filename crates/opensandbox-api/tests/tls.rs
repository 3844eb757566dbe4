//! An `https://` server whose certificate a private CA signed (a reverse proxy in front of the
//! OpenSandbox server): refused, once and for good, until the client is given the CA; then it
//! works. The CA and the certificate are made at test time; the HTTPS front forwards to an
//! httpmock server.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{KEY, SB, fast_retry};
use httpmock::prelude::*;
use opensandbox_api::{Client, ErrorKind};
use serde_json::json;

/// A throwaway CA (its PEM) and a TLS server setup whose certificate, for `localhost`, it
/// signed.
fn private_ca() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "opensandbox-api test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    (ca.pem(), Arc::new(server))
}

/// An HTTPS front with `tls` for the plain server at `upstream` (`host:port`): its port and
/// the count of connections it accepted.
async fn https_front(upstream: String, tls: Arc<rustls::ServerConfig>) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(inbound).await else {
                    return;
                };
                let Ok(mut out) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut out).await;
            });
        }
    });
    (port, accepted)
}

fn client(domain: &str, ca: Option<&str>) -> opensandbox_api::Result<Client> {
    let mut b = Client::builder()
        .domain(domain)
        .api_key(KEY)
        .timeout(Duration::from_secs(5))
        .retry(fast_retry());
    if let Some(pem) = ca {
        b = b.ca_certificates_pem(pem);
    }
    b.build()
}

async fn upstream() -> MockServer {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path(format!("/v1/sandboxes/{SB}"))
                .header("open-sandbox-api-key", KEY);
            then.status(200).json_body(json!({
                "id": SB,
                "image": {"uri": "python:3.12-slim"},
                "entrypoint": ["tail", "-f", "/dev/null"],
                "status": {"state": "Running"},
                "createdAt": "2026-01-01T00:00:00Z",
            }));
        })
        .await;
    server
}

#[tokio::test]
async fn a_private_ca_is_refused_once_until_given_then_works() {
    let server = upstream().await;
    let (ca_pem, tls) = private_ca();
    let (port, accepted) = https_front(server.address().to_string(), tls).await;
    let domain = format!("https://localhost:{port}");

    // Without the CA: a TLS failure, not retried (one connection), and not worth retrying.
    let err = client(&domain, None)
        .unwrap()
        .get_sandbox(SB)
        .await
        .unwrap_err();
    eprintln!("without the CA: {err}");
    assert!(err.is_tls_failure(), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("certificate"), "{err}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "tried exactly once");

    // With it: the same call works.
    let c = client(&domain, Some(&ca_pem)).unwrap();
    assert_eq!(c.get_sandbox(SB).await.unwrap().id, SB);

    // Another CA is no better than none, and the name is still checked.
    let (other_pem, _) = private_ca();
    let err = client(&domain, Some(&other_pem))
        .unwrap()
        .get_sandbox(SB)
        .await
        .unwrap_err();
    assert!(err.is_tls_failure(), "{err:?}");
    let err = client(&format!("https://127.0.0.1:{port}"), Some(&ca_pem))
        .unwrap()
        .get_sandbox(SB)
        .await
        .unwrap_err();
    assert!(err.is_tls_failure(), "{err:?}");
}

#[tokio::test]
async fn a_plain_server_on_an_https_url_is_a_tls_failure() {
    let server = upstream().await;
    let domain = format!("https://localhost:{}", server.address().port());
    let err = client(&domain, None)
        .unwrap()
        .get_sandbox(SB)
        .await
        .unwrap_err();
    assert!(err.is_tls_failure(), "{err:?}");
    assert!(!err.is_retryable());
}

#[test]
fn ca_text_without_a_certificate_is_a_config_error() {
    for bad in [
        "",
        "not a certificate",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    ] {
        let err = client("https://localhost:1", Some(bad)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad:?}: {err}");
    }
}
