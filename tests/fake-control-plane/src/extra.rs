//! Access tokens, templates, networks, disks and computer use.

use std::sync::Arc;

use crate::jsend::{ApiError, ApiResult};
use crate::server::Req;
use crate::state::App;

/// Routes for the account-level resources.
pub(crate) async fn dispatch(_app: &Arc<App>, _req: &mut Req) -> ApiResult {
    Err(ApiError::error(501, "not implemented yet"))
}
