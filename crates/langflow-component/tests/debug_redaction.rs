//! `Debug` of the component's inputs shows the code's and the command's sizes, never their
//! text (either may carry a secret).

use langflow_component::ComponentInputs;

#[test]
fn debug_never_shows_the_code_or_the_command() {
    let secret = "sk-component-secret-41c9";
    let inputs = ComponentInputs {
        flow_id: "flow-1".to_owned(),
        component_id: "node-1".to_owned(),
        python_code: format!("KEY = {secret:?}\nprint(KEY)\n"),
        command: format!("curl -H 'Authorization: Bearer {secret}' https://example.invalid"),
        timeout_seconds: 60,
        ..ComponentInputs::default()
    };
    for text in [format!("{inputs:?}"), format!("{inputs:#?}")] {
        assert!(!text.contains(secret), "{text}");
        assert!(
            text.contains("python_code_bytes") && text.contains("node-1"),
            "{text}"
        );
    }
}
