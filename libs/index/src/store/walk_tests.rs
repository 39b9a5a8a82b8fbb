//! [`Reader::walk`] across a page boundary: it goes on into the next page
//! only when a run filled its page to the end with keys left, and takes
//! the next page's first record only if it is live and carries the next
//! key.

use super::*;
use crate::store::Block;

use crate::store::tests::store_numbered_chain as chain;

fn key(block: &Block) -> u64 {
    block.key
}

/// Where each of `blocks` is stored.
fn recs(store: &Store, blocks: &[Block]) -> Vec<Option<RecId>> {
    let mut reader = store.reader(store.directory());
    blocks.iter().map(|b| reader.find(b.key, b.h)).collect()
}

/// A chain of two pages' records from a page's start, as a precondition.
fn two_pages(store: &Store) -> Vec<Block> {
    let a = chain(store, 1, 2 * PAGE_RECORDS as u32);
    let at = recs(store, &a);
    let first = at[0].unwrap();
    assert_eq!(offset_of(first), 0, "the chain starts a page");
    let run: Vec<_> = (0..a.len()).map(|i| Some(first + i as u32)).collect();
    assert_eq!(at, run, "the chain is stored in order over two pages");
    a
}

#[test]
fn a_mismatch_mid_page_does_not_walk_on_into_the_next_page() {
    // The key that did not match is spent: going on into the next page
    // would test its first record against the key after it, and a prompt
    // [a1, a2, X, a8] would match a8 though X is not held.
    let store = Store::new(4, 2, 8);
    let a = two_pages(&store);
    let first = recs(&store, &a[..1])[0].unwrap();
    let mut reader = store.reader(store.directory());
    let absent = 999_999;
    let prompt = [a[1].key, a[2].key, absent, a[8].key, a[9].key];
    let walked = reader.walk(first, &prompt, |&k| k, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (2, false));
    drop(reader);
    // The same with the record there dead (its block evicted).
    store.remove(&a[3..4], |_| true, |_| {});
    let mut reader = store.reader(store.directory());
    let prompt = [a[1].key, a[2].key, a[3].key, a[8].key, a[9].key];
    let walked = reader.walk(first, &prompt, |&k| k, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (2, false));
}

#[test]
fn a_dead_first_record_of_the_next_page_ends_the_walk() {
    let store = Store::new(4, 2, 8);
    let a = two_pages(&store);
    let first = recs(&store, &a[..1])[0].unwrap();
    store.remove(&a[PAGE_RECORDS..=PAGE_RECORDS], |_| true, |_| {});
    let mut reader = store.reader(store.directory());
    let walked = reader.walk(first, &a[1..], key, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (PAGE_RECORDS - 1, false));
}

#[test]
fn a_freed_next_page_or_another_chains_record_there_ends_the_walk() {
    let store = Store::new(4, 2, 8);
    let a = two_pages(&store);
    let first = recs(&store, &a[..1])[0].unwrap();
    let next = rec_id(page_of(first) + 1, 0);
    // The second page's records all go: compaction frees the page.
    store.remove(&a[PAGE_RECORDS..], |_| true, |_| {});
    store.compact();
    {
        let mut reader = store.reader(store.directory());
        assert!(reader.view(next).is_none(), "the page was freed");
        let walked = reader.walk(first, &a[1..], key, |_: &[u32]| true);
        assert_eq!((walked.blocks, walked.stopped), (PAGE_RECORDS - 1, false));
    }
    // Another chain takes the freed page, and the first chain's next
    // block is stored again elsewhere: the walk ends at the page's end
    // (the block is found through the key table).
    let b = chain(&store, 2, PAGE_RECORDS as u32);
    assert_eq!(recs(&store, &b[..1])[0], Some(next), "b reuses the page");
    chain(&store, 1, PAGE_RECORDS as u32 + 1);
    let again = recs(&store, &a[PAGE_RECORDS..=PAGE_RECORDS])[0].unwrap();
    assert_ne!(again, next);
    let mut reader = store.reader(store.directory());
    let walked = reader.walk(first, &a[1..=PAGE_RECORDS], key, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (PAGE_RECORDS - 1, false));
}

#[test]
fn keys_ending_at_a_pages_last_record_leave_the_next_page_unlocked() {
    let store = Store::new(4, 2, 8);
    let a = two_pages(&store);
    let first = recs(&store, &a[..1])[0].unwrap();
    let dir = store.directory();
    let next_page = dir.get(page_of(first) + 1).unwrap();
    // The prompt ends at the page's last record: nothing on the next
    // page is needed.
    let mut reader = store.reader(dir);
    let walked = reader.walk(first, &a[1..PAGE_RECORDS], key, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (PAGE_RECORDS - 1, false));
    assert!(!next_page.is_locked(), "the next page was read-locked");
    // One key more: the reader goes on, and holds the next page's guard
    // (the observation above can see it).
    let walked = reader.walk(first, &a[1..=PAGE_RECORDS], key, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (PAGE_RECORDS, false));
    assert!(next_page.is_locked());
    drop(reader);
    assert!(!next_page.is_locked());
}
