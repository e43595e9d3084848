//! Heap growth of a shared root, keeping data: a collective step (stage Agree) in which the
//! ranks agree on the largest need and apply the growth factor (capped by the consumer's
//! declared maximum budget), then a restart of the runtime with the bigger heap on behalf of
//! every consumer — the replacement list is built from the consumers' allocations, each one
//! preserved (its bytes are in its replacement after the growth, on every PE).
//!
//! Fault points (test builds): `grow:<Stage>:<root rank>:<action>` for every stage of
//! [`Stage::GROW`].

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::guard::guarded;
use super::lease::Lease;
use super::recovery::{classify, with_hint};
use super::restart::{restart_as, Replacement};
use super::root_channel;
use super::shared_root::{allocation_budget, show_bytes, Owned, Phase, HEAP_ROUNDING};
use super::stage::{self, Stage, StageFailure, StageTimings};
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::registry::{on_behalf_of_consumer, set_managed, GROWTH_CHECK};
use crate::shmem::{AllocationId, AllocationRecord, AllocationSpec};

/// The growth factor of a shared root unless set otherwise.
pub const DEFAULT_GROWTH_FACTOR: f64 = 2.0;

/// One growth, as [`super::SharedRootState`] shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrowthRecord {
    /// 1 for the first growth of the root, and so on.
    pub epoch: usize,
    /// The consumer that needed it.
    pub consumer: String,
    /// Heap bytes per PE before.
    pub from_bytes: u64,
    /// Heap bytes per PE after.
    pub to_bytes: u64,
    /// The consumer's budget before.
    pub budget_from_bytes: u64,
    /// The consumer's budget after.
    pub budget_to_bytes: u64,
    /// Bytes per PE carried over into the new heap.
    pub preserved_bytes: u64,
    /// Allocations replaced (every consumer's).
    pub allocations: usize,
    /// How long each stage took.
    pub timings: StageTimings,
}

/// What a growth returns: its record and each replaced allocation's new record.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    /// The growth.
    pub record: GrowthRecord,
    /// (old id, new record) of every allocation of every consumer.
    pub replaced: Vec<(AllocationId, AllocationRecord)>,
}

/// A buffer of a consumer whose first dimension (rows) can grow, keeping its contents:
/// [`GrowableBuffer::ensure_capacity`].
#[derive(Clone, Debug)]
pub struct GrowableBuffer {
    /// The allocation as first made (followed through every growth by [`Lease::current`]).
    origin: AllocationId,
}

/// The call a rank makes (its consumer and buffers; not the amount), as one word: equal on
/// every rank making the same call (the hash is the same in every process of one build).
fn call_hash(need: &Need) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&need.consumer, &need.buffers).hash(&mut hasher);
    hasher.finish() | 1
}

/// What each rank brings to Agree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Need {
    consumer: String,
    /// Budget bytes needed (a budget growth), or rows of the buffers (a buffer growth).
    amount: u64,
    /// The buffers' allocation indices for a buffer growth (empty for a budget growth).
    buffers: Vec<u64>,
}

impl Lease {
    /// Collective: allocates a growable buffer of `spec` (its first dimension is the rows).
    #[track_caller]
    pub fn allocate_growable(&self, spec: &AllocationSpec) -> Result<GrowableBuffer> {
        let site = std::panic::Location::caller();
        self.allocate_growable_from(spec, &format!("{}:{}", site.file(), site.line()))
    }

    /// [`Lease::allocate_growable`] for a front in another language (see
    /// [`Lease::allocate_spec_from`]).
    pub fn allocate_growable_from(
        &self,
        spec: &AllocationSpec,
        site: &str,
    ) -> Result<GrowableBuffer> {
        if spec.shape.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "allocate",
                "a growable buffer needs a shape with at least one dimension (its rows)",
            ));
        }
        let record = self.allocate_spec_from(spec, site)?;
        Ok(GrowableBuffer { origin: record.id })
    }

    /// The live record of allocation `id`, following it through every growth since it was
    /// made (a growth replaces every allocation).
    pub fn current(&self, id: AllocationId) -> Result<AllocationRecord> {
        let inner = self.shared.inner.lock();
        inner.check_active("current")?;
        let id = inner.follow(id);
        inner
            .consumers
            .iter()
            .find_map(|c| c.owned.get(&id.index).filter(|o| o.record.id == id))
            .map(|o| o.record.clone())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DoubleFree,
                    "current",
                    format!("allocation {} has been freed", id.index),
                )
            })
    }

    /// Collective: makes this consumer's budget at least the largest `need_budget_bytes` of
    /// any rank (times the growth factor, capped by its maximum budget), growing the heap for
    /// every consumer and keeping every allocation's data. `None` when the budget already
    /// covers every rank's need (nothing happens then).
    pub fn grow(&self, need_budget_bytes: u64) -> Result<Option<Growth>> {
        self.grow_for(need_budget_bytes, &[])
    }

    /// Collective: makes every one of `buffers` (growable buffers of this consumer) hold at
    /// least the largest `rows` of any rank, in one growth; see
    /// [`GrowableBuffer::ensure_capacity`].
    pub fn ensure_capacity(
        &self,
        buffers: &[&GrowableBuffer],
        rows: usize,
    ) -> Result<Option<Growth>> {
        let origins: Vec<AllocationId> = buffers.iter().map(|b| b.origin).collect();
        self.grow_for(rows as u64, &origins)
    }

    fn grow_for(&self, amount: u64, buffers: &[AllocationId]) -> Result<Option<Growth>> {
        const OP: &str = "grow";
        let _collective = self.shared.collective.lock();
        let started = Instant::now();
        let (local, buffers) = {
            let inner = self.shared.inner.lock();
            let buffers: Vec<AllocationId> = buffers.iter().map(|id| inner.follow(*id)).collect();
            let local = inner
                .check_lease(OP, self.consumer, self.generation)
                .map(|()| Need {
                    consumer: inner.consumers[self.consumer].spec.name.clone(),
                    amount,
                    buffers: buffers.iter().map(|id| id.index).collect(),
                });
            (local, buffers)
        };
        if self.covered_everywhere(&local, &buffers)? {
            return Ok(None);
        }
        // Without a runtime (the root failed) the local check's own error says why.
        let channel = match root_channel(OP) {
            Ok(channel) => channel,
            Err(error) => return Err(local.err().unwrap_or(error)),
        };
        let values = stage::run(
            channel.as_ref(),
            OP,
            Stage::Agree,
            false,
            || local.map_err(Into::into),
            // The test-only `differ` fault: this rank names another consumer.
            |need| need.consumer.push('~'),
        );
        let values = values.map_err(|failure| self.failed(failure))?;
        let plan = self
            .plan(&values, &buffers)
            .map_err(|e| with_hint(e, OP, Recovery::Retryable, Some(Stage::Agree)))?;
        let agree_ms = started.elapsed().as_secs_f64() * 1e3;
        let Some(plan) = plan else {
            return Ok(None);
        };
        let replacements: Vec<Replacement> = plan
            .owners
            .iter()
            .zip(&plan.targets)
            .map(|((_, owned), target)| Replacement {
                current: owned.record.region(),
                target: target.clone(),
                preserve: true,
            })
            .collect();
        let preserved_bytes = replacements
            .iter()
            .map(|r| r.current.bytes.min(r.target.bytes().unwrap_or(0)))
            .sum();
        let result = on_behalf_of_consumer(|| restart_as(OP, plan.heap, &replacements, None));
        let mut result = result.inspect_err(|error| {
            if error.recovery() != Some(Recovery::Retryable) {
                set_managed(None, None);
                self.shared.inner.lock().phase = Phase::Failed(error.to_string());
            }
        })?;
        result.timings.agree_ms = agree_ms;
        let mut inner = self.shared.inner.lock();
        let entry = &mut inner.consumers[self.consumer];
        let budget_from_bytes = entry.budget;
        entry.budget = plan.budget;
        for consumer in &mut inner.consumers {
            consumer.owned.clear();
        }
        let mut replaced = Vec::with_capacity(plan.owners.len());
        for ((owner, old), new) in plan.owners.iter().zip(&result.allocations) {
            inner.consumers[*owner].owned.insert(
                new.id.index,
                Owned {
                    record: new.clone(),
                    billed: allocation_budget(&new.spec)?,
                },
            );
            inner
                .moved
                .insert((old.record.id.index, old.record.id.generation), new.id);
            replaced.push((old.record.id, new.clone()));
        }
        let record = GrowthRecord {
            epoch: inner.growths.len() + 1,
            consumer: inner.consumers[self.consumer].spec.name.clone(),
            from_bytes: inner.heap_size,
            to_bytes: plan.heap,
            budget_from_bytes,
            budget_to_bytes: plan.budget,
            preserved_bytes,
            allocations: replacements.len(),
            timings: result.timings,
        };
        inner.heap_size = plan.heap;
        inner.growths.push(record.clone());
        tracing::debug!(
            "grow: heap {} -> {} for consumer {}: {:?}",
            show_bytes(record.from_bytes),
            show_bytes(record.to_bytes),
            record.consumer,
            record.timings
        );
        Ok(Some(Growth { record, replaced }))
    }

    /// The quick agreement of a growth that no rank needs, before the Agree stage: every rank
    /// publishes which call it makes and whether its own need is covered, through the heap's
    /// argument words (one shared-memory barrier on one host; the runtime's control plane
    /// across hosts) instead of a round over the root's channel — an MoE layer asks on every
    /// step, and under torch.distributed that channel is a gloo collective. True when every
    /// rank made the same call and every need is covered: nothing to do. Otherwise every rank
    /// goes on to Agree, which decides (and reports a mismatch or a lease error) as before.
    fn covered_everywhere(&self, local: &Result<Need>, buffers: &[AllocationId]) -> Result<bool> {
        let (call, covered) = match local {
            Ok(need) => (call_hash(need), self.covered(need, buffers)),
            Err(_) => (0, false),
        };
        let all = guarded(GROWTH_CHECK, |shmem| {
            shmem.exchange_words(GROWTH_CHECK, [call, u64::from(covered), 0])
        })
        .map_err(|error| self.failed(StageFailure::Convergence(error)))?;
        Ok(all.iter().all(|words| words[0] == call && words[1] == 1))
    }

    /// Whether this rank's own `need` is covered already (a budget, or every buffer's rows).
    fn covered(&self, need: &Need, buffers: &[AllocationId]) -> bool {
        let inner = self.shared.inner.lock();
        let entry = &inner.consumers[self.consumer];
        if buffers.is_empty() {
            return need.amount <= entry.budget;
        }
        buffers.iter().all(|id| {
            entry
                .owned
                .get(&id.index)
                .filter(|o| o.record.id == *id)
                .is_some_and(|o| o.record.spec.shape[0] as u64 >= need.amount)
        })
    }

    /// A failure of Agree, classified as a lifecycle stage failure (a lost peer invalidates the
    /// lifecycle and ends the root).
    fn failed(&self, failure: StageFailure) -> Error {
        let error = classify("grow", Stage::Agree, failure, false);
        if error.recovery() != Some(Recovery::Retryable) {
            set_managed(None, None);
            self.shared.inner.lock().phase = Phase::Failed(error.to_string());
        }
        error
    }

    /// The growth every rank computes alike from the agreed needs, or `None` if nothing needs
    /// to grow.
    fn plan(&self, needs: &[Need], buffers: &[AllocationId]) -> Result<Option<Plan>> {
        const OP: &str = "grow";
        let groups = super::hook::group_ranks(needs, |a, b| {
            a.consumer == b.consumer && a.buffers == b.buffers
        });
        if groups.len() > 1 {
            let listing: Vec<String> = groups
                .iter()
                .map(|(ranks, first)| {
                    let need = &needs[*first];
                    let what = match need.buffers.as_slice() {
                        [] => "its budget".to_string(),
                        buffers => format!("buffers {buffers:?}"),
                    };
                    format!(
                        "root_ranks={ranks:?}: consumer {} grows {what}",
                        need.consumer
                    )
                })
                .collect();
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "the ranks grow different things: {}; every rank must make the same growth \
                     call",
                    listing.join("; ")
                ),
            ));
        }
        let largest = needs.iter().map(|n| n.amount).max().unwrap_or(0);
        let inner = self.shared.inner.lock();
        let factor = inner.growth_factor;
        let entry = &inner.consumers[self.consumer];
        let name = &entry.spec.name;
        let cap = entry.spec.max_budget_bytes.unwrap_or(u64::MAX);
        let scaled = |amount: u64| ((amount as f64) * factor).ceil() as u64;
        let mut grown: BTreeMap<u64, AllocationSpec> = BTreeMap::new();
        let budget = if buffers.is_empty() {
            if largest <= entry.budget {
                return Ok(None);
            }
            if largest > cap {
                return Err(over_cap(name, largest, cap));
            }
            largest.max(scaled(entry.budget)).min(cap)
        } else {
            let mut growing = Vec::new();
            for id in buffers {
                let owned = entry.owned.get(&id.index).filter(|o| o.record.id == *id);
                let owned = owned.ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        OP,
                        format!(
                            "the growable buffer (allocation {}) is not a live allocation of \
                             consumer {name}",
                            id.index
                        ),
                    )
                })?;
                if (owned.record.spec.shape[0] as u64) < largest {
                    growing.push(owned);
                }
            }
            if growing.is_empty() {
                return Ok(None);
            }
            let kept = entry.used() - growing.iter().map(|o| o.billed).sum::<u64>();
            // Each growing buffer to `rows(its rows)`: its budget need and new specs.
            let resized =
                |rows: &dyn Fn(u64) -> u64| -> Result<(u64, BTreeMap<u64, AllocationSpec>)> {
                    let mut need = kept;
                    let mut specs = BTreeMap::new();
                    for owned in &growing {
                        let mut spec = owned.record.spec.clone();
                        let now = spec.shape[0] as u64;
                        spec.shape[0] = usize::try_from(rows(now)).unwrap_or(usize::MAX);
                        need = need.saturating_add(allocation_budget(&spec)?);
                        specs.insert(owned.record.id.index, spec);
                    }
                    Ok((need, specs))
                };
            let (mut need, mut specs) = resized(&|rows| largest.max(scaled(rows)))?;
            if need > cap {
                (need, specs) = resized(&|_| largest)?;
            }
            if need > cap {
                return Err(over_cap(name, need, cap));
            }
            grown = specs;
            need.max(entry.budget)
        };
        let others: u64 = inner
            .consumers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.consumer)
            .map(|(_, c)| c.budget)
            .sum();
        let total = others.saturating_add(budget);
        let heap = total
            .div_ceil(HEAP_ROUNDING)
            .saturating_mul(HEAP_ROUNDING)
            .max(inner.heap_size);
        let mut owners = Vec::new();
        let mut targets = Vec::new();
        for (index, consumer) in inner.consumers.iter().enumerate() {
            for owned in consumer.owned.values() {
                let target = grown
                    .get(&owned.record.id.index)
                    .unwrap_or(&owned.record.spec)
                    .clone();
                owners.push((index, owned.clone()));
                targets.push(target);
            }
        }
        Ok(Some(Plan {
            heap,
            budget,
            owners,
            targets,
        }))
    }
}

fn over_cap(name: &str, need: u64, cap: u64) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        "grow",
        format!(
            "consumer {name} needs a budget of {} but its declared maximum is {}; declare a \
             larger max_budget_bytes, or need less",
            show_bytes(need),
            show_bytes(cap)
        ),
    )
}

/// A growth every rank agreed on.
struct Plan {
    heap: u64,
    budget: u64,
    /// (consumer index, allocation) of every allocation, in replacement order.
    owners: Vec<(usize, Owned)>,
    targets: Vec<AllocationSpec>,
}

impl GrowableBuffer {
    /// The buffer's live record (after any number of growths).
    pub fn record(&self, lease: &Lease) -> Result<AllocationRecord> {
        lease.current(self.origin)
    }

    /// Collective: makes the buffer hold at least the largest `rows` of any rank. If it does
    /// not yet, its rows grow to that times the growth factor (fewer if the consumer's maximum
    /// budget allows only the need), the heap grows for every consumer, and every allocation's
    /// data is kept (this buffer's existing rows included). `None` when nothing had to grow.
    pub fn ensure_capacity(&self, lease: &Lease, rows: usize) -> Result<Option<Growth>> {
        lease.ensure_capacity(&[self], rows)
    }
}
