//! Every limiting algorithm, tested through the public API only.
//!
//! - `model`: deliberately naive reference models, one per algorithm, and the meaning of each
//!   [`ratemesh_core::Decision`] field written once on top of them (searches, not formulas).
//! - `props`: the implementation against the models on random operation sequences; exact
//!   `retry_after`; traffic envelopes (no window of length `period` over the limit, …); `fresh_at`.
//! - `edges`: table-driven edge cases, one line each, through a small script language.
//! - `snapshot`: export/import and join (commutative, idempotent, associative, never looser).
//! - `robust`: arbitrary `u64` inputs to every operation never panic.
//! - `validation`: the `Limit::new` error table.

mod edges;
mod generate;
mod model;
mod props;
mod robust;
mod snapshot;
mod validation;

use proptest::test_runner::{Config, FileFailurePersistence};

/// The proptest configuration of this file: `cases` cases, failures saved beside the source.
fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}
