//! The custom-template example against the fake control plane.

#![allow(dead_code)]

mod common;

use common::fake::{bounded, start};
#[path = "../examples/custom_template.rs"]
mod custom_template;

use std::time::Duration;

use createos_api::{
    ErrorKind, GetTemplateOptions, PaginationOptions, TemplateCreateRequest, TemplateLogsOptions,
    TemplateStatus,
};
use createos_fake::FakeOptions;
use futures::TryStreamExt as _;

#[tokio::test(flavor = "multi_thread")]
async fn followed_logs_ready_then_a_sandbox_from_the_template() {
    let (server, client) = start(FakeOptions::default()).await;
    let outcome = bounded(custom_template::run(
        &client,
        "custom-template-test",
        custom_template::DOCKERFILE,
        Duration::from_millis(50),
        Duration::from_secs(30),
    ))
    .await
    .unwrap();
    assert_eq!(outcome.final_status, Some(TemplateStatus::Ready));
    assert_eq!(outcome.template.status, TemplateStatus::Ready);
    assert!(
        outcome
            .log_lines
            .iter()
            .any(|l| l.contains("FROM nodeops/sandbox:debian")),
        "{:?}",
        outcome.log_lines
    );
    assert_eq!(outcome.sandbox_output, "running on a custom template\n");
    // The example deleted its template and destroyed its sandbox.
    let err = client
        .templates()
        .get(&outcome.template.id, GetTemplateOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(server.stats().live, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_build_ends_with_failed_and_no_sandbox() {
    let (server, client) = start(FakeOptions::default()).await;
    let outcome = bounded(custom_template::run(
        &client,
        "broken-template",
        "FROM nodeops/sandbox:debian\nRUN false\n",
        Duration::from_millis(50),
        Duration::from_secs(30),
    ))
    .await
    .unwrap();
    assert_eq!(outcome.final_status, Some(TemplateStatus::Failed));
    assert_eq!(outcome.template.status, TemplateStatus::Failed);
    assert!(outcome.sandbox_output.is_empty());
    assert_eq!(server.stats().created, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn get_with_dockerfile_list_and_plain_text_logs() {
    let (server, client) = start(FakeOptions::default()).await;
    bounded(async {
        let templates = client.templates();
        let dockerfile = "FROM nodeops/sandbox:debian\nRUN echo hi\n";
        let t = templates
            .create(&TemplateCreateRequest::new("tpl-plain", dockerfile))
            .await
            .unwrap();
        assert!(
            matches!(t.status, TemplateStatus::Pending | TemplateStatus::Building),
            "{t:?}"
        );
        // Wait for the build through the followed log.
        let events: Vec<_> = templates
            .follow_logs(&t.id, TemplateLogsOptions::default())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert!(events.last().unwrap().is_final);
        let plain = templates
            .get(&t.id, GetTemplateOptions::default())
            .await
            .unwrap();
        assert_eq!(plain.dockerfile, None);
        let full = templates
            .get(
                &t.id,
                GetTemplateOptions {
                    include_dockerfile: true,
                },
            )
            .await
            .unwrap();
        assert_eq!(full.dockerfile.as_deref(), Some(dockerfile));
        let text = templates
            .logs(&t.id, TemplateLogsOptions::default())
            .await
            .unwrap();
        assert!(text.contains("RUN echo hi"), "{text}");
        let all: Vec<_> = templates
            .list(PaginationOptions::default())
            .try_collect()
            .await
            .unwrap();
        assert!(all.iter().any(|x| x.id == t.id));
        templates.delete(&t.id).await.unwrap();
    })
    .await;
    server.shutdown().await;
}
