//! Peer TLS over loopback sockets: members of one CA talk, a member of another CA or a plain
//! caller is refused while the rest go on, certificate files that cannot be used are refused
//! with etcd's words, and a replaced certificate is served without a restart.

#[path = "../pki/mod.rs"]
mod pki;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_raft::{LogIndex, Message, MessageBody, NodeId, Snapshot, Term};
use cairn_transport::tls::common_name;
use cairn_transport::{
    ClientTls, Listener, PeerAddr, PeerTraffic, ServerTls, TlsError, TlsFiles, Transport,
    TransportConfig,
};
use pki::Ca;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::common::*;

const A: NodeId = NodeId(0xa);
const B: NodeId = NodeId(0xb);

/// A member `local` serving TLS with `files` on `l`, dialing `peer` at `addr` over TLS.
fn member(
    local: NodeId,
    l: TcpListener,
    peer: NodeId,
    addr: SocketAddr,
    files: &TlsFiles,
) -> (Transport, Receiver<Event>) {
    let (t, rx, _) = member_traffic(local, l, peer, addr, files, false);
    (t, rx)
}

/// [`member`], probing its peer every 20 ms, with where it keeps the round trips; `skip_san`
/// accepts peer certificates from addresses they do not name.
fn member_traffic(
    local: NodeId,
    l: TcpListener,
    peer: NodeId,
    addr: SocketAddr,
    files: &TlsFiles,
    skip_san: bool,
) -> (Transport, Receiver<Event>, Arc<PeerTraffic>) {
    let mut cfg = TransportConfig::new(7, local);
    cfg.probe_interval = Duration::from_millis(20);
    cfg.skip_client_san_verification = skip_san;
    let traffic = cfg.traffic.clone();
    let server = ServerTls::new(files.clone(), &[]).expect("server TLS");
    cfg.listeners.push(Listener { socket: l, tls: Some(Arc::new(server)) });
    let client = Arc::new(ClientTls::new(files.clone()).expect("client TLS"));
    let name = ServerName::try_from("localhost").expect("a name").to_owned();
    cfg.peers =
        BTreeMap::from([(peer, vec![PeerAddr { addr, host: None, tls: Some((name, client)) }])]);
    let (t, rx) = start_with(cfg);
    (t, rx, traffic)
}

/// No message arrives within `wait`.
fn no_message(rx: &Receiver<Event>, wait: Duration) {
    let deadline = std::time::Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(Event::Message(m)) => panic!("a refused peer got {m:?} through"),
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

#[test]
fn members_of_one_ca_exchange_messages_and_snapshots_over_mutual_tls() {
    let dir = pki::dir("peers-ok");
    let ca = Ca::new(&dir, "peer");
    let (fa, fb) = (ca.files("a", "a", true), ca.files("b", "b", true));
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra, traffic) = member_traffic(A, la, B, ab, &fa, false);
    let (tb, rb) = member(B, lb, A, aa, &fb);
    ta.send([heartbeat(A, B, 1)]);
    tb.send([heartbeat(B, A, 2)]);
    assert_eq!(next_message(&rb), heartbeat(A, B, 1));
    assert_eq!(next_message(&ra), heartbeat(B, A, 2));
    let mut snapshot = Snapshot::default();
    snapshot.meta.index = LogIndex(42);
    snapshot.data = Bytes::from(vec![7u8; 1 << 20]);
    let msg = Message { from: A, to: B, term: Term(2), body: MessageBody::Snapshot { snapshot } };
    ta.send([msg.clone()]);
    assert_eq!(next_message(&rb), msg);
    loop {
        match next(&ra) {
            Event::SnapshotSent(to, ok) => break assert_eq!((to, ok), (B, true)),
            Event::Unreachable(_) => {}
            e => panic!("unexpected {e:?}"),
        }
    }
    // Round-trip probes go through TLS too.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while traffic.round_trips().iter().all(|(id, h)| *id != B || h.count == 0) {
        assert!(std::time::Instant::now() < deadline, "no probe round trip over TLS");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// etcd's check of a peer's client certificate: one that names only 10.1.2.3 is refused from
/// 127.0.0.1, though the CA signed it, unless the member skips the check.
#[test]
fn a_peer_certificate_is_accepted_only_from_an_address_it_names() {
    let dir = pki::dir("peers-san");
    let ca = Ca::new(&dir, "peer");
    let fa = ca.files("a", "a", true);
    let (cert_file, key_file) = ca.issue_for("b", "b", &["10.1.2.3"]);
    let fb = TlsFiles {
        cert_file,
        key_file,
        trusted_ca_file: Some(ca.ca_file()),
        client_cert_auth: true,
        ..TlsFiles::default()
    };
    for skip in [false, true] {
        let ((la, aa), (lb, ab)) = (listener(), listener());
        let (_ta, ra, _) = member_traffic(A, la, B, ab, &fa, skip);
        let (tb, _rb) = member(B, lb, A, aa, &fb);
        if !skip {
            tb.send([heartbeat(B, A, 1)]);
            no_message(&ra, Duration::from_millis(1500));
            continue;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            tb.send([heartbeat(B, A, 1)]);
            match ra.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Message(m)) => break assert_eq!(m, heartbeat(B, A, 1)),
                _ => assert!(std::time::Instant::now() < deadline, "skipping the check lets B in"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--peer-crl-file`: a member whose certificate the list revokes is refused; another of the
/// same CA gets through.
#[test]
fn a_revoked_peer_certificate_is_refused() {
    let dir = pki::dir("peers-crl");
    let ca = Ca::new(&dir, "peer");
    let mut fa = ca.files("a", "a", true);
    fa.crl_file = Some(ca.crl("revoked", &[0x1bad]));
    let trusted = |(cert_file, key_file): (std::path::PathBuf, std::path::PathBuf)| TlsFiles {
        cert_file,
        key_file,
        trusted_ca_file: Some(ca.ca_file()),
        client_cert_auth: true,
        ..TlsFiles::default()
    };
    let revoked = trusted(ca.issue_serial("b", "b", 0x1bad));
    let good = trusted(ca.issue_serial("c", "c", 0x600d));
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = member(A, la, B, ab, &fa);
    let (tb, _rb) = member(B, lb, A, aa, &revoked);
    tb.send([heartbeat(B, A, 1)]);
    no_message(&ra, Duration::from_millis(1500));
    drop(tb);
    let (lc, _) = listener();
    let (tc, _rc) = member(B, lc, A, aa, &good);
    tc.send([heartbeat(B, A, 2)]);
    assert_eq!(next_message(&ra), heartbeat(B, A, 2));
    drop(ta);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--peer-cert-allowed-cn`, checked both ways as etcd checks it: A allows the Common Names
/// "a" and "c"; B (CN "b") can neither call A nor be called by it, C (CN "c") can both.
/// `--peer-cert-allowed-hostname`: a member allowing only "localhost" refuses a certificate
/// valid for 10.1.2.3 alone (the address check skipped, so this check is the one at work).
#[test]
fn allowed_common_names_and_host_names_are_checked() {
    let dir = pki::dir("peers-allowed");
    let ca = Ca::new(&dir, "peer");
    let mut fa = ca.files("a", "a", true);
    fa.allowed_cns = vec!["a".into(), "c".into()];
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = member(A, la, B, ab, &fa);
    let (tb, rb) = member(B, lb, A, aa, &ca.files("b", "b", true));
    tb.send([heartbeat(B, A, 1)]);
    ta.send([heartbeat(A, B, 2)]);
    no_message(&ra, Duration::from_millis(1500));
    no_message(&rb, Duration::from_millis(100));
    drop((ta, tb, ra, rb));
    let ((la, aa), (lc, ac)) = (listener(), listener());
    let (ta, ra) = member(A, la, B, ac, &fa);
    let (tc, rc) = member(B, lc, A, aa, &ca.files("c", "c", true));
    tc.send([heartbeat(B, A, 3)]);
    assert_eq!(next_message(&ra), heartbeat(B, A, 3));
    ta.send([heartbeat(A, B, 4)]);
    assert_eq!(next_message(&rc), heartbeat(A, B, 4));
    drop((ta, tc));
    let mut fa = ca.files("a2", "a", true);
    fa.allowed_hostnames = vec!["localhost".into()];
    let (cert_file, key_file) = ca.issue_for("d", "d", &["10.1.2.3"]);
    let fd = TlsFiles { cert_file, key_file, ..fa.clone() };
    let fd = TlsFiles { allowed_hostnames: vec![], ..fd };
    let ((la, aa), (ld, ad)) = (listener(), listener());
    let (_ta, ra, _) = member_traffic(A, la, B, ad, &fa, true);
    let (td, _rd) = member(B, ld, A, aa, &fd);
    td.send([heartbeat(B, A, 5)]);
    no_message(&ra, Duration::from_millis(1500));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--tls-max-version` and `--cipher-suites`: a listener held to TLS 1.2 and one suite
/// negotiates exactly that; one that requires TLS 1.3 refuses a dialer held to TLS 1.2.
#[tokio::test]
async fn versions_and_cipher_suites_are_as_configured() {
    let dir = pki::dir("policy");
    let ca = Ca::new(&dir, "policy");
    let policy = |suites: &[&str], min: &str, max: &str| {
        let suites: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
        cairn_transport::TlsPolicy::parse(&suites, min, max).expect("a policy")
    };
    let suite = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";
    let mut server = ca.files("server", "server", false);
    server.policy = policy(&[suite], "TLS1.2", "TLS1.2");
    let tls = ServerTls::new(server, &[]).expect("server TLS");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (conn, _) = listener.accept().await.expect("accept");
        let mut conn = tls.acceptor().accept(conn).await.expect("a handshake");
        // The byte each way `handshake` exchanges.
        let mut b = [0u8; 1];
        conn.read_exact(&mut b).await.expect("a byte");
        conn.write_all(b"y").await.expect("a byte back");
        conn.flush().await.expect("flushed");
        let state = conn.get_ref().1;
        (state.protocol_version(), state.negotiated_cipher_suite().map(|s| s.suite()))
    });
    let client = ClientTls::new(ca.files("client", "client", false)).expect("client TLS");
    handshake(addr, &client).await.expect("a handshake");
    let (version, negotiated) = acceptor.await.expect("the acceptor");
    assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(negotiated.map(|s| format!("{s:?}")), Some(suite.to_string()));
    let mut only13 = ca.files("server13", "server", false);
    only13.policy = policy(&[], "TLS1.3", "");
    let tls = Arc::new(ServerTls::new(only13, &[]).expect("server TLS"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (conn, _) = listener.accept().await.expect("accept");
        let _ = tls.acceptor().accept(conn).await;
    });
    let mut old = ca.files("client12", "client", false);
    old.policy = policy(&[], "", "TLS1.2");
    let old = ClientTls::new(old).expect("client TLS");
    assert!(handshake(addr, &old).await.is_err(), "a TLS 1.2 dialer met a TLS 1.3 listener");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_member_of_another_ca_and_a_plain_caller_are_refused_while_members_get_through() {
    let dir = pki::dir("peers-refused");
    let (ca, other) = (Ca::new(&dir, "peer"), Ca::new(&dir, "other"));
    let fa = ca.files("a", "a", true);
    // B trusts A's CA, but its own certificate is the other CA's: A refuses it as a client
    // certificate, and A, dialing B, refuses it as a server certificate.
    let mut fb = other.files("b", "b", true);
    fb.trusted_ca_file = Some(ca.ca_file());
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = member(A, la, B, ab, &fa);
    let (tb, rb) = member(B, lb, A, aa, &fb);
    tb.send([heartbeat(B, A, 1)]);
    ta.send([heartbeat(A, B, 2)]);
    no_message(&ra, Duration::from_millis(1500));
    no_message(&rb, Duration::from_millis(100));
    // A plain caller on A's TLS port is dropped without harm (what it sends is not a TLS
    // record), and A still serves members of its CA.
    let mut plain = std::net::TcpStream::connect(aa).expect("connect");
    plain.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    plain.write_all(b"CAIRN hello in the clear, not a TLS record").expect("write");
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest);
    assert!(!rest.starts_with(b"CAIRN"), "A answered in the clear");
    drop((tb, rb));
    let (lc, _) = listener();
    let fc = ca.files("c", "c", true);
    let (tc, _rc) = member(B, lc, A, aa, &fc);
    tc.send([heartbeat(B, A, 3)]);
    assert_eq!(next_message(&ra), heartbeat(B, A, 3));
    drop(ta);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unusable_certificate_files_are_refused_in_etcds_words() {
    let dir = pki::dir("files");
    let ca = Ca::new(&dir, "ca");
    let good = ca.files("server", "server", false);
    let missing = TlsFiles { cert_file: dir.join("nope.pem"), ..good.clone() };
    let e = ServerTls::new(missing, &[]).expect_err("a missing file");
    assert!(matches!(e, TlsError::Read { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("open {}: ", dir.join("nope.pem").display())));
    let (_, other_key) = ca.issue("other", "other");
    let mismatched = TlsFiles { key_file: other_key, ..good.clone() };
    let e = ServerTls::new(mismatched.clone(), &[]).expect_err("another certificate's key");
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e:?}");
    assert!(e.to_string().starts_with("tls: private key does not match public key"), "{e}");
    let e = ClientTls::new(mismatched).expect_err("the same for a dialing side");
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e:?}");
    std::fs::write(dir.join("empty.pem"), "not PEM\n").expect("write");
    let no_pem = TlsFiles { cert_file: dir.join("empty.pem"), ..good.clone() };
    let e = ServerTls::new(no_pem, &[]).expect_err("no certificate in the file");
    assert!(e.to_string().starts_with("tls: failed to find any PEM data in certificate input"));
    let no_ca = TlsFiles { trusted_ca_file: Some(dir.join("empty.pem")), ..good.clone() };
    assert!(matches!(ServerTls::new(no_ca, &[]), Err(TlsError::NoPem { .. })));
    assert!(ServerTls::new(good.clone(), &[b"h2"]).is_ok());
    let pem = std::fs::read(&good.cert_file).expect("read");
    let der = CertificateDer::from_pem_slice(&pem).expect("a certificate");
    assert_eq!(common_name(&der).as_deref(), Some("server"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Handshakes with a server on `addr` as a client that trusts only `ca_file`.
async fn handshake(addr: SocketAddr, client: &ClientTls) -> std::io::Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("a name").to_owned();
    let mut tls = client.connector().connect(name, tcp).await?;
    // TLS 1.3 finishes the client's side before the server has looked at everything; a byte
    // each way proves the server took the handshake.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(b"x").await?;
    tls.flush().await?;
    let mut b = [0u8; 1];
    tls.read_exact(&mut b).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_replaced_certificate_is_served_to_new_connections_and_a_broken_one_is_not() {
    let dir = pki::dir("reload");
    let (old_ca, new_ca) = (Ca::new(&dir, "old"), Ca::new(&dir, "new"));
    let (cert_file, key_file) = old_ca.issue("server", "server");
    let files = TlsFiles { cert_file, key_file, ..TlsFiles::default() };
    let server = Arc::new(ServerTls::new(files.clone(), &[]).expect("server TLS"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let srv = server.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = srv.acceptor();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut b = [0u8; 1];
                if tls.read_exact(&mut b).await.is_ok() {
                    let _ = tls.write_all(&b).await;
                    let _ = tls.flush().await;
                }
            });
        }
    });
    let client = ClientTls::new(new_ca.files("client", "client", false)).expect("client TLS");
    assert!(handshake(addr, &client).await.is_err(), "the old CA's certificate is not trusted");
    // Replace the pair as an operator would: write both files, then wait for the next look.
    let (new_cert, new_key) = new_ca.issue("server-new", "server");
    std::fs::copy(&new_cert, &files.cert_file).expect("replace the certificate");
    std::fs::copy(&new_key, &files.key_file).expect("replace the key");
    tokio::time::sleep(cairn_transport::tls::RELOAD_CHECK + Duration::from_millis(200)).await;
    handshake(addr, &client).await.expect("the new certificate is served");
    // A broken pair (a key that is not the certificate's) keeps the working one.
    let (_, stray_key) = old_ca.issue("stray", "stray");
    std::fs::copy(&stray_key, &files.key_file).expect("break the key");
    tokio::time::sleep(cairn_transport::tls::RELOAD_CHECK + Duration::from_millis(200)).await;
    handshake(addr, &client).await.expect("the previous certificate is still served");
    let _ = std::fs::remove_dir_all(dir);
}
