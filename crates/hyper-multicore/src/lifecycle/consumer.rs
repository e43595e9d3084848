//! A consumer of a shared root: its name, its claim on the execution lease (waiting while
//! another consumer holds it), its close and its allocations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lease::Lease;
use super::shared_root::Shared;
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::registry::set_lease;
use crate::shmem::AllocationRecord;

/// One consumer of a [`SharedRoot`](super::SharedRoot).
#[derive(Clone)]
pub struct Consumer {
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
    pub(super) name: String,
}

impl Consumer {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Claims the execution lease, waiting (up to the runtime's timeout,
    /// `HYPER_MULTICORE_SHMEM_TIMEOUT_SEC`) while another consumer holds it.
    pub fn claim(&self) -> Result<Lease> {
        self.claim_within(None)
    }

    /// Claims the execution lease at once, or fails saying which consumer holds it.
    pub fn try_claim(&self) -> Result<Lease> {
        self.claim_within(Some(Duration::ZERO))
    }

    fn claim_within(&self, wait: Option<Duration>) -> Result<Lease> {
        const OP: &str = "claim";
        let mut inner = self.shared.inner.lock();
        let deadline = Instant::now() + wait.unwrap_or(inner.timeout);
        loop {
            inner.check_active(OP)?;
            if !inner.consumers[self.index].open {
                return Err(closed(OP, &self.name));
            }
            match inner.lease {
                None => break,
                Some((holder, _)) => {
                    let timed_out = Instant::now() >= deadline
                        || self
                            .shared
                            .lease_freed
                            .wait_until(&mut inner, deadline)
                            .timed_out();
                    if timed_out && inner.lease.is_some() {
                        let holder = inner.lease.map_or(holder, |(h, _)| h);
                        let waited = match wait {
                            Some(Duration::ZERO) => String::new(),
                            _ => format!(" (waited {:?})", inner.timeout),
                        };
                        return Err(Error::new(
                            ErrorKind::InvalidState,
                            OP,
                            format!(
                                "consumer {} holds the lease{waited}; consumer {} can claim it \
                                 once that one releases it",
                                inner.consumers[holder].spec.name, self.name
                            ),
                        ));
                    }
                }
            }
        }
        inner.generations += 1;
        let generation = inner.generations;
        inner.lease = Some((self.index, generation));
        set_lease(Some(generation));
        Ok(Lease {
            shared: Arc::clone(&self.shared),
            consumer: self.index,
            generation,
        })
    }

    /// Closes this consumer (refused while it owns allocations or holds the lease).
    /// Idempotent.
    pub fn close(&self) -> Result<()> {
        const OP: &str = "close consumer";
        let mut inner = self.shared.inner.lock();
        let entry = &inner.consumers[self.index];
        if !entry.open {
            return Ok(());
        }
        if !entry.owned.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidState,
                OP,
                format!(
                    "consumer {} still owns allocations {:?}; free them first",
                    self.name,
                    entry.owned.keys().collect::<Vec<_>>()
                ),
            ));
        }
        if inner.lease.is_some_and(|(holder, _)| holder == self.index) {
            return Err(Error::new(
                ErrorKind::InvalidState,
                OP,
                format!("consumer {} holds the lease; release it first", self.name),
            ));
        }
        inner.consumers[self.index].open = false;
        Ok(())
    }

    /// Its live allocations, in index order.
    pub fn allocations(&self) -> Vec<AllocationRecord> {
        let inner = self.shared.inner.lock();
        inner.consumers[self.index]
            .owned
            .values()
            .map(|o| o.record.clone())
            .collect()
    }
}

fn closed(operation: &str, name: &str) -> Error {
    Error::new(
        ErrorKind::InvalidState,
        operation,
        format!("consumer {name} is closed"),
    )
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .finish()
    }
}
