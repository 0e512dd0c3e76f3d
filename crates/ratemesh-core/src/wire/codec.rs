//! The serialized form of a frame: the types postcard writes, and the conversions from and to the
//! message types of `wire`.
//!
//! A frame is its header and a list of sections, each a tag and its items; only non-empty
//! sections are written, in a fixed order, and the first is the table of the limits the items
//! refer to (in order of first use; an item names its limit by index). Key hashes are 16 fixed
//! bytes. Algorithms are codes: their position in [`Algorithm::ALL`] (a new algorithm is added at
//! the end).

use crate::prelude::*;
use serde::{Deserialize, Serialize};

use super::{
    Adjust, AdjustKind, AuditPiece, Body, CalendarWire, Decided, ForwardCheck, Frame, Grant, KeyState,
    LimitWire, RegionGrant, RegionReport, Release, Report, SnapshotWire, WireError, WireMode,
};
use crate::limit::Algorithm;
use crate::region::{PolicyRegion, RegionFallback, RegionId};

/// A frame as postcard writes it.
#[derive(Serialize, Deserialize)]
pub(super) struct FrameWire {
    from: u64,
    incarnation: u64,
    seq: u64,
    ack: u64,
    sack: u64,
    una: u64,
    sections: Vec<Section>,
}

/// One section of a frame.
#[derive(Serialize, Deserialize)]
enum Section {
    Limits(Vec<LimitCode>),
    Forward(Vec<ForwardItem>),
    Decided(Vec<Decided>),
    Report(Vec<ReportItem>),
    Grant(Vec<GrantItem>),
    Handoff(Vec<StateItem>),
    Replica(Vec<StateItem>),
    Release(Vec<ReleaseItem>),
    /// Added last: frames without adjustments keep their bytes.
    Adjust(Vec<AdjustItem>),
    /// Added after it, likewise (only clusters of several regions send them).
    RegionReport(Vec<RegionReportItem>),
    RegionGrant(Vec<RegionGrantItem>),
    /// Added after them, likewise.
    Audit(Vec<AuditItem>),
    /// Added after it, likewise: the terms between regions of the items that carry a policy's
    /// limit (forwards, reports, handoffs, replicas, region reports and grants) where they are
    /// not the defaults (a policy's pinned home region or its own fallback), by position.
    RegionTerms(Vec<RegionTermsItem>),
    /// Added after it, likewise: the sender's clock of a frame with audit pieces
    /// ([`Body::audit_clock_nanos`]).
    AuditClock(u64),
}

/// The region terms of one item that carries a policy's limit ([`PolicyRegion`]).
#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct RegionTermsItem {
    /// The section of the item.
    of: TermsOf,
    /// Its position in its section.
    index: u32,
    home_region: Option<u64>,
    fallback: Option<FallbackCode>,
}

/// The sections whose items carry region terms.
#[derive(Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
enum TermsOf {
    Forward,
    Report,
    RegionReport,
    RegionGrant,
    Handoff,
    Replica,
}

/// [`RegionFallback`] on the wire.
#[derive(Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
enum FallbackCode {
    Last,
    Floor,
    Closed,
}

impl FallbackCode {
    fn of(fallback: RegionFallback) -> FallbackCode {
        match fallback {
            RegionFallback::Last => FallbackCode::Last,
            RegionFallback::Floor => FallbackCode::Floor,
            RegionFallback::Closed => FallbackCode::Closed,
        }
    }

    fn fallback(self) -> RegionFallback {
        match self {
            FallbackCode::Last => RegionFallback::Last,
            FallbackCode::Floor => RegionFallback::Floor,
            FallbackCode::Closed => RegionFallback::Closed,
        }
    }
}

/// The terms items of a body's items, in section order, the default ones left out.
fn region_terms(body: &Body) -> Vec<RegionTermsItem> {
    let sections = [
        (TermsOf::Forward, body.forward.iter().map(|f| f.region).collect::<Vec<_>>()),
        (TermsOf::Report, body.report.iter().map(|r| r.region).collect()),
        (TermsOf::RegionReport, body.region_report.iter().map(|r| r.region).collect()),
        (TermsOf::RegionGrant, body.region_grant.iter().map(|g| g.region).collect()),
        (TermsOf::Handoff, body.handoff.iter().map(|s| s.region).collect()),
        (TermsOf::Replica, body.replica.iter().map(|s| s.region).collect()),
    ];
    let mut items = Vec::new();
    for (of, terms) in sections {
        for (index, region) in terms.into_iter().enumerate() {
            if region != PolicyRegion::default() {
                items.push(RegionTermsItem {
                    of,
                    // A frame holds far fewer items than u32::MAX (each takes bytes).
                    index: index as u32,
                    home_region: region.home.map(|r| r.0),
                    fallback: region.fallback.map(FallbackCode::of),
                });
            }
        }
    }
    items
}

/// Puts terms items on the body's items (decoded before them); one naming no item is not an
/// encoding [`region_terms`] makes.
fn apply_region_terms(body: &mut Body, items: Vec<RegionTermsItem>) -> Result<(), WireError> {
    for item in items {
        let index = item.index as usize;
        let target = match item.of {
            TermsOf::Forward => body.forward.get_mut(index).map(|f| &mut f.region),
            TermsOf::Report => body.report.get_mut(index).map(|r| &mut r.region),
            TermsOf::Handoff => body.handoff.get_mut(index).map(|s| &mut s.region),
            TermsOf::Replica => body.replica.get_mut(index).map(|s| &mut s.region),
            TermsOf::RegionReport => body.region_report.get_mut(index).map(|r| &mut r.region),
            TermsOf::RegionGrant => body.region_grant.get_mut(index).map(|g| &mut g.region),
        };
        *target.ok_or(WireError::NonCanonical)? = PolicyRegion {
            home: item.home_region.map(RegionId),
            fallback: item.fallback.map(FallbackCode::fallback),
        };
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct AuditItem {
    key: [u8; 16],
    group: u64,
    window_nanos: u64,
    first_age_nanos: u64,
    last_age_nanos: u64,
    admitted: u64,
    refused: u64,
}

#[derive(Serialize, Deserialize)]
struct RegionReportItem {
    key: [u8; 16],
    limit: u32,
    demand_per_s: u64,
    report_count: u64,
    applied_seq: u64,
    applied_part: u64,
}

#[derive(Serialize, Deserialize)]
struct RegionGrantItem {
    key: [u8; 16],
    limit: u32,
    seq: u64,
    part: u64,
    lease_nanos: u64,
    report_count: u64,
    first: bool,
}

#[derive(Serialize, Deserialize)]
struct LimitCode {
    algorithm: u8,
    limit: u64,
    period_nanos: u64,
    burst: Option<u64>,
    delay: Option<u64>,
    calendar: Option<CalendarWire>,
}

#[derive(Serialize, Deserialize)]
struct ForwardItem {
    id: u64,
    key: [u8; 16],
    limit: u32,
    cost: u64,
    mode: WireMode,
    refused_here: u64,
}

#[derive(Serialize, Deserialize)]
struct ReportItem {
    key: [u8; 16],
    limit: u32,
    epoch: u64,
    holding: u64,
    granted_seen: u64,
    uncovered: u64,
    returned: u64,
    refunded: u64,
    demand_per_s: u64,
    seed: Option<SnapshotWire>,
}

#[derive(Serialize, Deserialize)]
struct GrantItem {
    key: [u8; 16],
    epoch: u64,
    state: SnapshotWire,
    grant: u64,
    hold_max: u64,
    contended: bool,
    expires_in_nanos: Option<u64>,
    lease: bool,
}

#[derive(Serialize, Deserialize)]
struct StateItem {
    key: [u8; 16],
    limit: u32,
    state: SnapshotWire,
}

#[derive(Serialize, Deserialize)]
struct ReleaseItem {
    key: [u8; 16],
    limit: u32,
    lease: u64,
}

#[derive(Serialize, Deserialize)]
struct AdjustItem {
    id: u64,
    key: [u8; 16],
    limit: u32,
    kind: AdjustKind,
    hits: u64,
    mode: WireMode,
}

/// The limits of one frame being encoded, in order of first use.
#[derive(Default)]
struct Table(Vec<LimitWire>);

impl Table {
    fn index(&mut self, limit: &LimitWire) -> u32 {
        let at = self.0.iter().position(|known| known == limit).unwrap_or_else(|| {
            self.0.push(limit.clone());
            self.0.len() - 1
        });
        // A frame holds far fewer than 2^32 items.
        u32::try_from(at).unwrap_or(u32::MAX)
    }
}

/// The limits of one frame being decoded.
struct Limits(Vec<LimitWire>);

impl Limits {
    fn get(&self, index: u32) -> Result<LimitWire, WireError> {
        let found = usize::try_from(index).ok().and_then(|at| self.0.get(at));
        found.cloned().ok_or(WireError::LimitIndex { index, len: self.0.len() })
    }
}

fn key_bytes(key: u128) -> [u8; 16] {
    key.to_le_bytes()
}

impl FrameWire {
    pub(super) fn from_frame(frame: &Frame) -> FrameWire {
        let body = &frame.body;
        let mut table = Table::default();
        let forward: Vec<ForwardItem> = body
            .forward
            .iter()
            .map(|c| ForwardItem {
                id: c.id,
                key: key_bytes(c.key),
                limit: table.index(&c.limit),
                cost: c.cost,
                mode: c.mode,
                refused_here: c.refused_here,
            })
            .collect();
        let report: Vec<ReportItem> = body
            .report
            .iter()
            .map(|r| ReportItem {
                key: key_bytes(r.key),
                limit: table.index(&r.limit),
                epoch: r.epoch,
                holding: r.holding,
                granted_seen: r.granted_seen,
                uncovered: r.uncovered,
                returned: r.returned,
                refunded: r.refunded,
                demand_per_s: r.demand_per_s,
                seed: r.seed.clone(),
            })
            .collect();
        let grant: Vec<GrantItem> = body
            .grant
            .iter()
            .map(|g| GrantItem {
                key: key_bytes(g.key),
                epoch: g.epoch,
                state: g.state.clone(),
                grant: g.grant,
                hold_max: g.hold_max,
                contended: g.contended,
                expires_in_nanos: g.expires_in_nanos,
                lease: g.lease,
            })
            .collect();
        let mut states = |states: &[KeyState]| -> Vec<StateItem> {
            let item = |s: &KeyState| StateItem { key: key_bytes(s.key), limit: 0, state: s.state.clone() };
            states.iter().map(|s| StateItem { limit: table.index(&s.limit), ..item(s) }).collect()
        };
        let handoff = states(&body.handoff);
        let replica = states(&body.replica);
        let release: Vec<ReleaseItem> = body
            .release
            .iter()
            .map(|r| ReleaseItem { key: key_bytes(r.key), limit: table.index(&r.limit), lease: r.lease })
            .collect();
        let adjust: Vec<AdjustItem> = body
            .adjust
            .iter()
            .map(|a| AdjustItem {
                id: a.id,
                key: key_bytes(a.key),
                limit: table.index(&a.limit),
                kind: a.kind,
                hits: a.hits,
                mode: a.mode,
            })
            .collect();
        let region_report: Vec<RegionReportItem> = body
            .region_report
            .iter()
            .map(|r| RegionReportItem {
                key: key_bytes(r.key),
                limit: table.index(&r.limit),
                demand_per_s: r.demand_per_s,
                report_count: r.report_count,
                applied_seq: r.applied_seq,
                applied_part: r.applied_part,
            })
            .collect();
        let region_grant: Vec<RegionGrantItem> = body
            .region_grant
            .iter()
            .map(|g| RegionGrantItem {
                key: key_bytes(g.key),
                limit: table.index(&g.limit),
                seq: g.seq,
                part: g.part,
                lease_nanos: g.lease_nanos,
                report_count: g.report_count,
                first: g.first,
            })
            .collect();
        let audit: Vec<AuditItem> = body
            .audit
            .iter()
            .map(|a| AuditItem {
                key: key_bytes(a.key),
                group: a.group,
                window_nanos: a.window_nanos,
                first_age_nanos: a.first_age_nanos,
                last_age_nanos: a.last_age_nanos,
                admitted: a.admitted,
                refused: a.refused,
            })
            .collect();
        let region_terms = region_terms(body);
        let limits: Vec<LimitCode> = table.0.iter().map(LimitCode::from_limit).collect();
        // Sections in a fixed order, the empty ones left out.
        let candidates = [
            (limits.is_empty(), Section::Limits(limits)),
            (forward.is_empty(), Section::Forward(forward)),
            (body.decided.is_empty(), Section::Decided(body.decided.clone())),
            (report.is_empty(), Section::Report(report)),
            (grant.is_empty(), Section::Grant(grant)),
            (handoff.is_empty(), Section::Handoff(handoff)),
            (replica.is_empty(), Section::Replica(replica)),
            (release.is_empty(), Section::Release(release)),
            (adjust.is_empty(), Section::Adjust(adjust)),
            (region_report.is_empty(), Section::RegionReport(region_report)),
            (region_grant.is_empty(), Section::RegionGrant(region_grant)),
            (audit.is_empty(), Section::Audit(audit)),
            (region_terms.is_empty(), Section::RegionTerms(region_terms)),
            (body.audit_clock_nanos.is_none(), Section::AuditClock(body.audit_clock_nanos.unwrap_or(0))),
        ];
        let sections = candidates.into_iter().filter(|(empty, _)| !empty).map(|(_, s)| s).collect();
        FrameWire {
            from: frame.from,
            incarnation: frame.incarnation,
            seq: frame.seq,
            ack: frame.ack,
            sack: frame.sack,
            una: frame.una,
            sections,
        }
    }

    /// The frame, with every limit index resolved (the canonical form is checked by the caller).
    pub(super) fn into_frame(self) -> Result<Frame, WireError> {
        let mut limits = Limits(Vec::new());
        let mut body = Body::default();
        for section in self.sections {
            match section {
                Section::Limits(codes) => {
                    limits.0 = codes.into_iter().map(LimitCode::into_limit).collect::<Result<_, _>>()?;
                }
                Section::Forward(items) => {
                    body.forward =
                        items.into_iter().map(|i| i.into_check(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Decided(items) => body.decided = items,
                Section::Report(items) => {
                    body.report =
                        items.into_iter().map(|i| i.into_report(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Grant(items) => body.grant = items.into_iter().map(GrantItem::into_grant).collect(),
                Section::Handoff(items) => {
                    body.handoff =
                        items.into_iter().map(|i| i.into_state(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Replica(items) => {
                    body.replica =
                        items.into_iter().map(|i| i.into_state(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Release(items) => {
                    body.release =
                        items.into_iter().map(|i| i.into_release(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Adjust(items) => {
                    body.adjust =
                        items.into_iter().map(|i| i.into_adjust(&limits)).collect::<Result<_, _>>()?;
                }
                Section::RegionReport(items) => {
                    body.region_report =
                        items.into_iter().map(|i| i.into_report(&limits)).collect::<Result<_, _>>()?;
                }
                Section::RegionGrant(items) => {
                    body.region_grant =
                        items.into_iter().map(|g| g.into_grant(&limits)).collect::<Result<_, _>>()?;
                }
                Section::Audit(items) => {
                    body.audit = items
                        .into_iter()
                        .map(|a| AuditPiece {
                            key: u128::from_le_bytes(a.key),
                            group: a.group,
                            window_nanos: a.window_nanos,
                            first_age_nanos: a.first_age_nanos,
                            last_age_nanos: a.last_age_nanos,
                            admitted: a.admitted,
                            refused: a.refused,
                        })
                        .collect();
                }
                Section::RegionTerms(items) => apply_region_terms(&mut body, items)?,
                Section::AuditClock(nanos) => body.audit_clock_nanos = Some(nanos),
            }
        }
        Ok(Frame {
            from: self.from,
            incarnation: self.incarnation,
            seq: self.seq,
            ack: self.ack,
            sack: self.sack,
            una: self.una,
            body,
        })
    }
}

impl LimitCode {
    fn from_limit(limit: &LimitWire) -> LimitCode {
        let code = Algorithm::ALL.iter().position(|&a| a == limit.algorithm).unwrap_or(0);
        LimitCode {
            // Eight algorithms: the position fits a byte.
            algorithm: u8::try_from(code).unwrap_or(u8::MAX),
            limit: limit.limit,
            period_nanos: limit.period_nanos,
            burst: limit.burst,
            delay: limit.delay,
            calendar: limit.calendar,
        }
    }

    fn into_limit(self) -> Result<LimitWire, WireError> {
        let algorithm = *Algorithm::ALL
            .get(usize::from(self.algorithm))
            .ok_or(WireError::UnknownAlgorithm(self.algorithm))?;
        Ok(LimitWire {
            algorithm,
            limit: self.limit,
            period_nanos: self.period_nanos,
            burst: self.burst,
            delay: self.delay,
            calendar: self.calendar,
        })
    }
}

impl ForwardItem {
    fn into_check(self, limits: &Limits) -> Result<ForwardCheck, WireError> {
        Ok(ForwardCheck {
            id: self.id,
            key: u128::from_le_bytes(self.key),
            limit: limits.get(self.limit)?,
            cost: self.cost,
            mode: self.mode,
            refused_here: self.refused_here,
            region: PolicyRegion::default(),
        })
    }
}

impl ReportItem {
    fn into_report(self, limits: &Limits) -> Result<Report, WireError> {
        Ok(Report {
            key: u128::from_le_bytes(self.key),
            limit: limits.get(self.limit)?,
            epoch: self.epoch,
            holding: self.holding,
            granted_seen: self.granted_seen,
            uncovered: self.uncovered,
            returned: self.returned,
            refunded: self.refunded,
            demand_per_s: self.demand_per_s,
            seed: self.seed,
            region: PolicyRegion::default(),
        })
    }
}

impl GrantItem {
    fn into_grant(self) -> Grant {
        Grant {
            key: u128::from_le_bytes(self.key),
            epoch: self.epoch,
            state: self.state,
            grant: self.grant,
            hold_max: self.hold_max,
            contended: self.contended,
            expires_in_nanos: self.expires_in_nanos,
            lease: self.lease,
        }
    }
}

impl StateItem {
    fn into_state(self, limits: &Limits) -> Result<KeyState, WireError> {
        let (key, limit) = (u128::from_le_bytes(self.key), limits.get(self.limit)?);
        Ok(KeyState { key, limit, state: self.state, region: PolicyRegion::default() })
    }
}

impl ReleaseItem {
    fn into_release(self, limits: &Limits) -> Result<Release, WireError> {
        Ok(Release { key: u128::from_le_bytes(self.key), limit: limits.get(self.limit)?, lease: self.lease })
    }
}

impl AdjustItem {
    fn into_adjust(self, limits: &Limits) -> Result<Adjust, WireError> {
        Ok(Adjust {
            id: self.id,
            key: u128::from_le_bytes(self.key),
            limit: limits.get(self.limit)?,
            kind: self.kind,
            hits: self.hits,
            mode: self.mode,
        })
    }
}

impl RegionGrantItem {
    fn into_grant(self, limits: &Limits) -> Result<RegionGrant, WireError> {
        Ok(RegionGrant {
            key: u128::from_le_bytes(self.key),
            limit: limits.get(self.limit)?,
            seq: self.seq,
            part: self.part,
            lease_nanos: self.lease_nanos,
            report_count: self.report_count,
            first: self.first,
            region: PolicyRegion::default(),
        })
    }
}

impl RegionReportItem {
    fn into_report(self, limits: &Limits) -> Result<RegionReport, WireError> {
        Ok(RegionReport {
            key: u128::from_le_bytes(self.key),
            limit: limits.get(self.limit)?,
            demand_per_s: self.demand_per_s,
            report_count: self.report_count,
            applied_seq: self.applied_seq,
            applied_part: self.applied_part,
            region: PolicyRegion::default(),
        })
    }
}

/// A postcard output that compares what is serialized with the bytes a frame was decoded from,
/// without allocating: `true` when every byte matches and none is left over.
pub(super) struct SameAs<'a>(pub(super) &'a [u8]);

impl postcard::ser_flavors::Flavor for SameAs<'_> {
    type Output = bool;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        match self.0.split_first() {
            Some((&expected, rest)) if expected == byte => {
                self.0 = rest;
                Ok(())
            }
            _ => Err(postcard::Error::SerializeBufferFull),
        }
    }

    fn finalize(self) -> postcard::Result<bool> {
        Ok(self.0.is_empty())
    }
}
