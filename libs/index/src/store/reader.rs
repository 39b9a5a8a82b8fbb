//! Reading the store: a lookup's (and the writer's `locate`'s) view of the
//! pages through a few page read guards, and the key tables, which need
//! no lock.

use parking_lot::RwLockReadGuard;

use super::{Directory, Store};
use crate::arena::{MAX_PAGES, PAGE_RECORDS, Page, RecId, View, Visit, offset_of, page_of, rec_id};

/// Page read guards a reader keeps at once.
const READER_PAGES: usize = 4;

/// A reader's page guards: the directory read guard it borrows and a few
/// page guards.
#[derive(Debug)]
struct PageGuards<'a> {
    dir: &'a Directory,
    pages: [Option<(usize, RwLockReadGuard<'a, Page>)>; READER_PAGES],
    /// The slot used last, and the one to replace next.
    last: usize,
    next_evict: usize,
}

impl<'a> PageGuards<'a> {
    /// The cache slot holding page `n`'s read guard, locking it if needed.
    #[inline]
    fn slot(&mut self, n: usize) -> Option<usize> {
        // Consecutive blocks are mostly on the page of the previous one.
        if self.pages[self.last].as_ref().is_some_and(|c| c.0 == n) {
            return Some(self.last);
        }
        self.slot_slow(n)
    }

    #[inline(never)]
    fn slot_slow(&mut self, n: usize) -> Option<usize> {
        if let Some(at) = self
            .pages
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.0 == n))
        {
            self.last = at;
            return Some(at);
        }
        let page = self.dir.get(n)?;
        let at = match self.pages.iter().position(Option::is_none) {
            Some(at) => at,
            None => {
                self.next_evict = (self.next_evict + 1) % READER_PAGES;
                self.next_evict
            }
        };
        // Drop the old guard before locking the next page.
        self.pages[at] = None;
        self.pages[at] = Some((n, page.read()));
        self.last = at;
        Some(at)
    }

    #[inline]
    fn page_in(&self, slot: usize) -> Option<&Page> {
        self.pages[slot].as_ref().map(|c| &*c.1)
    }

    /// Page `n`, read-locked.
    #[inline]
    fn page(&mut self, n: usize) -> Option<&Page> {
        let slot = self.slot(n)?;
        self.page_in(slot)
    }

    /// Whether record `rec` is live and carries `key`.
    #[inline]
    fn is(&mut self, rec: RecId, key: u64) -> bool {
        self.page(page_of(rec)).and_then(|p| p.key(offset_of(rec))) == Some(key)
    }
}

/// A reader's view: the directory read guard it borrows and a few page
/// guards (the key tables need none).
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    store: &'a Store,
    pages: PageGuards<'a>,
}

impl<'a> Reader<'a> {
    /// Whether record `rec` is live and carries `key`.
    #[inline]
    pub(crate) fn is(&mut self, rec: RecId, key: u64) -> bool {
        self.pages.is(rec, key)
    }

    /// The record of `key` (hash `h`).
    // Inlined by request: out of line, its frame (nine registers saved and
    // restored) was some 19 of the ~160 instructions of each probe the
    // writer makes for a stored block.
    #[inline]
    pub(crate) fn find(&mut self, key: u64, h: u64) -> Option<RecId> {
        let pages = &mut self.pages;
        self.store
            .table(h)
            .and_then(|t| t.find(h, |rec| pages.is(rec, key)))
    }

    /// Starts loading the key slot of hash `h` (see [`KeyTable::prefetch`]).
    pub(crate) fn prefetch(&mut self, h: u64) {
        if let Some(table) = self.store.table(h) {
            table.prefetch(h);
        }
    }

    /// The record of `key`, trying the neighbours of `prev` first: a chain
    /// stored in one event was laid out in order, and evictions name a
    /// chain's blocks in order or in reverse (`back`: the record before
    /// `prev` is tried first, as the last block was found before its
    /// predecessor: a tail-first eviction).
    // Always inlined into `locate` (its only caller, once per stored or
    // removed block): left to the codegen units, it came out of line with
    // unrelated edits to the lookup (+2.6 % on `Index::apply`).
    #[inline(always)]
    pub(crate) fn find_near(
        &mut self,
        prev: Option<RecId>,
        back: bool,
        key: u64,
        h: u64,
    ) -> Option<RecId> {
        if let Some(prev) = prev {
            let before = (offset_of(prev) > 0).then(|| prev - 1);
            if back
                && let Some(b) = before
                && self.is(b, key)
            {
                return Some(b);
            }
            let next = if offset_of(prev) + 1 < PAGE_RECORDS {
                prev + 1
            } else {
                rec_id(page_of(prev) + 1, 0)
            };
            if page_of(next) < MAX_PAGES && self.is(next, key) {
                return Some(next);
            }
            if !back
                && let Some(b) = before
                && self.is(b, key)
            {
                return Some(b);
            }
        }
        self.find(key, h)
    }

    /// Visits the records right after `prev` while they carry `keys` in
    /// order (stopping early when `visit` returns false), on into the
    /// next page when a run fills its page to the end and keys are left
    /// (record ids run on across pages: a chain stored across a page
    /// boundary, as into a page the directory appended, continues at the
    /// next page's first record; where it does not, its key says so).
    /// `key_of` gives each of `keys`' record key (a slice and a function,
    /// not an iterator: the records' loop then indexes both with one
    /// counter).
    #[inline]
    pub(crate) fn walk<K>(
        &mut self,
        prev: RecId,
        keys: &[K],
        key_of: impl Fn(&K) -> u64 + Copy,
        mut visit: impl Visit,
    ) -> Walked {
        let mut at = prev.wrapping_add(1);
        let mut blocks = 0;
        loop {
            let (page_no, from) = (page_of(at), offset_of(at));
            if at == 0 || page_no >= MAX_PAGES {
                break;
            }
            let Some(page) = self.pages.page(page_no) else {
                break;
            };
            let (n, stopped) = page.walk(from, &keys[blocks..], key_of, &mut visit);
            blocks += n;
            if stopped {
                return Walked {
                    blocks,
                    stopped: true,
                };
            }
            // A run that ended before the page's end met a record not
            // carrying its key or the end of a page not yet full; one that
            // filled its page goes on only for a key left (no lock on a
            // page the lookup does not need).
            if from + n < PAGE_RECORDS || blocks >= keys.len() {
                break;
            }
            at = rec_id(page_no + 1, 0);
        }
        Walked {
            blocks,
            stopped: false,
        }
    }

    /// The live record `rec` (found by [`Reader::find`]).
    #[inline]
    pub(crate) fn view(&mut self, rec: RecId) -> Option<View<'_>> {
        self.pages.page(page_of(rec))?.view(offset_of(rec))
    }
}

/// How far [`Reader::walk`] got.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walked {
    /// Records visited.
    pub(crate) blocks: usize,
    /// Whether `visit` asked to stop.
    pub(crate) stopped: bool,
}

impl Store {
    /// Read access (to the pages: the key tables need none); `dir` comes
    /// from [`Store::directory`].
    pub(crate) fn reader<'a>(&'a self, dir: &'a Directory) -> Reader<'a> {
        Reader {
            store: self,
            pages: PageGuards {
                dir,
                pages: Default::default(),
                last: 0,
                next_evict: 0,
            },
        }
    }
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod walk_tests;
