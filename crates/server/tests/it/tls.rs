//! The client port over TLS, as the official clients use it: served to a client that trusts
//! the server's CA, refused to one without a certificate when client certificates are required
//! or with one of another CA, a plain client on the TLS port fails at once while the server
//! goes on serving, and a replaced certificate reaches the next connection without a restart.

use crate::pki;

use std::path::Path;
use std::time::Duration;

use cairn::{EngineConfig, ServeConfig};
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::{PutRequest, RangeRequest};
use cairn_transport::TlsFiles;
use pki::Ca;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A server on `https://127.0.0.1:<port>` serving `files`; dropping the sender stops it.
async fn serve(tag: &str, dir: &Path, files: TlsFiles) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = probe.local_addr().expect("a bound port").port();
    drop(probe);
    let mut cfg = ServeConfig::new(
        EngineConfig::new(tag, dir.join("data")),
        vec![format!("https://127.0.0.1:{port}")],
    );
    cfg.client_tls = Some(files);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        cairn::serve(cfg, async move {
            let _ = stopped.await;
        })
        .await
        .expect("the server runs and stops cleanly");
    });
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (port, stop);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server did not start");
}

/// A KV client over TLS trusting `ca`, presenting `identity` (certificate and key files).
async fn client(
    port: u16,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<KvClient<Channel>, tonic::transport::Error> {
    let pem = std::fs::read(ca).expect("read the CA");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
    if let Some((cert, key)) = identity {
        let (cert, key) = (std::fs::read(cert).expect("cert"), std::fs::read(key).expect("key"));
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .expect("a URL")
        .tls_config(tls.domain_name("localhost"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(KvClient::new(channel))
}

/// Puts `key` and reads it back; any failure (a refused handshake included) is an error.
async fn round_trip(kv: Result<KvClient<Channel>, tonic::transport::Error>, key: &str) -> bool {
    let Ok(mut kv) = kv else { return false };
    let put = PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
    if kv.put(put).await.is_err() {
        return false;
    }
    let got = kv.range(RangeRequest { key: key.into(), ..Default::default() }).await;
    got.is_ok_and(|r| r.into_inner().kvs.len() == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_served_a_plain_client_fails_cleanly_and_a_new_certificate_is_picked_up() {
    let dir = pki::dir("server-tls");
    let (ca, next_ca) = (Ca::new(&dir, "ca"), Ca::new(&dir, "next"));
    let (cert_file, key_file) = ca.issue("server", "server");
    let files = TlsFiles {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        ..TlsFiles::default()
    };
    let (port, stop) = serve("tls", &dir, files).await;
    assert!(round_trip(client(port, &ca.ca_file(), None).await, "a").await);
    // A plain gRPC client: an error within its timeout, not a hang or a crash.
    let plain = async {
        let mut kv = KvClient::connect(format!("http://127.0.0.1:{port}")).await?;
        kv.range(RangeRequest { key: b"a".to_vec(), ..Default::default() }).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let plain = tokio::time::timeout(Duration::from_secs(10), plain).await;
    assert!(matches!(plain, Ok(Err(_))), "a plain client fails at once");
    assert!(round_trip(client(port, &ca.ca_file(), None).await, "b").await, "still serving");
    // Rotation: the files are replaced in place; the next connection gets the new pair.
    assert!(!round_trip(client(port, &next_ca.ca_file(), None).await, "c").await);
    let (new_cert, new_key) = next_ca.issue("server-next", "server");
    std::fs::copy(new_cert, &cert_file).expect("replace the certificate");
    std::fs::copy(new_key, &key_file).expect("replace the key");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(round_trip(client(port, &next_ca.ca_file(), None).await, "c").await, "reloaded");
    drop(stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate_of_the_trusted_ca() {
    let dir = pki::dir("server-mtls");
    let (ca, other) = (Ca::new(&dir, "ca"), Ca::new(&dir, "other"));
    let (port, stop) = serve("mtls", &dir, ca.files("server", "server", true)).await;
    let (cert, key) = ca.issue("alice", "alice");
    let (stray_cert, stray_key) = other.issue("mallory", "alice");
    let trusted = ca.ca_file();
    assert!(!round_trip(client(port, &trusted, None).await, "a").await, "no certificate");
    let stray = client(port, &trusted, Some((&stray_cert, &stray_key))).await;
    assert!(!round_trip(stray, "a").await, "another CA's certificate");
    let good = client(port, &trusted, Some((&cert, &key))).await;
    assert!(round_trip(good, "a").await, "a certificate of the trusted CA");
    drop(stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// `--client-cert-allowed-hostname`: of two certificates of the trusted CA, only the one valid
/// for an allowed name gets served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_must_be_valid_for_an_allowed_host_name() {
    let dir = pki::dir("server-allowed");
    let ca = Ca::new(&dir, "ca");
    let mut files = ca.files("server", "server", true);
    files.allowed_hostnames = vec!["client.example".into()];
    let (port, stop) = serve("allowed", &dir, files).await;
    let (cert, key) = ca.issue("alice", "alice");
    let (named_cert, named_key) = ca.issue_for("bob", "bob", &["client.example"]);
    let trusted = ca.ca_file();
    let other = client(port, &trusted, Some((&cert, &key))).await;
    assert!(!round_trip(other, "a").await, "a certificate for another name");
    let named = client(port, &trusted, Some((&named_cert, &named_key))).await;
    assert!(round_trip(named, "a").await, "a certificate for the allowed name");
    drop(stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(dir);
}
