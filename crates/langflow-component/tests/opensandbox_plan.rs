//! The component on OpenSandbox (`ComponentOptions::provider`): refused before any I/O unless
//! the server's isolation is attested or container isolation is accepted, and never asking
//! for a CreateOS key.

use std::collections::HashMap;
use std::sync::Arc;

use langflow_component::{
    ComponentInputs, ComponentOptions, ProviderKind, Reuse, SandboxComponent, SurfaceOptions,
};
use sandbox_core::ErrorKind;

fn on_opensandbox(env: &[(&'static str, &'static str)]) -> SandboxComponent {
    let env: HashMap<&'static str, &'static str> = env.iter().copied().collect();
    SandboxComponent::with_options(ComponentOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k: &str| env.get(k).map(|v| (*v).to_owned())),
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        provider: ProviderKind::OpenSandbox,
        ..ComponentOptions::default()
    })
}

#[tokio::test]
async fn without_attestation_or_the_opt_in_the_run_is_refused_naming_both_settings() {
    let component = on_opensandbox(&[
        // Nothing listens here: a refusal must come before any call.
        ("OPEN_SANDBOX_DOMAIN", "http://127.0.0.1:9"),
        ("OPEN_SANDBOX_API_KEY", "os-key-never-shown"),
    ]);
    let inputs = ComponentInputs {
        flow_id: "f".into(),
        component_id: "CreateOSSandbox-os01".into(),
        python_code: "print(1)".into(),
        reuse: Reuse::Off,
        timeout_seconds: 20,
        ..ComponentInputs::default()
    };
    let err = component.run(&inputs).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    let msg = err.message();
    assert!(
        msg.contains("sandbox component")
            && msg.contains("OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized")
            && msg.contains("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true"),
        "{msg}"
    );
    assert!(!msg.contains("os-key-never-shown") && !msg.contains("CREATEOS_SANDBOX_API_KEY"));
}

#[tokio::test]
async fn guest_reuse_is_refused_on_opensandbox_before_any_call() {
    let component = on_opensandbox(&[
        ("OPEN_SANDBOX_DOMAIN", "http://127.0.0.1:9"),
        ("OPEN_SANDBOX_API_KEY", "os-key-never-shown"),
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
    ]);
    for reuse in [Reuse::Flow, Reuse::Session] {
        let inputs = ComponentInputs {
            flow_id: "f".into(),
            session_id: "s".into(),
            component_id: "CreateOSSandbox-os01".into(),
            python_code: "print(1)".into(),
            reuse,
            timeout_seconds: 20,
            ..ComponentInputs::default()
        };
        let err = component.run(&inputs).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
        assert!(
            err.message().contains("Guest Reuse (session_mode)")
                && err.message().contains("not available on OpenSandbox"),
            "{err}"
        );
    }
}
