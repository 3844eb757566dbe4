//! CreateOS's shape catalog and its floor. A CreateOS shape fixes vCPU and memory together;
//! the configured memory is a floor, and the choice never rounds down. Every surface's shape
//! goes through here (by way of [`crate::shapes`]): the one "not in the shape catalog" refusal
//! ([`in_catalog`]) and the one choice ([`select_shape`]).

use crate::error::SandboxError;

/// The smallest memory an automatically chosen shape gets, in MiB: a fresh guest importing
/// numpy or pandas needs it, whatever lfx's 192 MB default says.
pub const AUTO_MIN_MIB: u32 = 4096;

pub use crate::control::Shape;

/// How a shape was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeChoice {
    /// The shape.
    pub shape: Shape,
    /// True when `CREATEOS_SANDBOX_SHAPE` pinned it.
    pub pinned: bool,
    /// The memory the choice had to satisfy, in MiB.
    pub required_mib: u32,
}

/// A shape a setting (or a node's input) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin<'a> {
    /// The shape id.
    pub id: &'a str,
    /// The setting or input that names it (refusals name it).
    pub setting: &'a str,
    /// What else the user can do besides picking a listed shape (e.g. `set it to auto`).
    pub otherwise: &'a str,
}

/// The pinned shape from `catalog`, or the refusal naming the setting and the shapes there are.
pub fn in_catalog<'c>(catalog: &'c [Shape], pin: &Pin<'_>) -> Result<&'c Shape, SandboxError> {
    catalog.iter().find(|s| s.id == pin.id).ok_or_else(|| {
        let mut ids: Vec<&str> = catalog.iter().map(|s| s.id.as_str()).collect();
        ids.sort_unstable();
        let otherwise = if pin.otherwise.is_empty() {
            String::new()
        } else {
            format!(" or {}", pin.otherwise)
        };
        SandboxError::refused(format!(
            "{}={} is not in the CreateOS shape catalog (available: {}); pick one of those{otherwise}",
            pin.setting,
            pin.id,
            ids.join(", ")
        ))
    })
}

/// Chooses the shape for a run: the pinned one if set (it must exist and hold at least
/// `memory_mb`; 0 asks nothing of it), else the smallest shape with at least
/// `max(memory_mb, 4096)` MiB (ties broken by fewer vCPUs, then id). Refusals name
/// `memory_setting`, the setting of the calling surface that carries `memory_mb`, and the pin's.
pub fn select_shape(
    catalog: &[Shape],
    memory_mb: u32,
    pinned: Option<Pin<'_>>,
    memory_setting: &str,
) -> Result<ShapeChoice, SandboxError> {
    let mem = memory_setting;
    if let Some(pin) = pinned {
        let shape = in_catalog(catalog, &pin)?;
        if shape.mem_mib < memory_mb {
            let (setting, id) = (pin.setting, pin.id);
            return Err(SandboxError::refused(format!(
                "{setting}={id} has {} MiB, below {mem}={memory_mb}; a smaller guest \
                 would turn memory exhaustion into confusing out-of-memory kills. Pin a larger \
                 shape, lower {mem}, or set {setting}=auto",
                shape.mem_mib
            )));
        }
        return Ok(ShapeChoice {
            shape: shape.clone(),
            pinned: true,
            required_mib: memory_mb,
        });
    }
    let required = memory_mb.max(AUTO_MIN_MIB);
    catalog
        .iter()
        .filter(|s| s.mem_mib >= required)
        .min_by(|a, b| (a.mem_mib, a.vcpu, a.id.as_str()).cmp(&(b.mem_mib, b.vcpu, b.id.as_str())))
        .map(|s| ShapeChoice {
            shape: s.clone(),
            pinned: false,
            required_mib: required,
        })
        .ok_or_else(|| {
            let largest = catalog.iter().map(|s| s.mem_mib).max().unwrap_or(0);
            SandboxError::refused(format!(
                "no CreateOS shape has at least {required} MiB (max({mem}={memory_mb}, \
                 {AUTO_MIN_MIB})); the largest in the catalog has {largest} MiB. Lower \
                 {mem} or pin a shape with {}",
                super::ENV_SHAPE
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "SURFACE_MEMORY_MB";
    const S: &str = crate::provider::createos::ENV_SHAPE;

    #[allow(clippy::unnecessary_wraps)] // what select_shape takes
    fn pin(id: &str) -> Option<Pin<'_>> {
        Some(Pin {
            id,
            setting: S,
            otherwise: "set it to auto",
        })
    }

    fn cat() -> Vec<Shape> {
        [
            ("s-1vcpu-256mb", 1, 256),
            ("s-1vcpu-1gb", 1, 1024),
            ("s-4vcpu-4gb", 4, 4096),
            ("s-2vcpu-4gb", 2, 4096),
            ("s-4vcpu-8gb", 4, 8192),
            ("s-4vcpu-16gb", 4, 16384),
        ]
        .iter()
        .map(|(id, v, m)| Shape {
            id: (*id).to_owned(),
            vcpu: *v,
            mem_mib: *m,
        })
        .collect()
    }

    #[test]
    fn floor_of_4096_and_smallest_fit() {
        let c = select_shape(&cat(), 192, None, M).unwrap();
        assert_eq!(c.shape.id, "s-2vcpu-4gb");
        assert_eq!(c.required_mib, 4096);
        assert_eq!(
            select_shape(&cat(), 4096, None, M).unwrap().shape.id,
            "s-2vcpu-4gb"
        );
        assert_eq!(
            select_shape(&cat(), 4097, None, M).unwrap().shape.id,
            "s-4vcpu-8gb"
        );
        assert_eq!(
            select_shape(&cat(), 9000, None, M).unwrap().shape.id,
            "s-4vcpu-16gb"
        );
    }

    #[test]
    fn never_rounds_down() {
        let e = select_shape(&cat(), 16385, None, M).unwrap_err();
        assert!(e.kind().is_unavailable());
        assert!(e.to_string().contains("16385"));
        let e = select_shape(&[], 192, None, M).unwrap_err();
        assert!(e.to_string().contains("4096"));
    }

    #[test]
    fn pinned_shape_checks() {
        let c = select_shape(&cat(), 192, pin("s-1vcpu-256mb"), M).unwrap();
        assert!(c.pinned);
        assert_eq!(c.shape.mem_mib, 256);
        let e = select_shape(&cat(), 512, pin("s-1vcpu-256mb"), M).unwrap_err();
        assert!(e.to_string().contains(S) && e.to_string().contains(M));
        let e = select_shape(&cat(), 192, pin("s-64vcpu-1tb"), M).unwrap_err();
        assert!(e.to_string().contains("not in the CreateOS shape catalog"));
        assert!(
            e.to_string()
                .ends_with("pick one of those or set it to auto"),
            "{e}"
        );
        let bare = Pin {
            id: "x",
            setting: "SOME_SHAPE",
            otherwise: "",
        };
        let e = in_catalog(&cat(), &bare).unwrap_err().to_string();
        assert!(
            e.starts_with("SOME_SHAPE=x is not in") && e.ends_with("pick one of those"),
            "{e}"
        );
    }
}
