//! The gateway enforced for real: guests of the enforcing fake (their egress is the gateway's
//! `IP:port` only) reach an allowed name through it with curl, Python's `urllib` and pip, and
//! nothing else; raw clients check the refusals, the TLS name check and the limits. See
//! `common/mod.rs` for the network. Without root, `ip` or `nft` every test passes after saying
//! why it did not run.

mod common;

use std::time::{Duration, SystemTime};

use common::{
    Gateway, Guests, Net, basic, body_text, connect, exchange, get, name, python_has_pip, read_all,
    token,
};
use egress_gateway::REASON_HEADER;
use tokio::io::AsyncWriteExt as _;

/// Fetches each URL with `urllib` (the proxy comes from the environment) and prints
/// `URL OK body` or `URL ERR error` per line.
const URLLIB: &str = r#"
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=20) as r:
            print(url, "OK", r.read().decode())
    except Exception as e:
        print(url, "ERR", e)
"#;

/// curl in guest `id`, trusting the test CA: `(exit code, stdout, stderr)`.
async fn curl(guests: &Guests, id: &str, args: &[&str]) -> (i64, String, String) {
    let mut all = vec!["-sS", "--max-time", "20", "--cacert", "/workspace/ca.pem"];
    all.extend_from_slice(args);
    guests.exec(id, "curl", &all).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_reaches_allowed_names_through_the_gateway_and_nothing_else() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let guests = Guests::start(&net).await;
    let tok = token("run-1", &["pkg.test"]);
    let proxy = format!("http://run:{tok}@{}", gw.addr);
    // The guest's egress is exactly the gateway's IP:port; the proxy settings carry the token
    // (curl reads only the lowercase `http_proxy`, so both spellings are set).
    let guest = guests
        .create(
            &net,
            &[gw.addr.to_string()],
            &[
                ("HTTPS_PROXY", &proxy),
                ("HTTP_PROXY", &proxy),
                ("https_proxy", &proxy),
                ("http_proxy", &proxy),
            ],
        )
        .await;
    // A guest with no egress rules at all: shows the servers are reachable when allowed.
    let open = guests.create(&net, &[], &[]).await;

    // curl: the allowed name over HTTPS and plain HTTP, through the gateway.
    let (rc, out, err) = curl(&guests, &guest, &["https://pkg.test/hello"]).await;
    assert_eq!(
        (rc, out.as_str()),
        (0, "hello from pkg.test over https"),
        "{err}"
    );
    let (rc, out, err) = curl(&guests, &guest, &["http://pkg.test/headers"]).await;
    assert_eq!(rc, 0, "{err}");
    // Forwarded plain HTTP carries neither the token nor proxy-only headers upstream.
    assert_eq!(
        out,
        "host: pkg.test\nproxy-authorization: absent\nproxy-connection: absent\n"
    );
    // An unlisted name is refused by the gateway, with its reason.
    let (rc, _, err) = curl(&guests, &guest, &["https://api.test/hello"]).await;
    assert_ne!(rc, 0);
    assert!(err.contains("403"), "{err}");

    // Python's urllib, the same way.
    let (rc, out, err) = guests
        .exec(
            &guest,
            "python3",
            &[
                "-c",
                URLLIB,
                "https://pkg.test/hello",
                "https://api.test/hello",
            ],
        )
        .await;
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("https://pkg.test/hello OK hello from pkg.test over https"),
        "{out}"
    );
    assert!(
        out.contains("https://api.test/hello ERR <urlopen error Tunnel connection failed: 403 Forbidden (egress gateway: host not in this run's allowlist)>"),
        "{out}"
    );

    // A program that ignores the proxy settings reaches nothing: the firewall drops it. The
    // same command from the guest without rules gets through, so the drop is the firewall's.
    let direct = [
        "--noproxy",
        "*",
        "--connect-timeout",
        "2",
        "--resolve",
        "pkg.test:443:11.0.0.1",
        "https://pkg.test/hello",
    ];
    let (rc, _, err) = curl(&guests, &guest, &direct).await;
    assert_eq!(rc, 28, "expected a connect timeout (dropped), got: {err}");
    let (rc, out, err) = curl(&guests, &open, &direct).await;
    assert_eq!(
        (rc, out.as_str()),
        (0, "hello from pkg.test over https"),
        "{err}"
    );

    // pip installs from an index the allowlist names, and fails closed on one it does not.
    if python_has_pip() {
        let pip = |index: &'static str| {
            [
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--no-cache-dir",
                "--retries",
                "0",
                "--timeout",
                "20",
                "--index-url",
                index,
                "--cert",
                "/workspace/ca.pem",
                "-d",
                "/workspace/dl",
                "tinypkg",
            ]
        };
        let (rc, out, err) = guests
            .exec(&guest, "python3", &pip("https://pkg.test/simple/"))
            .await;
        assert_eq!(rc, 0, "pip download failed:\n{out}\n{err}");
        let (_, listing, _) = guests.exec(&guest, "ls", &["/workspace/dl"]).await;
        assert_eq!(listing.trim(), "tinypkg-0.1-py3-none-any.whl");
        let refused = |gw: &Gateway| {
            gw.records()
                .iter()
                .filter(|r| r.contains(" host=api.test ") && r.contains(" reason=host_not_allowed"))
                .count()
        };
        let before = refused(&gw);
        let (rc, out, err) = guests
            .exec(&guest, "python3", &pip("https://api.test/simple/"))
            .await;
        assert_ne!(rc, 0, "pip reached an unlisted index:\n{out}\n{err}");
        assert!(
            refused(&gw) > before,
            "pip's attempt was not refused by the gateway"
        );
    } else {
        eprintln!("pip part skipped: `python3 -m pip` is not available on this machine");
    }

    // One record per connection, with the run, host, bytes and verdict, never the token.
    let ok = gw
        .wait_record(&[
            "guest=run-1",
            "kind=connect",
            "host=pkg.test",
            "port=443",
            "verdict=allowed",
        ])
        .await;
    assert!(
        ok.contains("upstream=11.0.0.1:443") && ok.contains("duration_ms="),
        "{ok}"
    );
    let down: u64 = ok
        .split(' ')
        .find_map(|w| w.strip_prefix("bytes_down="))
        .and_then(|n| n.parse().ok())
        .expect("bytes_down");
    assert!(down > 0, "{ok}");
    gw.wait_record(&[
        "guest=run-1",
        "kind=http",
        "host=pkg.test",
        "port=80",
        "verdict=allowed",
    ])
    .await;
    gw.wait_record(&[
        "guest=run-1",
        "host=api.test",
        "verdict=refused",
        "reason=host_not_allowed",
    ])
    .await;
    assert!(!gw.log().contains(&tok), "the token reached the log");
}

#[tokio::test(flavor = "multi_thread")]
async fn names_that_resolve_to_internal_addresses_are_refused() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let auth = basic(&token(
        "run-2",
        &[
            "pkg.test",
            "loop.test",
            "private.test",
            "metadata.test",
            "mixed.test",
        ],
    ));
    // The internal addresses answer from where the gateway runs: only the gateway's check
    // stands between a guest and them.
    let reachable = net.gw.enter(|| {
        std::net::TcpStream::connect_timeout(
            &"10.99.0.1:443".parse().expect("addr"),
            Duration::from_secs(5),
        )
    });
    assert!(
        reachable.is_ok(),
        "the test network is broken: {reachable:?}"
    );

    for (host, why) in [
        ("loop.test", "loopback"),
        ("private.test", "private"),
        ("metadata.test", "link-local"),
    ] {
        let (head, mut stream) = connect(&net, &gw, &format!("{host}:443"), Some(&auth)).await;
        assert_eq!(head.status, 403, "{host}: {head:?}");
        assert_eq!(head.headers[REASON_HEADER], "forbidden_address", "{host}");
        let mut body = head.rest.clone();
        body.extend(read_all(&mut stream).await);
        assert!(
            String::from_utf8_lossy(&body).contains(why),
            "{host}: {body:?}"
        );
    }
    // Plain HTTP to the metadata service by name: refused the same way.
    let mut stream = net.connect_from_hub(gw.addr);
    let head = exchange(
        &mut stream,
        &format!("GET http://metadata.test/latest/meta-data HTTP/1.1\r\nHost: metadata.test\r\nProxy-Authorization: {auth}\r\n\r\n"),
    )
    .await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (403, "forbidden_address")
    );
    // A name with one internal and one public address: only the public one is used.
    let (head, stream) = connect(&net, &gw, "mixed.test:443", Some(&auth)).await;
    assert_eq!(head.status, 200, "{head:?}");
    drop(stream);
    gw.wait_record(&["host=mixed.test", "upstream=11.0.0.1:443"])
        .await;
    // Addresses instead of names are refused: the allowlist names hosts.
    let (head, _) = connect(&net, &gw, "11.0.0.1:443", Some(&auth)).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (403, "ip_literal")
    );
    gw.wait_record(&[
        "guest=run-2",
        "host=metadata.test",
        "verdict=refused",
        "reason=forbidden_address",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_expired_altered_or_foreign_credentials_are_refused() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let good = token("run-3", &["pkg.test"]);
    let secret = egress_gateway::Secret::new(common::SECRET.to_vec()).expect("secret");
    let expired = egress_gateway::mint_until(
        &secret,
        "run-3",
        &["pkg.test"],
        SystemTime::now() - Duration::from_secs(1),
    )
    .expect("mint");
    let mut altered = good.clone().into_bytes();
    altered[10] = if altered[10] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).expect("ascii");
    let other = egress_gateway::Secret::new(vec![b'z'; 32]).expect("secret");
    let foreign = egress_gateway::mint(&other, "run-3", &["pkg.test"], Duration::from_secs(60))
        .expect("mint");

    let (head, _) = connect(&net, &gw, "pkg.test:443", None).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (407, "no_credentials")
    );
    assert_eq!(
        head.headers.get("proxy-authenticate").map(String::as_str),
        Some("Basic realm=\"createos-egress-gateway\"")
    );
    for (tok, reason) in [
        (&expired, "token_expired"),
        (&altered, "bad_credentials"),
        (&foreign, "bad_credentials"),
    ] {
        let (head, _) = connect(&net, &gw, "pkg.test:443", Some(&basic(tok))).await;
        assert_eq!(
            (head.status, head.headers[REASON_HEADER].as_str()),
            (407, reason)
        );
    }
    let (head, _) = connect(&net, &gw, "pkg.test:443", Some("Bearer nonsense")).await;
    assert_eq!(head.status, 407);
    // A valid token does not widen: another host, or a port its entry does not name.
    let (head, _) = connect(&net, &gw, "api.test:443", Some(&basic(&good))).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (403, "host_not_allowed")
    );
    let (head, _) = connect(&net, &gw, "pkg.test:8443", Some(&basic(&good))).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (403, "port_not_allowed")
    );
    let (head, _) = connect(&net, &gw, "pkg.test:443", Some(&basic(&good))).await;
    assert_eq!(head.status, 200, "{head:?}");
    // A tunnel does not outlive its token: it is closed when the token expires.
    let short = egress_gateway::mint_until(
        &secret,
        "run-3-short",
        &["pkg.test"],
        SystemTime::now() + Duration::from_secs(2),
    )
    .expect("mint");
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&basic(&short))).await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut tunnel = net
        .tls()
        .connect(name("pkg.test"), stream)
        .await
        .expect("TLS");
    assert!(read_all(&mut tunnel).await.is_empty());
    gw.wait_record(&[
        "guest=run-3-short",
        "verdict=allowed",
        "reason=token_expired",
    ])
    .await;
    // An oversized request head is refused before anything else.
    let mut stream = net.connect_from_hub(gw.addr);
    let huge = format!(
        "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let _ = stream.write_all(huge.as_bytes()).await;
    let answer = String::from_utf8_lossy(&read_all(&mut stream).await).into_owned();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    gw.wait_record(&["guest=run-3", "reason=host_not_allowed"])
        .await;
    gw.wait_record(&["reason=token_expired"]).await;
    let log = gw.log();
    for tok in [&good, &expired, &altered, &foreign] {
        assert!(!log.contains(tok.as_str()), "a token reached the log");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tls_server_name_must_be_the_connect_host() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(&net, &[]);
    let auth = basic(&token("run-4", &["pkg.test", "api.test"]));
    let tls = net.tls();

    // The right name: TLS to the server, end to end, never decrypted on the way.
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&auth)).await;
    assert_eq!(head.status, 200);
    let mut tunnel = tls.connect(name("pkg.test"), stream).await.expect("TLS");
    let raw = get(&mut tunnel, "pkg.test", "/hello").await;
    assert_eq!(body_text(&raw), "hello from pkg.test over https");

    // CONNECT to one allowed host, TLS for another the certificate also covers: refused.
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&auth)).await;
    assert_eq!(head.status, 200);
    let err = tls
        .connect(name("api.test"), stream)
        .await
        .expect_err("a mismatched server name got through");
    assert!(err.to_string().contains("AccessDenied"), "{err}");
    gw.wait_record(&[
        "guest=run-4",
        "host=pkg.test",
        "verdict=refused",
        "reason=sni_mismatch",
    ])
    .await;

    // No server name at all: refused.
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&auth)).await;
    assert_eq!(head.status, 200);
    let ip_name = tokio_rustls::rustls::pki_types::ServerName::IpAddress(
        std::net::Ipv4Addr::new(11, 0, 0, 1).into(),
    );
    assert!(tls.connect(ip_name, stream).await.is_err());
    gw.wait_record(&["guest=run-4", "reason=no_sni"]).await;

    // Something that is not TLS: closed without a byte reaching the server.
    let (head, mut stream) = connect(&net, &gw, "pkg.test:443", Some(&auth)).await;
    assert_eq!(head.status, 200);
    let answer = get(&mut stream, "pkg.test", "/hello").await;
    assert!(answer.is_empty(), "{answer:?}");
    let record = gw.wait_record(&["guest=run-4", "reason=not_tls"]).await;
    assert!(record.contains("bytes_up=0 "), "{record}");
}

#[tokio::test(flavor = "multi_thread")]
async fn per_credential_connection_byte_and_idle_limits_hold() {
    let Some(net) = Net::setup() else { return };
    let gw = Gateway::start(
        &net,
        &[
            "--max-connections-per-credential",
            "2",
            "--max-bytes-per-credential",
            "256K",
            "--idle-timeout",
            "1",
        ],
    );
    let tls = net.tls();

    // Connections: two at once, the third refused; another credential is not affected.
    let a = basic(&token("run-5a", &["pkg.test"]));
    let (h1, s1) = connect(&net, &gw, "pkg.test:443", Some(&a)).await;
    let (h2, _s2) = connect(&net, &gw, "pkg.test:443", Some(&a)).await;
    assert_eq!((h1.status, h2.status), (200, 200));
    let (h3, _) = connect(&net, &gw, "pkg.test:443", Some(&a)).await;
    assert_eq!(
        (h3.status, h3.headers[REASON_HEADER].as_str()),
        (429, "connection_limit")
    );
    let b = basic(&token("run-5b", &["pkg.test"]));
    let (hb, _sb) = connect(&net, &gw, "pkg.test:443", Some(&b)).await;
    assert_eq!(hb.status, 200);
    // Closing one frees its place (once the gateway has seen it close).
    drop(s1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (h, _s) = connect(&net, &gw, "pkg.test:443", Some(&a)).await;
        if h.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Bytes: a 1 MiB download is cut near the 256 KiB budget, counted while copying, and the
    // credential gets no further connection.
    let c = basic(&token("run-5c", &["pkg.test"]));
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&c)).await;
    assert_eq!(head.status, 200);
    let mut tunnel = tls.connect(name("pkg.test"), stream).await.expect("TLS");
    let raw = get(&mut tunnel, "pkg.test", "/big/1048576").await;
    assert!(raw.len() < 256 * 1024, "{} bytes came through", raw.len());
    let record = gw.wait_record(&["guest=run-5c", "reason=byte_limit"]).await;
    let moved: u64 = ["bytes_up=", "bytes_down="]
        .iter()
        .filter_map(|k| record.split(' ').find_map(|w| w.strip_prefix(k)))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum();
    assert_eq!(moved, 256 * 1024, "{record}");
    let (head, _) = connect(&net, &gw, "pkg.test:443", Some(&c)).await;
    assert_eq!(
        (head.status, head.headers[REASON_HEADER].as_str()),
        (403, "byte_limit")
    );

    // Idle: a tunnel with nothing moving is closed after the idle timeout.
    let d = basic(&token("run-5d", &["pkg.test"]));
    let (head, stream) = connect(&net, &gw, "pkg.test:443", Some(&d)).await;
    assert_eq!(head.status, 200);
    let mut tunnel = tls.connect(name("pkg.test"), stream).await.expect("TLS");
    let rest = read_all(&mut tunnel).await;
    assert!(rest.is_empty());
    gw.wait_record(&["guest=run-5d", "verdict=allowed", "reason=idle_timeout"])
        .await;
}
