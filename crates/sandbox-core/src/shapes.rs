//! Shape selection, as every surface reaches it: CreateOS's catalog and floor
//! ([`crate::provider::createos::shapes`], re-exported here) and the pin a setting makes
//! ([`pin_of`]).

pub use crate::provider::createos::shapes::{
    AUTO_MIN_MIB, Pin, Shape, ShapeChoice, in_catalog, select_shape,
};

/// The shape [`crate::settings::ENV_SHAPE`] pins in `settings`, if any, as [`select_shape`]
/// takes it.
pub fn pin_of(settings: &crate::settings::Settings) -> Option<Pin<'_>> {
    settings.pinned_shape.as_deref().map(|id| Pin {
        id,
        setting: crate::settings::ENV_SHAPE,
        otherwise: "set it to auto",
    })
}
