//! The seam's calls counted: a control plane ([`Observed`]) or a provider ([`ObservedProvider`])
//! wrapped so that every call is reported to an [`Observation`] as a control-plane request (its
//! route and status class). Kept apart from [`crate::observe`], which holds what is counted and
//! sits below the seam; this module sits on both.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::control::{
    AgedGuest, CallError, ControlPlane, CreateGuest, Download, ExecRequest, ExecStream, GuestInfo,
    ProcessSpec, Shape, TemplateInfo, TemplateLogStream,
};
use crate::egress::{EgressException, EgressPolicy};
use crate::kind::ProviderKind;
use crate::observe::{Event, Observation};
use crate::provider::{EgressCheck, GuestSpec as ProviderGuestSpec, Isolation, Provider, Size};

/// `fut`, whose outcome is counted in `obs` as a control-plane request on `route` (its status
/// class): what [`Observed`] and [`ObservedProvider`] do around every call.
fn counted<'a, T: Send + 'a>(
    obs: &'a Observation,
    route: &'static str,
    fut: BoxFuture<'a, Result<T, CallError>>,
) -> BoxFuture<'a, Result<T, CallError>> {
    Box::pin(async move {
        let r = fut.await;
        obs.emit(&Event::ControlRequest {
            route,
            status: crate::observe::status_class(&r),
        });
        r
    })
}

/// A control plane whose every call is counted (route and status class) in an
/// [`Observation`]; the session wraps each account's control plane in one.
pub struct Observed {
    inner: Arc<dyn ControlPlane>,
    obs: Observation,
}

impl Observed {
    /// `inner`, counted in `obs`.
    pub fn wrap(inner: Arc<dyn ControlPlane>, obs: Observation) -> Arc<dyn ControlPlane> {
        Arc::new(Self { inner, obs })
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        route: &'static str,
        fut: BoxFuture<'a, Result<T, CallError>>,
    ) -> BoxFuture<'a, Result<T, CallError>> {
        counted(&self.obs, route, fut)
    }
}

impl ControlPlane for Observed {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.call("whoami", self.inner.check_credential())
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.call("shapes", self.inner.list_shapes())
    }
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("create", self.inner.create(req))
    }
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.call("list", self.inner.find_by_name(name))
    }
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        self.call("egress_get", self.inner.egress(id))
    }
    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.call("upload", self.inner.upload(id, path, data))
    }
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.call("exec_stream", self.inner.exec_stream(id, req))
    }
    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        self.call("process", self.inner.spawn_process(id, spec))
    }
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.call("delete", self.inner.destroy(id))
    }
    fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        self.call("list", self.inner.list_guests(prefix))
    }
    fn list_guests_aged(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.call("list", self.inner.list_guests_aged(prefix))
    }
    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("get", self.inner.get(id))
    }
    fn set_auto_pause(
        &self,
        id: String,
        seconds: u32,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("patch", self.inner.set_auto_pause(id, seconds))
    }
    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("resume", self.inner.resume(id))
    }
    fn create_template(
        &self,
        name: String,
        dockerfile: String,
    ) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        self.call(
            "template_create",
            self.inner.create_template(name, dockerfile),
        )
    }
    fn get_template(&self, id_or_name: String) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        self.call("template_get", self.inner.get_template(id_or_name))
    }
    fn follow_template_log(
        &self,
        id: String,
    ) -> BoxFuture<'_, Result<TemplateLogStream, CallError>> {
        self.call("template_log", self.inner.follow_template_log(id))
    }
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        self.call("download", self.inner.download(id, path, max_bytes))
    }
}

/// A provider whose every call is counted (route and status class) in an [`Observation`],
/// under the same routes as [`Observed`]; the session wraps the provider of an account that is
/// not CreateOS's in one (CreateOS's control plane is counted by [`Observed`] underneath).
pub struct ObservedProvider {
    inner: Arc<dyn Provider>,
    obs: Observation,
}

impl ObservedProvider {
    /// `inner`, counted in `obs`.
    pub fn wrap(inner: Arc<dyn Provider>, obs: Observation) -> Arc<dyn Provider> {
        Arc::new(Self { inner, obs })
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        route: &'static str,
        fut: BoxFuture<'a, Result<T, CallError>>,
    ) -> BoxFuture<'a, Result<T, CallError>> {
        counted(&self.obs, route, fut)
    }
}

impl Provider for ObservedProvider {
    fn kind(&self) -> ProviderKind {
        self.inner.kind()
    }
    fn isolation(&self) -> Isolation {
        self.inner.isolation()
    }
    fn egress_exceptions(&self) -> &'static [EgressException] {
        self.inner.egress_exceptions()
    }
    fn identity(&self) -> usize {
        self.inner.identity()
    }
    fn describe_egress(&self, policy: &EgressPolicy) -> String {
        self.inner.describe_egress(policy)
    }
    fn egress_in_answer(&self, info: &GuestInfo, policy: &EgressPolicy) -> Option<EgressCheck> {
        self.inner.egress_in_answer(info, policy)
    }
    fn running_is_ready(&self) -> bool {
        self.inner.running_is_ready()
    }
    fn readiness(&self) -> Option<crate::provider::Readiness> {
        self.inner.readiness()
    }
    fn pauses_idle_guests(&self) -> bool {
        self.inner.pauses_idle_guests()
    }
    fn replaces_drifted_kept_guests(&self) -> bool {
        self.inner.replaces_drifted_kept_guests()
    }
    fn check(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.call("whoami", self.inner.check())
    }
    fn sizes(&self) -> BoxFuture<'_, Result<Vec<Size>, CallError>> {
        self.call("shapes", self.inner.sizes())
    }
    fn create(&self, spec: ProviderGuestSpec) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("create", self.inner.create(spec))
    }
    fn find(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.call("list", self.inner.find(name))
    }
    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("get", self.inner.get(id))
    }
    fn wait_ready(
        &self,
        id: String,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("ready", self.inner.wait_ready(id, deadline))
    }
    fn verify_egress(
        &self,
        id: String,
        policy: EgressPolicy,
    ) -> BoxFuture<'_, Result<EgressCheck, CallError>> {
        self.call("egress_get", self.inner.verify_egress(id, policy))
    }
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.call("exec_stream", self.inner.exec_stream(id, req))
    }
    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.call("upload", self.inner.upload(id, path, data))
    }
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        self.call("download", self.inner.download(id, path, max_bytes))
    }
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.call("delete", self.inner.destroy(id))
    }
    fn list_ours(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.call("list", self.inner.list_ours(prefix))
    }
    fn keep_alive(
        &self,
        id: String,
        idle: std::time::Duration,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("patch", self.inner.keep_alive(id, idle))
    }
    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.call("resume", self.inner.resume(id))
    }
    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        self.call("process", self.inner.spawn_process(id, spec))
    }
}
