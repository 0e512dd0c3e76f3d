//! [`Region`]: the name of the region a member runs in (a data centre, a cloud region), as a
//! node is configured with it ([`crate::NodeBuilder::region`]) and advertises it in gossip
//! ([`crate::membership::KEY_REGION`]). The core knows a region by its [`RegionId`], a hash of
//! the name; the name is kept for people (the cluster view, logs).

use std::fmt;

use ratemesh_core::RegionId;

/// The longest region name, in bytes.
pub const REGION_NAME_BYTES_MAX: usize = 64;

/// A region's name: at most [`REGION_NAME_BYTES_MAX`] bytes of lower-case ASCII letters, digits,
/// `.`, `_` and `-` (`eu-west`, `us-east-1`). The empty name is [`Region::NONE`]: a cluster whose
/// members name no region is one region. Small and `Copy` (the name is held inline).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    name: [u8; REGION_NAME_BYTES_MAX],
    len: u8,
}

/// A region name that is not one: nothing was configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// The name is longer than [`REGION_NAME_BYTES_MAX`] bytes.
    #[error("a region name has at most {REGION_NAME_BYTES_MAX} bytes, this one {0}")]
    TooLong(usize),
    /// The name has a character other than `a`-`z`, `0`-`9`, `.`, `_` and `-`.
    #[error("a region name has only the characters a-z, 0-9, '.', '_' and '-'; this one has {0:?}")]
    BadCharacter(char),
}

impl Region {
    /// No region (the empty name).
    pub const NONE: Region = Region { name: [0; REGION_NAME_BYTES_MAX], len: 0 };

    /// The region named `name`, if it is a valid name (the empty name is [`Region::NONE`]).
    pub fn new(name: &str) -> Result<Region, RegionError> {
        if let Some(bad) = name.chars().find(|&c| !is_region_char(c)) {
            return Err(RegionError::BadCharacter(bad));
        }
        if name.len() > REGION_NAME_BYTES_MAX {
            return Err(RegionError::TooLong(name.len()));
        }
        let mut region = Region::NONE;
        region.name[..name.len()].copy_from_slice(name.as_bytes());
        // At most REGION_NAME_BYTES_MAX (64), which fits a byte.
        region.len = u8::try_from(name.len()).unwrap_or(u8::MAX);
        Ok(region)
    }

    /// The name (empty for [`Region::NONE`]).
    pub fn name(&self) -> &str {
        // Only ASCII bytes are ever stored (`Region::new`).
        std::str::from_utf8(&self.name[..usize::from(self.len)]).unwrap_or_default()
    }

    /// Whether this is [`Region::NONE`].
    pub fn is_none(&self) -> bool {
        self.len == 0
    }

    /// The core's id of the region ([`RegionId::from_name`]).
    pub fn id(&self) -> RegionId {
        RegionId::from_name(self.name())
    }
}

impl Default for Region {
    fn default() -> Self {
        Region::NONE
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region({:?})", self.name())
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Region {
    type Err = RegionError;

    fn from_str(name: &str) -> Result<Region, RegionError> {
        Region::new(name)
    }
}

fn is_region_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_round_trip_and_the_empty_name_is_none() {
        for name in ["eu-west", "us-east-1", "a.b_c", &"x".repeat(REGION_NAME_BYTES_MAX)] {
            let region = Region::new(name).expect("valid");
            assert_eq!(region.name(), name);
            assert_eq!(region.id(), RegionId::from_name(name));
            assert!(!region.is_none());
        }
        assert_eq!(Region::new(""), Ok(Region::NONE));
        assert_eq!(Region::NONE.id(), RegionId::NONE);
    }

    #[test]
    fn invalid_names_are_refused() {
        assert_eq!(Region::new("EU"), Err(RegionError::BadCharacter('E')));
        assert_eq!(Region::new("eu west"), Err(RegionError::BadCharacter(' ')));
        assert_eq!(Region::new("eu/west"), Err(RegionError::BadCharacter('/')));
        assert_eq!(Region::new("é"), Err(RegionError::BadCharacter('é')));
        let long = "x".repeat(REGION_NAME_BYTES_MAX + 1);
        assert_eq!(Region::new(&long), Err(RegionError::TooLong(REGION_NAME_BYTES_MAX + 1)));
    }
}
