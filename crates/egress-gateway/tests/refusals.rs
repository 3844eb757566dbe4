//! The gateway's refusals, in process on loopback: no root needed, so these run everywhere
//! (what is admitted needs a public destination, and is proven in `netns.rs`).

mod common;

use std::net::{IpAddr, SocketAddr};

use common::{SECRET, basic, exchange, read_all, token};
use egress_gateway::{GatewayConfig, REASON_HEADER, Secret};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

async fn gateway() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let names: Vec<(String, Vec<IpAddr>)> = [
        ("loop.test", "127.0.0.1"),
        ("private.test", "192.168.1.10"),
        ("v6.test", "::ffff:169.254.169.254"),
    ]
    .iter()
    .map(|(n, ip)| ((*n).to_owned(), vec![ip.parse().expect("ip")]))
    .collect();
    let config = GatewayConfig::new(Secret::new(SECRET.to_vec()).expect("secret"))
        .with_test_only_resolver(names)
        .expect("resolver");
    tokio::spawn(egress_gateway::serve(listener, config));
    addr
}

/// Sends `head` on a new connection; returns the status and the reason header.
async fn ask(gw: SocketAddr, head: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(gw).await.expect("connect");
    let got = exchange(&mut stream, head).await;
    (
        got.status,
        got.headers.get(REASON_HEADER).cloned().unwrap_or_default(),
    )
}

fn connect_head(target: &str, auth: Option<&str>) -> String {
    let auth = auth.map_or(String::new(), |a| format!("Proxy-Authorization: {a}\r\n"));
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_carry_their_status_and_reason() {
    let gw = gateway().await;
    let auth = basic(&token(
        "run-r",
        &["loop.test", "private.test", "v6.test", "nowhere.test"],
    ));
    let cases: [(String, u16, &str); 9] = [
        (connect_head("loop.test:443", None), 407, "no_credentials"),
        (
            connect_head("loop.test:443", Some("Basic !!!")),
            407,
            "bad_credentials",
        ),
        (
            connect_head("other.test:443", Some(&auth)),
            403,
            "host_not_allowed",
        ),
        (
            connect_head("loop.test:22", Some(&auth)),
            403,
            "port_not_allowed",
        ),
        (
            connect_head("loop.test:443", Some(&auth)),
            403,
            "forbidden_address",
        ),
        (
            connect_head("private.test:443", Some(&auth)),
            403,
            "forbidden_address",
        ),
        (
            connect_head("v6.test:443", Some(&auth)),
            403,
            "forbidden_address",
        ),
        (
            connect_head("127.0.0.1:443", Some(&auth)),
            403,
            "ip_literal",
        ),
        (
            connect_head("nowhere.test:443", Some(&auth)),
            502,
            "resolve_failed",
        ),
    ];
    for (head, status, reason) in cases {
        assert_eq!(ask(gw, &head).await, (status, reason.to_owned()), "{head}");
    }
    // Requests a forward proxy does not serve.
    let origin =
        format!("GET / HTTP/1.1\r\nHost: loop.test\r\nProxy-Authorization: {auth}\r\n\r\n");
    assert_eq!(ask(gw, &origin).await, (400, "bad_request".to_owned()));
    let tls_url = format!(
        "GET https://loop.test/ HTTP/1.1\r\nHost: loop.test\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    assert_eq!(ask(gw, &tls_url).await, (400, "bad_request".to_owned()));
    let plain = format!(
        "GET http://loop.test/latest HTTP/1.1\r\nHost: loop.test\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    assert_eq!(ask(gw, &plain).await, (403, "forbidden_address".to_owned()));
    // A request head over the bound is refused, whatever it carries.
    let mut stream = TcpStream::connect(gw).await.expect("connect");
    let huge = format!(
        "CONNECT loop.test:443 HTTP/1.1\r\nHost: loop.test:443\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(32 * 1024)
    );
    let _ = stream.write_all(huge.as_bytes()).await;
    let answer = String::from_utf8_lossy(&read_all(&mut stream).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}
