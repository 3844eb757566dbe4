//! Lenient decoding: an explicit JSON `null` in a field that has a default decodes as that
//! default, exactly like an absent key ("absent optional fields never fail a call").

mod common;

use std::fmt::Debug;

use common::{bounded, client, ok};
use createos_api::{
    Bandwidth, CommandResult, Disk, DiskConfig, DiskKind, GetTemplateOptions, Health, Host,
    ManagedProcess, MountStatus, Network, NetworkMember, PaginationOptions, Point,
    ProcessForeground, ProcessOutputWindow, Readiness, ResizeResult, RootFsCatalog, RootFsEntry,
    RunCommandResponse, SandboxDisk, SandboxStats, Screen, ScreenSize, Shape, Template,
    TemplateLogEvent, TemplateLogsOptions, TemplateStatus, UploadResult, WhoAmI, Window,
    WindowGeometry,
};
use futures::{StreamExt as _, TryStreamExt as _};
use httpmock::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Every key `T::default()` serializes, set to `null`.
fn all_null<T: Default + Serialize>() -> Value {
    let Value::Object(map) = serde_json::to_value(T::default()).unwrap() else {
        panic!("not an object");
    };
    assert!(!map.is_empty());
    Value::Object(map.into_iter().map(|(k, _)| (k, Value::Null)).collect())
}

fn nulls_read_as_default<T>()
where
    T: Default + Serialize + DeserializeOwned + PartialEq + Debug,
{
    let nulls = all_null::<T>();
    let decoded: T = serde_json::from_value(nulls.clone()).unwrap_or_else(|e| {
        panic!(
            "{} does not accept {nulls}: {e}",
            std::any::type_name::<T>()
        )
    });
    assert_eq!(decoded, T::default(), "{}", std::any::type_name::<T>());
}

#[test]
fn every_defaulted_model_reads_null_as_its_default() {
    nulls_read_as_default::<Template>();
    nulls_read_as_default::<TemplateLogEvent>();
    nulls_read_as_default::<Network>();
    nulls_read_as_default::<NetworkMember>();
    nulls_read_as_default::<Disk>();
    nulls_read_as_default::<DiskConfig>();
    nulls_read_as_default::<SandboxDisk>();
    nulls_read_as_default::<ManagedProcess>();
    nulls_read_as_default::<ProcessForeground>();
    nulls_read_as_default::<ProcessOutputWindow>();
    nulls_read_as_default::<Window>();
    nulls_read_as_default::<WindowGeometry>();
    nulls_read_as_default::<Screen>();
    nulls_read_as_default::<Point>();
    nulls_read_as_default::<ScreenSize>();
    nulls_read_as_default::<Host>();
    nulls_read_as_default::<Health>();
    nulls_read_as_default::<Readiness>();
    nulls_read_as_default::<WhoAmI>();
    nulls_read_as_default::<SandboxStats>();
    nulls_read_as_default::<Shape>();
    nulls_read_as_default::<RootFsEntry>();
    nulls_read_as_default::<RootFsCatalog>();
    nulls_read_as_default::<Bandwidth>();
    nulls_read_as_default::<ResizeResult>();
    nulls_read_as_default::<UploadResult>();
}

#[test]
fn a_null_exit_code_or_result_never_reads_as_success() {
    let r: CommandResult = serde_json::from_value(all_null::<CommandResult>()).unwrap();
    assert_eq!(r.exit_code, 1);
    assert_eq!(r.stdout, "");
    for body in [json!({"result": null}), json!({}), json!({"exec_ms": 3.0})] {
        let resp: RunCommandResponse = serde_json::from_value(body.clone()).unwrap();
        assert!(!resp.success(), "{body}");
        assert_eq!(resp.result.exit_code, 1, "{body}");
    }
}

#[tokio::test]
async fn null_fields_from_the_server_decode_as_defaults() {
    let server = MockServer::start_async().await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/templates/tpl_1");
            then.status(200).json_body(ok(json!({
                "id": "tpl_1", "name": null, "base": null, "status": null,
                "ext4_size_bytes": null, "created_at": null, "built_at": null
            })));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/networks/net_1");
            then.status(200).json_body(ok(json!({
                "id": "net_1", "name": null, "created_at": null, "member_count": null,
                "members": [{"sandbox_id": "sb_1", "status": null, "ip": null, "name": null}]
            })));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/disks/d1");
            then.status(200).json_body(ok(json!({
                "id": "disk_1", "name": null, "kind": null, "created_at": null,
                "config": {"bucket": null, "endpoint": null, "region": null, "use_path_style": null}
            })));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/disks");
            then.status(200).json_body(ok(json!([{
                "disk_id": "disk_1", "name": null, "kind": "s3", "config": null,
                "mount_path": null, "sub_path": null, "mount_status": null, "mount_error": null
            }])));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/processes/p1");
            then.status(200).json_body(ok(json!({
                "process_id": "p1", "kind": "process", "pid": null, "state": "running",
                "leader_exited": null, "tree_exited": null, "cmd": null, "args": null,
                "cwd": null, "foreground": {"pid": null, "cmd": null, "args": null},
                "output": {"oldest_seq": null, "newest_seq": 4, "bytes": null}
            })));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/computer/windows");
            then.status(200).json_body(ok(
                json!([{"id": 7, "title": null}, {"id": null, "title": "x"}]),
            ));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/sandboxes/s/computer/windows/7/geometry");
            then.status(200).json_body(ok(json!({
                "id": 7, "x": null, "y": 3, "width": null, "height": null, "screen": null
            })));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/sandboxes/s/computer/screens");
            then.status(200).json_body(ok(json!([{
                "screen_id": "screen-1", "display": null, "width": null, "height": 600,
                "vnc_port": null, "novnc_port": null
            }])));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET).path("/v1/hosts");
            then.status(200).json_body(ok(json!([{
                "id": "h1", "status": null, "free_mib": null, "vm_count": null, "rootfses": null
            }])));
        })
        .await;
    server
        .mock_async(|when, then| {
            when.method(GET)
                .path("/v1/templates/tpl_1/logs")
                .query_param("follow", "true");
            then.status(200).body(concat!(
                "{\"ts\":null,\"level\":null,\"line\":null,\"attempt\":null,\"final\":null}\n",
                "{\"line\":\"done\",\"attempt\":1,\"final\":true,\"status\":\"ready\"}\n",
            ));
        })
        .await;
    let c = client(&server);
    let sb = c.sandbox_handle("s");

    let template = bounded(c.templates().get("tpl_1", GetTemplateOptions::default()))
        .await
        .unwrap();
    assert_eq!(
        (template.id.as_str(), template.name.as_str()),
        ("tpl_1", "")
    );
    assert_eq!(template.status, TemplateStatus::default());
    assert_eq!(template.ext4_size_bytes, 0);

    let network = bounded(c.networks().get("net_1")).await.unwrap();
    assert_eq!(network.member_count, 0);
    assert_eq!(network.members[0].sandbox_id, "sb_1");
    assert_eq!(network.members[0].ip_address, "");

    let disk = bounded(c.disks().get("d1")).await.unwrap();
    assert_eq!(disk.kind, DiskKind::default());
    assert_eq!(disk.config, DiskConfig::default());

    let mounted: Vec<SandboxDisk> =
        bounded(sb.list_disks(PaginationOptions::default()).try_collect())
            .await
            .unwrap();
    assert_eq!(mounted[0].mount_status, MountStatus::default());
    assert_eq!(mounted[0].mount_path, "");

    let process = bounded(sb.processes().get("p1")).await.unwrap();
    assert_eq!(
        (process.pid, process.cmd.as_str(), process.cwd.as_str()),
        (0, "", "")
    );
    assert!(process.args.is_empty());
    assert_eq!(process.foreground.unwrap(), ProcessForeground::default());
    assert_eq!(process.output.newest_seq, 4);

    let computer = sb.computer();
    let windows = bounded(computer.windows().list(None)).await.unwrap();
    assert_eq!(windows[0].id, "7");
    assert_eq!(windows[0].title, "");
    assert_eq!(windows[1].id, "");
    let geometry = bounded(computer.windows().geometry("7")).await.unwrap();
    assert_eq!(
        (
            geometry.x,
            geometry.y,
            geometry.width,
            geometry.height,
            geometry.screen
        ),
        (0, 3, 0, 0, 0)
    );
    let screens = bounded(computer.screens().list()).await.unwrap();
    assert_eq!((screens[0].width, screens[0].height), (0, 600));
    assert_eq!(screens[0].display, "");

    let hosts: Vec<Host> = bounded(c.list_hosts(PaginationOptions::default()).try_collect())
        .await
        .unwrap();
    assert_eq!((hosts[0].free_mib, hosts[0].vm_count), (0, 0));
    assert!(hosts[0].rootfses.is_empty());

    let mut logs = bounded(
        c.templates()
            .follow_logs("tpl_1", TemplateLogsOptions::default()),
    )
    .await
    .unwrap();
    let first = bounded(logs.next()).await.unwrap().unwrap();
    assert_eq!(
        (first.line.as_str(), first.attempt, first.is_final),
        ("", 0, false)
    );
    let last = bounded(logs.next()).await.unwrap().unwrap();
    assert!(last.is_final);
}
