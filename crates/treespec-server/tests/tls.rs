//! HTTPS (`--ssl-cert-file`, `--ssl-key-file`; issue #65): a toy server started with a
//! certificate answers a TLS client that trusts it — health and a streamed chat, every chunk
//! through the session — and a client speaking plain HTTP to the same port gets no answer, while
//! the server goes on serving. The certificate is made for the test (rcgen), so no key lives in
//! the tree.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use treespec_server::lifecycle::{Server, Start, Stops};
use treespec_server::{SchedulerConfig, ServerConfig, TlsFiles, ToyConfig};

/// A self-signed certificate for localhost and its key, written as PEM files under `dir`.
fn certificate(dir: &std::path::Path) -> (TlsFiles, CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let files = TlsFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") };
    std::fs::write(&files.cert, made.cert.pem()).unwrap();
    std::fs::write(&files.key, made.key_pair.serialize_pem()).unwrap();
    (files, made.cert.der().clone())
}

/// One HTTP/1.1 request over TLS to `addr`, trusting only `trusted`; the whole response.
async fn https(addr: SocketAddr, trusted: &CertificateDer<'static>, request: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // The server closes after answering (`Connection: close`); a peer that ends without TLS's
    // close_notify is still a complete answer here.
    let _ = tls.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_certificate_speaks_https_only() {
    let dir = tempfile::tempdir().unwrap();
    let (files, trusted) = certificate(dir.path());
    let start =
        Start { http: ServerConfig::default(), drain: Duration::ZERO, histories: None, tls: Some(files) };
    let server = Server::toy(start, ToyConfig::default(), SchedulerConfig::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stops) = Stops::channel();
    let run = tokio::spawn(server.run(listener, stops));

    let health =
        https(addr, &trusted, "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // Plain HTTP to the HTTPS port: not an HTTP answer (the handshake fails, the connection
    // closes), and the server is unharmed.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), plain.read_to_end(&mut answer)).await.unwrap();
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "plain HTTP was answered");

    let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
        "temperature": 0.0, "stream": true})
    .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let streamed = https(addr, &trusted, &request).await;
    assert!(streamed.starts_with("HTTP/1.1 200"), "{streamed}");
    assert!(streamed.contains("\"finish_reason\"") && streamed.contains("data: [DONE]"), "{streamed}");

    stop.stop();
    tokio::time::timeout(Duration::from_secs(10), run).await.expect("the server stopped").unwrap().unwrap();
}

/// A certificate file that is not one fails the start, naming the file.
#[test]
fn a_bad_certificate_fails_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = certificate(dir.path());
    let swapped = TlsFiles { cert: files.key.clone(), key: files.key };
    let start =
        Start { http: ServerConfig::default(), drain: Duration::ZERO, histories: None, tls: Some(swapped) };
    let e = Server::toy(start, ToyConfig::default(), SchedulerConfig::default()).err().expect("refused");
    let e = format!("{e:#}");
    assert!(e.contains("key.pem") && e.contains("certificate"), "{e}");
}
