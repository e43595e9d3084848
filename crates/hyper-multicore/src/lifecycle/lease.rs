//! The execution lease of a shared root's consumer: the one way its allocations, frees and
//! data-plane calls reach the runtime, each check made locally and then agreed over the root
//! before any collective work.

use std::sync::Arc;

use serde::Serialize;

use super::guard::guarded;
use super::root_channel;
use super::shared_root::{allocation_budget, show_bytes, Owned, Shared};
use crate::control::converge::converge;
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::registry::{bind_lease, on_behalf_of_consumer, set_lease, under_lease};
use crate::shmem::{Allocation, AllocationId, AllocationRecord, AllocationSpec, Element, Shmem};

/// The execution lease of a consumer: its allocations, frees, growth and data-plane calls are
/// made through it. One consumer holds the lease at a time per process; each claim is a new
/// generation, and a lease of an earlier generation is refused. Dropping it releases it.
pub struct Lease {
    pub(super) shared: Arc<Shared>,
    pub(super) consumer: usize,
    pub(super) generation: u64,
}

impl Lease {
    /// The lease's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The consumer's name.
    pub fn consumer(&self) -> String {
        self.shared.inner.lock().consumers[self.consumer]
            .spec
            .name
            .clone()
    }

    /// Releases the lease (refused if it is stale: released already, or of an earlier
    /// generation).
    pub fn release(&self) -> Result<()> {
        let mut inner = self.shared.inner.lock();
        inner.check_lease("release lease", self.consumer, self.generation)?;
        inner.lease = None;
        set_lease(None);
        self.shared.lease_freed.notify_all();
        Ok(())
    }

    /// Runs `f` on the runtime for this consumer (a data-plane or collective call), if the
    /// lease is current. While a shared root is active this is the way to the runtime: a bare
    /// [`guarded`] call is refused unless its thread acts under the lease held (here, or
    /// [`Lease::bind_thread`]).
    pub fn run<R>(&self, operation: &str, f: impl FnOnce(&Shmem) -> Result<R>) -> Result<R> {
        self.shared
            .inner
            .lock()
            .check_lease(operation, self.consumer, self.generation)?;
        under_lease(self.generation, || guarded(operation, f))
    }

    /// Makes the calling thread act under this lease for its bare [`guarded`] calls, until the
    /// lease is released (a later lease is not inherited): for a front in another language
    /// whose data-plane calls reach the runtime through [`guarded`] and are checked against the
    /// lease there (the Python front binds the thread that claims).
    pub fn bind_thread(&self) {
        bind_lease(self.generation);
    }

    /// Collective: allocates `len` elements of `T`, billed to the consumer.
    #[track_caller]
    pub fn allocate<T: Element>(
        &self,
        len: usize,
        alignment: Option<u64>,
    ) -> Result<Allocation<T>> {
        self.allocate_spec(&AllocationSpec::of::<T>(len, alignment))?
            .into_allocation()
    }

    /// Collective: allocates by spec, billed to the consumer. Refused on every rank, before
    /// any collective work, when the lease is stale or the budget would be exceeded on any rank.
    /// At debug log level the allocation is logged with its caller's file and line.
    #[track_caller]
    pub fn allocate_spec(&self, spec: &AllocationSpec) -> Result<AllocationRecord> {
        let site = std::panic::Location::caller();
        self.allocate_spec_from(spec, &format!("{}:{}", site.file(), site.line()))
    }

    /// [`Lease::allocate_spec`] for a front in another language: `site` (its caller's
    /// `file:line`) is what the debug log names.
    pub fn allocate_spec_from(
        &self,
        spec: &AllocationSpec,
        site: &str,
    ) -> Result<AllocationRecord> {
        const OP: &str = "allocate";
        let _collective = self.shared.collective.lock();
        let local = self.billing_check(OP, spec);
        let billed = self.agree(OP, local)?;
        let record = on_behalf_of_consumer(|| self.run(OP, |shmem| shmem.allocate_spec(spec)))?;
        let mut inner = self.shared.inner.lock();
        let entry = &mut inner.consumers[self.consumer];
        tracing::debug!(
            "consumer {}: allocation {} ({} bytes, {billed} billed) allocated at {site}",
            entry.spec.name,
            record.id.index,
            record.bytes
        );
        entry.owned.insert(
            record.id.index,
            Owned {
                record: record.clone(),
                billed,
            },
        );
        Ok(record)
    }

    /// Collective: frees allocation `id` of this consumer. Refused on every rank, before any
    /// collective work, when the lease is stale or another consumer owns it; a free that fails
    /// keeps the bill.
    pub fn free(&self, id: AllocationId) -> Result<()> {
        const OP: &str = "free";
        let _collective = self.shared.collective.lock();
        let local = self.ownership_check(OP, id);
        self.agree(OP, local)?;
        on_behalf_of_consumer(|| self.run(OP, |shmem| shmem.free_id(id)))?;
        let mut inner = self.shared.inner.lock();
        inner.consumers[self.consumer].owned.remove(&id.index);
        Ok(())
    }

    /// Exchanges a local check's outcome over the root: the same verdict on every rank.
    fn agree<T>(&self, operation: &str, local: Result<T>) -> Result<T>
    where
        T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug + PartialEq + Clone,
    {
        // Without a runtime (the root failed) the local check's own error says why.
        let channel = match root_channel(operation) {
            Ok(channel) => channel,
            Err(error) => return Err(local.err().unwrap_or(error)),
        };
        let rank = channel.rank();
        let values = converge(
            channel.as_ref(),
            operation,
            local.map_err(|e| e.on_rank(rank)),
        )?;
        Ok(values[rank].clone())
    }

    /// The budget an allocation of `spec` costs, if the lease is current and it fits.
    fn billing_check(&self, operation: &str, spec: &AllocationSpec) -> Result<u64> {
        let inner = self.shared.inner.lock();
        inner.check_lease(operation, self.consumer, self.generation)?;
        let entry = &inner.consumers[self.consumer];
        let cost = allocation_budget(spec)?;
        let left = entry.budget.saturating_sub(entry.used());
        if cost > left {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "consumer {}: {} requested, {} of {} left; free some of its allocations, \
                     declare a larger budget, or grow it",
                    entry.spec.name,
                    show_bytes(cost),
                    show_bytes(left),
                    show_bytes(entry.budget)
                ),
            ));
        }
        Ok(cost)
    }

    fn ownership_check(&self, operation: &str, id: AllocationId) -> Result<()> {
        let inner = self.shared.inner.lock();
        inner.check_lease(operation, self.consumer, self.generation)?;
        let name = &inner.consumers[self.consumer].spec.name;
        let owner = inner
            .consumers
            .iter()
            .find(|c| c.owned.get(&id.index).is_some_and(|o| o.record.id == id));
        match owner {
            Some(c) if c.spec.name == *name => Ok(()),
            Some(c) => Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "allocation {} is owned by consumer {}; consumer {name} cannot free it",
                    id.index, c.spec.name
                ),
            )),
            None => Err(Error::new(
                ErrorKind::DoubleFree,
                operation,
                format!(
                    "allocation {} is not a live allocation of any consumer (freed already, or \
                     of an earlier heap: a growth replaces every allocation)",
                    id.index
                ),
            )),
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("consumer", &self.consumer)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut inner = self.shared.inner.lock();
        if inner.lease == Some((self.consumer, self.generation)) {
            inner.lease = None;
            set_lease(None);
            self.shared.lease_freed.notify_all();
        }
    }
}
