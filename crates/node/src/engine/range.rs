//! Range reads in bounded steps (see cairn-kv's `store/read.rs`): the store's lock is held for
//! one step at a time, and the task yields to its executor between steps, so a range of a
//! million keys neither stops writes nor monopolizes a runtime thread.
//!
//! A read is planned before its values are read: [`RangePlan::bytes`] tells a server how much
//! memory the answer will take, so it can bound what responses in flight hold (and refuse or
//! delay a read) before the memory is spent.

use std::sync::atomic::Ordering;

use cairn_kv::{KvError, RangeRead, RangeRequest, RangeResponse};

use super::Engine;
use crate::error::EngineError;

/// The largest range read whole at once, under one hold of the store's lock, on the caller's
/// thread: most reads (a Kubernetes list page is 500 keys) take no step at all.
const WHOLE_KEYS: usize = 1_000;
/// Keys one step of a larger range walks or reads. A step walks the read's copy of the index,
/// so no write waits for it; the steps bound what one call does between two checks that the
/// engine still runs (and, on a runtime, between two yields).
const STEP_KEYS: usize = 100;
/// Bytes of values one reading step reads at most, and the largest answer read whole at once.
const STEP_BYTES: u64 = 1 << 20;

/// A range read that is planned: its revision is fixed and pinned, its size known, and no value
/// has been read yet. [`Engine::range_read`] reads it.
#[derive(Debug)]
pub struct RangePlan {
    read: RangeRead,
}

impl RangePlan {
    /// The bytes the answer will hold: keys, values and their framing in a response (an
    /// estimate within a few bytes per key). A small range is read whole while it is planned.
    pub fn bytes(&self) -> u64 {
        self.read.bytes()
    }

    /// Whether the answer was small enough to be read whole while it was planned:
    /// [`Engine::range_read`] then only hands it over.
    pub fn is_read(&self) -> bool {
        self.read.done()
    }

    /// Whether the whole range has been counted, so [`RangePlan::bytes`] is final. A plan
    /// from [`Engine::range_begin`] may not be; [`Engine::range_plan_blocking`] finishes it.
    pub fn is_planned(&self) -> bool {
        self.read.planned()
    }
}

impl Engine {
    /// A read: linearizable unless `serializable` is set, in which case it reads this member's
    /// applied state without a round of Raft. Large ranges are read in steps (see
    /// [`Engine::range_plan`]); the answer is the state at one revision all the same.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, EngineError> {
        let plan = self.range_plan(req).await?;
        self.range_read(plan).await
    }

    /// The first half of [`Engine::range`]: checks the request, waits for the read barrier
    /// (unless `serializable`), fixes the revision the read sees and counts what the answer
    /// holds, without reading values (except for a small range, read whole at once).
    pub async fn range_plan(&self, req: RangeRequest) -> Result<RangePlan, EngineError> {
        let RangePlan { mut read } = self.range_begin(req).await?;
        let store = &self.shared.store;
        while !read.planned() {
            tokio::task::yield_now().await;
            self.check_running()?;
            store.range_step(&mut read, STEP_KEYS, STEP_BYTES)?;
        }
        Ok(RangePlan { read })
    }

    /// The first step of [`Engine::range_plan`]: checks the request, waits for the read barrier
    /// (unless `serializable`), fixes the revision and plans (or reads, if small) the first
    /// step's keys. The plan of a large range is unfinished ([`RangePlan::is_planned`]): a
    /// caller with a blocking pool finishes it there ([`Engine::range_plan_blocking`]), as
    /// counting a million keys takes a runtime thread's time even in yielding steps.
    pub async fn range_begin(&self, req: RangeRequest) -> Result<RangePlan, EngineError> {
        if req.key.is_empty() {
            return Err(KvError::EmptyKey.into());
        }
        self.check_running()?;
        if !req.serializable {
            self.read_barrier().await?;
        }
        let read = self.shared.store.range_begin(&req, WHOLE_KEYS, STEP_BYTES)?;
        Ok(RangePlan { read })
    }

    /// Finishes an unfinished plan from [`Engine::range_begin`], for a caller on a thread of
    /// its own.
    pub fn range_plan_blocking(&self, plan: RangePlan) -> Result<RangePlan, EngineError> {
        let RangePlan { mut read } = plan;
        let store = &self.shared.store;
        while !read.planned() {
            self.check_running()?;
            store.range_step(&mut read, STEP_KEYS, STEP_BYTES)?;
        }
        Ok(RangePlan { read })
    }

    /// The second half of [`Engine::range`]: reads the planned range's values, in steps.
    pub async fn range_read(&self, plan: RangePlan) -> Result<RangeResponse, EngineError> {
        let RangePlan { mut read } = plan;
        let store = &self.shared.store;
        while !read.done() {
            tokio::task::yield_now().await;
            self.check_running()?;
            store.range_step(&mut read, STEP_KEYS, STEP_BYTES)?;
        }
        Ok(read.finish())
    }

    /// [`Engine::range_read`] for a caller on a thread of its own (a blocking pool's): the same
    /// steps, without yielding between them.
    pub fn range_read_blocking(&self, plan: RangePlan) -> Result<RangeResponse, EngineError> {
        let RangePlan { mut read } = plan;
        let store = &self.shared.store;
        while !read.done() {
            self.check_running()?;
            store.range_step(&mut read, STEP_KEYS, STEP_BYTES)?;
        }
        Ok(read.finish())
    }

    fn check_running(&self) -> Result<(), EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            Err(self.stopped())
        } else {
            Ok(())
        }
    }
}
