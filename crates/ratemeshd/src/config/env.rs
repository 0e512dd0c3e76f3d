//! Environment overrides: `RATEMESH_<SECTION>_<FIELD>` replaces `<section>.<field>` of the file.
//!
//! Overrides are applied to the file as written, before validation, so that a bad value from the
//! environment is refused by the same checks as one from the file, and the error names the
//! variable instead of a line. The variables come in as an explicit list (the CLI passes the
//! process environment), so tests never touch the process's own environment.

use std::ffi::OsStr;

use super::raw::{At, OVERRIDES, RawConfig, Val};
use super::{ConfigError, Location};

/// The prefix of every variable this module reads. Any other variable with it is an error: a typo
/// in an override must not silently leave the file's value in force.
pub const ENV_PREFIX: &str = "RATEMESH_";

/// One variable being applied.
struct EnvValue<'a> {
    variable: &'a str,
    field: &'static str,
    text: &'a str,
}

impl EnvValue<'_> {
    fn string(&self) -> Val<String> {
        Val { value: self.text.to_owned(), at: At::Env(self.variable.to_owned()) }
    }

    fn number(&self) -> Result<Val<u64>, ConfigError> {
        let value = self.text.trim().parse::<u64>().map_err(|error| ConfigError::Invalid {
            location: Location::Env { variable: self.variable.to_owned() },
            field: self.field.to_owned(),
            message: format!("{:?} is not an unsigned integer ({error})", self.text),
        })?;
        Ok(Val { value, at: At::Env(self.variable.to_owned()) })
    }

    /// A comma-separated list; blanks around items are ignored, an empty string is an empty list.
    fn list(&self) -> Vec<Val<String>> {
        let at = At::Env(self.variable.to_owned());
        self.text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| Val { value: item.to_owned(), at: at.clone() })
            .collect()
    }
}

/// Where an override goes, by the type its text is parsed into.
pub(super) enum Slot<'a> {
    Number(&'a mut Option<Val<u64>>),
    Text(&'a mut Option<Val<String>>),
    List(&'a mut Option<Vec<Val<String>>>),
}

/// Where a field lives in the raw file; the table of every overridable field is
/// `super::raw::OVERRIDES`, generated with the raw sections.
pub(super) type Locate = fn(&mut RawConfig) -> Slot<'_>;

/// The variable that overrides `field` (`cluster.seeds` → `RATEMESH_CLUSTER_SEEDS`).
pub fn variable_name(field: &str) -> String {
    format!("{ENV_PREFIX}{}", field.replace('.', "_").to_ascii_uppercase())
}

/// Every variable that overrides a field, in the order of the file's sections.
pub fn variable_names() -> impl Iterator<Item = String> {
    OVERRIDES.iter().map(|(field, _)| variable_name(field))
}

/// Applies every `RATEMESH_` variable of `vars` to `raw`; other variables are ignored.
pub(super) fn apply<I, K, V>(raw: &mut RawConfig, vars: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    for (name, value) in vars {
        let name = name.as_ref().to_string_lossy();
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        let variable = name.as_ref();
        let Some((field, locate)) = OVERRIDES.iter().find(|(field, _)| variable_name(field) == variable)
        else {
            return Err(ConfigError::UnknownVariable { variable: variable.to_owned() });
        };
        let text = value.as_ref().to_str().ok_or_else(|| ConfigError::Invalid {
            location: Location::Env { variable: variable.to_owned() },
            field: (*field).to_owned(),
            message: "not valid UTF-8".to_owned(),
        })?;
        let value = EnvValue { variable, field, text };
        match locate(raw) {
            Slot::Number(slot) => *slot = Some(value.number()?),
            Slot::Text(slot) => *slot = Some(value.string()),
            Slot::List(slot) => *slot = Some(value.list()),
        }
    }
    Ok(())
}
