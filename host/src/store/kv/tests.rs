//! Tests of the key-value plan (`store::kv`): every operation against the old values and the
//! quota, each refusal named.

use super::*;

fn old<'a>(entries: &[(&'a str, &'a [u8])]) -> HashMap<&'a str, Option<&'a [u8]>> {
    entries.iter().map(|&(k, v)| (k, Some(v))).collect()
}

const ROOMY: KvQuota = KvQuota::UNLIMITED;

#[test]
fn a_batch_keeps_the_last_write_of_a_key_and_counts_usage_exactly() {
    let writes = [
        KvWrite::Set {
            key: "a",
            value: b"12345",
        },
        KvWrite::Delete { key: "b" },
        KvWrite::Set {
            key: "a",
            value: b"1",
        },
        KvWrite::Set {
            key: "c",
            value: b"xy",
        },
    ];
    let stored = old(&[("a", b"old"), ("b", b"bb")]);
    let usage = KvUsage::of([("a", &b"old"[..]), ("b", &b"bb"[..])]);
    let plan = plan(&KvOp::Batch(&writes), &stored, usage, &ROOMY).unwrap();
    assert_eq!(plan.done, KvDone::Written);
    assert_eq!(
        plan.changes,
        vec![
            ("a".to_owned(), Some(b"1".to_vec())),
            ("b".to_owned(), None),
            ("c".to_owned(), Some(b"xy".to_vec())),
        ]
    );
    assert_eq!(
        plan.usage,
        KvUsage::of([("a", &b"1"[..]), ("c", &b"xy"[..])])
    );
}

#[test]
fn a_quota_refuses_growth_past_it_but_never_a_shrink() {
    let stored = old(&[("a", b"1234")]);
    let usage = KvUsage::of([("a", &b"1234"[..])]);
    let keys = KvQuota {
        max_keys: 1,
        max_bytes: u64::MAX,
    };
    let new_key = [KvWrite::Set {
        key: "b",
        value: b"",
    }];
    assert_eq!(
        plan(&KvOp::Batch(&new_key), &stored, usage, &keys),
        Err(KvRefusal::TooManyKeys { limit: 1 })
    );
    let overwrite = [KvWrite::Set {
        key: "a",
        value: b"9",
    }];
    assert!(plan(&KvOp::Batch(&overwrite), &stored, usage, &keys).is_ok());

    let bytes = KvQuota {
        max_keys: u64::MAX,
        max_bytes: 3,
    };
    // Already over 3 bytes (5): shrinking passes, growing does not.
    assert!(plan(&KvOp::Batch(&overwrite), &stored, usage, &bytes).is_ok());
    let grow = [KvWrite::Set {
        key: "a",
        value: b"12345",
    }];
    assert_eq!(
        plan(&KvOp::Batch(&grow), &stored, usage, &bytes),
        Err(KvRefusal::TooManyBytes { limit: 3 })
    );
    let delete = [KvWrite::Delete { key: "a" }];
    let freed = plan(&KvOp::Batch(&delete), &stored, usage, &bytes).unwrap();
    assert_eq!(freed.usage, KvUsage::default());
}

#[test]
fn an_increment_counts_from_zero_and_refuses_text_and_overflow() {
    let none = HashMap::new();
    let op = KvOp::Increment { key: "n", delta: 5 };
    let first = plan(&op, &none, KvUsage::default(), &ROOMY).unwrap();
    assert_eq!(first.done, KvDone::Number(5));
    assert_eq!(first.changes, vec![("n".to_owned(), Some(b"5".to_vec()))]);

    let neg = KvOp::Increment {
        key: "n",
        delta: -7,
    };
    let stored = old(&[("n", b"5")]);
    assert_eq!(
        plan(&neg, &stored, KvUsage::default(), &ROOMY)
            .unwrap()
            .done,
        KvDone::Number(-2)
    );
    let text = old(&[("n", b"five")]);
    assert_eq!(
        plan(&op, &text, KvUsage::default(), &ROOMY),
        Err(KvRefusal::NotANumber)
    );
    let max = i64::MAX.to_string();
    let top = old(&[("n", max.as_bytes())]);
    assert_eq!(
        plan(&op, &top, KvUsage::default(), &ROOMY),
        Err(KvRefusal::Overflow)
    );
}

#[test]
fn a_swap_compares_the_exact_bytes_and_absence() {
    let stored = old(&[("k", b"v1")]);
    let usage = KvUsage::of([("k", &b"v1"[..])]);
    let swap = |expected: Option<&'static [u8]>| KvOp::Swap {
        key: "k",
        expected,
        new: b"v2",
    };
    let lost = plan(&swap(Some(b"v1 ")), &stored, usage, &ROOMY).unwrap();
    assert_eq!(lost.done, KvDone::Swapped(false));
    assert!(lost.changes.is_empty());
    assert_eq!(
        plan(&swap(None), &stored, usage, &ROOMY).unwrap().done,
        KvDone::Swapped(false)
    );
    let won = plan(&swap(Some(b"v1")), &stored, usage, &ROOMY).unwrap();
    assert_eq!(won.done, KvDone::Swapped(true));
    assert_eq!(won.changes, vec![("k".to_owned(), Some(b"v2".to_vec()))]);
    let fresh = plan(&swap(None), &HashMap::new(), KvUsage::default(), &ROOMY).unwrap();
    assert_eq!(fresh.done, KvDone::Swapped(true));
}
