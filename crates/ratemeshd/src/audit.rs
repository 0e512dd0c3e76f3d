//! The audit as the daemon shows it (`GET /v1/audit`, the `ratemesh_audit_*` metrics,
//! `ratemeshd audit`): figures named by policy, and the ratios an operator reads.
//!
//! A configured policy is audited in the group of its name
//! ([`ratemesh::NamedPolicy::audit_group`]), its tiers and overrides with it; inline limits (HTTP
//! bodies, Envoy descriptors of the drop-in mode, RESP) are audited in group 0, shown as
//! [`INLINE_LABEL`]. A group no policy of the running configuration has (a policy a reload
//! removed, its windows still in the last minute) is not shown.

use std::time::Duration;

use ratemesh::AuditSums;

use crate::config::INLINE_LABEL;
use crate::policy::PolicyTable;

/// The name the figures of `group` are shown under: its policy's, [`INLINE_LABEL`] for group 0,
/// `None` for a group no policy of `table` has.
pub fn policy_label(table: &PolicyTable, group: u64) -> Option<&str> {
    match group {
        0 => Some(INLINE_LABEL),
        group => table.by_audit_group(group).map(|entry| entry.name.as_str()),
    }
}

/// The audit group of what `GET /v1/audit?policy=NAME` names: the policy's, 0 for
/// [`INLINE_LABEL`]; `None` for a name `table` does not have.
pub fn group_of(table: &PolicyTable, name: &str) -> Option<u64> {
    match name {
        INLINE_LABEL => Some(0),
        name => table.get(name).map(|_| ratemesh::NamedPolicy::audit_group(name)),
    }
}

/// The ratios of some sums: `(admitted_over_limit, over_admission, false_refusal)`.
///
/// - `admitted_over_limit`: the worst key window's admitted hits over that window's limit (0
///   without a complete window);
/// - `over_admission`: the hits admitted above the ideal, window by window (`Σ max(0, admitted −
///   ideal)`), over the ideal's (0 when the ideal admitted nothing): an excess in one window is
///   not netted against a bucket paying it back in the next;
/// - `false_refusal`: hits refused that the ideal would have admitted, over the hits that
///   arrived (0 when none arrived).
pub fn ratios(sums: &AuditSums) -> (f64, f64, f64) {
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let worst = sums.worst.map_or(0.0, |(admitted, limit)| ratio(admitted, limit));
    let over = ratio(sums.over_admitted, sums.ideal);
    (worst, over, ratio(sums.false_refused, sums.arrivals))
}

/// A window length as the `window` label: seconds, shortest form (`1`, `0.5`, `60`).
pub fn window_label(window: Duration) -> String {
    format!("{}", window.as_secs_f64())
}

/// A window length in whole milliseconds (the JSON's `window_ms`).
pub fn window_ms(window: Duration) -> u64 {
    u64::try_from(window.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_zero_without_a_denominator_and_never_negative() {
        let none = AuditSums::default();
        assert_eq!(ratios(&none), (0.0, 0.0, 0.0));
        let sums = AuditSums {
            key_windows: 3,
            admitted: 330,
            ideal: 300,
            arrivals: 600,
            over_admitted: 40,
            false_refused: 12,
            worst: Some((130, 100)),
        };
        let (worst, over, false_refusal) = ratios(&sums);
        assert_eq!((worst, over, false_refusal), (1.3, 40.0 / 300.0, 0.02));
        let paid_back = AuditSums { admitted: 290, ..sums };
        assert_eq!(ratios(&paid_back).1, 40.0 / 300.0, "an excess is not netted against a later payback");
        let none_over = AuditSums { over_admitted: 0, ..sums };
        assert_eq!(ratios(&none_over).1, 0.0);
        assert_eq!(window_label(Duration::from_secs(1)), "1");
        assert_eq!(window_label(Duration::from_millis(500)), "0.5");
        assert_eq!(window_label(Duration::from_secs(3600)), "3600");
    }
}
