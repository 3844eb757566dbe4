//! The backend wired to the gateway, enforced for real: a run with
//! `LANGFLOW_SANDBOX_ALLOWED_DOMAINS` gets a guest of the enforcing fake whose only egress is the
//! gateway, and the proxy variables with its own token; its program `pip install`s a package
//! from the test index when the index's name is allowed, and fails closed when it is not. See
//! `common/mod.rs` for the network. Without root, `ip`, `nft` or pip the test passes after
//! saying why it did not run.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{Gateway, Guests, Net, SECRET, python_has_pip};
use langflow_backend::{Backend, BackendOptions, LfxPolicy, SurfaceOptions};
use langflow_component::{ComponentInputs, ComponentOptions, Reuse, SandboxComponent};

/// Installs `tinypkg` from the test index into a fresh directory with pip (which reads the
/// proxy from `PIP_PROXY`/`HTTPS_PROXY`), imports it, then tries a direct connection that
/// ignores the proxy settings. Prints `INSTALL <rc>`, `VALUE <n>` and `DIRECT <outcome>`.
const PROGRAM: &str = r#"
import os, socket, subprocess, sys, tempfile
d = tempfile.mkdtemp()
ca = os.path.join(d, "ca.pem")
open(ca, "w").write(CA_PEM)
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
    "--no-cache-dir", "--retries", "0", "--timeout", "10", "--index-url", "https://pkg.test/simple/",
    "--cert", ca, "--target", os.path.join(d, "t"), "tinypkg"], capture_output=True, text=True)
print("INSTALL", r.returncode)
sys.stderr.write(r.stdout[-2000:] + r.stderr[-2000:])
if r.returncode == 0:
    sys.path.insert(0, os.path.join(d, "t"))
    import tinypkg
    print("VALUE", tinypkg.VALUE)
try:
    socket.create_connection(("11.0.0.1", 443), timeout=2).close()
    print("DIRECT connected")
except OSError as e:
    print("DIRECT", type(e).__name__)
"#;

/// The settings of a plugin pointed at the enforcing fake and the gateway.
fn settings(guests: &Guests, gateway: &Gateway) -> HashMap<String, String> {
    HashMap::from([
        (
            "CREATEOS_SANDBOX_API_KEY".to_owned(),
            guests.fake.api_key().to_owned(),
        ),
        ("CREATEOS_SANDBOX_BASE_URL".to_owned(), guests.fake.url()),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".to_owned(),
            "true".to_owned(),
        ),
        (
            "CREATEOS_GATEWAY_URL".to_owned(),
            format!("http://{}", gateway.addr),
        ),
        (
            "CREATEOS_GATEWAY_SECRET".to_owned(),
            String::from_utf8(SECRET.to_vec()).expect("ascii"),
        ),
    ])
}

/// What both surfaces run with here: the plugin's settings pointed at this fake and gateway,
/// without the orphan sweep.
fn surface(guests: &Guests, gateway: &Gateway) -> SurfaceOptions {
    let env = settings(guests, gateway);
    SurfaceOptions {
        env: Arc::new(move |k| env.get(k).cloned()),
        orphan_sweep: false,
        ..SurfaceOptions::default()
    }
}

/// The network, a gateway and the enforcing fake; `None` after saying why this machine cannot
/// run them.
async fn setup() -> Option<(Net, Gateway, Guests)> {
    let net = Net::setup()?;
    if !python_has_pip() {
        eprintln!("skipped: `python3 -m pip` is not available on this machine");
        return None;
    }
    let gw = Gateway::start(&net, &[]);
    let guests = Guests::start(&net).await;
    Some((net, gw, guests))
}

fn backend(guests: &Guests, gateway: &Gateway) -> Backend {
    Backend::with_options(BackendOptions {
        surface: SurfaceOptions {
            background_destroy: false,
            ..surface(guests, gateway)
        },
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_run_installs_from_an_allowed_index_and_fails_closed_otherwise() {
    let Some((net, gw, guests)) = setup().await else {
        return;
    };
    let b = backend(&guests, &gw);
    let code = PROGRAM.replace("CA_PEM", &format!("{:?}", net.ca_pem));
    let policy = |domains: &[&str]| LfxPolicy {
        timeout_seconds: 60,
        allow_network: true,
        allowed_domains: domains.iter().map(|d| (*d).to_owned()).collect(),
        ..LfxPolicy::default()
    };

    // Allowed: pip reaches the index through the gateway; a direct connection is dropped by
    // the guest's firewall (its only egress rule is the gateway's address).
    let out = b.run(&code, None, &policy(&["pkg.test"])).await.unwrap();
    let stdout = out.stdout.to_string();
    let stderr = out.stderr.to_string();
    assert!(
        stdout.contains("INSTALL 0\nVALUE 42\n"),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("DIRECT connected"), "{stdout}");
    gw.wait_record(&[
        &format!("guest={}", out.guest),
        "host=pkg.test",
        "verdict=allowed",
    ])
    .await;

    // Not allowed (another name is): the install fails, refused by the gateway; still nothing
    // reachable directly.
    let out = b.run(&code, None, &policy(&["api.test"])).await.unwrap();
    let stdout = out.stdout.to_string();
    assert!(stdout.contains("INSTALL 1\n"), "{stdout}\n{}", out.stderr);
    assert!(!stdout.contains("VALUE"), "{stdout}");
    assert!(!stdout.contains("DIRECT connected"), "{stdout}");
    gw.wait_record(&[
        &format!("guest={}", out.guest),
        "host=pkg.test",
        "verdict=refused",
        "reason=host_not_allowed",
    ])
    .await;

    b.shutdown().await;
    assert_eq!(guests.fake.stats().live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_component_guest_gets_a_working_token_each_run_and_only_its_list() {
    let Some((net, gw, guests)) = setup().await else {
        return;
    };
    let c = SandboxComponent::with_options(ComponentOptions {
        surface: surface(&guests, &gw),
        ..ComponentOptions::default()
    });
    let code = PROGRAM.replace("CA_PEM", &format!("{:?}", net.ca_pem));
    let inputs = |domains: &str| ComponentInputs {
        flow_id: "flow-gw".into(),
        component_id: "CreateOSSandbox-gw1".into(),
        python_code: code.clone(),
        reuse: Reuse::Flow,
        allow_network: true,
        allowed_domains: domains.into(),
        timeout_seconds: 60,
        ..ComponentInputs::default()
    };
    // The same kept guest twice: each run's own token works.
    let first = c.run(&inputs("pkg.test")).await.unwrap();
    assert!(
        first.result.contains("INSTALL 0\nVALUE 42"),
        "{}\n{}",
        first.result,
        first.stderr
    );
    let again = c.run(&inputs("pkg.test")).await.unwrap();
    assert_eq!(again.sandbox_id, first.sandbox_id);
    assert!(
        again.result.contains("INSTALL 0\nVALUE 42"),
        "{}\n{}",
        again.result,
        again.stderr
    );
    assert!(
        !again.result.contains("DIRECT connected"),
        "{}",
        again.result
    );
    // Another list is another guest, and reaches only its own list.
    let other = c.run(&inputs("api.test")).await.unwrap();
    assert_ne!(other.sandbox_id, first.sandbox_id);
    assert!(
        other.result.contains("INSTALL 1"),
        "{}\n{}",
        other.result,
        other.stderr
    );
    gw.wait_record(&[
        &format!("guest={}", other.sandbox_name),
        "host=pkg.test",
        "reason=host_not_allowed",
    ])
    .await;
    c.shutdown().await;
}
