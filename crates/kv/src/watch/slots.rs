//! A hash table of slot numbers, two bytes an entry while a stream's slots fit in 16 bits.
//!
//! A stream's watchers are found through two such tables (by id, and by key), and their
//! entries are most of what an idle watcher costs beside its slot and key: hashbrown keeps a
//! stream of 100 watchers in 128 buckets, 4 bytes and a control byte each. Nearly every stream
//! holds far fewer than 65,536 watchers, so its tables hold `u16` entries; the stream that
//! grows past that (up to [`super::group::MAX_WATCHERS`]) has its table rebuilt wide, once.

use hashbrown::HashTable;

/// Slot numbers hashed by what the caller chooses (a watcher's id, or its key).
#[derive(Debug)]
pub(super) enum SlotIndex {
    Narrow(HashTable<u16>),
    Wide(HashTable<u32>),
}

impl Default for SlotIndex {
    fn default() -> Self {
        SlotIndex::Narrow(HashTable::new())
    }
}

impl SlotIndex {
    /// Adds `slot`, whose hash is `hash`; `rehash` gives the hash of any slot held.
    pub fn insert(&mut self, hash: u64, slot: u32, rehash: impl Fn(u32) -> u64) {
        if let SlotIndex::Narrow(t) = self {
            match u16::try_from(slot) {
                Ok(s) => {
                    t.insert_unique(hash, s, |&s| rehash(u32::from(s)));
                    return;
                }
                Err(_) => self.widen(&rehash),
            }
        }
        if let SlotIndex::Wide(t) = self {
            t.insert_unique(hash, slot, |&s| rehash(s));
        }
    }

    /// Rebuilds a narrow table with wide entries.
    fn widen(&mut self, rehash: &impl Fn(u32) -> u64) {
        let SlotIndex::Narrow(narrow) = self else { return };
        let mut wide = HashTable::with_capacity(narrow.len() + 1);
        for s in narrow.iter().map(|&s| u32::from(s)) {
            wide.insert_unique(rehash(s), s, |&s| rehash(s));
        }
        *self = SlotIndex::Wide(wide);
    }

    /// The slot with hash `hash` that `is` accepts.
    pub fn find(&self, hash: u64, is: impl Fn(u32) -> bool) -> Option<u32> {
        match self {
            SlotIndex::Narrow(t) => t.find(hash, |&s| is(u32::from(s))).map(|&s| u32::from(s)),
            SlotIndex::Wide(t) => t.find(hash, |&s| is(s)).copied(),
        }
    }

    /// Removes `slot`, if held under `hash`.
    pub fn remove(&mut self, hash: u64, slot: u32) {
        match self {
            SlotIndex::Narrow(t) => {
                if let Ok(e) = t.find_entry(hash, |&s| u32::from(s) == slot) {
                    e.remove();
                }
            }
            SlotIndex::Wide(t) => {
                if let Ok(e) = t.find_entry(hash, |&s| s == slot) {
                    e.remove();
                }
            }
        }
    }

    /// Renumbers slot `from`, held under `hash`, to `to`, a lower slot (the last watcher
    /// moves into a freed slot), so it fits wherever `from` did.
    pub fn repoint(&mut self, hash: u64, from: u32, to: u32) {
        debug_assert!(to < from);
        match self {
            SlotIndex::Narrow(t) => {
                if let Some(s) = t.find_mut(hash, |&s| u32::from(s) == from) {
                    *s = u16::try_from(to).expect("below a slot that fits");
                }
            }
            SlotIndex::Wide(t) => {
                if let Some(s) = t.find_mut(hash, |&s| s == from) {
                    *s = to;
                }
            }
        }
    }

    /// Calls `f` with each slot held under `hash` (and perhaps others that share it).
    pub fn each_with_hash(&self, hash: u64, mut f: impl FnMut(u32)) {
        match self {
            SlotIndex::Narrow(t) => t.iter_hash(hash).for_each(|&s| f(u32::from(s))),
            SlotIndex::Wide(t) => t.iter_hash(hash).for_each(|&s| f(s)),
        }
    }

    /// Calls `f` with every slot held.
    pub fn each(&self, mut f: impl FnMut(u32)) {
        match self {
            SlotIndex::Narrow(t) => t.iter().for_each(|&s| f(u32::from(s))),
            SlotIndex::Wide(t) => t.iter().for_each(|&s| f(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(s: u32) -> u64 {
        u64::from(s % 1000).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// Slots past 16 bits widen the table; every slot is found, renumbered and removed as
    /// before, and slots that share a hash are all visited.
    #[test]
    fn a_table_widens_past_sixteen_bits_and_keeps_every_slot() {
        let mut t = SlotIndex::default();
        let n = 70_000u32;
        for s in 0..n {
            t.insert(hash(s), s, hash);
            assert_eq!(matches!(t, SlotIndex::Narrow(_)), s <= u32::from(u16::MAX), "slot {s}");
        }
        for s in (0..n).step_by(997) {
            assert_eq!(t.find(hash(s), |x| x == s), Some(s));
        }
        let mut shared = Vec::new();
        t.each_with_hash(hash(7), |s| shared.push(s));
        shared.retain(|s| s % 1000 == 7);
        assert_eq!(shared.len(), 70);
        t.remove(hash(5), 5);
        t.repoint(hash(n - 1), n - 1, 5);
        assert_eq!(t.find(hash(n - 1), |x| x == 5), Some(5));
        assert_eq!(t.find(hash(5), |x| x == 5), None, "5 now holds what was last");
        let mut count = 0;
        t.each(|_| count += 1);
        assert_eq!(count, n - 1);
    }
}
